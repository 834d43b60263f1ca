"""Read a CloudFormation / SAM template (YAML with short-form intrinsics) into plain data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class _CfnLoader(yaml.SafeLoader):
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
    doc = yaml.load(Path(path).read_text(), Loader=_CfnLoader)  # noqa: S506 - a SafeLoader subclass
    if not isinstance(doc, dict) or "Resources" not in doc:
        raise ValueError(f"{path} is not a CloudFormation template (no Resources)")
    return doc
