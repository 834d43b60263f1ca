"""create_network: the private network a run's instances and its Lustre file system share.

A new network is one VPC (plan.network.vpc_cidr) with one private subnet of the planned size
(plan.network.subnet_cidr) in one availability zone, a route table with an S3 gateway endpoint (SageMaker reads
the code and writes the model through it; without a route to S3 the job fails "Artifact upload failed"), and a
security group that the instances and the file system share:
- all traffic in from itself and out to itself: EFA (the p4d's 400 Gbps between instances) needs both; its
  OS-bypass traffic is not matched by CIDR rules;
- TCP 988 and 1018-1023 in from itself: Lustre (FSx checks these ports when the file system is created);
- TCP 443 out to S3's managed prefix list: the gateway endpoint's traffic is filtered by the security group like
  any other, and without it the job cannot fetch its code, sync checkpoints or upload the model. The default
  0.0.0.0/0 egress is removed: nothing else leaves the group.
Each piece is tagged with the job id, found by that tag before it is created (a retried step reuses what it
made), and appended to the job record for teardown.

A run with code.secrets also gets an interface endpoint of each service its secrets live in (Secrets Manager,
SSM) in its subnet, with private DNS: the job, which has no internet, reads its secrets through it
(lustrain_core.secrets_launcher). It is the run's like the rest, and teardown deletes it before the subnet.

With network.subnet_id given nothing is created: the subnet, its route to S3 and the given security groups are
checked, and, for code.secrets, an interface endpoint of each service in its VPC; NetworkInvalid names
everything missing. What the groups must allow between their members
(`required_rules`):
- Lustre's ports in, always;
- all traffic in and out, naming the group itself, for an instance type with EFA (CIDR rules do not match EFA's
  OS-bypass traffic);
- all traffic in and out among the instances of any job of more than one instance (torchrun's rendezvous and
  NCCL's sockets use ports chosen at run time): the group itself or a CIDR range covering the subnet;
- UDP 500 and ESP (IP protocol 50) in and out among the instances when the stack encrypts inter-container traffic
  (InterContainerTrafficEncryption: SageMaker's EnableInterContainerTrafficEncryption runs IPsec between the
  instances; SageMaker Developer Guide, "Protect Communications Between ML Compute Instances in a Distributed
  Training Job"); a job of one instance sends none.
The group create_network makes allows all traffic in from and out to itself, which holds every one of these.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core import aws_requests, prepare_plan
from lustrain_core.aws_errors import error_code
from lustrain_core.aws_requests import inter_container_encryption, tag_spec
from lustrain_core.config import Settings
from lustrain_core.document import Job, Network, Resource, Run
from lustrain_core.errors import NetworkInvalid, SpecInvalid
from lustrain_core.launch_plan import TAG_CREATED_BY, TAG_JOB_ID, Names, names_of
from lustrain_core.prices import INSTANCE_TYPES
from lustrain_core.steps import prepare, records, warm_pool, zones

LUSTRE_PORT_RANGES = ((988, 988), (1018, 1023))
HTTPS = 443
#: IPsec between the instances of an encrypted job: IKE on UDP 500, the traffic itself as ESP (IP protocol 50)
IKE_PORT = 500
ESP = "50"

#: IpProtocol as EC2 gives it (a name or a number) -> its number; "-1" is every protocol
_PROTOCOL_NUMBERS = {"tcp": "6", "udp": "17", "icmp": "1", "esp": "50"}


def _protocol(value: Any) -> str:
    text = str(value).lower()
    return _PROTOCOL_NUMBERS.get(text, text)


@dataclass(frozen=True)
class Rule:
    """A rule a run needs in its security groups, between members of those groups."""

    direction: str  # "ingress" | "egress"
    protocol: str  # "-1" (all) | "tcp" | "udp" | an IP protocol number ("50": ESP)
    from_port: int | None
    to_port: int | None
    why: str
    #: whether a CIDR range covering the subnet stands in for the group itself (not for EFA's traffic)
    cidr_counts: bool = True

    def describe(self) -> str:
        if self.protocol == "-1":
            what = "all traffic"
        elif _protocol(self.protocol) in {"6", "17"}:
            what = f"{self.protocol.upper()} {self.from_port}" + (
                f"-{self.to_port}" if self.to_port != self.from_port else ""
            )
        else:
            what = (
                "ESP (IP protocol 50)" if _protocol(self.protocol) == ESP else f"IP protocol {self.protocol}"
            )
        way = "inbound" if self.direction == "ingress" else "outbound"
        towards = "from" if self.direction == "ingress" else "to"
        return f"{way} {what} {towards} the group itself ({self.why})"


EFA_RULES = (
    Rule("ingress", "-1", None, None, "EFA", cidr_counts=False),
    Rule("egress", "-1", None, None, "EFA", cidr_counts=False),
)
RANK_RULES = tuple(
    Rule(direction, "-1", None, None, "the ranks of a job of several instances")
    for direction in ("ingress", "egress")
)
ENCRYPTION_RULES = tuple(
    Rule(direction, protocol, port, port, "inter-container traffic encryption")
    for direction in ("ingress", "egress")
    for protocol, port in (("udp", IKE_PORT), (ESP, None))
)
LUSTRE_RULES = tuple(Rule("ingress", "tcp", lo, hi, "Lustre") for lo, hi in LUSTRE_PORT_RANGES)


def required_rules(
    instance_type: str, instance_count: int = 1, *, encrypted: bool = False
) -> tuple[Rule, ...]:
    """What a job's security groups must allow among their members: Lustre's ports always; all traffic both ways
    for an EFA instance type (unknown types: assume EFA) or a job of several instances; IPsec's UDP 500 and ESP both
    ways when the traffic between several instances is encrypted."""
    known = INSTANCE_TYPES.get(instance_type)
    efa = known.efa if known is not None else True
    between: tuple[Rule, ...] = EFA_RULES if efa else RANK_RULES if instance_count > 1 else ()
    ipsec = ENCRYPTION_RULES if encrypted and instance_count > 1 else ()
    return between + ipsec + LUSTRE_RULES


def _covers(permission: dict[str, Any], rule: Rule) -> bool:
    protocol = _protocol(permission.get("IpProtocol"))
    if protocol == "-1":
        return True
    if rule.protocol == "-1" or protocol != _protocol(rule.protocol):
        return False
    if protocol not in {"6", "17"}:
        return True  # a protocol without ports (ESP): EC2 ignores any port range given
    lo, hi = permission.get("FromPort"), permission.get("ToPort")
    return lo is not None and hi is not None and lo <= (rule.from_port or 0) and (rule.to_port or 0) <= hi


def _from_members(
    permission: dict[str, Any], group_ids: set[str], subnet_cidr: str | None, rule: Rule
) -> bool:
    if any(pair.get("GroupId") in group_ids for pair in permission.get("UserIdGroupPairs", [])):
        return True
    if not rule.cidr_counts or subnet_cidr is None:
        return False  # EFA's rules must name the group: CIDR ranges do not match its traffic
    subnet = ipaddress.ip_network(subnet_cidr)
    return any(
        subnet.subnet_of(ipaddress.ip_network(r["CidrIp"]))  # type: ignore[arg-type]
        for r in permission.get("IpRanges", [])
        if r.get("CidrIp")
    )


def missing_rules(
    groups: list[dict[str, Any]], rules: tuple[Rule, ...], subnet_cidr: str | None
) -> list[Rule]:
    """The rules no group grants between the groups' members (every instance and the file system carry all)."""
    ids = {g["GroupId"] for g in groups}
    missing = []
    for rule in rules:
        key = "IpPermissions" if rule.direction == "ingress" else "IpPermissionsEgress"
        if not any(
            _covers(p, rule) and _from_members(p, ids, subnet_cidr, rule)
            for g in groups
            for p in g.get(key, [])
        ):
            missing.append(rule)
    return missing


