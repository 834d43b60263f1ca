"""The infra handlers' boundary: the sample events in events/ parse with the models the handlers use, and AWS's
transient failures reach the state machine under the names its Retry knows."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError
from lustrain_core import aws_requests
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.document import Job
from lustrain_core.errors import AwsThrottled, AwsUnavailable
from lustrain_core.spec import validate_spec
from lustrain_core.steps import filesystem as fs
from lustrain_core.steps import job

EVENTS = Path(__file__).resolve().parents[2] / "events"


def load(name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / f"{name}.json").read_text())
    return event


def test_the_s3_drop_sample_is_an_object_created_event_the_handler_reads():
    source = job.parse_start(load("register_job"))
    assert source.kind == "s3-event"
    assert (
        source.identity
        == "s3://lustrain-jobs-123456789012/jobs/gpt-small.yaml#b1946ac92492d2347c6235b4d2611184"
    )
    assert source.execution


def test_the_inline_sample_carries_a_valid_spec():
    source = job.parse_start(load("register_job_inline"))
    assert source.kind == "inline" and source.inline_spec is not None
    job.check_code_source(validate_spec(source.inline_spec))


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("check_quota", {"job", "recovery"}),
        ("create_network", {"job", "recovery", "quota"}),
        ("create_filesystem", {"job", "quota", "network", "poll"}),
        ("check_filesystem", {"job", "quota", "network", "poll", "filesystem"}),
        ("teardown", {"job", "recovery", "quota", "network", "filesystem", "code", "training"}),
    ],
)
def test_each_state_document_sample_holds_the_registered_job_and_what_came_before(name, keys):
    document = load(name)
    assert set(document) == keys
    registered = Job.from_document(document)
    assert registered.job_id == document["job"]["job_id"]
    assert registered.job_id == job.job_id_for(registered.spec.name, document["job"]["source"]["identity"])
    assert registered.plan["network"]["ips_needed"] > 0


@pytest.mark.parametrize("path", sorted(EVENTS.glob("*.json")), ids=lambda p: p.stem)
def test_each_samples_registered_job_is_what_register_job_compiles_for_its_spec(path):
    """A sample never drifts from the compiler: its plan and launch plan are the ones register_job makes
    (scripts/refresh_events.py rewrites them)."""
    sys.path.insert(0, str(EVENTS.parent / "scripts"))
    from refresh_events import refreshed

    document = json.loads(path.read_text())
    assert refreshed(json.loads(path.read_text())) == document


def test_the_execution_end_sample_is_a_status_change_the_handler_reads():
    from lustrain_core.steps import execution_end

    change = execution_end.parse_status_change(load("on_execution_end")).detail
    assert change.status == "ABORTED" and change.executionArn.endswith(":" + change.name)
    error = execution_end.run_error(change)
    assert error["Error"] == "RunCancelled"
    assert "arn:aws:sts::123456789012:assumed-role/ml-team/alice" in error["Cause"]
    # the sweeper's stop keeps the sweeper's error
    swept = change.model_copy(update={"error": "RunAbandoned", "cause": "stopped by the sweeper: past its deadline"})
    assert execution_end.run_error(swept)["Error"] == "RunAbandoned"


def test_an_execution_failed_without_its_teardown_keeps_its_cause_in_words():
    """A Lambda error that ended the execution (States.Runtime, or a Fail state's cause) is its message in the run's
    record and notice: no Lambda error JSON, no stack trace."""
    from lustrain_core.steps import execution_end

    change = execution_end.parse_status_change(load("on_execution_end")).detail
    raised = json.dumps({"errorMessage": "the quota 'ml.p4d.24xlarge for training job usage' is 0 in us-east-1",
                         "errorType": "QuotaExceeded", "stackTrace": ['  File "/var/task/handler.py", line 9\n']})
    failed = change.model_copy(update={"status": "FAILED", "error": "StepFunctionsError",
                                       "cause": json.dumps({"Error": "States.TaskFailed", "Cause": raised})})
    cause = execution_end.run_error(failed)["Cause"]
    assert cause.endswith(": States.TaskFailed: the quota 'ml.p4d.24xlarge for training job usage' is 0 in us-east-1")
    assert "stackTrace" not in cause and "errorMessage" not in cause


def test_the_file_system_samples_agree_with_the_directory_path_rule():
    for name in ("check_filesystem", "teardown"):
        document = load(name)
        described = document["filesystem"]
        mount_path = Job.from_document(document).spec.filesystem.mount_path
        assert described["directory_path"] == aws_requests.directory_path(described["mount_name"], mount_path)
    assert fs.poll_settings(load("check_filesystem")) == load("check_filesystem")["poll"]


def test_the_network_sample_names_the_subnet_and_group_the_file_system_uses():
    network = load("create_filesystem")["network"]
    assert network["subnet_id"].startswith("subnet-") and network["security_group_ids"][0].startswith("sg-")


# --- AWS's transient failures, as the state machine's Retry sees them ----------------------------------


def client_error(code: str, status: int = 400) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "try later"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "CreateFileSystem",
    )


def raised_by(exc: BaseException) -> BaseException:
    @translate_aws_errors()
    def step() -> None:
        raise exc

    with pytest.raises(BaseException) as info:
        step()
    return info.value


@pytest.mark.parametrize(
    "code",
    ["Throttling", "ThrottlingException", "TooManyRequestsException", "RequestLimitExceeded", "SlowDown"],
)
def test_throttling_codes_become_aws_throttled(code):
    error = raised_by(client_error(code))
    assert isinstance(error, AwsThrottled)
    assert "CreateFileSystem" in error.message and code in error.message


@pytest.mark.parametrize(
    ("code", "status"), [("ServiceUnavailable", 503), ("InternalError", 500), ("Whatever", 502)]
)
def test_5xx_and_internal_errors_become_aws_unavailable(code, status):
    assert isinstance(raised_by(client_error(code, status)), AwsUnavailable)


@pytest.mark.parametrize(
    "exc",
    [
        EndpointConnectionError(endpoint_url="https://fsx.us-east-1.amazonaws.com"),
        ConnectTimeoutError(endpoint_url="https://fsx.us-east-1.amazonaws.com"),
        ReadTimeoutError(endpoint_url="https://fsx.us-east-1.amazonaws.com"),
    ],
)
def test_no_answer_from_aws_becomes_aws_unavailable(exc):
    assert isinstance(raised_by(exc), AwsUnavailable)


def test_a_real_answer_passes_through_untouched():
    original = client_error("AccessDeniedException")
    assert raised_by(original) is original
    assert isinstance(raised_by(ValueError("mine")), ValueError)


def test_the_context_manager_form_translates_too():
    with pytest.raises(AwsThrottled), translate_aws_errors():
        raise client_error("ThrottlingException")


def test_the_prepare_sample_is_a_data_preparations_document_after_its_first_stage():
    """events/prepare.json: what the prepare handler reads (`sam local invoke PrepareFunction -e`)."""
    from lustrain_core.document import Sections
    from lustrain_core.spec import validate_prepare_spec

    document = load("prepare")
    assert document["job"]["kind"] == "prepare"
    spec = validate_prepare_spec(document["job"]["spec"])
    assert document["job"]["job_id"] == job.job_id_for(spec.name, document["job"]["source"]["identity"])
    sections = Sections.of(document, "network", "code")
    assert sections.network is not None and sections.code is not None
    assert document["prepare"]["done"] == ["plan"] and document["prepare"]["stage"] == "work"
