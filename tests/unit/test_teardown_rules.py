"""Teardown's waiting and ownership rules against an in-memory EC2 whose deletes can be blocked, and a fake
clock (no test sleeps)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from lustrain_core.config import Settings
from lustrain_core.steps import teardown

SETTINGS = Settings(stack_name="lustrain-test")
JOB = "gpt-0badc0de"
OURS = [{"Key": "lustrain:job-id", "Value": JOB}, {"Key": "lustrain:created-by", "Value": "lustrain-test"}]


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def clock(budget: float = 60.0, fake: FakeClock | None = None) -> teardown.Clock:
    fake = fake or FakeClock()
    return teardown.Clock(budget, now=fake.now, sleep=fake.sleep, interval=1.0, max_interval=8.0)


class FakeEC2:
    """Just enough EC2: resources by id with tags; `blocked[id] = n` fails the next n deletes DependencyViolation.

    A VPC cannot go while a subnet is left in it, as on AWS."""

    KINDS = {
        "vpc": ("VpcId", "Vpcs", "VpcIds"),
        "subnet": ("SubnetId", "Subnets", "SubnetIds"),
        "security_group": ("GroupId", "SecurityGroups", "GroupIds"),
        "route_table": ("RouteTableId", "RouteTables", "RouteTableIds"),
        "vpc_endpoint": ("VpcEndpointId", "VpcEndpoints", "VpcEndpointIds"),
    }

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.blocked: dict[str, int] = {}
        self.calls: list[tuple[str, str]] = []

    def add(
        self, kind: str, resource_id: str, tags: list[dict[str, str]] = OURS, **extra: Any
    ) -> dict[str, str]:
        key = self.KINDS[kind][0]
        self.items[resource_id] = {"kind": kind, key: resource_id, "Tags": tags, **extra}
        return {"type": kind, "id": resource_id}

    def _describe(self, kind: str, ids: list[str]) -> dict[str, Any]:
        _, result_key, _ = self.KINDS[kind]
        return {result_key: [dict(self.items[i]) for i in ids if i in self.items]}

    def describe_vpcs(self, VpcIds: list[str]) -> dict[str, Any]:
        return self._describe("vpc", VpcIds)

    def describe_subnets(self, SubnetIds: list[str]) -> dict[str, Any]:
        return self._describe("subnet", SubnetIds)

    def describe_security_groups(self, GroupIds: list[str]) -> dict[str, Any]:
        return self._describe("security_group", GroupIds)

    def describe_route_tables(self, RouteTableIds: list[str]) -> dict[str, Any]:
        return self._describe("route_table", RouteTableIds)

    def describe_vpc_endpoints(self, VpcEndpointIds: list[str]) -> dict[str, Any]:
        return self._describe("vpc_endpoint", VpcEndpointIds)

    def _delete(self, operation: str, resource_id: str) -> dict[str, Any]:
        self.calls.append((operation, resource_id))
        if self.blocked.get(resource_id, 0) > 0:
            self.blocked[resource_id] -= 1
            raise ClientError({"Error": {"Code": "DependencyViolation", "Message": "in use"}}, operation)
        del self.items[resource_id]
        return {}

    def delete_vpc(self, VpcId: str) -> dict[str, Any]:
        if any(item["kind"] == "subnet" for item in self.items.values()):
            self.calls.append(("DeleteVpc", VpcId))  # as AWS: a VPC with a subnet left cannot go
            raise ClientError(
                {"Error": {"Code": "DependencyViolation", "Message": "has subnets"}}, "DeleteVpc"
            )
        return self._delete("DeleteVpc", VpcId)

    def delete_subnet(self, SubnetId: str) -> dict[str, Any]:
        return self._delete("DeleteSubnet", SubnetId)

    def delete_security_group(self, GroupId: str) -> dict[str, Any]:
        return self._delete("DeleteSecurityGroup", GroupId)

    def delete_route_table(self, RouteTableId: str) -> dict[str, Any]:
        return self._delete("DeleteRouteTable", RouteTableId)

    def delete_vpc_endpoints(self, VpcEndpointIds: list[str]) -> dict[str, Any]:
        self._delete("DeleteVpcEndpoints", VpcEndpointIds[0])
        return {"Unsuccessful": []}

    def disassociate_route_table(self, AssociationId: str) -> dict[str, Any]:
        self.calls.append(("DisassociateRouteTable", AssociationId))
        return {}

    def revoke_security_group_ingress(
        self, GroupId: str, IpPermissions: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.calls.append(("RevokeSecurityGroupIngress", GroupId))
        self.items[GroupId]["IpPermissions"] = []
        return {}

    def revoke_security_group_egress(
        self, GroupId: str, IpPermissions: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.calls.append(("RevokeSecurityGroupEgress", GroupId))
        self.items[GroupId]["IpPermissionsEgress"] = []
        return {}


def the_network(ec2: FakeEC2) -> list[dict[str, str]]:
    self_rule = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-1"}]}
    return [
        ec2.add("vpc", "vpc-1"),
        ec2.add("subnet", "subnet-1"),
        ec2.add(
            "route_table", "rtb-1", Associations=[{"RouteTableAssociationId": "rtbassoc-1", "Main": False}]
        ),
        ec2.add("vpc_endpoint", "vpce-1", State="available"),
        ec2.add("security_group", "sg-1", IpPermissions=[self_rule], IpPermissionsEgress=[self_rule]),
    ]


def work(ec2: FakeEC2, clk: teardown.Clock) -> teardown.Teardown:
    return teardown.Teardown(ec2=ec2, fsx=None, job_id=JOB, settings=SETTINGS, clock=clk)


def test_the_network_goes_in_dependency_order_rules_and_associations_first():
    ec2 = FakeEC2()
    resources = the_network(ec2)
    step = work(ec2, clock())
    assert step.delete_network(resources) == []
    # the endpoints first: an interface endpoint's network interfaces (code.secrets) hold the group and the subnet
    assert ec2.calls == [
        ("DeleteVpcEndpoints", "vpce-1"),
        ("RevokeSecurityGroupIngress", "sg-1"),
        ("RevokeSecurityGroupEgress", "sg-1"),
        ("DeleteSecurityGroup", "sg-1"),
        ("DisassociateRouteTable", "rtbassoc-1"),
        ("DeleteRouteTable", "rtb-1"),
        ("DeleteSubnet", "subnet-1"),
        ("DeleteVpc", "vpc-1"),
    ]
    assert ec2.items == {}
    assert {(r["type"], r["id"]) for r in step.report.deleted} == {(r["type"], r["id"]) for r in resources}


def test_dependency_violation_is_retried_while_interfaces_drain():
    ec2 = FakeEC2()
    resources = the_network(ec2)
    ec2.blocked = {"subnet-1": 2}
    fake = FakeClock()
    step = work(ec2, clock(fake=fake))
    assert step.delete_network(resources) == []
    assert ec2.items == {}
    assert [c for c in ec2.calls if c[0] == "DeleteSubnet"] == [("DeleteSubnet", "subnet-1")] * 3
    assert fake.slept == [1.0, 2.0]


def test_a_subnet_still_blocked_when_the_budget_runs_out_is_reported_with_what_waits_on_it():
    ec2 = FakeEC2()
    resources = the_network(ec2)
    ec2.blocked = {"subnet-1": 10**6}
    fake = FakeClock()
    step = work(ec2, clock(budget=20.0, fake=fake))
    remaining = step.delete_network(resources)
    assert remaining == [
        "subnet subnet-1 (DependencyViolation: still in use)",
        "vpc vpc-1 (DependencyViolation: still in use)",
    ]
    assert set(ec2.items) == {"subnet-1", "vpc-1"}
    assert sum(fake.slept) <= 20.0
    assert fake.slept == [1.0, 2.0, 4.0, 8.0, 5.0]


def test_a_resource_in_the_ledger_without_this_jobs_tags_is_never_deleted():
    ec2 = FakeEC2()
    foreign = ec2.add("vpc", "vpc-team", tags=[{"Key": "Name", "Value": "team-prod"}])
    other_job = ec2.add("subnet", "subnet-other", tags=[{"Key": "lustrain:job-id", "Value": "gpt-11111111"}])
    step = work(ec2, clock())
    assert step.delete_network([foreign, other_job]) == []
    assert set(ec2.items) == {"vpc-team", "subnet-other"}
    assert ec2.calls == []
    assert [k["id"] for k in step.report.kept] == ["subnet-other", "vpc-team"]
    assert all("never deleted" in k["reason"] for k in step.report.kept)


def test_what_is_already_gone_counts_as_gone_not_as_an_error():
    ec2 = FakeEC2()
    step = work(ec2, clock())
    assert step.delete_network([{"type": "vpc", "id": "vpc-gone"}]) == []
    assert step.report.already_gone == [{"type": "vpc", "id": "vpc-gone"}]


def test_the_clock_doubles_its_pause_up_to_the_cap_and_stops_at_the_budget():
    fake = FakeClock()
    clk = clock(budget=30.0, fake=fake)
    while clk.wait():
        pass
    assert fake.slept == [1.0, 2.0, 4.0, 8.0, 8.0, 7.0]
    assert fake.t == 30.0


class Context:
    def __init__(self, millis: int) -> None:
        self.millis = millis

    def get_remaining_time_in_millis(self) -> int:
        return self.millis


def test_the_budget_is_the_lambdas_remaining_time_less_a_reserve():
    assert teardown.clock_for(Context(120_000), SETTINGS).budget_seconds == 90.0
    assert teardown.clock_for(Context(10_000), SETTINGS).budget_seconds == 0.0
    assert teardown.clock_for(Context(900_000), SETTINGS).budget_seconds == teardown.MAX_BUDGET_SECONDS
    assert teardown.clock_for(None, SETTINGS).budget_seconds == teardown.MAX_BUDGET_SECONDS


def test_the_first_pause_comes_from_the_stack_setting():
    fast = Settings(extra={"LUSTRAIN_TEARDOWN_POLL_SECONDS": "0.05"})
    assert teardown.clock_for(None, fast).interval == 0.05
    assert teardown.clock_for(None, SETTINGS).interval == teardown.DEFAULT_INTERVAL_SECONDS
    with pytest.raises(ValueError, match="LUSTRAIN_TEARDOWN_POLL_SECONDS='soon'"):
        teardown.clock_for(None, Settings(extra={"LUSTRAIN_TEARDOWN_POLL_SECONDS": "soon"}))


class Untouchable:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"teardown called {name} for a run it does not own")


@pytest.mark.parametrize(
    "document",
    [
        {"execution": "e", "input": {"spec": {}}, "error": {"Error": "SpecInvalid", "Cause": "..."}},
        {"job": {"job_id": JOB, "duplicate": True}},
    ],
)
def test_a_run_that_registered_nothing_or_is_a_duplicate_touches_nothing(document):
    result = teardown.teardown(
        document, ec2=Untouchable(), fsx=Untouchable(), ddb=Untouchable(), settings=SETTINGS, clock=clock()
    )
    assert (result["deleted"], result["kept"], result["remaining"]) == ([], [], [])
