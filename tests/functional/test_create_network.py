"""create_network on moto: the run's own network as the field guide builds it, or an existing one checked."""

from __future__ import annotations

import boto3
import pytest
from infra_support import REGION, count_of_job, invoke, job_record, register, spec
from lustrain_core.errors import NetworkInvalid, SpecInvalid


def ec2():
    return boto3.client("ec2", region_name=REGION)


def test_a_new_network_is_a_private_subnet_with_an_s3_endpoint_and_the_efa_lustre_group(aws):
    document = register()
    plan = document["job"]["plan"]["network"]
    net = invoke("create_network", document)
    job_id = document["job"]["job_id"]

    vpc = ec2().describe_vpcs(VpcIds=[net["vpc_id"]])["Vpcs"][0]
    subnet = ec2().describe_subnets(SubnetIds=[net["subnet_id"]])["Subnets"][0]
    assert vpc["CidrBlock"] == plan["vpc_cidr"] == "10.80.0.0/16"
    assert subnet["CidrBlock"] == plan["subnet_cidr"]
    assert (subnet["VpcId"], subnet["AvailabilityZone"]) == (net["vpc_id"], net["availability_zone"])
    assert subnet["MapPublicIpOnLaunch"] is False

    table = ec2().describe_route_tables(RouteTableIds=[net["route_table_id"]])["RouteTables"][0]
    assert [a["SubnetId"] for a in table["Associations"]] == [net["subnet_id"]]
    endpoint = ec2().describe_vpc_endpoints(VpcEndpointIds=[net["endpoint_id"]])["VpcEndpoints"][0]
    assert (endpoint["ServiceName"], endpoint["VpcEndpointType"]) == (f"com.amazonaws.{REGION}.s3", "Gateway")
    assert endpoint["RouteTableIds"] == [net["route_table_id"]]

    (group_id,) = net["security_group_ids"]
    group = ec2().describe_security_groups(GroupIds=[group_id])["SecurityGroups"][0]
    ingress = sorted(
        (
            p["IpProtocol"],
            p.get("FromPort"),
            p.get("ToPort"),
            tuple(g["GroupId"] for g in p["UserIdGroupPairs"]),
        )
        for p in group["IpPermissions"]
    )
    assert ingress == [
        ("-1", None, None, (group_id,)),
        ("tcp", 988, 988, (group_id,)),
        ("tcp", 1018, 1023, (group_id,)),
    ]
    s3_list = ec2().describe_managed_prefix_lists(
        Filters=[{"Name": "prefix-list-name", "Values": [f"com.amazonaws.{REGION}.s3"]}]
    )["PrefixLists"][0]["PrefixListId"]
    egress = sorted(
        (
            p["IpProtocol"],
            p.get("FromPort"),
            [r["CidrIp"] for r in p["IpRanges"]],
            [g["GroupId"] for g in p["UserIdGroupPairs"]],
            [pl["PrefixListId"] for pl in p.get("PrefixListIds", [])],
        )
        for p in group["IpPermissionsEgress"]
    )
    # all traffic to itself (EFA) and HTTPS to S3 through the endpoint (code, checkpoints, model); nothing else
    assert egress == [("-1", None, [], [group_id], []), ("tcp", 443, [], [], [s3_list])]

    tags = {t["Key"]: t["Value"] for t in vpc["Tags"]}
    assert tags == {
        "team": "rehearsal",
        "Name": f"{job_id}-vpc",
        "lustrain:job-id": job_id,
        "lustrain:created-by": aws.stack_name,
        "lustrain:team": "default",
    }
    assert count_of_job(job_id) == {
        "vpcs": 1,
        "subnets": 1,
        "security_groups": 1,
        "route_tables": 1,
        "endpoints": 1,
        "file_systems": 0,
    }
    recorded = job_record(aws.jobs_table, job_id)["resources"]
    assert sorted((r["type"], r["id"]) for r in recorded) == sorted(
        [
            ("vpc", net["vpc_id"]),
            ("subnet", net["subnet_id"]),
            ("route_table", net["route_table_id"]),
            ("vpc_endpoint", net["endpoint_id"]),
            ("security_group", group_id),
        ]
    )
    assert net["created"] is True


def test_a_retried_create_reuses_what_it_made(aws):
    document = register()
    first = invoke("create_network", document)
    again = invoke("create_network", document)
    for key in ("vpc_id", "subnet_id", "route_table_id", "endpoint_id", "security_group_ids"):
        assert again[key] == first[key]
    job_id = document["job"]["job_id"]
    assert set(count_of_job(job_id).values()) <= {0, 1}
    assert len(job_record(aws.jobs_table, job_id)["resources"]) == 5
    group = ec2().describe_security_groups(GroupIds=first["security_group_ids"])["SecurityGroups"][0]
    assert len(group["IpPermissions"]) == 3 and len(group["IpPermissionsEgress"]) == 2


