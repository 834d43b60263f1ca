"""network.availability_zone: auto, a zone's name or id, or a list of them in order of preference."""

from __future__ import annotations

import pytest
from lustrain_core.errors import SpecInvalid
from lustrain_core.spec import validate_spec

BASE = {"name": "x", "data": {"s3_uri": "s3://bkt/d/"}, "output": {"s3_uri": "s3://bkt/o/"}}


def zones(value: object) -> list[str]:
    return validate_spec({**BASE, "network": {"availability_zone": value}}).network.preferred_zones


@pytest.mark.parametrize(
    ("value", "preferred"),
    [
        ("auto", []),
        ("us-east-1a", ["us-east-1a"]),
        ("use1-az4", ["use1-az4"]),
        ("apne1-az4", ["apne1-az4"]),
        (["use1-az4", "us-east-1b"], ["use1-az4", "us-east-1b"]),
    ],
)
def test_zones_are_given_by_name_or_id_in_order(value: object, preferred: list[str]) -> None:
    assert zones(value) == preferred


@pytest.mark.parametrize("value", ["us-east-1zz", ["auto"], [], ["use1-az4", "use1-az4"], 5, ["a"] * 11])
def test_anything_else_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(SpecInvalid) as exc:
        zones(value)
    assert [e.path for e in exc.value.errors] == ["network.availability_zone"]
    assert "name (us-east-1a) or id (use1-az4)" in exc.value.message
