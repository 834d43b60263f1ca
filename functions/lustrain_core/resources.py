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
    warm_pool                     sagemaker  ListTags of each      DescribeTrainingJob TrainingJobName (its pool)
    iam_role                      iam        ListRoleTags of each  GetRole RoleName (a preparation's own role)

Each kind also says what it bills an hour while it exists (`hourly_usd`, at the price table's list prices), which
`lustrain leftovers` (lustrain_core.leftovers) reports: the pieces of a VPC, a file system's link to S3 and a role
bill nothing; an interface endpoint bills per zone; a file system by its capacity and throughput tier; a job and a
warm pool by their instances.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core.aws_errors import not_found, training_job_missing
from lustrain_core.prices import PriceTable

#: what a resource bills an hour while it exists, from its description (None: not priced here)
Hourly = Callable[[dict[str, Any], PriceTable], "float | None"]


def free(item: dict[str, Any], prices: PriceTable) -> float | None:
    """VPCs, subnets, security groups, route tables, a file system's link to S3 and IAM roles bill nothing."""
    return 0.0


def endpoint_hourly_usd(item: dict[str, Any], prices: PriceTable) -> float | None:
    """An interface endpoint (AWS PrivateLink) bills each hour in each zone it has a subnet in; a gateway endpoint
    (S3's, the only one a run's network has besides code.secrets' interface endpoints) bills nothing."""
    if str(item.get("VpcEndpointType", "")).lower() != "interface":
        return 0.0
    return len(item.get("SubnetIds") or []) * prices.interface_endpoint_az_hour_usd


def file_system_hourly_usd(item: dict[str, Any], prices: PriceTable) -> float | None:
    """A Lustre file system bills its StorageCapacity (GiB) at its deployment type's and throughput tier's price a
    GB-month (SCRATCH_2 has one tier, 200 MB/s per TiB)."""
    lustre = item.get("LustreConfiguration") or {}
    deployment = str(lustre.get("DeploymentType", ""))
    tier = int(lustre.get("PerUnitStorageThroughput") or (200 if deployment == "SCRATCH_2" else 0))
    rate = prices.fsx_gb_month_usd.get((deployment, tier))
    if rate is None or item.get("StorageCapacity") is None:
        return None
    return float(item["StorageCapacity"]) * 2**30 / 1e9 * rate / prices.hours_per_month


def _instances_hourly_usd(prices: PriceTable, instance_type: str, count: int, spot: bool = False) -> float | None:
    itype = prices.instance_types.get(instance_type)
    if itype is None or itype.hourly_usd is None:
        return None
    return count * itype.hourly_usd * (prices.spot_price_fraction if spot else 1.0)


def training_job_hourly_usd(item: dict[str, Any], prices: PriceTable) -> float | None:
    """A training job's instances (or its warm pool's: the same ResourceConfig), managed spot at the price table's
    planned fraction of on-demand."""
    config = item.get("ResourceConfig") or {}
    if not config.get("InstanceType"):
        return None
    spot = bool(item.get("EnableManagedSpotTraining"))
    return _instances_hourly_usd(prices, config["InstanceType"], int(config.get("InstanceCount") or 0), spot)


def processing_job_hourly_usd(item: dict[str, Any], prices: PriceTable) -> float | None:
    cluster = (item.get("ProcessingResources") or {}).get("ClusterConfig") or {}
    if not cluster.get("InstanceType"):
        return None
    return _instances_hourly_usd(prices, cluster["InstanceType"], int(cluster.get("InstanceCount") or 0))


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
    #: the field holding its state (a dotted path into the item where nested), and the states in which it counts
    #: as gone, or (`alive`, where given) the only states in which it exists
    state_key: str | None = None
    gone: frozenset[str] = frozenset()
    alive: frozenset[str] = frozenset()
    #: EC2's describe calls filter by tag; FSx's return each item's Tags
    tag_filter: bool = False
    #: described one at a time, by name: the answer is the item (result_key "") or holds it under result_key
    single: bool = False
    #: what it bills an hour while it exists
    hourly_usd: Hourly = free
    #: a job: the call that stops it (by ids_param) and the field of its ARN, whose tags say whose it is
    stop: str = ""
    arn_key: str = ""


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
    state_key="State", gone=frozenset({"deleted", "deleting"}), tag_filter=True, hourly_usd=endpoint_hourly_usd,
)  # fmt: skip
FILE_SYSTEM = Kind(
    "file_system", "fsx", "storage", "describe_file_systems", "FileSystemIds", "FileSystems", "FileSystemId",
    state_key="Lifecycle", gone=frozenset({"deleting"}), hourly_usd=file_system_hourly_usd,
)  # fmt: skip
DATA_REPOSITORY_ASSOCIATION = Kind(
    "data_repository_association", "fsx", "storage", "describe_data_repository_associations", "AssociationIds",
    "Associations", "AssociationId", state_key="Lifecycle", gone=frozenset({"deleting"}),
)  # fmt: skip
TRAINING_JOB = Kind(
    "training_job", "sagemaker", "compute", "describe_training_job", "TrainingJobName", "", "TrainingJobName",
    state_key="TrainingJobStatus", single=True, hourly_usd=training_job_hourly_usd, stop="stop_training_job",
    arn_key="TrainingJobArn",
)  # fmt: skip

#: data preparation's stages (lustrain_core.prepare_plan, steps/prepare.py)
PROCESSING_JOB = Kind(
    "processing_job", "sagemaker", "compute", "describe_processing_job", "ProcessingJobName", "",
    "ProcessingJobName", state_key="ProcessingJobStatus", single=True, hourly_usd=processing_job_hourly_usd,
    stop="stop_processing_job", arn_key="ProcessingJobArn",
)  # fmt: skip

#: the instances a training job's warm pool keeps after the job ended (compute.keep_alive_minutes,
#: steps/warm_pool.py): they bill until the pool ends (Available), or bill as the job that reused them (InUse)
WARM_POOL = Kind(
    "warm_pool", "sagemaker", "compute", "describe_training_job", "TrainingJobName", "", "TrainingJobName",
    state_key="WarmPoolStatus.Status", alive=frozenset({"available", "inuse"}), single=True,
    hourly_usd=training_job_hourly_usd,
)  # fmt: skip

#: a data preparation's own IAM role (steps/prepare_role), deleted last (teardown_identity)
IAM_ROLE = Kind("iam_role", "iam", "identity", "get_role", "RoleName", "Role", "RoleName", single=True)

KINDS: tuple[Kind, ...] = (
    VPC, SUBNET, SECURITY_GROUP, ROUTE_TABLE, VPC_ENDPOINT, FILE_SYSTEM, DATA_REPOSITORY_ASSOCIATION, TRAINING_JOB,
    PROCESSING_JOB, WARM_POOL, IAM_ROLE,
)  # fmt: skip
BY_NAME: dict[str, Kind] = {kind.name: kind for kind in KINDS}
#: The network's pieces in the order AWS lets them be deleted (each depends on the ones after it).
NETWORK_ORDER: tuple[str, ...] = ("vpc_endpoint", "security_group", "route_table", "subnet", "vpc")
assert set(NETWORK_ORDER) == {kind.name for kind in KINDS if kind.family == "network"}


def state(kind: Kind, item: dict[str, Any]) -> str | None:
    """A described item's state (its kind's state_key, followed through nested fields), None where it has none."""
    if kind.state_key is None:
        return None
    found: Any = item
    for key in kind.state_key.split("."):
        found = found.get(key) if isinstance(found, dict) else None
    return None if found is None else str(found)


def present(kind: Kind, item: dict[str, Any]) -> bool:
    """Whether a described item still exists (in one of its kind's alive states where it names them, else not in
    one of its gone states)."""
    if kind.state_key is None:
        return True
    now = (state(kind, item) or "").lower()
    return now in kind.alive if kind.alive else now not in kind.gone


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


def job_tags(sagemaker: Any, arn: str) -> list[dict[str, str]]:
    """A SageMaker job's tags (ListTags, every page): neither ListTrainingJobs nor ListProcessingJobs gives them."""
    tags: list[dict[str, str]] = []
    params: dict[str, Any] = {"ResourceArn": arn}
    while True:
        page = sagemaker.list_tags(**params)
        tags.extend(page.get("Tags", []))
        if not page.get("NextToken"):
            return tags
        params["NextToken"] = page["NextToken"]


def tagged(client: Any, kind: Kind, tags: dict[str, str]) -> Iterator[dict[str, Any]]:
    """Every existing resource of an EC2 kind carrying all of `tags` (EC2 filters by tag; paginated)."""
    if not kind.tag_filter:
        raise ValueError(f"{kind.name} is not found by a tag filter")
    filters = [{"Name": f"tag:{key}", "Values": [value]} for key, value in tags.items()]
    for page in client.get_paginator(kind.describe).paginate(Filters=filters):
        for item in page.get(kind.result_key, []):
            if present(kind, item):
                yield dict(item)