# --------------------------------------------------------------------------- AWS helpers


def _tag_filters(job_id: str, stack_name: str) -> list[dict[str, Any]]:
    return [
        {"Name": f"tag:{TAG_JOB_ID}", "Values": [job_id]},
        {"Name": f"tag:{TAG_CREATED_BY}", "Values": [stack_name]},
    ]


@dataclass(frozen=True)
class NetworkFor:
    """What a new network is built for, read once from the run of either kind: a training run's plan and launch
    plan (`of_job`), or a data preparation run's spec (`of_prepare`: its processing instances, no file system)."""

    job_id: str
    vpc_cidr: str
    subnet_cidr: str
    names: Names
    #: the tags of each resource but for its Name (from `names`)
    base_tags: tuple[tuple[str, str], ...]
    instance_type: str
    preferred_zones: tuple[str, ...] = ()
    #: the one zone the instances are in (a training plan's), if any
    required_zone: str | None = None
    secret_services: tuple[str, ...] = ()

    def tags(self, resource: str) -> list[dict[str, str]]:
        return [
            *({"Key": k, "Value": v} for k, v in self.base_tags),
            {"Key": "Name", "Value": self.name_of(resource)},
        ]

    def name_of(self, resource: str) -> str:
        return str(getattr(self.names, resource))

    @classmethod
    def of_job(cls, job: Job) -> NetworkFor:
        net, plan = job.planned.network, job.launch.training_plan
        return cls(
            job_id=job.job_id,
            vpc_cidr=str(net.vpc_cidr),
            subnet_cidr=str(net.subnet_cidr),
            names=job.launch.names,
            base_tags=tuple((t.Key, t.Value) for t in job.launch.tags),
            instance_type=job.spec.compute.instance_type,
            preferred_zones=tuple(job.spec.network.preferred_zones),
            required_zone=plan.availability_zone if plan is not None else None,
            secret_services=tuple(job.spec.code.secret_services),
        )

    @classmethod
    def of_prepare(cls, document: dict[str, Any], settings: Settings) -> NetworkFor:
        job_id, spec = prepare.job_of(document)
        tags = prepare.run_tags(job_id, spec, settings.stack_name, prepare.team_in(document))
        return cls(
            job_id=job_id,
            vpc_cidr=prepare_plan.VPC_CIDR,
            subnet_cidr=prepare_plan.subnet_cidr(spec.instances),
            names=names_of(job_id),
            base_tags=tuple((t["Key"], t["Value"]) for t in tags),
            instance_type=spec.instance_type,
        )


