"""on_execution_end on moto: the run of a stopped execution is found by its execution name and torn down; one whose
teardown already ran, or an execution that recorded no run, is left alone; a malformed event names its field.

Each run has an execution of a (moto, non-executing) state machine, the stack's own: it stays RUNNING until the
test stops it, and DescribeExecution is what on_execution_end believes. An end moto cannot reach (TIMED_OUT, FAILED)
is served by botocore's Stubber, which checks the answer against the API model. A forged event (another state
machine, an execution still running) changes nothing."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from infra_support import (
    REGION,
    MinuteLeft,
    count_of_job,
    invoke,
    job_record,
    prepare_spec,
    register,
    sfn,
    state_machine,
)
from lustrain_core import clients
from lustrain_core.errors import EventInvalid

from lustrain.twin import faults
from lustrain.twin.patches import fsx as twin_fsx

SAMPLE = json.loads((Path(__file__).resolve().parents[2] / "events" / "on_execution_end.json").read_text())
NOTHING = {
    "vpcs": 0,
    "subnets": 0,
    "security_groups": 0,
    "route_tables": 0,
    "endpoints": 0,
    "file_systems": 0,
}


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setenv("LUSTRAIN_TEARDOWN_POLL_SECONDS", "0.01")
    faults.clear()
    twin_fsx.configure(polls=1)




@pytest.fixture
def machine(aws, monkeypatch) -> str:
    """The stack's own state machine (LUSTRAIN_STATE_MACHINE_ARN, as template.yaml sets it)."""
    arn = state_machine("lustrain-test-runs")
    monkeypatch.setenv("LUSTRAIN_STATE_MACHINE_ARN", arn)
    return arn


def execution_arn(machine: str, execution: str) -> str:
    return machine.replace(":stateMachine:", ":execution:") + ":" + execution


def status_change(machine: str, execution: str, status: str = "ABORTED", **detail: Any) -> dict[str, Any]:
    event = copy.deepcopy(SAMPLE)
    arn = execution_arn(machine, execution)
    event["detail"].update(executionArn=arn, stateMachineArn=machine, name=execution, status=status, **detail)
    event["resources"] = [arn]
    return event


def stop(machine: str, execution: str, **reason: str) -> None:
    sfn().stop_execution(executionArn=execution_arn(machine, execution), **reason)


def described_as(machine: str, execution: str, status: str, **ended: Any) -> Stubber:
    """DescribeExecution answers that the execution ended `status` (an end moto's executions never reach)."""
    arn = execution_arn(machine, execution)
    answer = {
        "executionArn": arn,
        "stateMachineArn": machine,
        "name": execution,
        "status": status,
        "startDate": datetime(2026, 12, 1, 8, 0, tzinfo=UTC),
        "stopDate": datetime(2026, 12, 1, 9, 0, tzinfo=UTC),
        **ended,
    }
    stubber = Stubber(clients.client("stepfunctions"))
    stubber.add_response("describe_execution", answer, {"executionArn": arn})
    return stubber


def built(machine: str, execution: str) -> dict[str, Any]:
    """A run stopped while its file system was being made: network and file system exist."""
    sfn().start_execution(stateMachineArn=machine, name=execution, input="{}")
    document = register(execution=execution)
    document["network"] = invoke("create_network", document)
    document["poll"] = {"initial_seconds": 1, "max_seconds": 1, "max_polls": 5}
    document["filesystem"] = invoke("create_filesystem", document)
    return document


def published(topic_queue: str) -> list[str]:
    sqs = boto3.client("sqs", region_name=REGION)
    return [
        m["Body"]
        for m in sqs.receive_message(QueueUrl=topic_queue, MaxNumberOfMessages=10).get("Messages", [])
    ]


@pytest.fixture
def notices(aws) -> str:
    sqs = boto3.client("sqs", region_name=REGION)
    queue = sqs.create_queue(QueueName="notices")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    boto3.client("sns", region_name=REGION).subscribe(
        TopicArn=aws.notify_topic_arn, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"}
    )
    return str(queue)


def test_a_stopped_run_is_torn_down_recorded_as_cancelled_and_announced(aws, machine, notices):
    document = built(machine, "run-stopped")
    job_id = document["job"]["job_id"]
    assert count_of_job(job_id)["file_systems"] == 1
    stop(machine, "run-stopped", error="RunCancelled", cause="by alice")

    event = status_change(machine, "run-stopped", error="RunCancelled", cause="by alice")
    result = invoke("on_execution_end", event, MinuteLeft())

    assert result["action"] == "torn down" and result["job_id"] == job_id
    assert count_of_job(job_id) == NOTHING
    record = job_record(aws.jobs_table, job_id)
    assert record["status"] == "FAILED" and record["resources"] == []
    assert record["error"]["Error"] == "RunCancelled"
    assert (
        "was stopped (StopExecution)" in record["error"]["Cause"] and "by alice" in record["error"]["Cause"]
    )
    (body,) = published(notices)
    assert body.startswith(f"lustrain run {job_id} cancelled.")
    facts = json.loads(body.split("\n\n")[-1])
    assert {d["type"] for d in facts["deleted"]} >= {"file_system", "vpc", "subnet", "security_group"}


def test_a_stop_without_a_cause_says_where_to_find_who_stopped_it(aws, machine):
    document = built(machine, "run-bare")
    stop(machine, "run-bare")
    result = invoke(
        "on_execution_end", status_change(machine, "run-bare", error=None, cause=None), MinuteLeft()
    )
    assert "CloudTrail" in result["error"]["Cause"] and "no error or cause given" in result["error"]["Cause"]
    assert count_of_job(document["job"]["job_id"]) == NOTHING


