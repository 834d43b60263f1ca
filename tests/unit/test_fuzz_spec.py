"""Fuzzing the pure edges: spec text, spec documents, run starts, SageMaker events and state documents.

Whatever comes in, each reader returns its typed value or raises SpecInvalid, whose every error names a field
path and says what is allowed; nothing else escapes (no KeyError, TypeError, pydantic ValidationError,
yaml/json errors, OverflowError). A spec that passes is planned, and the plan is strict JSON (it travels through
Step Functions and DynamoDB, which take neither NaN nor Infinity).

The strategies here (`json_values`, `mutated`) are the fuzz's vocabulary; tests/functional/test_fuzz_handlers.py
sends the same to the handlers on moto. Examples are derandomized: the same on every run.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lustrain_core.document import Job
from lustrain_core.errors import SpecInvalid
from lustrain_core.planner import plan
from lustrain_core.spec import JobSpec, load_spec, validate_spec
from lustrain_core.steps.events import parse_state_change
from lustrain_core.steps.job import parse_start

pytestmark = pytest.mark.slow

EVENTS = Path(__file__).resolve().parents[2] / "events"
SPEC: dict[str, Any] = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml").read_text()
)
SPEC["code"]["source"] = "s3://fuzz-code/tiny/"

_FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def fuzz(examples: int) -> settings:
    return settings(_FUZZ, max_examples=examples)


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=40)
    | st.sampled_from(["", "auto", "s3://", "s3://b/k", "fs-0123456789abcdef0", "subnet-01234567", "0", "-1"])
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=16), json_values, max_size=6)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path into a JSON value (dict keys and list indexes)."""
    if prefix:
        yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from paths(inner, (*prefix, index))


def mutated(base: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    """`base` with one to three of its parts replaced by anything, removed, or given a new sibling."""
    doc = copy.deepcopy(base)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3), label="mutations")):
        found = list(paths(doc))
        if not found:
            break
        # each depth as likely as any other: a whole part ($.network) breaks as often as one of its leaves
        depth = data.draw(st.sampled_from(sorted({len(p) for p in found})), label="depth")
        path = data.draw(st.sampled_from([p for p in found if len(p) == depth]), label="path")
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        action = data.draw(st.sampled_from(["replace", "remove", "add"]), label="action")
        if action == "replace":
            parent[path[-1]] = data.draw(json_values, label="value")
        elif action == "remove":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[data.draw(st.text(max_size=12), label="new key")] = data.draw(json_values, label="value")
    return doc