def test_the_availability_zone_of_the_spec_is_used(aws):
    net = invoke("create_network", register(spec(network={"availability_zone": "us-east-1c"})))
    assert net["availability_zone"] == "us-east-1c"


def test_an_unknown_availability_zone_is_refused_naming_the_field(aws):
    with pytest.raises(SpecInvalid) as exc:  # by register_job, before anything exists (test_zone_choice.py)
        register(spec(network={"availability_zone": "us-east-1z"}))
    assert [e.path for e in exc.value.errors] == ["network.availability_zone"]
    assert "us-east-1a" in exc.value.message


# --- an existing network ---------------------------------------------------------------------------------


def existing(
    lustre_ports: bool = True,
    efa: bool = True,
    s3_route: bool = True,
    prefix: int = 24,
    open_egress: bool = True,
) -> dict:
    """A team's network: a VPC, one subnet, one group, perhaps the rules and the S3 endpoint the run needs."""
    vpc_id = ec2().create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet_id = ec2().create_subnet(
        VpcId=vpc_id, CidrBlock=f"10.9.0.0/{prefix}", AvailabilityZone="us-east-1b"
    )["Subnet"]["SubnetId"]
    group_id = ec2().create_security_group(GroupName="team-training", Description="team", VpcId=vpc_id)[
        "GroupId"
    ]
    me = [{"GroupId": group_id}]
    ingress = [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "10.0.0.0/8"}]}]
    if efa:
        ingress.append({"IpProtocol": "-1", "UserIdGroupPairs": me})
        ec2().authorize_security_group_egress(
            GroupId=group_id, IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": me}]
        )
    if lustre_ports:
        ingress += [
            {"IpProtocol": "tcp", "FromPort": 988, "ToPort": 988, "UserIdGroupPairs": me},
            {"IpProtocol": "tcp", "FromPort": 1018, "ToPort": 1023, "UserIdGroupPairs": me},
        ]
    ec2().authorize_security_group_ingress(GroupId=group_id, IpPermissions=ingress)
    if not open_egress:
        ec2().revoke_security_group_egress(
            GroupId=group_id, IpPermissions=[{"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]
        )
    if s3_route:
        main = ec2().describe_route_tables(
            Filters=[{"Name": "vpc-id", "Values": [vpc_id]}, {"Name": "association.main", "Values": ["true"]}]
        )["RouteTables"][0]
        ec2().create_vpc_endpoint(
            VpcId=vpc_id,
            ServiceName=f"com.amazonaws.{REGION}.s3",
            VpcEndpointType="Gateway",
            RouteTableIds=[main["RouteTableId"]],
        )
    return {"subnet_id": subnet_id, "security_group_ids": [group_id], "vpc_id": vpc_id}


def network_problems(document: dict) -> list[str]:
    with pytest.raises(NetworkInvalid) as exc:
        invoke("create_network", document)
    return exc.value.details["problems"]


def test_a_good_existing_network_is_checked_and_nothing_is_created(aws):
    given = existing()
    vpcs_before = len(ec2().describe_vpcs()["Vpcs"])
    document = register(
        spec(network={"subnet_id": given["subnet_id"], "security_group_ids": given["security_group_ids"]})
    )
    net = invoke("create_network", document)
    assert (net["subnet_id"], net["vpc_id"], net["created"]) == (given["subnet_id"], given["vpc_id"], False)
    assert net["availability_zone"] == "us-east-1b" and net["endpoint_id"].startswith("vpce-")
    assert len(ec2().describe_vpcs()["Vpcs"]) == vpcs_before
    assert job_record(aws.jobs_table, document["job"]["job_id"])["resources"] == []


def test_an_existing_group_missing_the_lustre_ports_is_named_with_each_missing_rule(aws):
    # one instance without EFA (ml.m5) needs only Lustre's ports, and this group opens everything else but those
    given = existing(lustre_ports=False, efa=False)
    document = register(
        spec(
            compute={"instance_type": "ml.m5.xlarge", "instance_count": 1},
            network={"subnet_id": given["subnet_id"], "security_group_ids": given["security_group_ids"]},
        )
    )
    assert network_problems(document) == [
        "network.security_group_ids: no rule allows inbound TCP 988 from the group itself (Lustre)",
        "network.security_group_ids: no rule allows inbound TCP 1018-1023 from the group itself (Lustre)",
    ]


def test_ranks_of_a_multi_instance_job_without_efa_must_reach_each_other(aws):
    # two ml.m5 instances: torchrun's rendezvous and NCCL's sockets need all traffic among them; the group's open
    # egress (0.0.0.0/0) lets it out, but nothing lets it in
    given = existing(efa=False)
    document = register(
        spec(
            compute={"instance_type": "ml.m5.xlarge", "instance_count": 2},
            network={"subnet_id": given["subnet_id"], "security_group_ids": given["security_group_ids"]},
        )
    )
    assert network_problems(document) == [
        "network.security_group_ids: no rule allows inbound all traffic from the group itself (the ranks of a job "
        "of several instances)"
    ]


def test_with_inter_container_encryption_ipsec_must_pass_among_the_instances(aws, monkeypatch):
    monkeypatch.setenv("LUSTRAIN_INTER_CONTAINER_ENCRYPTION", "true")
    given = existing(efa=False)
    document = register(
        spec(
            compute={"instance_type": "ml.m5.xlarge", "instance_count": 2},
            network={"subnet_id": given["subnet_id"], "security_group_ids": given["security_group_ids"]},
        )
    )
    rule = "network.security_group_ids: no rule allows"
    assert network_problems(document) == [
        f"{rule} inbound all traffic from the group itself (the ranks of a job of several instances)",
        f"{rule} inbound UDP 500 from the group itself (inter-container traffic encryption)",
        f"{rule} inbound ESP (IP protocol 50) from the group itself (inter-container traffic encryption)",
    ]


@pytest.mark.parametrize(
    ("instance_type", "count", "encrypted"),
    [
        ("ml.p4d.24xlarge", 2, True),
        ("ml.m5.xlarge", 4, True),
        ("ml.m5.xlarge", 1, False),
        ("ml.g5.12xlarge", 2, False),
    ],
)
def test_the_network_a_run_creates_has_every_rule_the_check_of_a_reused_one_requires(
    aws, monkeypatch, instance_type, count, encrypted
):
    from lustrain_core.steps import network

    monkeypatch.setenv("LUSTRAIN_INTER_CONTAINER_ENCRYPTION", str(encrypted).lower())
    document = register(spec(compute={"instance_type": instance_type, "instance_count": count}))
    net = invoke("create_network", document)
    groups = ec2().describe_security_groups(GroupIds=net["security_group_ids"])["SecurityGroups"]
    subnet = ec2().describe_subnets(SubnetIds=[net["subnet_id"]])["Subnets"][0]

    rules = network.required_rules(instance_type, count, encrypted=encrypted)
    assert network.missing_rules(groups, rules, subnet["CidrBlock"]) == []
    # and the check of a reused network passes on it
    again = register(
        spec(
            compute={"instance_type": instance_type, "instance_count": count},
            network={"subnet_id": net["subnet_id"], "security_group_ids": net["security_group_ids"]},
        ),
        execution="reuse",
    )
    assert invoke("create_network", again)["created"] is False


def test_an_existing_group_without_efa_rules_and_a_subnet_without_s3_are_all_reported(aws):
    given = existing(efa=False, s3_route=False)
    document = register(
        spec(network={"subnet_id": given["subnet_id"], "security_group_ids": given["security_group_ids"]})
    )
    problems = network_problems(document)
    assert (
        "network.security_group_ids: no rule allows inbound all traffic from the group itself (EFA)"
        in problems
    )
    assert (
        "network.security_group_ids: no rule allows outbound all traffic to the group itself (EFA)"
        in problems
    )
    assert any(
        p.startswith("network.subnet_id:") and "no S3 gateway endpoint and no NAT route" in p
        for p in problems
    )


def test_an_existing_group_that_sends_nothing_out_but_to_itself_is_refused_as_unable_to_reach_s3(aws):
    # the egress the first create_network left: traffic to a gateway endpoint is still filtered by the group
    given = existing(open_egress=False)
    document = register(
        spec(network={"subnet_id": given["subnet_id"], "security_group_ids": given["security_group_ids"]})
    )
    (problem,) = network_problems(document)
    assert problem.startswith("network.security_group_ids: no rule allows outbound HTTPS (TCP 443) to S3")


def test_an_existing_subnet_too_small_for_the_run_is_named_with_its_free_ips(aws):
    given = existing(prefix=28)
    document = register(
        spec(
            compute={"instance_count": 3},
            network={"subnet_id": given["subnet_id"], "security_group_ids": given["security_group_ids"]},
        )
    )
    needed = document["job"]["plan"]["network"]["ips_needed"]
    (problem,) = network_problems(document)
    assert problem.startswith(
        f"network.subnet_id: {given['subnet_id']} has 11 free IP addresses; the run needs {needed}"
    )


def test_a_subnet_that_does_not_exist_is_named(aws):
    given = existing()
    document = register(
        spec(
            network={
                "subnet_id": "subnet-0123456789abcdef0",
                "security_group_ids": given["security_group_ids"],
            }
        )
    )
    with pytest.raises(NetworkInvalid, match=r"network.subnet_id: subnet-0123456789abcdef0 does not exist"):
        invoke("create_network", document)
