"""Write every Task state's Retry in statemachine/training_job.asl.json from the run policy (lustrain_core.recovery).

The per-call retries of the state machine (Lambda's own errors, throttling and 5xx, an incomplete teardown) are
decided once, in recovery.CALL_RETRIERS; this script writes them into the definition, whose other parts are
written by hand. Run it after changing them:

    .venv/bin/python scripts/render_asl.py          rewrite the definition
    .venv/bin/python scripts/render_asl.py --check  exit 1 when the definition differs (tests/unit/test_recovery_policy.py)
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lustrain_core.recovery import Retrier, retriers_for

DEFINITION = Path(__file__).resolve().parents[1] / "statemachine" / "training_job.asl.json"
PLACEHOLDER = re.compile(r"\$\{(\w+)\}")
RETRY = re.compile(r'^(?P<indent> *)"Retry": \[', re.M)


def parsed(text: str) -> dict[str, Any]:
    """The definition as JSON: each unquoted ${Name} placeholder read as the string "${Name}"."""
    quoted = re.sub(r"(:\s*)\$\{(\w+)\}(?=\s*[,}\]])", r'\1"${\2}"', text)
    return json.loads(quoted)  # type: ignore[no-any-return]


def tasks_with_retry(states: dict[str, Any]) -> Iterator[str]:
    """The names of the states that have a Retry, in the order the file writes them (branches inside)."""
    for name, state in states.items():
        if "Retry" in state:
            yield name
        for branch in state.get("Branches", []):
            yield from tasks_with_retry(branch["States"])


def _value(value: object) -> str:
    if isinstance(value, str) and PLACEHOLDER.fullmatch(value):
        return value  # a number, filled in by DefinitionSubstitutions
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value)


def retry_text(retriers: tuple[Retrier, ...], indent: str) -> str:
    inner, field = indent + "  ", indent + "    "
    rules = []
    for retrier in retriers:
        lines = [f'{field}"{key}": {_value(value)}' for key, value in retrier.asl().items()]
        rules.append(f"{inner}{{\n" + ",\n".join(lines) + f"\n{inner}}}")
    return f'{indent}"Retry": [\n' + ",\n".join(rules) + f"\n{indent}]"


def _end_of_list(text: str, start: int) -> int:
    """The index just past the `]` that closes the list opened at text[start] (strings may hold brackets)."""
    depth, i, in_string = 0, start, False
    while i < len(text):
        char = text[i]
        if in_string:
            if char == "\\":
                i += 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced brackets in the definition")


def rendered(text: str) -> str:
    names = list(tasks_with_retry(parsed(text)["States"]))
    matches = list(RETRY.finditer(text))
    if len(names) != len(matches):
        raise ValueError(f"{len(matches)} Retry lists in the text but {len(names)} states with one")
    out, last = [], 0
    for name, match in zip(names, matches, strict=True):
        end = _end_of_list(text, match.end() - 1)
        out.append(text[last : match.start()])
        out.append(retry_text(retriers_for(name), match["indent"]))
        last = end
    out.append(text[last:])
    return "".join(out)


def main(argv: list[str]) -> int:
    text = DEFINITION.read_text()
    new = rendered(text)
    if "--check" in argv:
        if new != text:
            print(f"{DEFINITION.name}: its Retry lists differ from the run policy; run scripts/render_asl.py")
            return 1
        return 0
    DEFINITION.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