def sample(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((EVENTS / f"{name}.json").read_text())
    return loaded


def named_errors(raised: SpecInvalid) -> None:
    """Every error of a SpecInvalid says where and what: a message, and a field path (or the whole document)."""
    assert raised.errors
    for error in raised.errors:
        assert error.message.strip()
        assert isinstance(error.path, str)
        assert str(error).startswith(error.path or "(spec)")


def planned(spec: JobSpec) -> None:
    """A valid spec plans, or its plan is refused by name; a plan is strict JSON."""
    try:
        the_plan = plan(spec)
    except SpecInvalid as raised:
        named_errors(raised)
        return
    json.dumps(the_plan.to_dict(), allow_nan=False)


# ------------------------------------------------------------------------------------------------ specs


@fuzz(300)
@given(text=st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_any_text_is_a_spec_or_a_named_refusal(text):
    try:
        load_spec(text)
    except SpecInvalid as raised:
        named_errors(raised)


@fuzz(200)
@given(doc=json_values)
def test_any_yaml_or_json_document_is_a_spec_or_a_named_refusal(doc):
    for text in (yaml.safe_dump(doc), json.dumps(doc)):
        try:
            planned(load_spec(text))
        except SpecInvalid as raised:
            named_errors(raised)


@fuzz(400)
@given(data=st.data())
def test_a_spec_with_parts_broken_is_refused_by_name_or_planned(data):
    doc = mutated(SPEC, data)
    try:
        spec = validate_spec(doc)
    except SpecInvalid as raised:
        named_errors(raised)
        # the path starts at a field of the spec, or is the unknown key that was added at the top
        tops = set(JobSpec.model_fields) | set(doc)
        assert all(
            not e.path or any(e.path == k or e.path.startswith(f"{k}.") for k in tops) for e in raised.errors
        )
        return
    planned(spec)


def test_the_base_spec_is_valid_and_plans():
    planned(validate_spec(SPEC))


# ------------------------------------------------------------------------------------- starts and events


def read_or_refused_by_name(read: Any, value: Any) -> None:
    """`read(value)` answers, or raises SpecInvalid whose every error names its field."""
    try:
        read(value)
    except SpecInvalid as raised:
        named_errors(raised)


@fuzz(150)
@given(event=json_objects)
def test_any_object_is_a_run_start_or_a_named_refusal(event):
    read_or_refused_by_name(parse_start, event)


@fuzz(200)
@given(data=st.data(), start=st.sampled_from(["register_job", "register_job_inline"]))
def test_a_run_start_with_parts_broken_is_read_or_refused_by_name(data, start):
    read_or_refused_by_name(parse_start, mutated(sample(start), data))


@fuzz(200)
@given(data=st.data(), name=st.sampled_from(["on_training_event", "on_training_event_failed"]))
def test_a_training_event_with_parts_broken_is_read_or_refused_by_name(data, name):
    read_or_refused_by_name(parse_state_change, mutated(sample(name), data))


@fuzz(250)
@given(data=st.data(), name=st.sampled_from(["create_filesystem", "check_filesystem", "start_training"]))
def test_a_state_document_with_parts_broken_is_read_or_refused_by_name(data, name):
    read_or_refused_by_name(Job.from_document, mutated(sample(name), data))


def test_the_samples_read_as_they_are():
    assert parse_start(sample("register_job")).kind == "s3-event"
    assert parse_state_change(sample("on_training_event")).detail.TrainingJobStatus == "Completed"
    assert Job.from_document(sample("start_training"), "network", "filesystem", "code").job_id.startswith(
        "gpt-small-"
    )


# ----------------------------------------------------------------------------- bugs the fuzz found


def test_non_finite_numbers_are_refused_by_name():
    """Bug: `.nan` / `.inf` passed the spec (a hyperparameter, data.size_gib: .inf) and broke the plan and
    DynamoDB, neither of which takes them."""
    for section, field, value in (
        ("code", "hyperparameters", {"lr": float("nan")}),
        ("data", "size_gib", float("inf")),
        ("budget", "max_usd", float("inf")),
    ):
        doc = copy.deepcopy(SPEC)
        doc.setdefault(section, {})[field] = value
        with pytest.raises(SpecInvalid) as raised:
            validate_spec(doc)
        assert raised.value.errors[0].path.startswith(f"{section}.{field}")


def test_a_size_beyond_any_file_system_is_refused_not_planned_forever():
    """Bug: filesystem.storage_gib (or data.size_gib) of 10**20 made the planner list every valid capacity up
    to it, until the process ran out of memory."""
    for section, field in (
        ("filesystem", "storage_gib"),
        ("data", "size_gib"),
        ("output", "expected_size_gib"),
    ):
        doc = copy.deepcopy(SPEC)
        doc.setdefault(section, {})[field] = 10**20
        with pytest.raises(SpecInvalid) as raised:
            validate_spec(doc)
        assert raised.value.errors[0].path == f"{section}.{field}"


def test_an_event_time_out_of_range_is_refused_by_name():
    """Bug: an epoch-milliseconds time beyond the platform's range raised OverflowError/OSError from inside the
    model, which pydantic does not turn into a validation error."""
    event = sample("on_training_event")
    event["detail"]["CreationTime"] = 10**30
    with pytest.raises(SpecInvalid) as raised:
        parse_state_change(event)
    assert raised.value.errors[0].path == "detail.CreationTime"


def test_a_state_document_from_nowhere_is_refused_before_any_step_reads_it():
    """Bug: a document without $.network reached create_filesystem's `document["network"]` (KeyError), a plan
    that was not an object reached `dict(plan)` (TypeError)."""
    document = sample("create_filesystem")
    del document["network"]
    with pytest.raises(SpecInvalid) as raised:
        Job.from_document(document, "network")
    assert raised.value.errors[0].path == "network"
    document = sample("create_filesystem")
    document["job"]["plan"] = True
    with pytest.raises(SpecInvalid) as raised:
        Job.from_document(document)
    assert raised.value.errors[0].path.startswith("job.plan")
