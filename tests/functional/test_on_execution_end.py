"""on_execution_end on moto: the run of a stopped execution is found by its execution name and torn down; one whose
teardown already ran, or an execution that recorded no run, is left alone; a malformed event names its field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from infra_support import REGION, MinuteLeft, count_of_job, invoke, job_record, register
from lustrain_core.errors import EventInvalid

from lustrain.twin import faults
from lustrain.twin.patches import fsx as twin_fsx

SAMPLE = json.loads((Path(__file__).resolve().parents[2] / "events" / "on_execution_end.json").read_text())
NOTHING = {"vpcs": 0, "subnets": 0, "security_groups": 0, "route_tables": 0, "endpoints": 0, "file_systems": 0}


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setenv("LUSTRAIN_TEARDOWN_POLL_SECONDS", "0.01")
    faults.clear()
    twin_fsx.configure(polls=1)


def status_change(execution: str, status: str = "ABORTED", **detail: Any) -> dict[str, Any]:
    event = copy.deepcopy(SAMPLE)
    machine = event["detail"]["stateMachineArn"]
    arn = machine.replace(":stateMachine:", ":execution:") + ":" + execution
    event["detail"].update(executionArn=arn, name=execution, status=status, **detail)
    event["resources"] = [arn]
    return event


def built(execution: str) -> dict[str, Any]:
    """A run stopped while its file system was being made: network and file system exist."""
    document = register(execution=execution)
    document["network"] = invoke("create_network", document)
    document["poll"] = {"initial_seconds": 1, "max_seconds": 1, "max_polls": 5}
    document["filesystem"] = invoke("create_filesystem", document)
    return document


def published(topic_queue: str) -> list[str]:
    sqs = boto3.client("sqs", region_name=REGION)
    return [m["Body"] for m in sqs.receive_message(QueueUrl=topic_queue, MaxNumberOfMessages=10).get("Messages", [])]


@pytest.fixture
def notices(aws) -> str:
    sqs = boto3.client("sqs", region_name=REGION)
    queue = sqs.create_queue(QueueName="notices")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    boto3.client("sns", region_name=REGION).subscribe(
        TopicArn=aws.notify_topic_arn, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"}
    )
    return str(queue)


def test_a_stopped_run_is_torn_down_recorded_as_cancelled_and_announced(aws, notices):
    document = built("run-stopped")
    job_id = document["job"]["job_id"]
    assert count_of_job(job_id)["file_systems"] == 1

    result = invoke("on_execution_end", status_change("run-stopped", error="RunCancelled", cause="by alice"), MinuteLeft())

    assert result["action"] == "torn down" and result["job_id"] == job_id
    assert count_of_job(job_id) == NOTHING
    record = job_record(aws.jobs_table, job_id)
    assert record["status"] == "FAILED" and record["resources"] == []
    assert record["error"]["Error"] == "RunCancelled"
    assert "was stopped (StopExecution)" in record["error"]["Cause"] and "by alice" in record["error"]["Cause"]
    (body,) = published(notices)
    assert body.startswith(f"lustrain run {job_id} cancelled.")
    facts = json.loads(body.split("\n\n")[-1])
    assert {d["type"] for d in facts["deleted"]} >= {"file_system", "vpc", "subnet", "security_group"}


def test_a_stop_without_a_cause_says_where_to_find_who_stopped_it(aws):
    document = built("run-bare")
    result = invoke("on_execution_end", status_change("run-bare", error=None, cause=None), MinuteLeft())
    assert "CloudTrail" in result["error"]["Cause"] and "no error or cause given" in result["error"]["Cause"]
    assert count_of_job(document["job"]["job_id"]) == NOTHING


def test_a_timed_out_execution_is_torn_down_as_run_timed_out(aws):
    document = built("run-late")
    result = invoke("on_execution_end", status_change("run-late", status="TIMED_OUT", error=None), MinuteLeft())
    assert result["error"]["Error"] == "RunTimedOut"
    assert count_of_job(document["job"]["job_id"]) == NOTHING


def test_a_failed_execution_whose_teardown_ran_is_left_alone(aws, notices):
    document = built("run-failed")
    invoke("teardown", {**document, "error": {"Error": "FileSystemFailed", "Cause": "FAILED"}}, MinuteLeft())
    before = job_record(aws.jobs_table, document["job"]["job_id"])

    result = invoke("on_execution_end", status_change("run-failed", status="FAILED", error="FileSystemFailed"))

    assert result["action"] == "none" and "already ran" in result["reason"]
    assert job_record(aws.jobs_table, document["job"]["job_id"]) == before
    assert published(notices) == []


def test_an_execution_that_recorded_no_run_created_nothing_to_tear_down(aws):
    result = invoke("on_execution_end", status_change("never-registered"))
    assert result["action"] == "none" and "recorded no run" in result["reason"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("executionArn", "arn:aws:states:us-east-1:123456789012:stateMachine:m"), ("status", "STOPPED")],
)
def test_a_malformed_event_names_the_event_field(aws, field, value):
    event = status_change("x")
    event["detail"][field] = value
    with pytest.raises(EventInvalid) as info:
        invoke("on_execution_end", event)
    assert f"detail.{field}" in str(info.value) and "invalid event" in str(info.value)
    assert "Step Functions Execution Status Change" in str(info.value)
