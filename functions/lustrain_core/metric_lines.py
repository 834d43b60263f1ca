"""The metrics a training job's log lines carry, read through its MetricDefinitions (the regexes SageMaker itself
reads them with: steps/code.py). One reader for `lustrain report`'s curves and the run's MLflow metrics."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import regex

#: the MetricDefinition whose value is the step every other metric of the line is logged at
STEP = "step"


class Point(NamedTuple):
    step: float
    value: float
    #: when the line was logged (CloudWatch's timestamp)
    timestamp_ms: int


def points(lines: Iterable[tuple[int, str]], definitions: Iterable[dict[str, str]]) -> dict[str, list[Point]]:
    """Each metric a line logs beside its step, in the lines' order, from (timestamp ms, message) pairs; a metric
    of a line without a step is not a point of any curve."""
    patterns = {d["Name"]: regex.compile(d["Regex"]) for d in definitions}
    step_pattern = patterns.pop(STEP, None)
    found: dict[str, list[Point]] = {name: [] for name in patterns}
    if step_pattern is None:
        return found
    for timestamp_ms, message in lines:
        step = step_pattern.search(message)
        if not step:
            continue
        for name, pattern in patterns.items():
            value = pattern.search(message)
            if value:
                found[name].append(Point(float(step.group(1)), float(value.group(1)), int(timestamp_ms)))
    return found
