"""Read a CloudFormation / SAM template (YAML with short-form intrinsics) into plain data.

libyaml's parser where PyYAML has it (its wheels do), and one parse per version of the file: every twin and many
tests read template.yaml, which took about a second of CPU each time in pure Python. Each caller gets a copy of its
own to change.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

_BASE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _CfnLoader(_BASE):  # type: ignore[misc,valid-type]
    """SafeLoader that turns `!Ref X`, `!GetAtt A.B`, `!Sub ...` into their long forms."""


def _intrinsic(name: str):  # type: ignore[no-untyped-def]
    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> dict[str, Any]:
        if isinstance(node, yaml.ScalarNode):
            value: Any = loader.construct_scalar(node)
            if name == "Fn::GetAtt":
                value = str(value).split(".", 1)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
        return {name: value}

    return construct


for _tag in (
    "Ref", "Condition", "GetAtt", "Sub", "Join", "Select", "Split", "If", "Equals", "Not", "And", "Or",
    "GetAZs", "FindInMap", "Base64", "ImportValue", "Cidr", "Transform", "ToJsonString", "Length",
):  # fmt: skip
    _CfnLoader.add_constructor(
        f"!{_tag}", _intrinsic(_tag if _tag in ("Ref", "Condition") else f"Fn::{_tag}")
    )


def load_template(path: str | Path) -> dict[str, Any]:
    """The template as data: a copy of its own for the caller."""
    file = Path(path).resolve()
    found = file.stat()
    return copy.deepcopy(_parsed(file, found.st_mtime_ns, found.st_size))


@functools.lru_cache(maxsize=8)
def _parsed(file: Path, mtime_ns: int, size: int) -> dict[str, Any]:
    doc = yaml.load(file.read_text(), Loader=_CfnLoader)  # noqa: S506 - a SafeLoader subclass
    if not isinstance(doc, dict) or "Resources" not in doc:
        raise ValueError(f"{file} is not a CloudFormation template (no Resources)")
    return doc
