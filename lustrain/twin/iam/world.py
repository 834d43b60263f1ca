"""What authorization reads of the twin's AWS: a role's policies, a bucket's policy, a resource's tags.

Everything is read from moto's backends at the moment of the request, as IAM reads the live policies: a policy
changed with `aws iam put-role-policy` applies to the next call.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from lustrain.twin.iam.actions import ResourceFinder
from lustrain.twin.iam.policy import Policy


@cache
def aws_managed_policy_documents() -> dict[str, Any]:
    """AWS managed policies by name, from moto's copy of them (moto loads them only on request, slowly)."""
    from moto.iam.aws_managed_policies import aws_managed_policies_data

    data: dict[str, Any] = json.loads(aws_managed_policies_data)
    return data


def _iam(account: str) -> Any:
    from moto.iam.models import iam_backends

    return iam_backends[account]["aws"]


def find_role(role_arn: str) -> Any | None:
    """moto's role of an ARN (its name is the ARN's last part, whatever its path), or None."""
    account, name = role_arn.split(":")[4], role_arn.rsplit("/", 1)[-1]
    return next((role for role in _iam(account).roles.values() if role.name == name), None)


def ensure_aws_managed_policy(account: str, arn: str) -> None:
    """Make an AWS managed policy attachable in moto without loading all 1,500 of them."""
    from moto.iam.models import AWSManagedPolicy

    backend = _iam(account)
    if arn in backend.managed_policies:
        return
    name = arn.rsplit("/", 1)[-1]
    data = aws_managed_policy_documents().get(name)
    if data is None:
        raise LookupError(f"{arn} is not an AWS managed policy moto knows")
    backend.managed_policies[arn] = AWSManagedPolicy.from_data(name, account, "us-east-1", data)


def _default_document(policy: Any) -> str:
    for version in policy.versions:
        if version.is_default:
            return str(version.document)
    return str(policy.versions[-1].document)


def role_policies(role_arn: str) -> list[Policy]:
    """The identity-based policies of a role: its inline policies, then its attached managed policies."""
    role = find_role(role_arn)
    if role is None:
        return []
    found = [
        Policy.parse(f"{role.name}/{name}", document) for name, document in sorted(role.policies.items())
    ]
    found += [
        Policy.parse(arn, _default_document(policy)) for arn, policy in sorted(role.managed_policies.items())
    ]
    return found


def permissions_boundary(role_arn: str) -> Policy | None:
    """A role's permissions boundary (a managed policy), or None where it has none: what the role's policies
    grant counts only where the boundary allows it too (IAM User Guide, "Permissions boundaries for IAM
    entities")."""
    role = find_role(role_arn)
    arn = getattr(role, "permissions_boundary_arn", None) if role is not None else None
    if not arn:
        return None
    policy = _iam(role_arn.split(":")[4]).managed_policies.get(arn)
    if policy is None:
        # a boundary whose policy is gone allows nothing (IAM would refuse such a role's every call)
        return Policy.parse(f"{arn} (missing)", {"Version": "2012-10-17", "Statement": []})
    return Policy.parse(arn, _default_document(policy))


def trust_policy(role_arn: str) -> Policy | None:
    role = find_role(role_arn)
    if role is None:
        return None
    return Policy.parse(f"{role.name}/trust", role.assume_role_policy_document)


def bucket_policy(account: str, bucket: str) -> Policy | None:
    from moto.s3.models import s3_backends

    found = s3_backends[account]["aws"].buckets.get(bucket)
    if found is None or not found.policy:
        return None
    text = found.policy.decode() if isinstance(found.policy, bytes) else str(found.policy)
    return Policy.parse(f"s3://{bucket} bucket policy", text)


class MotoState(ResourceFinder):
    """Tags and associations of the resources a call names, read from moto for aws:ResourceTag conditions."""

    def __init__(self, account: str) -> None:
        self.account = account

    def route_table_association(self, region: str, association_id: str) -> tuple[str | None, str | None]:
        from moto.ec2.models import ec2_backends

        for table in ec2_backends[self.account][region].route_tables.values():
            target = table._associations.get(association_id)
            if target is not None:
                return table.id, target
        return None, None

    def subnet_vpc(self, region: str, subnet_id: str) -> str | None:
        from moto.ec2.models import ec2_backends

        for by_zone in ec2_backends[self.account][region].subnets.values():
            if subnet_id in by_zone:
                return str(by_zone[subnet_id].vpc_id)
        return None

    def association_file_system(self, region: str, association_id: str) -> str | None:
        from lustrain.twin.patches.fsx import association_file_system

        return association_file_system(self.account, region, association_id)

    def role(self, name: str) -> tuple[str, str | None] | None:
        role = next((r for r in _iam(self.account).roles.values() if r.name == name), None)
        if role is None:
            return None
        return str(role.arn), getattr(role, "permissions_boundary_arn", None) or None

    def tags(self, arn: str) -> dict[str, str] | None:
        parts = arn.split(":", 5)
        if len(parts) != 6 or "*" in arn:
            return None
        service, region, resource = parts[2], parts[3], parts[5]
        if service == "ec2":
            from moto.ec2.models import ec2_backends

            resource_id = resource.split("/", 1)[-1]
            tags = ec2_backends[self.account][region].tags.get(resource_id)
            return dict(tags) if tags else None
        if service == "fsx":
            from moto.fsx.models import fsx_backends

            listed = fsx_backends[self.account][region].list_tags_for_resource(arn)
            return {t["Key"]: t["Value"] for t in listed} if listed else None
        if service == "iam" and resource.startswith("role/"):
            role = find_role(arn)
            if role is None or not role.tags:
                return None
            held: list[Any] = list(role.tags.values() if isinstance(role.tags, dict) else role.tags)
            return {str(t["Key"]): str(t["Value"]) for t in held}
        if service == "sagemaker" and resource.startswith("training-job/"):
            from moto.sagemaker.models import sagemaker_backends

            job = sagemaker_backends[self.account][region].training_jobs.get(resource.split("/", 1)[1])
            return {t["Key"]: t["Value"] for t in job.tags or []} if job is not None and job.tags else None
        return None
