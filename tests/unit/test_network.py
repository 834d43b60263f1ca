"""The network step's pure parts: which security-group rules a run needs and how an existing set is judged."""

from __future__ import annotations

from typing import Any

import pytest
from lustrain_core.steps import network

SUBNET = "10.1.4.0/24"


def group(
    group_id: str, ingress: list[dict[str, Any]] = (), egress: list[dict[str, Any]] = ()
) -> dict[str, Any]:
    return {"GroupId": group_id, "IpPermissions": list(ingress), "IpPermissionsEgress": list(egress)}


def from_group(group_id: str, protocol: str = "-1", ports: tuple[int, int] | None = None) -> dict[str, Any]:
    permission: dict[str, Any] = {"IpProtocol": protocol, "UserIdGroupPairs": [{"GroupId": group_id}]}
    if ports:
        permission.update(FromPort=ports[0], ToPort=ports[1])
    return permission


def from_cidr(cidr: str, protocol: str = "tcp", ports: tuple[int, int] | None = (988, 988)) -> dict[str, Any]:
    permission: dict[str, Any] = {"IpProtocol": protocol, "IpRanges": [{"CidrIp": cidr}]}
    if ports:
        permission.update(FromPort=ports[0], ToPort=ports[1])
    return permission


OPEN_EGRESS = from_cidr("0.0.0.0/0", protocol="-1", ports=None)
P4D = network.required_rules("ml.p4d.24xlarge")


def described(rules: list[network.Rule]) -> list[str]:
    return [r.describe() for r in rules]


def test_a_p4d_run_needs_efa_both_ways_and_the_lustre_ports():
    assert described(list(P4D)) == [
        "inbound all traffic from the group itself (EFA)",
        "outbound all traffic to the group itself (EFA)",
        "inbound TCP 988 from the group itself (Lustre)",
        "inbound TCP 1018-1023 from the group itself (Lustre)",
    ]


def test_an_instance_without_efa_needs_only_the_lustre_ports():
    assert described(list(network.required_rules("ml.m5.xlarge"))) == [
        "inbound TCP 988 from the group itself (Lustre)",
        "inbound TCP 1018-1023 from the group itself (Lustre)",
    ]


def test_the_group_lustrain_creates_needs_nothing_more():
    sg = group(
        "sg-1",
        ingress=[
            from_group("sg-1"),
            from_group("sg-1", "tcp", (988, 988)),
            from_group("sg-1", "tcp", (1018, 1023)),
        ],
        egress=[from_group("sg-1")],
    )
    assert network.missing_rules([sg], P4D, SUBNET) == []


def test_a_default_looking_group_misses_every_rule():
    sg = group("sg-1", ingress=[from_cidr("10.0.0.0/8", ports=(22, 22))], egress=[OPEN_EGRESS])
    assert network.missing_rules([sg], P4D, SUBNET) == list(P4D)


def test_open_egress_does_not_stand_in_for_efas_self_rule():
    sg = group("sg-1", ingress=[from_group("sg-1")], egress=[OPEN_EGRESS])
    assert described(network.missing_rules([sg], P4D, SUBNET)) == [
        "outbound all traffic to the group itself (EFA)"
    ]


def test_a_group_missing_only_the_lustre_ports_is_told_exactly_those():
    sg = group("sg-1", ingress=[from_group("sg-1", "tcp", (22, 22))], egress=[OPEN_EGRESS])
    missing = network.missing_rules([sg], network.required_rules("ml.m5.xlarge"), SUBNET)
    assert described(missing) == [
        "inbound TCP 988 from the group itself (Lustre)",
        "inbound TCP 1018-1023 from the group itself (Lustre)",
    ]


def test_lustre_ports_from_a_cidr_covering_the_subnet_count_but_not_from_a_narrower_one():
    rules = network.required_rules("ml.m5.xlarge")
    wide = group(
        "sg-1",
        ingress=[from_cidr("10.1.0.0/16", ports=(988, 988)), from_cidr("10.1.0.0/16", ports=(1018, 1023))],
    )
    assert network.missing_rules([wide], rules, SUBNET) == []
    narrow = group("sg-1", ingress=[from_cidr("10.1.4.0/25", ports=(0, 65535))])
    assert len(network.missing_rules([narrow], rules, SUBNET)) == 2


def test_a_wide_tcp_range_from_the_group_covers_both_lustre_rules():
    sg = group("sg-1", ingress=[from_group("sg-1", "tcp", (0, 65535))])
    assert network.missing_rules([sg], network.required_rules("ml.m5.xlarge"), SUBNET) == []


def test_rules_across_several_given_groups_count_when_they_name_any_of_them():
    a = group("sg-a", ingress=[from_group("sg-b")], egress=[from_group("sg-b")])
    b = group(
        "sg-b", ingress=[from_group("sg-a", "tcp", (988, 988)), from_group("sg-a", "tcp", (1018, 1023))]
    )
    assert network.missing_rules([a, b], P4D, SUBNET) == []
    stranger = group("sg-a", ingress=[from_group("sg-zzz")], egress=[from_group("sg-zzz")])
    assert len(network.missing_rules([stranger], P4D, SUBNET)) == 4


@pytest.mark.parametrize("protocol", ["tcp", "6"])
def test_tcp_is_recognised_by_name_or_number(protocol):
    sg = group("sg-1", ingress=[from_group("sg-1", protocol, (988, 1023))])
    assert network.missing_rules([sg], network.LUSTRE_RULES, SUBNET) == []
