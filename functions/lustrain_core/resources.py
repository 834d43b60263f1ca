"""The registry of what a run can create: every resource kind, once, with how it is found and described.

Each kind is a `{type, id}` entry of the job record's ledger (`type` is its name here). Teardown
(steps/teardown.py: its deletion order, what it discovers by tag, how it describes each one before touching it),
the sweeper (steps/sweep.py: everything of this stack by tag), the twin's leak count (lustrain/twin/rehearse.py)
and the benches read this table; how each family is deleted lives in teardown, per family, in NETWORK_ORDER.

    kind                          service    found by tag          described by
    vpc                           ec2        tag filter            DescribeVpcs VpcIds
    subnet                        ec2        tag filter            DescribeSubnets SubnetIds
    security_group                ec2        tag filter            DescribeSecurityGroups GroupIds
    route_table                   ec2        tag filter            DescribeRouteTables RouteTableIds
    vpc_endpoint                  ec2        tag filter            DescribeVpcEndpoints VpcEndpointIds
    file_system                   fsx        Tags of each          DescribeFileSystems FileSystemIds
    data_repository_association   fsx        Tags of each          DescribeDataRepositoryAssociations AssociationIds
    training_job                  sagemaker  ListTags of each      DescribeTrainingJob TrainingJobName
    processing_job                sagemaker  ListTags of each      DescribeProcessingJob ProcessingJobName
    iam_role                      iam        ListRoleTags of each  GetRole RoleName (a preparation's own role)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core.aws_errors import not_found, training_job_missing


@dataclass(frozen=True)
class Kind:
    name: str
    service: str
    family: str
    #: the describe call, its ids parameter, its result list and each item's id field
    describe: str
    ids_param: str
    result_key: str
    id_key: str
    #: the field holding its state, and the states in which it counts as gone
    state_key: str | None = None
    gone: frozenset[str] = frozenset()
    #: EC2's describe calls filter by tag; FSx's return each item's Tags
    tag_filter: bool = False
    #: described one at a time, by name: the answer is the item (result_key "") or holds it under result_key
    single: bool = False


VPC = Kind("vpc", "ec2", "network", "describe_vpcs", "VpcIds", "Vpcs", "VpcId", tag_filter=True)
SUBNET = Kind("subnet", "ec2", "network", "describe_subnets", "SubnetIds", "Subnets", "SubnetId", tag_filter=True)
SECURITY_GROUP = Kind(
    "security_group", "ec2", "network", "describe_security_groups", "GroupIds", "SecurityGroups", "GroupId",
    tag_filter=True,
)  # fmt: skip
ROUTE_TABLE = Kind(
    "route_table", "ec2", "network", "describe_route_tables", "RouteTableIds", "RouteTables", "RouteTableId",
    tag_filter=True,
)  # fmt: skip
VPC_ENDPOINT = Kind(
    "vpc_endpoint", "ec2", "network", "describe_vpc_endpoints", "VpcEndpointIds", "VpcEndpoints", "VpcEndpointId",
    state_key="State", gone=frozenset({"deleted", "deleting"}), tag_filter=True,
)  # fmt: skip
FILE_SYSTEM = Kind(
    "file_system", "fsx", "storage", "describe_file_systems", "FileSystemIds", "FileSystems", "FileSystemId",
    state_key="Lifecycle", gone=frozenset({"deleting"}),
)  # fmt: skip
DATA_REPOSITORY_ASSOCIATION = Kind(
    "data_repository_association", "fsx", "storage", "describe_data_repository_associations", "AssociationIds",
    "Associations", "AssociationId", state_key="Lifecycle", gone=frozenset({"deleting"}),
)  # fmt: skip
TRAINING_JOB = Kind(
    "training_job", "sagemaker", "compute", "describe_training_job", "TrainingJobName", "", "TrainingJobName",
    state_key="TrainingJobStatus", single=True,
)  # fmt: skip

#: data preparation's stages (lustrain_core.prepare_plan, steps/prepare.py)
PROCESSING_JOB = Kind(
    "processing_job", "sagemaker", "compute", "describe_processing_job", "ProcessingJobName", "",
    "ProcessingJobName", state_key="ProcessingJobStatus", single=True,
)  # fmt: skip

#: a data preparation's own IAM role (steps/prepare_role), deleted last (teardown_identity)
IAM_ROLE = Kind("iam_role", "iam", "identity", "get_role", "RoleName", "Role", "RoleName", single=True)

KINDS: tuple[Kind, ...] = (
    VPC, SUBNET, SECURITY_GROUP, ROUTE_TABLE, VPC_ENDPOINT, FILE_SYSTEM, DATA_REPOSITORY_ASSOCIATION, TRAINING_JOB,
    PROCESSING_JOB, IAM_ROLE,
)  # fmt: skip
BY_NAME: dict[str, Kind] = {kind.name: kind for kind in KINDS}
#: The network's pieces in the order AWS lets them be deleted (each depends on the ones after it).
NETWORK_ORDER: tuple[str, ...] = ("vpc_endpoint", "security_group", "route_table", "subnet", "vpc")
assert set(NETWORK_ORDER) == {kind.name for kind in KINDS if kind.family == "network"}


def present(kind: Kind, item: dict[str, Any]) -> bool:
    """Whether a described item still exists (not in one of its kind's gone states)."""
    return kind.state_key is None or str(item.get(kind.state_key, "")).lower() not in kind.gone


def describe(client: Any, kind: Kind, resource_id: str) -> dict[str, Any] | None:
    """One resource as its service describes it, or None when it is gone (not found, or in a gone state)."""
    try:
        if kind.single:
            answer = getattr(client, kind.describe)(**{kind.ids_param: resource_id})
            found = [answer[kind.result_key] if kind.result_key else answer]
        else:
            found = getattr(client, kind.describe)(**{kind.ids_param: [resource_id]})[kind.result_key]
    except ClientError as exc:
        if not_found(exc) or (kind.single and training_job_missing(exc)):
            return None
        raise
    item = dict(found[0]) if found else None
    return item if item is not None and present(kind, item) else None


def tagged(client: Any, kind: Kind, tags: dict[str, str]) -> Iterator[dict[str, Any]]:
    """Every existing resource of an EC2 kind carrying all of `tags` (EC2 filters by tag; paginated)."""
    if not kind.tag_filter:
        raise ValueError(f"{kind.name} is not found by a tag filter")
    filters = [{"Name": f"tag:{key}", "Values": [value]} for key, value in tags.items()]
    for page in client.get_paginator(kind.describe).paginate(Filters=filters):
        for item in page.get(kind.result_key, []):
            if present(kind, item):
                yield dict(item)
