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


def test_a_multi_instance_job_without_efa_needs_all_traffic_among_its_ranks():
    rules = network.required_rules("ml.g5.12xlarge", 2)
    assert described(list(rules))[:2] == [
        "inbound all traffic from the group itself (the ranks of a job of several instances)",
        "outbound all traffic to the group itself (the ranks of a job of several instances)",
    ]
    only_lustre = group(
        "sg-1", ingress=[from_group("sg-1", "tcp", (988, 988)), from_group("sg-1", "tcp", (1018, 1023))]
    )
    assert network.missing_rules([only_lustre], rules, SUBNET) == list(rules[:2])
    # unlike EFA's, the ranks' TCP is matched by a CIDR range covering the subnet (the open egress, for one)
    cidr = group(
        "sg-1",
        ingress=[from_cidr("10.1.0.0/16", protocol="-1", ports=None), from_group("sg-1", "tcp", (988, 1023))],
        egress=[OPEN_EGRESS],
    )
    assert network.missing_rules([cidr], rules, SUBNET) == []


def test_inter_container_encryption_needs_ike_and_esp_both_ways_among_several_instances():
    rules = network.required_rules("ml.m5.xlarge", 2, encrypted=True)
    assert [r.describe() for r in rules if r.why == "inter-container traffic encryption"] == [
        "inbound UDP 500 from the group itself (inter-container traffic encryption)",
        "inbound ESP (IP protocol 50) from the group itself (inter-container traffic encryption)",
        "outbound UDP 500 to the group itself (inter-container traffic encryption)",
        "outbound ESP (IP protocol 50) to the group itself (inter-container traffic encryption)",
    ]
    # one instance sends nothing to another: neither the ranks' rules nor IPsec's
    assert network.required_rules("ml.m5.xlarge", 1, encrypted=True) == network.LUSTRE_RULES


@pytest.mark.parametrize("esp", ["50", "esp"])
def test_ipsec_rules_are_recognised_by_protocol_name_or_number(esp):
    ipsec = tuple(
        r for r in network.required_rules("ml.m5.xlarge", 2, encrypted=True) if r.why.startswith("inter")
    )
    sg = group(
        "sg-1",
        ingress=[from_group("sg-1", "udp", (500, 500)), from_group("sg-1", esp, (-1, -1))],
        egress=[from_group("sg-1", "17", (500, 500)), from_group("sg-1", esp)],
    )
    assert network.missing_rules([sg], ipsec, SUBNET) == []
    tcp_only = group("sg-1", ingress=[from_group("sg-1", "tcp", (0, 65535))])
    assert len(network.missing_rules([tcp_only], ipsec, SUBNET)) == 4


def test_the_all_traffic_self_rules_lustrain_creates_hold_every_requirement():
    sg = group(
        "sg-1",
        ingress=[
            from_group("sg-1"),
            from_group("sg-1", "tcp", (988, 988)),
            from_group("sg-1", "tcp", (1018, 1023)),
        ],
        egress=[from_group("sg-1")],
    )
    for instance_type in ("ml.p4d.24xlarge", "ml.g5.12xlarge", "ml.m5.xlarge"):
        for count in (1, 2):
            rules = network.required_rules(instance_type, count, encrypted=True)
            assert network.missing_rules([sg], rules, SUBNET) == []