def _zone_choices(ec2: Any, job: Job) -> list[zones.Zone]:
    plan = job.launch.training_plan
    return zones.zone_choices(
        ec2,
        job.spec.compute.instance_type,
        job.spec.network.preferred_zones,
        required=plan.availability_zone if plan is not None else None,
    )


def choose_zone(ec2: Any, run: NetworkFor) -> str:
    """The zone of the run's new subnet: its training plan's, else the first of network.availability_zone that offers
    the instance type, or the first zone that offers it (steps/zones.py)."""
    return zones.zone_choices(ec2, run.instance_type, list(run.preferred_zones), required=run.required_zone)[
        0
    ].name


def s3_prefix_list(ec2: Any, region: str) -> str:
    """The id of the AWS-managed prefix list of S3's addresses in the region (com.amazonaws.<region>.s3)."""
    name = f"com.amazonaws.{region}.s3"
    found = ec2.describe_managed_prefix_lists(Filters=[{"Name": "prefix-list-name", "Values": [name]}])
    lists = found.get("PrefixLists", [])
    if not lists:
        raise NetworkInvalid(f"the region has no managed prefix list {name}: S3 cannot be reached by a route")
    return str(lists[0]["PrefixListId"])


def allows_https_to_s3(groups: list[dict[str, Any]], prefix_list_id: str) -> bool:
    """Whether a group lets the instances open HTTPS to S3: to 0.0.0.0/0 or to S3's prefix list. A gateway
    endpoint's traffic is filtered by the security group like any other (VPC User Guide, "Gateway endpoints")."""
    for group in groups:
        for p in group.get("IpPermissionsEgress", []):
            https = _covers(p, Rule("egress", "tcp", HTTPS, HTTPS, "S3"))
            to_s3 = any(r.get("CidrIp") == "0.0.0.0/0" for r in p.get("IpRanges", [])) or any(
                r.get("PrefixListId") == prefix_list_id for r in p.get("PrefixListIds", [])
            )
            if https and to_s3:
                return True
    return False


