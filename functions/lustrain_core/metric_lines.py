"""The metrics a training job's log lines carry, read through its MetricDefinitions (the regexes SageMaker itself
reads them with: steps/code.py). One reader for `lustrain report`'s curves and the run's MLflow metrics."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import regex

#: the MetricDefinition whose value is the step every other metric of the line is logged at
STEP = "step"


class Point(NamedTuple):
    step: float
    value: float
    #: when the line was logged (CloudWatch's timestamp)
    timestamp_ms: int


def each_point(
    lines: Iterable[tuple[int, str]], definitions: Iterable[dict[str, str]]
) -> Iterator[tuple[str, Point]]:
    """(metric name, point) of each metric a line logs beside its step, in the lines' order, from (timestamp ms,
    message) pairs, one line at a time. A metric of a line without a step is no point of any curve; a definition
    whose regex does not compile or captures nothing, and a capture that is no number, give none either (a spec's
    own metric_definitions.json may hold such)."""
    patterns: dict[str, Any] = {}
    for d in definitions:
        try:
            patterns[d["Name"]] = regex.compile(d["Regex"])
        except (regex.error, KeyError, TypeError):
            continue
    step_pattern = patterns.pop(STEP, None)
    if step_pattern is None:
        return
    for timestamp_ms, message in lines:
        step = _number(step_pattern.search(message))
        if step is None:
            continue
        for name, pattern in patterns.items():
            value = _number(pattern.search(message))
            if value is not None:
                yield name, Point(step, value, int(timestamp_ms))


def _number(found: Any) -> float | None:
    if not found:
        return None
    try:
        return float(found.group(1))
    except (IndexError, ValueError, TypeError):
        return None


def points(lines: Iterable[tuple[int, str]], definitions: Iterable[dict[str, str]]) -> dict[str, list[Point]]:
    """Each metric's points (each_point), by name; every defined metric named, with or without points."""
    found: dict[str, list[Point]] = {d["Name"]: [] for d in definitions if d.get("Name") != STEP}
    for name, point in each_point(lines, definitions):
        found[name].append(point)
    return found
