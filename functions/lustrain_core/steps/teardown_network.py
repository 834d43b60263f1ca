"""Teardown's network family: the VPC endpoints (the S3 gateway, and code.secrets' interface endpoints, whose network
interfaces hold the security group and the subnet), the security group (its self-referencing rules revoked first,
one at a time: a rule another teardown revoked meanwhile is gone, as wanted), the route table (disassociated first),
the subnet, the VPC, in the registry's NETWORK_ORDER; DependencyViolation (interfaces still draining) is retried
until the step's time runs out."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from lustrain_core import resources as registry
from lustrain_core.aws_errors import error_code, not_found
from lustrain_core.steps.teardown_base import BUSY, NETWORK_ORDER, Scope

#: EC2's answer to revoking a rule a security group (of a non-default VPC) no longer has (EC2 API reference,
#: RevokeSecurityGroupIngress / RevokeSecurityGroupEgress).
RULE_GONE = "InvalidPermission.NotFound"


class Network(Scope):
    def _describe_ec2(self, kind: str, resource_id: str) -> dict[str, Any] | None:
        return registry.describe(self.ec2, registry.BY_NAME[kind], resource_id)

    def _delete_ec2(self, kind: str, item: dict[str, Any]) -> None:
        if kind == "security_group":
            group_id = item["GroupId"]
            for key, revoke in (
                ("IpPermissions", self.ec2.revoke_security_group_ingress),
                ("IpPermissionsEgress", self.ec2.revoke_security_group_egress),
            ):
                own = [
                    {
                        **{k: v for k, v in p.items() if k in {"IpProtocol", "FromPort", "ToPort"}},
                        "UserIdGroupPairs": [{"GroupId": group_id}],
                    }
                    for p in item.get(key, [])
                    if any(pair.get("GroupId") == group_id for pair in p.get("UserIdGroupPairs", []))
                ]
                for permission in own:
                    try:
                        revoke(GroupId=group_id, IpPermissions=[permission])
                    except ClientError as exc:
                        # another teardown of the run (a retry beside one cut off by its timeout) revoked it
                        # between this one's look and its revoke: gone is what was wanted
                        if error_code(exc) != RULE_GONE:
                            raise
            self.ec2.delete_security_group(GroupId=group_id)
        elif kind == "vpc_endpoint":
            answer = self.ec2.delete_vpc_endpoints(VpcEndpointIds=[item["VpcEndpointId"]])
            failed = answer.get("Unsuccessful", [])
            if failed:
                error = failed[0].get("Error", {})
                raise ClientError(
                    {"Error": {"Code": error.get("Code", ""), "Message": error.get("Message", "")}},
                    "DeleteVpcEndpoints",
                )
        elif kind == "route_table":
            for association in item.get("Associations", []):
                if not association.get("Main") and association.get("RouteTableAssociationId"):
                    self.ec2.disassociate_route_table(AssociationId=association["RouteTableAssociationId"])
            self.ec2.delete_route_table(RouteTableId=item["RouteTableId"])
        elif kind == "subnet":
            self.ec2.delete_subnet(SubnetId=item["SubnetId"])
        elif kind == "vpc":
            self.ec2.delete_vpc(VpcId=item["VpcId"])

    def delete_network(self, resources: list[dict[str, str]]) -> list[str]:
        """Delete the run's network pieces in dependency order, retrying while interfaces drain; what remains."""
        pending = sorted(resources, key=lambda r: NETWORK_ORDER.index(r["type"]))
        while True:
            blocked: list[tuple[dict[str, str], str]] = []
            for entry in pending:
                item = self._describe_ec2(entry["type"], entry["id"])
                if item is None:
                    self.report.already_gone.append(entry)
                    continue
                if not self.ours(item.get("Tags")):
                    self.report.kept.append({**entry, "reason": "not tagged as this job's: never deleted"})
                    continue
                try:
                    self._delete_ec2(entry["type"], item)
                except ClientError as exc:
                    if not_found(exc):
                        self.report.already_gone.append(entry)
                        continue
                    if error_code(exc) not in BUSY:
                        raise
                    blocked.append((entry, error_code(exc)))
                    continue
                self.report.deleted.append(entry)
            if not blocked:
                return []
            pending = [entry for entry, _ in blocked]
            if not self.clock.wait():
                return [f"{e['type']} {e['id']} ({code}: still in use)" for e, code in blocked]