def _ensure_rules(ec2: Any, group_id: str, prefix_list_id: str) -> None:
    """Give the job's group exactly its rules; add only what is missing (a retry adds nothing): all traffic in from
    and out to itself (EFA), the Lustre ports in from itself, HTTPS out to S3's prefix list (code, checkpoints,
    model), and no other egress."""
    group = ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"][0]
    self_pair = [{"GroupId": group_id}]
    ingress = [{"IpProtocol": "-1", "UserIdGroupPairs": self_pair}] + [
        {"IpProtocol": "tcp", "FromPort": lo, "ToPort": hi, "UserIdGroupPairs": self_pair}
        for lo, hi in LUSTRE_PORT_RANGES
    ]
    to_s3: dict[str, Any] = {
        "IpProtocol": "tcp",
        "FromPort": HTTPS,
        "ToPort": HTTPS,
        "PrefixListIds": [
            {"PrefixListId": prefix_list_id, "Description": "S3, through the gateway endpoint"}
        ],
    }

    def present(wanted: dict[str, Any], have: list[dict[str, Any]]) -> bool:
        return any(
            p.get("IpProtocol") == wanted["IpProtocol"]
            and p.get("FromPort") == wanted.get("FromPort")
            and p.get("ToPort") == wanted.get("ToPort")
            and (
                any(pair.get("GroupId") == group_id for pair in p.get("UserIdGroupPairs", []))
                if "UserIdGroupPairs" in wanted
                else any(r.get("PrefixListId") == prefix_list_id for r in p.get("PrefixListIds", []))
            )
            for p in have
        )

    new_in = [p for p in ingress if not present(p, group.get("IpPermissions", []))]
    if new_in:
        ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=new_in)
    egress: list[dict[str, Any]] = [{"IpProtocol": "-1", "UserIdGroupPairs": self_pair}, to_s3]
    new_out = [p for p in egress if not present(p, group.get("IpPermissionsEgress", []))]
    if new_out:
        ec2.authorize_security_group_egress(GroupId=group_id, IpPermissions=new_out)
    open_egress = [
        p
        for p in group.get("IpPermissionsEgress", [])
        if p.get("IpProtocol") == "-1" and any(r.get("CidrIp") == "0.0.0.0/0" for r in p.get("IpRanges", []))
    ]
    if open_egress:
        ec2.revoke_security_group_egress(
            GroupId=group_id, IpPermissions=[{"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]
        )


def _live(items: list[dict[str, Any]], state_key: str = "State") -> list[dict[str, Any]]:
    return [
        i
        for i in items
        if str(i.get(state_key, "available")).lower() not in {"deleted", "deleting", "failed"}
    ]


def create_new_network(ec2: Any, ddb: Any, job: NetworkFor, settings: Settings) -> Network:
    records.require(ddb, settings.jobs_table, job.job_id)
    filters = _tag_filters(job.job_id, settings.stack_name)
    created: list[dict[str, str]] = []

    def remember(kind: str, resource_id: str) -> None:
        created.append({"type": kind, "id": resource_id})
        # recorded at once: if a later call fails, teardown still knows this one
        records.add_resources(ddb, settings.jobs_table, job.job_id, [{"type": kind, "id": resource_id}])

    vpcs = ec2.describe_vpcs(Filters=filters)["Vpcs"]
    if vpcs:
        vpc_id = vpcs[0]["VpcId"]
    else:
        vpc_id = ec2.create_vpc(**aws_requests.vpc(job, job.vpc_cidr))["Vpc"]["VpcId"]
    remember("vpc", vpc_id)

    subnets = ec2.describe_subnets(Filters=filters)["Subnets"]
    if subnets:
        subnet = subnets[0]
    else:
        zone = choose_zone(ec2, job)
        subnet = ec2.create_subnet(
            VpcId=vpc_id,
            CidrBlock=job.subnet_cidr,
            AvailabilityZone=zone,
            TagSpecifications=tag_spec(job, "subnet", "subnet"),
        )["Subnet"]
    remember("subnet", subnet["SubnetId"])

    tables = ec2.describe_route_tables(Filters=filters)["RouteTables"]
    if tables:
        table = tables[0]
    else:
        table = ec2.create_route_table(
            VpcId=vpc_id, TagSpecifications=tag_spec(job, "route_table", "route-table")
        )["RouteTable"]
    remember("route_table", table["RouteTableId"])
    if not any(a.get("SubnetId") == subnet["SubnetId"] for a in table.get("Associations", [])):
        ec2.associate_route_table(RouteTableId=table["RouteTableId"], SubnetId=subnet["SubnetId"])

    s3_service = {"Name": "service-name", "Values": [f"com.amazonaws.{settings.region}.s3"]}
    endpoints = _live(ec2.describe_vpc_endpoints(Filters=[*filters, s3_service])["VpcEndpoints"])
    if endpoints:
        endpoint_id = endpoints[0]["VpcEndpointId"]
    else:
        endpoint_id = ec2.create_vpc_endpoint(
            VpcEndpointType="Gateway",
            VpcId=vpc_id,
            ServiceName=f"com.amazonaws.{settings.region}.s3",
            RouteTableIds=[table["RouteTableId"]],
            ClientToken=f"{job.job_id}-s3",
            TagSpecifications=tag_spec(job, "endpoint", "vpc-endpoint"),
        )["VpcEndpoint"]["VpcEndpointId"]
    remember("vpc_endpoint", endpoint_id)

    groups = ec2.describe_security_groups(Filters=filters)["SecurityGroups"]
    if groups:
        group_id = groups[0]["GroupId"]
    else:
        group_id = ec2.create_security_group(**aws_requests.security_group(job, vpc_id))["GroupId"]
    remember("security_group", group_id)
    _ensure_rules(ec2, group_id, s3_prefix_list(ec2, settings.region))
    for service in job.secret_services:
        remember("vpc_endpoint", ensure_secrets_endpoint(ec2, job, settings, service, subnet, group_id))

    return Network(
        vpc_id=vpc_id,
        subnet_id=subnet["SubnetId"],
        security_group_ids=[group_id],
        route_table_id=table["RouteTableId"],
        endpoint_id=endpoint_id,
        availability_zone=subnet["AvailabilityZone"],
        created=True,
        resources=[Resource(**r) for r in created],
    )


def secrets_endpoint_service(region: str, service: str) -> str:
    """The interface endpoint service a job reads code.secrets through (secretsmanager or ssm)."""
    return f"com.amazonaws.{region}.{service}"


def secrets_endpoint_request(
    job: aws_requests.Tagged, settings: Settings, service: str, subnet: dict[str, Any], group_id: str
) -> dict[str, Any]:
    """CreateVpcEndpoint of the interface endpoint that lets the job, in a subnet with no internet, read its secrets:
    in the run's subnet, with the run's security group (whose all-traffic self rules let the job reach it on 443),
    its private DNS answering for the service's own name so the SDK in the job needs no endpoint URL. A lost answer
    is retried with the same ClientToken: EC2 returns the endpoint it made, not a second one."""
    return {
        "VpcEndpointType": "Interface",
        "VpcId": subnet["VpcId"],
        "ServiceName": secrets_endpoint_service(settings.region, service),
        "SubnetIds": [subnet["SubnetId"]],
        "SecurityGroupIds": [group_id],
        "PrivateDnsEnabled": True,
        "ClientToken": f"{job.job_id}-{service}",
        "TagSpecifications": tag_spec(job, "endpoint", "vpc-endpoint"),
    }


def ensure_secrets_endpoint(
    ec2: Any,
    job: aws_requests.Tagged,
    settings: Settings,
    service: str,
    subnet: dict[str, Any],
    group_id: str,
) -> str:
    """The run's interface endpoint for `service`, found by its tags or created (with the VPC's DNS hostnames on,
    which private DNS needs: a new VPC has them off)."""
    found = _live(
        ec2.describe_vpc_endpoints(
            Filters=[
                *_tag_filters(job.job_id, settings.stack_name),
                {"Name": "service-name", "Values": [secrets_endpoint_service(settings.region, service)]},
            ]
        )["VpcEndpoints"]
    )
    if found:
        return str(found[0]["VpcEndpointId"])
    ec2.modify_vpc_attribute(VpcId=subnet["VpcId"], EnableDnsHostnames={"Value": True})
    request = secrets_endpoint_request(job, settings, service, subnet, group_id)
    return str(ec2.create_vpc_endpoint(**request)["VpcEndpoint"]["VpcEndpointId"])


def secrets_endpoint_in(ec2: Any, vpc_id: str, region: str, service: str) -> str | None:
    """An available interface endpoint of `service` with private DNS in an existing VPC: the job's SDK reaches the
    service's own name through it."""
    for endpoint in _live(
        ec2.describe_vpc_endpoints(
            Filters=[
                {"Name": "vpc-id", "Values": [vpc_id]},
                {"Name": "service-name", "Values": [secrets_endpoint_service(region, service)]},
            ]
        )["VpcEndpoints"]
    ):
        if str(endpoint.get("VpcEndpointType", "")).lower() == "interface" and endpoint.get(
            "PrivateDnsEnabled"
        ):
            return str(endpoint["VpcEndpointId"])
    return None


def _route_table_of(ec2: Any, subnet: dict[str, Any]) -> dict[str, Any] | None:
    explicit = ec2.describe_route_tables(
        Filters=[{"Name": "association.subnet-id", "Values": [subnet["SubnetId"]]}]
    )["RouteTables"]
    if explicit:
        return dict(explicit[0])
    main = ec2.describe_route_tables(
        Filters=[
            {"Name": "vpc-id", "Values": [subnet["VpcId"]]},
            {"Name": "association.main", "Values": ["true"]},
        ]
    )["RouteTables"]
    return dict(main[0]) if main else None


def _reaches_s3(ec2: Any, table: dict[str, Any], vpc_id: str, region: str) -> str | None:
    """The S3 gateway endpoint or NAT gateway the route table reaches S3 through, or None."""
    table_id = table["RouteTableId"]
    for endpoint in _live(
        ec2.describe_vpc_endpoints(Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])["VpcEndpoints"]
    ):
        if (
            endpoint.get("ServiceName") == f"com.amazonaws.{region}.s3"
            and str(endpoint.get("VpcEndpointType", "Gateway")).lower() == "gateway"
            and table_id in endpoint.get("RouteTableIds", [])
        ):
            return str(endpoint["VpcEndpointId"])
    for route in table.get("Routes", []):
        if route.get("DestinationCidrBlock") == "0.0.0.0/0" and route.get("NatGatewayId"):
            return str(route["NatGatewayId"])
    return None


def _zone_problems(ec2: Any, job: Job, subnet: dict[str, Any]) -> list[str]:
    """What is wrong with the zone of network.subnet_id: one network.availability_zone does not name, or one that does
    not offer the instance type."""
    where = str(subnet["AvailabilityZone"])
    try:
        choices = _zone_choices(ec2, job)
    except SpecInvalid as exc:
        return [str(e) for e in exc.errors]
    if any(z.named(where) for z in choices):
        return []
    if job.launch.training_plan is not None:
        return [
            f"network.subnet_id: {subnet['SubnetId']} is in {where}; compute.training_plan's instances are in "
            f"{job.launch.training_plan.availability_zone}"
        ]
    if job.spec.network.preferred_zones:
        return [
            f"network.subnet_id: {subnet['SubnetId']} is in {where}, which network.availability_zone does not name"
        ]
    return [
        f"network.subnet_id: {subnet['SubnetId']} is in {where}, which does not offer "
        f"{zones.ec2_instance_type(job.spec.compute.instance_type)} (EC2 DescribeInstanceTypeOfferings); zones "
        f"that do: {', '.join(str(z) for z in choices)}"
    ]


def check_existing_network(ec2: Any, job: Job, settings: Settings) -> Network:
    spec = job.spec.network
    subnet_id = str(spec.subnet_id)
    problems: list[str] = []
    found = ec2.describe_subnets(Filters=[{"Name": "subnet-id", "Values": [subnet_id]}])["Subnets"]
    if not found:
        raise NetworkInvalid(
            f"network.subnet_id: {subnet_id} does not exist in {settings.region}", subnet_id=subnet_id
        )
    subnet = found[0]
    needed = job.planned.network.ips_needed
    free = int(subnet.get("AvailableIpAddressCount", 0))
    if free < needed:
        problems.append(
            f"network.subnet_id: {subnet_id} has {free} free IP addresses; the run needs {needed} "
            f"({job.spec.compute.instance_count} x {job.planned.network.ips_per_instance} for instances, "
            "plus the file system and headroom): use a larger subnet"
        )

    group_ids = list(spec.security_group_ids)
    groups = ec2.describe_security_groups(Filters=[{"Name": "group-id", "Values": group_ids}])[
        "SecurityGroups"
    ]
    unknown = sorted(set(group_ids) - {g["GroupId"] for g in groups})
    if unknown:
        problems.append(f"network.security_group_ids: {', '.join(unknown)} do not exist")
    elsewhere = sorted(g["GroupId"] for g in groups if g.get("VpcId") != subnet["VpcId"])
    if elsewhere:
        problems.append(
            f"network.security_group_ids: {', '.join(elsewhere)} belong to another VPC than {subnet_id} "
            f"({subnet['VpcId']})"
        )
    if groups:
        rules = required_rules(
            job.spec.compute.instance_type,
            job.spec.compute.instance_count,
            encrypted=inter_container_encryption(settings),
        )
        for rule in missing_rules(groups, rules, subnet.get("CidrBlock")):
            problems.append(f"network.security_group_ids: no rule allows {rule.describe()}")

    if groups and not allows_https_to_s3(groups, s3_prefix_list(ec2, settings.region)):
        problems.append(
            "network.security_group_ids: no rule allows outbound HTTPS (TCP 443) to S3 (0.0.0.0/0 or the "
            f"prefix list com.amazonaws.{settings.region}.s3): SageMaker could not fetch the code nor upload the "
            "model"
        )

    problems += _zone_problems(ec2, job, subnet)
    table = _route_table_of(ec2, subnet)
    via = _reaches_s3(ec2, table, subnet["VpcId"], settings.region) if table else None
    if via is None:
        problems.append(
            f"network.subnet_id: the route table of {subnet_id} "
            f"({table['RouteTableId'] if table else 'none'}) has no S3 gateway endpoint and no NAT route: "
            "SageMaker could not reach S3 (add a gateway endpoint for com.amazonaws."
            f"{settings.region}.s3 to that route table)"
        )
    for service in job.spec.code.secret_services:
        if secrets_endpoint_in(ec2, subnet["VpcId"], settings.region, service) is None:
            problems.append(
                f"network.subnet_id: the VPC of {subnet_id} ({subnet['VpcId']}) has no interface endpoint for "
                f"{secrets_endpoint_service(settings.region, service)} with private DNS: the job could not read "
                "code.secrets (add one there, or leave network.subnet_id out and the run makes its own)"
            )
    if problems:
        raise NetworkInvalid(
            "the existing network cannot carry this run:\n" + "\n".join(f"  - {p}" for p in problems),
            problems=problems,
            subnet_id=subnet_id,
        )
    return Network(
        vpc_id=subnet["VpcId"],
        subnet_id=subnet_id,
        security_group_ids=group_ids,
        route_table_id=table["RouteTableId"] if table else None,
        endpoint_id=via if via and via.startswith("vpce-") else None,
        availability_zone=subnet["AvailabilityZone"],
        created=False,
    )


def create_network(document: dict[str, Any], *, ec2: Any, ddb: Any, settings: Settings) -> Network:
    """$.network: a new network for the run, or the checked existing one named by network.subnet_id. A data
    preparation run (kind: prepare) always gets a new one, sized for its processing instances."""
    if prepare.is_prepare_run(document):
        return create_new_network(ec2, ddb, NetworkFor.of_prepare(document, settings), settings)
    job = Run.parse(document).job
    if job.spec.network.subnet_id:
        return check_existing_network(ec2, job, settings)
    if job.launch.keep_alive_seconds:
        kept = warm_pool_network(ec2, ddb, job, settings)
        if kept is not None:
            return kept
    return create_new_network(ec2, ddb, NetworkFor.of_job(job), settings)


def warm_pool_network(ec2: Any, ddb: Any, job: Job, settings: Settings) -> Network | None:
    """The network a warm pool of the run's shape kept (steps/warm_pool.py), claimed for this run (or claimed by
    an earlier try of this step); None when there is none to take, and the run builds its own."""
    record = records.require(ddb, settings.jobs_table, job.job_id)
    offered = record.warm_pool_network
    if not isinstance(offered, dict):
        pool_shape = warm_pool.shape(job, settings)
        # the shape, for the run's teardown to offer its pool's network under
        records.set_fields(ddb, settings.jobs_table, job.job_id, warm_pool_shape=pool_shape)
        offered = warm_pool.claim(ddb, settings, pool_shape, job.job_id)
        if offered is None:
            return None
        records.set_fields(ddb, settings.jobs_table, job.job_id, warm_pool_network=offered)
    kept = warm_pool.network_of(offered)
    try:
        ec2.describe_subnets(SubnetIds=[kept.subnet_id])
    except ClientError as exc:
        if error_code(exc) != "InvalidSubnetID.NotFound":
            raise
        return None  # its pool ended and the network went meanwhile
    return kept
