"""Whether a training job's instances can reach what they need, as AWS's network would let them.

A job with a VpcConfig runs its instances in the given subnets with the given security groups, and all of its
traffic takes the subnet's path: moto stores that network but filters nothing, so this module decides, from
moto's EC2 records, what the real network would do.

- S3 (code download, checkpoints, model upload): the subnet's route table must route the S3 prefix list to an
  available gateway endpoint for com.amazonaws.<region>.s3 (or 0.0.0.0/0 to a NAT gateway); a security group
  of the job must allow outbound HTTPS to S3 (0.0.0.0/0, a CIDR holding every S3 range, or the S3 prefix list:
  a gateway endpoint's traffic is still filtered by the security group); the subnet's network ACL, which is
  stateless, must allow HTTPS out and the replies (TCP 1024-65535) in. The gateway endpoint's policy then gates
  every S3 call (storage.py). Else SageMaker fails the job with the FailureReason `unreachable_s3()` gives
  (AWS Knowledge Center, "SageMaker training job fails with Data download failed / Artifact upload failed").
- Between instances (a job of more than one instance): torchrun's rendezvous and NCCL need all traffic in from,
  and out to, the other instances; on an EFA instance type the rules must name the job's own security groups
  (EFA's OS-bypass traffic matches no CIDR rule: "Prepare an EFA-enabled security group", EC2 User Guide).
  Else the distributed job hangs in its first collective and fails, as NCCL reports it.

- Secrets Manager and SSM (code.secrets, read by lustrain's launcher inside the job): the subnet has no internet,
  so an available interface endpoint of the service with private DNS must be in the job's VPC, its security
  groups letting HTTPS in from the job's and the job's letting it out (secrets.py serves the calls).

A job without a VpcConfig runs in SageMaker's own network, which reaches S3 and has no endpoint policy.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lustrain_core.instance_types import INSTANCE_TYPES

HTTPS = 443
EPHEMERAL = (1024, 65535)


def unreachable_s3(phase: str) -> str:
    """SageMaker's FailureReason when the instances cannot reach S3; phase: 'Data download' or 'Artifact upload'."""
    return (
        f"ClientError: {phase} failed:Please ensure that the subnet's route table has a route to an S3 VPC "
        "endpoint or a NAT device, and both the security groups and the subnet's network ACL allow outbound "
        "traffic to S3."
    )


def distributed_failure(instance_count: int) -> str:
    """How a distributed job whose instances cannot talk to each other fails (as NCCL/torchrun report it)."""
    return (
        'AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage "torch.distributed.DistNetworkError: '
        f"The client socket has timed out after 1800000ms while trying to connect to (algo-1, 29500): the "
        f"{instance_count} instances cannot reach each other; the job's security groups must allow all traffic "
        'in from and out to themselves (EFA and NCCL)"\nCommand "torchrun", exit code: 1'
    )


@dataclass(frozen=True)
class S3Path:
    """How the job's traffic reaches S3: `problem` is None when it does; `endpoint_policy` gates each call."""

    problem: str | None = None
    endpoint_policy: dict[str, Any] | None = None
    via: str = "sagemaker-network"


@dataclass(frozen=True)
class _Rule:
    protocol: str
    from_port: int | None
    to_port: int | None
    cidr: str | None = None
    group: str | None = None
    prefix_list: str | None = None

    def covers_port(self, port: int) -> bool:
        if self.protocol == "-1":
            return True
        if self.protocol not in ("tcp", "6") or self.from_port is None or self.to_port is None:
            return False
        return self.from_port <= port <= self.to_port


