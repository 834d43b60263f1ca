"""register_job's pure parts: how a run is started, the job id, the code location, data measurement, the stack's
allow-lists (steps/policy.py)."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest
from lustrain_core import planner
from lustrain_core.errors import SpecForbidden, SpecInvalid
from lustrain_core.launch import compile_offline
from lustrain_core.spec import validate_spec
from lustrain_core.steps import job
from lustrain_core.steps.policy import Policy

SPEC: dict[str, Any] = {
    "name": "gpt-small",
    "code": {"source": "s3://code-bucket/gpt/"},
    "data": {"s3_uri": "s3://data-bucket/tokens/", "size_gib": 100},
    "output": {"s3_uri": "s3://results-bucket/gpt/"},
}


def spec_with(**sections: Any):
    doc = copy.deepcopy(SPEC)
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return validate_spec(doc)


def s3_event(version_id: str | None = "v-123", detail_type: str = "Object Created") -> dict[str, Any]:
    obj: dict[str, Any] = {"key": "jobs/gpt.yaml", "size": 300, "etag": "0123abcd", "sequencer": "00A1"}
    if version_id:
        obj["version-id"] = version_id
    return {
        "version": "0",
        "id": "1d7d7f07-7d4b-4a51-9bde-0b8a6c6e1e01",
        "detail-type": detail_type,
        "source": "aws.s3",
        "account": "123456789012",
        "time": "2026-11-20T09:14:07Z",
        "region": "us-east-1",
        "resources": ["arn:aws:s3:::jobs-bucket"],
        "detail": {
            "version": "0",
            "bucket": {"name": "jobs-bucket"},
            "object": obj,
            "request-id": "R1",
            "requester": "123456789012",
            "reason": "PutObject",
        },
    }


def field_of(exc: pytest.ExceptionInfo[SpecInvalid]) -> str:
    assert len(exc.value.errors) == 1, exc.value.message
    return exc.value.errors[0].path


# --- how a run starts ---------------------------------------------------------------------------------


def test_an_s3_drop_is_identified_by_bucket_key_and_etag():
    source = job.parse_start({"execution": "exec-1", "input": s3_event()})
    assert source.kind == "s3-event"
    # the ETag, not the version: the same spec put twice is one run (a versioned bucket gives each put a version)
    assert source.identity == "s3://jobs-bucket/jobs/gpt.yaml#0123abcd"
    assert (source.bucket, source.key, source.version_id, source.execution) == (
        "jobs-bucket",
        "jobs/gpt.yaml",
        "v-123",
        "exec-1",
    )


def test_an_unversioned_drop_is_identified_by_its_etag():
    source = job.parse_start({"execution": "exec-1", "input": s3_event(version_id=None)})
    assert source.identity == "s3://jobs-bucket/jobs/gpt.yaml#0123abcd"


def test_a_drop_without_an_etag_is_identified_by_its_version_or_refused():
    event = s3_event()
    del event["detail"]["object"]["etag"]
    assert job.parse_start({"execution": "e", "input": event}).identity.endswith("#v-123")
    event = s3_event(version_id=None)
    del event["detail"]["object"]["etag"]
    with pytest.raises(SpecInvalid) as exc:
        job.parse_start({"execution": "e", "input": event})
    assert field_of(exc) == "detail.object.etag"


def test_the_unwrapped_event_with_execution_beside_it_is_taken_too():
    source = job.parse_start({**s3_event(), "execution": "exec-2"})
    assert source.identity.endswith("#0123abcd") and source.execution == "exec-2"


def test_an_s3_event_other_than_object_created_is_refused_naming_detail_type():
    with pytest.raises(SpecInvalid) as exc:
        job.parse_start({"execution": "e", "input": s3_event(detail_type="Object Deleted")})
    assert field_of(exc) == "detail-type"
    assert "Object Created" in exc.value.message


def test_a_broken_s3_event_is_a_spec_error_not_a_crash():
    broken = s3_event()
    del broken["detail"]["bucket"]
    with pytest.raises(SpecInvalid, match="not an S3 Object Created event"):
        job.parse_start({"execution": "e", "input": broken})


def test_an_inline_start_is_identified_by_the_execution_name():
    source = job.parse_start({"execution": "console-run-7", "input": {"spec": SPEC}})
    assert source.kind == "inline" and source.identity == "console-run-7"
    assert source.inline_spec == SPEC


def test_a_spec_s3_uri_start_names_the_object():
    source = job.parse_start({"execution": "cli-1", "input": {"spec_s3_uri": "s3://jobs-bucket/a/gpt.yaml"}})
    assert (source.kind, source.bucket, source.key, source.identity) == (
        "s3-uri",
        "jobs-bucket",
        "a/gpt.yaml",
        "cli-1",
    )


@pytest.mark.parametrize(
    ("body", "path", "words"),
    [
        ({"spec": SPEC, "spec_s3_uri": "s3://b/k.yaml"}, "spec", "exactly one of"),
        ({}, "spec", "exactly one of"),
        ({"spec_s3_uri": "s3://jobs-bucket/prefix/"}, "spec_s3_uri", "not a prefix"),
        ({"spec_s3_uri": "https://example.com/spec.yaml"}, "spec_s3_uri", "S3 URI"),
    ],
)
def test_a_malformed_inline_start_names_what_is_wrong(body, path, words):
    with pytest.raises(SpecInvalid) as exc:
        job.parse_start({"execution": "e", "input": body})
    assert field_of(exc) == path
    assert words in exc.value.message


def test_an_inline_start_without_the_execution_name_is_refused_naming_execution():
    with pytest.raises(SpecInvalid) as exc:
        job.parse_start({"spec": SPEC})
    assert field_of(exc) == "execution"


def test_the_job_id_is_the_name_and_8_hex_of_the_identity_and_fits_a_training_job_name():
    identity = "s3://jobs-bucket/jobs/gpt.yaml#v-123"
    job_id = job.job_id_for("gpt-small", identity)
    assert job_id == "gpt-small-" + hashlib.sha256(identity.encode()).hexdigest()[:8]
    assert job.job_id_for("gpt-small", identity) == job_id
    assert job.job_id_for("gpt-small", identity + "x") != job_id
    longest = job.job_id_for("a" * 40, identity) + "-99"
    assert len(longest) <= 63


# --- the spec's code and data -------------------------------------------------------------------------


def test_a_local_code_source_is_refused_at_code_source_saying_the_cli_uploads_it():
    with pytest.raises(SpecInvalid) as exc:
        job.check_code_source(spec_with(code={"source": "trainer/"}))
    assert field_of(exc) == "code.source"
    assert "`lustrain submit SPEC" in exc.value.message and "s3://" in exc.value.message


def test_an_s3_code_source_passes():
    job.check_code_source(spec_with())


class FakeS3:
    """list_objects_v2 pages over a fixed listing."""

    def __init__(self, keys: dict[str, int], page_size: int = 2) -> None:
        self.keys, self.page_size = keys, page_size
        self.calls: list[dict[str, Any]] = []

    def get_paginator(self, operation: str) -> FakeS3:
        assert operation == "list_objects_v2"
        return self

    def paginate(self, **params: Any):
        self.calls.append(params)
        items = [
            {"Key": k, "Size": v} for k, v in sorted(self.keys.items()) if k.startswith(params["Prefix"])
        ]
        for i in range(0, len(items), self.page_size):
            yield {"Contents": items[i : i + self.page_size]}


def test_data_is_measured_over_every_page_with_bytes_per_extension():
    s3 = FakeS3({"tokens/a.bin": 2**30, "tokens/b.BIN": 2**29, "tokens/img/c.jpg": 2**29, "tokens/dir/": 0})
    gib, by_ext = job.measure_data(s3, "s3://data-bucket/tokens/")
    assert gib == 2.0
    assert by_ext == {".bin": 2**30 + 2**29, ".jpg": 2**29}
    assert s3.calls == [{"Bucket": "data-bucket", "Prefix": "tokens/"}]


def test_an_empty_data_prefix_is_refused_at_data_s3_uri():
    with pytest.raises(SpecInvalid) as exc:
        job.measure_data(FakeS3({"other/x": 1}), "s3://data-bucket/tokens/")
    assert field_of(exc) == "data.s3_uri"
    assert "no objects" in exc.value.message


def test_too_many_objects_to_measure_asks_for_data_size_gib(monkeypatch):
    monkeypatch.setattr(job, "MAX_MEASURED_OBJECTS", 3)
    with pytest.raises(SpecInvalid) as exc:
        job.measure_data(FakeS3({f"tokens/{i}": 1 for i in range(6)}), "s3://data-bucket/tokens/")
    assert field_of(exc) == "data.size_gib"


def test_the_measured_extensions_reach_the_planners_compression_judgement():
    text = planner.plan(spec_with(data={"size_gib": None}), data_gib=3000, extension_bytes={".txt": 1})
    images = planner.plan(spec_with(data={"size_gib": None}), data_gib=3000, extension_bytes={".jpg": 1})
    assert images.filesystem.stored_gib == 3000
    assert text.filesystem.stored_gib < 3000


def test_the_scratch_mount_path_rule_is_checked_when_the_job_is_compiled():
    spec = spec_with(filesystem={"mount_path": "/"}, output={"to_filesystem": True})
    with pytest.raises(SpecInvalid) as exc:
        compile_offline(spec)
    assert field_of(exc) == "filesystem.mount_path"


# --- the stack's allow-lists (steps/policy.py) --------------------------------------------------------


def forbidden(policy: Policy, spec: Any, team: str = "default") -> SpecForbidden:
    with pytest.raises(SpecForbidden) as exc:
        policy.check_spec(spec, team)
    return exc.value


def test_no_rules_allow_everything():
    policy = Policy.from_env({})
    policy.check_spec(spec_with(compute={"instance_count": 500}))
    policy.check_plan({"cost": {"total_usd": 10**9}})


def test_data_outside_the_allowed_prefixes_is_forbidden_naming_rule_and_field():
    policy = Policy.from_env({"LUSTRAIN_ALLOWED_DATA_PREFIXES": "s3://data-bucket/public/, s3://other/"})
    error = forbidden(policy, spec_with())
    assert error.details["rule"] == "LUSTRAIN_ALLOWED_DATA_PREFIXES"
    assert error.details["field"] == "data.s3_uri"
    assert "s3://data-bucket/public/" in error.message


def test_a_prefix_matches_at_a_path_boundary_only():
    policy = Policy.from_env({"LUSTRAIN_ALLOWED_DATA_PREFIXES": "s3://data-bucket/tok"})
    assert forbidden(policy, spec_with()).details["field"] == "data.s3_uri"
    Policy.from_env({"LUSTRAIN_ALLOWED_DATA_PREFIXES": "s3://data-bucket/tokens"}).check_spec(spec_with())
    Policy.from_env({"LUSTRAIN_ALLOWED_DATA_PREFIXES": "s3://data-bucket"}).check_spec(spec_with())


def test_output_and_checkpoints_must_both_be_the_runs_team_folder_of_an_output_prefix():
    policy = Policy.from_env({"LUSTRAIN_ALLOWED_OUTPUT_PREFIXES": "s3://results-bucket/,s3://more-results/"})
    mine = {"s3_uri": "s3://results-bucket/vision/"}
    policy.check_spec(spec_with(output=mine), "vision")
    policy.check_spec(spec_with(output=mine, checkpoints={"s3_uri": "s3://more-results/vision/"}), "vision")
    error = forbidden(policy, spec_with(output=mine, checkpoints={"s3_uri": "s3://elsewhere/ckpt/"}), "vision")
    assert error.details["field"] == "checkpoints.s3_uri"
    error = forbidden(policy, spec_with(output={"s3_uri": "s3://elsewhere/out/"}), "vision")
    assert error.details["field"] == "output.s3_uri"
    # a folder inside the team's, or another team's folder: a run's folder <prefix><team>/<job id>/ only
    for elsewhere in ("s3://results-bucket/vision/gpt/", "s3://results-bucket/speech/", "s3://results-bucket/"):
        error = forbidden(policy, spec_with(output={"s3_uri": elsewhere}), "vision")
        assert error.details == {**error.details, "field": "output.s3_uri", "rule": "LUSTRAIN_ALLOWED_OUTPUT_PREFIXES"}
        assert "s3://results-bucket/vision/, s3://more-results/vision/" in error.message


@pytest.mark.parametrize(
    ("section", "uri", "field"),
    [
        ("output", "s3://stack-artifacts/archive/", "output.s3_uri"),
        ("output", "s3://stack-artifacts/", "output.s3_uri"),
        ("checkpoints", "s3://stack-artifacts/code/gpt-small-0123abcd/", "checkpoints.s3_uri"),
        ("data", "s3://stack-artifacts/uploads/team/", "data.s3_uri"),
    ],
)
def test_no_spec_points_into_the_stacks_code_uploads_or_archives(section, uri, field):
    """Whatever the allow-lists say (an administrator may allow the whole artifacts bucket), a job's writes never
    land where the stack keeps code bundles, uploaded code and archives."""
    from lustrain_core.config import Settings

    settings = Settings(
        artifacts_bucket="stack-artifacts", extra={"LUSTRAIN_ALLOWED_OUTPUT_PREFIXES": "s3://stack-artifacts/"}
    )
    error = forbidden(Policy.for_stack(settings), spec_with(**{section: {"s3_uri": uri}}))
    assert error.details == {**error.details, "rule": "reserved", "field": field}
    assert "s3://stack-artifacts/" in error.message
    Policy.for_stack(settings).check_spec(spec_with(output={"s3_uri": "s3://stack-artifacts/default/"}))


def test_code_on_s3_must_lie_under_the_code_prefixes_the_stack_allows():
    policy = Policy.from_env(
        {"LUSTRAIN_ALLOWED_CODE_PREFIXES": "s3://data-bucket/, s3://stack-artifacts/uploads/"}
    )
    policy.check_spec(spec_with(code={"source": "s3://stack-artifacts/uploads/gpt/0123/"}))
    error = forbidden(policy, spec_with())
    assert (error.details["rule"], error.details["field"]) == (
        "LUSTRAIN_ALLOWED_CODE_PREFIXES",
        "code.source",
    )
    assert "s3://code-bucket/gpt/" in error.message and "s3://stack-artifacts/uploads/" in error.message


def test_instance_type_and_count_rules_name_their_field():
    policy = Policy.from_env(
        {"LUSTRAIN_ALLOWED_INSTANCE_TYPES": "ml.g5.48xlarge", "LUSTRAIN_MAX_INSTANCES_PER_RUN": "4"}
    )
    error = forbidden(policy, spec_with())
    assert (error.details["rule"], error.details["field"]) == (
        "LUSTRAIN_ALLOWED_INSTANCE_TYPES",
        "compute.instance_type",
    )
    assert "ml.g5.48xlarge" in error.message
    policy = Policy.from_env({"LUSTRAIN_MAX_INSTANCES_PER_RUN": "4"})
    error = forbidden(policy, spec_with(compute={"instance_count": 5}))
    assert (error.details["rule"], error.details["field"]) == (
        "LUSTRAIN_MAX_INSTANCES_PER_RUN",
        "compute.instance_count",
    )
    policy.check_spec(spec_with(compute={"instance_count": 4}))


def test_custom_images_must_come_from_an_allowed_registry_host_or_account():
    uri = "111122223333.dkr.ecr.us-east-1.amazonaws.com/team/pytorch:2.8"
    by_host = Policy.from_env(
        {"LUSTRAIN_ALLOWED_IMAGE_REGISTRIES": "111122223333.dkr.ecr.us-east-1.amazonaws.com"}
    )
    by_account = Policy.from_env({"LUSTRAIN_ALLOWED_IMAGE_REGISTRIES": "111122223333"})
    by_host.check_spec(spec_with(image={"uri": uri}))
    by_account.check_spec(spec_with(image={"uri": uri}))
    other = Policy.from_env({"LUSTRAIN_ALLOWED_IMAGE_REGISTRIES": "999988887777"})
    error = forbidden(other, spec_with(image={"uri": uri}))
    assert (error.details["rule"], error.details["field"]) == (
        "LUSTRAIN_ALLOWED_IMAGE_REGISTRIES",
        "image.uri",
    )
    other.check_spec(spec_with())  # a framework_version image is SageMaker's own


def test_existing_network_and_file_system_must_be_allow_listed_by_id():
    reuse = spec_with(
        network={"subnet_id": "subnet-0123456789abcdef0", "security_group_ids": ["sg-0123456789abcdef0"]},
        filesystem={"file_system_id": "fs-0123456789abcdef0"},
    )
    Policy.from_env({}).check_spec(reuse)
    allowed = "subnet-0123456789abcdef0,sg-0123456789abcdef0,fs-0123456789abcdef0"
    Policy.from_env({"LUSTRAIN_ALLOWED_EXISTING_RESOURCES": allowed}).check_spec(reuse)
    # the stack's default: nothing existing may be used, and a run that names nothing is not affected
    none = Policy.from_env({"LUSTRAIN_ALLOWED_EXISTING_RESOURCES": "none"})
    none.check_spec(spec_with())
    error = forbidden(none, reuse)
    assert (error.details["rule"], error.details["field"]) == (
        "LUSTRAIN_ALLOWED_EXISTING_RESOURCES",
        "network.subnet_id",
    )
    assert "subnet-0123456789abcdef0" in error.message and "creates its own" in error.message
    only_network = Policy.from_env(
        {"LUSTRAIN_ALLOWED_EXISTING_RESOURCES": "subnet-0123456789abcdef0,sg-0123456789abcdef0"}
    )
    assert forbidden(only_network, reuse).details["field"] == "filesystem.file_system_id"
    other_group = Policy.from_env(
        {"LUSTRAIN_ALLOWED_EXISTING_RESOURCES": "subnet-0123456789abcdef0,fs-0123456789abcdef0"}
    )
    assert forbidden(other_group, reuse).details["field"] == "network.security_group_ids"


def test_an_estimate_above_the_stack_budget_is_forbidden_naming_the_rule():
    policy = Policy.from_env({"LUSTRAIN_MAX_BUDGET_USD": "1000"})
    policy.check_plan({"cost": {"total_usd": 999.5}})
    with pytest.raises(SpecForbidden) as exc:
        policy.check_plan({"cost": {"total_usd": 1809.02}})
    assert exc.value.details["rule"] == "LUSTRAIN_MAX_BUDGET_USD"
    assert "$1,809.02" in exc.value.message and "$1,000.00" in exc.value.message


@pytest.mark.parametrize(
    ("env", "words"),
    [
        (
            {"LUSTRAIN_MAX_INSTANCES_PER_RUN": "many"},
            "LUSTRAIN_MAX_INSTANCES_PER_RUN='many' is not a whole number",
        ),
        ({"LUSTRAIN_MAX_BUDGET_USD": "-5"}, "must be above 0"),
        ({"LUSTRAIN_ALLOWED_DATA_PREFIXES": "data-bucket/x"}, "not an s3:// prefix"),
    ],
)
def test_a_broken_stack_setting_is_reported_by_its_variable(env, words):
    with pytest.raises(ValueError, match=words):
        Policy.from_env(env)
