"""The twin writes DynamoDB's answers as moto's serializer does, only without walking each attribute value."""

from __future__ import annotations

import json
from typing import Any

import pytest
from boto3.dynamodb.types import Binary
from moto.core.serialize import JSONSerializer, XFormedAttributePicker
from moto.core.utils import get_service_model
from twinhelpers import key_table

from lustrain.twin.patches import dynamodb_wire

pytestmark = pytest.mark.usefixtures("moto_twin")

#: every kind of attribute value, nested as a run's record nests them, and what the fast way hands back to moto
ITEM: dict[str, Any] = {
    "job_id": {"S": "run-1"},
    "empty": {"S": ""},
    "count": {"N": "12"},
    "price": {"N": "32.7726"},
    "done": {"BOOL": False},
    "nothing": {"NULL": True},
    "names": {"SS": ["a", "b"]},
    "sizes": {"NS": ["1", "2.5"]},
    "blob": {"B": b"\x00\x01"},
    "blobs": {"BS": [b"x", b"y"]},
    "spec": {
        "M": {
            "name": {"S": "tiny"},
            "compute": {"M": {"instance_count": {"N": "2"}, "spot": {"BOOL": True}}},
            "resources": {"L": [{"M": {"type": {"S": "vpc"}, "id": {"S": "vpc-1"}}}, {"L": []}, {"M": {}}]},
            "raw": {"B": b"\xff"},
        }
    },
}


def _serialize(result: dict[str, Any], operation: str) -> str:
    model = get_service_model("dynamodb")
    serializer = JSONSerializer(model.operation_model(operation), value_picker=XFormedAttributePicker())
    return serializer.serialize(result)["body"]


def test_every_kind_of_attribute_value_is_written_as_motos_serializer_writes_it(monkeypatch):
    answers = {"GetItem": {"Item": ITEM}, "Query": {"Items": [ITEM, {"k": {"S": "v"}}], "Count": 2}}
    fast = {operation: _serialize(result, operation) for operation, result in answers.items()}
    slow_way = JSONSerializer._serialize_type_structure.__wrapped__  # type: ignore[attr-defined]
    monkeypatch.setattr(JSONSerializer, "_serialize_type_structure", slow_way)
    slow = {operation: _serialize(result, operation) for operation, result in answers.items()}
    assert fast == slow
    assert json.loads(fast["GetItem"])["Item"]["blob"] == {"B": "AAE="}


def test_only_plain_values_take_the_fast_way():
    assert dynamodb_wire.wire({"M": {"a": {"L": [{"N": 1}]}}}) == {"M": {"a": {"L": [{"N": "1"}]}}}
    for value in (
        {"B": b"x"},
        {"S": None},
        {"S": "a", "N": "1"},
        {"M": {"a": {"BS": [b"x"]}}},
        {"BOOL": None},
    ):
        with pytest.raises(dynamodb_wire._NotPlain):
            dynamodb_wire.wire(value)


def test_an_item_put_reads_back_the_same_through_the_twin():
    ddb = key_table("wire", "job_id")
    ddb.put_item(TableName="wire", Item=ITEM)
    got = ddb.get_item(TableName="wire", Key={"job_id": {"S": "run-1"}})["Item"]
    assert got == ITEM | {"blobs": {"BS": [b"x", b"y"]}}
    assert isinstance(Binary(got["blob"]["B"]).value, bytes)