def test_a_timed_out_execution_is_torn_down_as_run_timed_out(aws, machine):
    document = built(machine, "run-late")
    with described_as(machine, "run-late", "TIMED_OUT"):
        result = invoke(
            "on_execution_end",
            status_change(machine, "run-late", status="TIMED_OUT", error=None),
            MinuteLeft(),
        )
    assert (
        result["error"]["Error"] == "RunTimedOut"
        and "timed out at 2026-12-01T09:00:00Z" in result["error"]["Cause"]
    )
    assert count_of_job(document["job"]["job_id"]) == NOTHING


def test_a_failed_execution_whose_teardown_ran_is_left_alone(aws, machine, notices):
    document = built(machine, "run-failed")
    invoke("teardown", {**document, "error": {"Error": "FileSystemFailed", "Cause": "FAILED"}}, MinuteLeft())
    before = job_record(aws.jobs_table, document["job"]["job_id"])

    event = status_change(machine, "run-failed", status="FAILED", error="FileSystemFailed")
    with described_as(machine, "run-failed", "FAILED", error="FileSystemFailed", cause="FAILED"):
        result = invoke("on_execution_end", event)

    assert result["action"] == "none" and "already ran" in result["reason"]
    assert job_record(aws.jobs_table, document["job"]["job_id"]) == before
    assert published(notices) == []


def test_an_execution_that_recorded_no_run_created_nothing_to_tear_down(aws, machine):
    sfn().start_execution(stateMachineArn=machine, name="never-registered", input="{}")
    stop(machine, "never-registered")
    result = invoke("on_execution_end", status_change(machine, "never-registered"))
    assert result["action"] == "none" and "recorded no run" in result["reason"]


def test_an_aborted_event_for_another_state_machine_changes_nothing(aws, machine, notices):
    """Another state machine's execution, stopped, carrying the name of a live run of ours: nothing is touched."""
    document = built(machine, "run-live")
    job_id = document["job"]["job_id"]
    other = state_machine("someone-elses-machine")
    sfn().start_execution(stateMachineArn=other, name="run-live", input="{}")
    stop(other, "run-live")
    before = job_record(aws.jobs_table, job_id)

    result = invoke("on_execution_end", status_change(other, "run-live"), MinuteLeft())

    assert result["action"] == "none" and "not this stack's" in result["reason"] and other in result["reason"]
    assert count_of_job(job_id)["file_systems"] == 1 and count_of_job(job_id)["vpcs"] == 1
    assert job_record(aws.jobs_table, job_id) == before
    assert published(notices) == []


def test_an_aborted_event_whose_execution_still_runs_changes_nothing(aws, machine, notices):
    document = built(machine, "run-live")
    job_id = document["job"]["job_id"]
    before = job_record(aws.jobs_table, job_id)

    result = invoke("on_execution_end", status_change(machine, "run-live"), MinuteLeft())

    assert result["action"] == "none" and "DescribeExecution says RUNNING" in result["reason"]
    assert count_of_job(job_id)["file_systems"] == 1 and count_of_job(job_id)["vpcs"] == 1
    assert job_record(aws.jobs_table, job_id) == before
    assert sfn().describe_execution(executionArn=execution_arn(machine, "run-live"))["status"] == "RUNNING"
    assert published(notices) == []


def test_an_event_whose_status_is_not_the_executions_end_changes_nothing(aws, machine):
    document = built(machine, "run-stopped")
    stop(machine, "run-stopped")
    result = invoke(
        "on_execution_end", status_change(machine, "run-stopped", status="TIMED_OUT"), MinuteLeft()
    )
    assert result["action"] == "none" and "says ABORTED" in result["reason"]
    assert count_of_job(document["job"]["job_id"])["file_systems"] == 1


def test_an_execution_step_functions_does_not_know_changes_nothing(aws, machine):
    built(machine, "run-1")
    result = invoke("on_execution_end", status_change(machine, "never-started"))
    assert result["action"] == "none" and "ExecutionDoesNotExist" in result["reason"]


def test_without_the_stacks_state_machine_no_end_is_acted_on(aws, machine, monkeypatch):
    monkeypatch.delenv("LUSTRAIN_STATE_MACHINE_ARN")
    with pytest.raises(ValueError, match="LUSTRAIN_STATE_MACHINE_ARN"):
        invoke("on_execution_end", status_change(machine, "run-1"))


@pytest.mark.parametrize(
    ("field", "value"),
    [("executionArn", "arn:aws:states:us-east-1:123456789012:stateMachine:m"), ("status", "STOPPED")],
)
def test_a_malformed_event_names_the_event_field(aws, machine, field, value):
    event = status_change(machine, "x")
    event["detail"][field] = value
    with pytest.raises(EventInvalid) as info:
        invoke("on_execution_end", event)
    assert f"detail.{field}" in str(info.value) and "invalid event" in str(info.value)
    assert "Step Functions Execution Status Change" in str(info.value)


def test_a_stopped_data_preparation_run_is_torn_down_and_announced(aws, machine, notices):
    """A kind: prepare record (no training spec) is torn down and its end published as a training run's is."""
    spec = prepare_spec()
    sfn().start_execution(stateMachineArn=machine, name="prep-stopped", input="{}")
    job = invoke("register_job", {"execution": "prep-stopped", "input": {"spec": spec}})
    stop(machine, "prep-stopped", error="RunCancelled", cause="by alice")

    result = invoke(
        "on_execution_end", status_change(machine, "prep-stopped", error="RunCancelled"), MinuteLeft()
    )

    assert (result["action"], result["job_id"], result["teardown"]["remaining"]) == (
        "torn down",
        job["job_id"],
        [],
    )
    assert job_record(aws.jobs_table, job["job_id"])["status"] == "FAILED"
    (notice,) = published(notices)
    assert job["job_id"] in notice and "cancelled" in notice.lower()
