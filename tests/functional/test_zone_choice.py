"""The zone of a run's subnet on the twin: one that offers the instance type, in network.availability_zone's order, and
a named zone that does not offer it refused by register_job before anything exists.

The twin's us-east-1 offers p4d.24xlarge in use1-az1, use1-az2 and use1-az4 only (lustrain/twin/patches/offerings.py),
which its mapping calls us-east-1b, us-east-1c and us-east-1d: us-east-1a, the alphabetically first zone, has none.
"""

from __future__ import annotations

import boto3
import pytest
from infra_support import REGION, invoke, register, spec
from lustrain_core.errors import NetworkInvalid, SpecInvalid


def ec2():
    return boto3.client("ec2", region_name=REGION)


def zone_ids() -> dict[str, str]:
    return {z["ZoneName"]: z["ZoneId"] for z in ec2().describe_availability_zones()["AvailabilityZones"]}


def p4d_zone_ids() -> set[str]:
    found = ec2().describe_instance_type_offerings(
        LocationType="availability-zone-id", Filters=[{"Name": "instance-type", "Values": ["p4d.24xlarge"]}]
    )
    return {o["Location"] for o in found["InstanceTypeOfferings"]}


def refused(spec_doc: dict) -> SpecInvalid:
    with pytest.raises(SpecInvalid) as exc:
        register(spec_doc)
    assert ec2().describe_vpcs(Filters=[{"Name": "tag-key", "Values": ["lustrain:job-id"]}])["Vpcs"] == []
    return exc.value


def test_the_twin_offers_p4d_in_some_zones_only_and_not_in_the_first(aws):
    offered = p4d_zone_ids()
    assert offered and offered < set(zone_ids().values())
    assert zone_ids()["us-east-1a"] not in offered


def test_auto_puts_the_subnet_in_a_zone_that_offers_the_instance_type(aws):
    net = invoke("create_network", register())
    subnet = ec2().describe_subnets(SubnetIds=[net["subnet_id"]])["Subnets"][0]
    assert subnet["AvailabilityZoneId"] in p4d_zone_ids()
    assert net["availability_zone"] == "us-east-1b"  # the first offering zone by name


def test_the_first_preferred_zone_is_used_given_by_its_id(aws):
    net = invoke("create_network", register(spec(network={"availability_zone": ["use1-az4", "us-east-1b"]})))
    assert net["availability_zone"] == "us-east-1d" and zone_ids()["us-east-1d"] == "use1-az4"


def test_a_named_zone_that_does_not_offer_the_type_is_refused_at_register(aws):
    error = refused(spec(network={"availability_zone": "us-east-1a"}))
    assert [e.path for e in error.errors] == ["network.availability_zone"]
    assert "does not offer p4d.24xlarge" in error.message and "us-east-1b (use1-az1)" in error.message


def test_one_zone_of_a_list_that_does_not_offer_the_type_is_refused(aws):
    error = refused(spec(network={"availability_zone": ["us-east-1c", "use1-az3"]}))
    assert [(e.path, e.value) for e in error.errors] == [("network.availability_zone", "use1-az3")]


def test_a_zone_not_of_the_region_is_refused_at_register(aws):
    error = refused(spec(network={"availability_zone": "use1-az9"}))
    assert [e.path for e in error.errors] == ["network.availability_zone"]
    assert "not an available zone" in error.message


def test_a_type_offered_everywhere_may_take_any_zone(aws):
    doc = spec(
        compute={"instance_type": "ml.m5.xlarge", "instance_count": 1},
        network={"availability_zone": "us-east-1a"},
    )
    assert invoke("create_network", register(doc))["availability_zone"] == "us-east-1a"


def test_an_existing_subnet_in_a_zone_without_the_type_is_refused(aws):
    vpc_id = ec2().create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet_id = ec2().create_subnet(VpcId=vpc_id, CidrBlock="10.9.0.0/20", AvailabilityZone="us-east-1a")[
        "Subnet"
    ]["SubnetId"]
    group_id = ec2().create_security_group(GroupName="given", Description="given", VpcId=vpc_id)["GroupId"]
    document = register(spec(network={"subnet_id": subnet_id, "security_group_ids": [group_id]}))
    with pytest.raises(NetworkInvalid) as exc:
        invoke("create_network", document)
    assert any("us-east-1a, which does not offer p4d.24xlarge" in p for p in exc.value.details["problems"])