@dataclass
class NetworkView:
    """One account and region's network as moto holds it (read-only)."""

    backend: Any
    region: str
    _s3_list: tuple[str | None, tuple[str, ...]] | None = field(default=None, init=False)

    @classmethod
    def of(cls, account: str, region: str) -> NetworkView:
        from moto.ec2.models import ec2_backends

        return cls(ec2_backends[account][region], region)

    # --- reading moto's records ---------------------------------------------------------------------------

    def s3_prefix_list(self) -> tuple[str | None, tuple[str, ...]]:
        """The AWS-managed S3 prefix list: its id and CIDRs."""
        if self._s3_list is None:
            name = f"com.amazonaws.{self.region}.s3"
            found: tuple[str | None, tuple[str, ...]] = (None, ())
            entries: list[dict[str, str]]
            for prefix_list in self.backend.describe_managed_prefix_lists():
                if prefix_list.prefix_list_name == name:
                    version = prefix_list.version
                    entries = prefix_list.entries.get(version) or next(iter(prefix_list.entries.values()), [])
                    found = (prefix_list.id, tuple(e["Cidr"] for e in entries))
            self._s3_list = found
        return self._s3_list

    def subnet(self, subnet_id: str) -> Any | None:
        return next((s for s in self.backend.describe_subnets(subnet_ids=None) if s.id == subnet_id), None)

    def route_table(self, subnet: Any) -> Any | None:
        main = None
        for table in self.backend.describe_route_tables():
            if table.vpc_id != subnet.vpc_id:
                continue
            if any(a.get("SubnetId") == subnet.id for a in table.associations):
                return table
            if table.main_association_id is not None:
                main = table
        return main

    def groups(self, group_ids: Iterable[str]) -> list[Any]:
        found = (self.backend.get_security_group_from_id(g) for g in group_ids)
        return [g for g in found if g is not None]

    def network_acl(self, subnet: Any) -> Any | None:
        default = None
        for acl in self.backend.describe_network_acls():
            if acl.vpc_id != subnet.vpc_id:
                continue
            if any(a.subnet_id == subnet.id for a in acl.associations):
                return acl
            if acl.default:
                default = acl
        return default

    def endpoint(self, endpoint_id: str) -> Any | None:
        return self.backend.vpc_end_points.get(endpoint_id)

    # --- deciding -------------------------------------------------------------------------------------------

    def s3_path(self, vpc_config: dict[str, Any] | None) -> S3Path:
        if not vpc_config:
            return S3Path()
        problems = []
        policies: list[dict[str, Any]] = []
        via = ""
        for subnet_id in vpc_config.get("Subnets") or []:
            subnet = self.subnet(subnet_id)
            if subnet is None:
                problems.append(f"subnet {subnet_id} does not exist")
                continue
            route = self._route_to_s3(subnet)
            if route is None:
                problems.append(f"the route table of {subnet_id} has no route to S3")
                continue
            via, policy = route
            if policy is not None:
                policies.append(policy)
            if not self._acl_allows_https(subnet):
                problems.append(f"the network ACL of {subnet_id} refuses HTTPS to S3")
        if not self._groups_allow_https(vpc_config.get("SecurityGroupIds") or []):
            problems.append("no security group of the job allows outbound HTTPS to S3")
        if problems:
            return S3Path(problem="; ".join(problems))
        return S3Path(endpoint_policy=policies[0] if policies else None, via=via)

    def _route_to_s3(self, subnet: Any) -> tuple[str, dict[str, Any] | None] | None:
        """(what carries S3 traffic, the endpoint's policy) for the subnet's route table; None if nothing does."""
        table = self.route_table(subnet)
        if table is None:
            return None
        list_id, _cidrs = self.s3_prefix_list()
        for route in table.routes:
            target = getattr(route, "vpc_endpoint_id", None) or getattr(route, "gateway", None)
            target_id = getattr(target, "id", target)
            destination = getattr(route.destination_prefix_list, "id", route.destination_prefix_list)
            if list_id and destination == list_id and str(target_id or "").startswith("vpce-"):
                endpoint = self.endpoint(str(target_id))
                if (
                    endpoint is not None
                    and endpoint.state == "available"
                    and endpoint.service_name == f"com.amazonaws.{self.region}.s3"
                ):
                    return endpoint.id, json.loads(endpoint.policy_document)
        for route in table.routes:
            if route.destination_cidr_block == "0.0.0.0/0" and route.nat_gateway is not None:
                return str(getattr(route.nat_gateway, "id", route.nat_gateway)), None
        return None

    def _s3_cidrs(self) -> tuple[str, ...]:
        return self.s3_prefix_list()[1] or ("0.0.0.0/0",)

    def _covers_s3(self, cidr: str | None) -> bool:
        if not cidr:
            return False
        network = ipaddress.ip_network(cidr, strict=False)
        return all(ipaddress.ip_network(c).subnet_of(network) for c in self._s3_cidrs())  # type: ignore[arg-type]

    def _groups_allow_https(self, group_ids: list[str]) -> bool:
        list_id = self.s3_prefix_list()[0]
        for group in self.groups(group_ids):
            for rule in _rules(group.egress_rules):
                if rule.covers_port(HTTPS) and (
                    self._covers_s3(rule.cidr) or (list_id is not None and rule.prefix_list == list_id)
                ):
                    return True
        return False

    def _acl_allows_https(self, subnet: Any) -> bool:
        acl = self.network_acl(subnet)
        if acl is None:
            return True
        return self._acl_decides(acl, egress=True, ports=(HTTPS, HTTPS)) and self._acl_decides(
            acl, egress=False, ports=EPHEMERAL
        )

    def _acl_decides(self, acl: Any, *, egress: bool, ports: tuple[int, int]) -> bool:
        """A network ACL's verdict on S3 traffic: its entries in rule-number order, the first match decides."""
        for entry in sorted(
            (e for e in acl.network_acl_entries if e.egress in (egress, str(egress).lower())),
            key=lambda e: int(e.rule_number),
        ):
            protocol = str(entry.protocol)
            if protocol not in ("-1", "6", "tcp"):
                continue
            if protocol != "-1":
                lo, hi = int(entry.port_range_from or 0), int(entry.port_range_to or 0)
                if not (lo <= ports[0] and ports[1] <= hi):
                    continue
            if not self._covers_s3(entry.cidr_block):
                continue
            return str(entry.rule_action).lower() == "allow"
        return False

    def interface_endpoint_problem(self, vpc_config: dict[str, Any] | None, service: str) -> str | None:
        """Why the job cannot reach `service` (secretsmanager, ssm) by its own name, or None when it can: an
        available interface endpoint of the service in the job's VPC, with private DNS (and the VPC's DNS hostnames
        on, which private DNS needs), whose security groups let HTTPS in from the job's and the job's let it out."""
        if not vpc_config:
            return None
        name = f"com.amazonaws.{self.region}.{service}"
        subnets = [self.subnet(s) for s in vpc_config.get("Subnets") or []]
        subnet = next((s for s in subnets if s is not None), None)
        if subnet is None:
            return "the job's subnet does not exist"
        vpc = self.backend.vpcs.get(subnet.vpc_id)
        endpoints = [
            e
            for e in self.backend.vpc_end_points.values()
            if e.vpc_id == subnet.vpc_id
            and e.service_name == name
            and str(e.vpc_endpoint_type).lower() == "interface"
            and e.state == "available"
        ]
        if not endpoints:
            return f"no interface endpoint for {name} in {subnet.vpc_id}, and the subnet has no internet"
        private = [
            e for e in endpoints if e.private_dns_enabled and getattr(vpc, "enable_dns_hostnames", False)
        ]
        if not private:
            return f"the endpoint for {name} has no private DNS in {subnet.vpc_id}: {service}'s own name is not it"
        job_groups = set(vpc_config.get("SecurityGroupIds") or [])
        cidrs = [ipaddress.ip_network(s.cidr_block) for s in subnets if s is not None]
        for endpoint in private:
            groups = set(endpoint.security_group_ids or [])
            out = any(self._https_between(g.egress_rules, groups, None) for g in self.groups(job_groups))
            into = any(self._https_between(g.ingress_rules, job_groups, cidrs) for g in self.groups(groups))
            if out and into:
                return None
        return f"the security groups of the job and of the endpoint for {name} do not let HTTPS from one to the other"

    def _https_between(self, rules: list[Any], peers: set[str], cidrs: list[Any] | None) -> bool:
        """Whether one of `rules` lets HTTPS go to (or come from) one of `peers`' groups, or CIDRs holding the job's
        subnets (`cidrs`, for an ingress rule; an egress rule to 0.0.0.0/0 reaches the endpoint too)."""
        for rule in _rules(rules):
            if not rule.covers_port(HTTPS):
                continue
            if rule.group in peers:
                return True
            if rule.cidr:
                network = ipaddress.ip_network(rule.cidr, strict=False)
                if cidrs is None and network.prefixlen == 0:
                    return True
                if cidrs and all(c.subnet_of(network) for c in cidrs):
                    return True
        return False

    def instances_reach_each_other(self, vpc_config: dict[str, Any] | None, instance_type: str) -> bool:
        """Whether the job's instances can talk to each other: all traffic in and out between them. With EFA
        the rules must name the job's own groups (its OS-bypass traffic matches no CIDR rule); without, a CIDR
        rule that holds the job's subnets does too."""
        if not vpc_config:
            return True
        ids = set(vpc_config.get("SecurityGroupIds") or [])
        groups = self.groups(ids)
        subnets = [self.subnet(s) for s in vpc_config.get("Subnets") or []]
        cidrs = [ipaddress.ip_network(s.cidr_block) for s in subnets if s is not None]
        efa = uses_efa(instance_type)

        def peer(rule: _Rule) -> bool:
            if rule.group in ids:
                return True
            if efa or not rule.cidr or not cidrs:
                return False
            network = ipaddress.ip_network(rule.cidr, strict=False)
            return all(c.subnet_of(network) for c in cidrs)  # type: ignore[arg-type]

        def allows(rules: list[Any]) -> bool:
            return any(r.protocol == "-1" and peer(r) for r in _rules(rules))

        return any(allows(g.ingress_rules) for g in groups) and any(allows(g.egress_rules) for g in groups)


def uses_efa(instance_type: str) -> bool:
    """Whether the instance type's row in lustrain's instance catalogue has EFA interfaces (a type outside it: no)."""
    row = INSTANCE_TYPES.get(instance_type)
    return row is not None and row.efa


def _rules(rules: list[Any]) -> list[_Rule]:
    out = []
    for rule in rules:
        protocol = str(rule.ip_protocol or "-1")
        out.append(
            _Rule(
                protocol=protocol,
                from_port=rule.from_port,
                to_port=rule.to_port,
                cidr=(rule.ip_range or {}).get("CidrIp"),
                group=(rule.source_group or {}).get("GroupId"),
                prefix_list=rule.prefix_list_id,
            )
        )
    return out
