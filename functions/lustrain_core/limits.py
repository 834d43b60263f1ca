"""AWS's limits on a request, from botocore's service model: what CreateTrainingJob and CreateFileSystem refuse.

botocore validates a request's types and minimums before sending it, not its maximum lengths, patterns or
element counts: those AWS checks on its side, after the run has paid for what came before. `problems()` walks a
request against the operation's input shape and reports every value outside the model's `max`, `min`, `pattern`
and `enum` (a pattern is matched whole, as AWS's Java validators match it, with the `regex` package, which knows
the `\\p{L}` classes the models use). Rules that AWS documents but the model leaves out (EC2's models carry no
patterns) are in DOCUMENTED, each with the page that states it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import botocore.session
import regex

#: Rules AWS documents that the service models do not carry, by (service, operation, member path).
DOCUMENTED: dict[tuple[str, str, str], tuple[str, str]] = {
    # https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateSecurityGroup.html
    ("ec2", "CreateSecurityGroup", "GroupName"): (
        r"(?!sg-)[a-zA-Z0-9 ._\-:/()#,@\[\]+=&;{}!$*]{1,255}",
        "up to 255 of a-z, A-Z, 0-9, spaces and ._-:/()#,@[]+=&;{}!$*, not starting with sg-",
    ),
    ("ec2", "CreateSecurityGroup", "Description"): (
        r"[a-zA-Z0-9 ._\-:/()#,@\[\]+=&;{}!$*]{1,255}",
        "up to 255 of a-z, A-Z, 0-9, spaces and ._-:/()#,@[]+=&;{}!$*",
    ),
    # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_Tags.html#tag-restrictions
    ("ec2", "*", "TagSpecifications[].Tags[].Key"): (r"(?!aws:)[\s\S]{1,128}", "1 to 128 characters, not aws:"),
    ("ec2", "*", "TagSpecifications[].Tags[].Value"): (r"[\s\S]{0,256}", "at most 256 characters"),
}
#: EC2 takes at most 50 tags per resource (the same page).
EC2_MAX_TAGS = 50


@dataclass(frozen=True)
class Problem:
    """One value AWS would refuse: where it is in the request, the value, and what is allowed."""

    path: str
    value: Any
    allowed: str
    #: the model's number the value broke (a length or a count), where there is one
    limit: int | None = None
    #: the constraint as AWS words it ("Member must have length less than or equal to 63")
    constraint: str = ""


@cache
def _session() -> Any:
    return botocore.session.get_session()


@cache
def input_shape(service: str, operation: str) -> Any:
    return _session().get_service_model(service).operation_model(operation).input_shape


@cache
def _compiled(pattern: str) -> Any:
    return regex.compile(pattern)


def _generic(path: str) -> str:
    """A[3].B.C{key} -> A[].B.C{}: the path of a member whatever the index or key."""
    out, skip = [], False
    for char in path:
        if char in "[{":
            out.append(char)
            skip = True
        elif char in "]}":
            out.append(char)
            skip = False
        elif not skip:
            out.append(char)
    return "".join(out).replace("{}", "")


def _documented(service: str, operation: str, path: str) -> tuple[str, str] | None:
    generic = _generic(path)
    return DOCUMENTED.get((service, operation, generic)) or DOCUMENTED.get((service, "*", generic))


def _string(shape: Any, value: str, path: str, rule: tuple[str, str] | None) -> Iterator[Problem]:
    meta = shape.metadata
    low, high = meta.get("min"), meta.get("max")
    if high is not None and len(value) > high:
        yield Problem(
            path, value, f"at most {high} characters (it has {len(value)})", high,
            f"Member must have length less than or equal to {high}",
        )
    if low is not None and len(value) < low:
        yield Problem(
            path, value, f"at least {low} characters", low, f"Member must have length greater than or equal to {low}"
        )
    enum = meta.get("enum")
    if enum and value not in enum:
        yield Problem(
            path, value, f"one of {', '.join(enum)}", None, f"Member must satisfy enum value set: [{', '.join(enum)}]"
        )
    pattern = meta.get("pattern")
    if pattern and not _compiled(pattern).fullmatch(value):
        yield Problem(
            path, value, f"must match {pattern}", None, f"Member must satisfy regular expression pattern: {pattern}"
        )
    if rule and not _compiled(rule[0]).fullmatch(value):
        yield Problem(path, value, rule[1], None, rule[1])


def _walk(service: str, operation: str, shape: Any, value: Any, path: str) -> Iterator[Problem]:
    kind = shape.type_name
    meta = shape.metadata
    if kind == "structure" and isinstance(value, dict):
        for name, member in value.items():
            if name in shape.members:
                yield from _walk(service, operation, shape.members[name], member, f"{path}.{name}".lstrip("."))
    elif kind == "list" and isinstance(value, list):
        if meta.get("max") is not None and len(value) > meta["max"]:
            yield Problem(
                path, len(value), f"at most {meta['max']} items", meta["max"],
                f"Member must have length less than or equal to {meta['max']}",
            )
        for index, item in enumerate(value):
            yield from _walk(service, operation, shape.member, item, f"{path}[{index}]")
    elif kind == "map" and isinstance(value, dict):
        if meta.get("max") is not None and len(value) > meta["max"]:
            yield Problem(
                path, len(value), f"at most {meta['max']} entries", meta["max"],
                f"Member must have length less than or equal to {meta['max']}",
            )
        for key, item in value.items():
            yield from _walk(service, operation, shape.key, key, f"{path}{{{key}}}")
            yield from _walk(service, operation, shape.value, item, f"{path}{{{key}}}.value")
    elif kind == "string" and isinstance(value, str):
        # a map's key and its value have one generic path each: Environment{} and Environment{}.value
        yield from _string(shape, value, path, _documented(service, operation, path))
    elif kind in {"integer", "long"} and isinstance(value, int):
        if meta.get("max") is not None and value > meta["max"]:
            yield Problem(path, value, f"at most {meta['max']}", meta["max"], f"Member must be less than or equal to {meta['max']}")
        if meta.get("min") is not None and value < meta["min"]:
            yield Problem(
                path, value, f"at least {meta['min']}", meta["min"], f"Member must be greater than or equal to {meta['min']}"
            )


def aws_path(path: str) -> str:
    """Our path of a member (Tags[0].Value, HyperParameters{k}) as AWS names it in a ValidationException
    (tags.1.member.value, hyperParameters)."""
    parts: list[str] = []
    for segment in path.split("."):
        name, _, rest = segment.partition("[")
        name = name.split("{", 1)[0]
        if name == "value" and parts and "{" in path:
            continue
        parts.append(name[:1].lower() + name[1:])
        if rest:
            parts.append(f"{int(rest.rstrip(']')) + 1}.member")
    return ".".join(p for p in parts if p)


def validation_message(problems: list[Problem]) -> str:
    """AWS's ValidationException text for these problems."""
    shown = [f"Value '{p.value}' at '{aws_path(p.path)}' failed to satisfy constraint: {p.constraint}" for p in problems]
    noun = "error" if len(problems) == 1 else "errors"
    return f"{len(problems)} validation {noun} detected: {'; '.join(shown)}"


def problems(service: str, operation: str, request: dict[str, Any]) -> list[Problem]:
    """Every value of `request` that the operation's model (and AWS's documented rules) refuses."""
    shape = input_shape(service, operation)
    if shape is None:
        return []
    found = list(_walk(service, operation, shape, request, ""))
    if service == "ec2":
        for index, spec in enumerate(request.get("TagSpecifications") or []):
            if len(spec.get("Tags") or []) > EC2_MAX_TAGS:
                found.append(
                    Problem(
                        f"TagSpecifications[{index}].Tags", len(spec["Tags"]), f"at most {EC2_MAX_TAGS} tags",
                        EC2_MAX_TAGS, f"Member must have length less than or equal to {EC2_MAX_TAGS}",
                    )
                )
    return found
