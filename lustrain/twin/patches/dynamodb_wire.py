"""DynamoDB's answers: an item's attribute values are written to the wire as they are, not walked member by member.

moto 5.2.5 serializes every answer through the service model: for each member of each structure it asks an
attribute picker for about a dozen spellings of the member's name. An AttributeValue is a structure of ten members
(S, N, B, SS, NS, BS, M, L, NULL, BOOL), and a run's record nests maps and lists several levels deep (its spec, its
plan, its ledger), so one GetItem of a record asked the picker tens of thousands of times: about 0.3 s of CPU, and
two fifths of the CPU of the twin's control plane went there.

moto's DynamoDB keeps an item's attributes as plain dicts already in the wire's shape ({"S": "..."}, {"M": {...}}).
For those, this patch writes what moto's serializer would write — each scalar string as `str()`, BOOL and NULL as
they are, SS and NS as lists of strings, M and L recursively — without asking the picker. Anything else (binary
values, which the serializer base64-encodes, an empty or None value, which it treats apart, an object in place of
a dict) goes to moto's serializer unchanged. tests/functional/twin/test_twin_dynamodb_wire.py holds both ways to
the same bytes for every kind of attribute value.
"""

from __future__ import annotations

import functools
from typing import Any

from moto.core.serialize import JSONSerializer

_PATCHED = "_lustrain_twin_dynamodb_wire"
_STRINGS = frozenset({"S", "N"})
_FLAGS = frozenset({"BOOL", "NULL"})
_STRING_SETS = frozenset({"SS", "NS"})
_EMPTY: tuple[Any, ...] = (None, {}, [])


class _NotPlain(Exception):
    """The value is not a plain attribute value of the wire's shape: moto's serializer writes it."""


def wire(value: Any) -> dict[str, Any]:
    """An AttributeValue held as a plain dict, as moto's JSON serializer writes it; _NotPlain otherwise."""
    if type(value) is not dict or len(value) != 1:
        raise _NotPlain
    ((kind, inner),) = value.items()
    if kind in _STRINGS:
        if inner in _EMPTY:
            raise _NotPlain
        return {kind: str(inner)}
    if kind in _FLAGS:
        if type(inner) is not bool:
            raise _NotPlain
        return {kind: inner}
    if kind in _STRING_SETS:
        if type(inner) is not list or any(item in _EMPTY for item in inner):
            raise _NotPlain
        return {kind: [str(item) for item in inner]}
    if kind == "M":
        if type(inner) is not dict:
            raise _NotPlain
        return {"M": {str(name): wire(member) for name, member in inner.items()}}
    if kind == "L":
        if type(inner) is not list:
            raise _NotPlain
        return {"L": [wire(member) for member in inner]}
    raise _NotPlain


def install() -> None:
    original = JSONSerializer._serialize_type_structure
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def serialize_structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
        if key and shape.name == "AttributeValue" and self.service_model.service_name == "dynamodb":
            try:
                serialized[self.get_serialized_name(shape, key)] = wire(value)
                return
            except _NotPlain:
                pass
        original(self, serialized, value, shape, key)

    setattr(serialize_structure, _PATCHED, True)
    JSONSerializer._serialize_type_structure = serialize_structure  # type: ignore[method-assign]
