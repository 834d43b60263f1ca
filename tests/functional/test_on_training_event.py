"""on_training_event on moto: SageMaker's state changes answered to the waiting execution, once each, as
DescribeTrainingJob gives them, never as the event says.

The job is started by start_training on the twin and held there; a Failed / Stopped job is the twin's job moved
to that state, and the Completed description (with its artifacts and metrics) is served by botocore's Stubber (it
checks the answer against the API model), while S3, DynamoDB and Step Functions stay moto. The SFN client's calls
are recorded as sent. Forged and replayed events change nothing.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.stub import ANY, Stubber
from infra_support import REGION, invoke
from lustrain_core import clients
from lustrain_core.errors import AwsThrottled
from lustrain_core.steps.job import split_s3_uri
from training_support import (
    RESULTS_BUCKET,
    TOKEN,
    calls_of,
    held_training_jobs,
    move_job,
    token_item,
    training_input,
)

from lustrain.twin.patches.s3 import crc64nvme_base64

EVENTS = Path(__file__).resolve().parents[2] / "events"
MODEL = b"model weights " * 1000
OUTPUT = b"output data " * 500
WRITES = {"PutObject", "CopyObject", "UploadPartCopy", "CreateMultipartUpload"}


@pytest.fixture
def started(aws):
    """A run whose training job start_training created and which now waits for its end."""
    from lustrain.twin.patches import service_quotas

    service_quotas.set_quota("ml.p4d.24xlarge", 4, REGION)
    with held_training_jobs():
        event = training_input()
        result = invoke("start_training", event)
        yield {"settings": aws, "name": result["training_job_name"], "job_id": event["job"]["job_id"]}


def state_change(name: str, status: str, **detail) -> dict:
    event = json.loads((EVENTS / "on_training_event.json").read_text())
    event["detail"] = {**event["detail"], "TrainingJobName": name, "TrainingJobStatus": status, **detail}
    event["resources"] = [f"arn:aws:sagemaker:{REGION}:123456789012:training-job/{name}"]
    if status != "Completed":
        event["detail"].pop("ModelArtifacts")
    return event


def uploader():
    """An S3 client that sends no checksum of its own, as an uploader that does not: S3 adds its CRC64NVME."""
    return boto3.client("s3", region_name=REGION, config=Config(request_checksum_calculation="when_required"))


def completed_description(name: str, bucket: str | None = None) -> dict:
    """What DescribeTrainingJob says once the job has completed, its artifacts where SageMaker uploaded them
    (its OutputDataConfig.S3OutputPath: the run's archive; `bucket`: a results bucket, as an older run's)."""
    described = boto3.client("sagemaker", region_name=REGION).describe_training_job(TrainingJobName=name)
    described.pop("ResponseMetadata")
    if bucket is None:
        bucket, base = split_s3_uri(described["OutputDataConfig"]["S3OutputPath"], "S3OutputPath")
    else:
        base = "tiny/"
    prefix = f"{base}{name}/output/"
    s3 = uploader()
    if bucket == RESULTS_BUCKET:
        s3.create_bucket(Bucket=RESULTS_BUCKET)
    s3.put_object(Bucket=bucket, Key=prefix + "model.tar.gz", Body=MODEL)
    s3.put_object(Bucket=bucket, Key=prefix + "output.tar.gz", Body=OUTPUT)
    end = datetime(2026, 11, 21, 6, 35, tzinfo=UTC)
    described.update(
        TrainingJobStatus="Completed",
        SecondaryStatus="Completed",
        TrainingEndTime=end,
        ModelArtifacts={"S3ModelArtifacts": f"s3://{bucket}/{prefix}model.tar.gz"},
        FinalMetricDataList=[
            {"MetricName": "train_loss", "Value": 2.31, "Timestamp": end},
            {"MetricName": "tokens_per_second", "Value": 412000.0, "Timestamp": end},
        ],
        BillableTimeInSeconds=3512,
    )
    return described


def stub_describe(description: dict) -> Stubber:
    """DescribeTrainingJob answers `description` once (use it as a context manager)."""
    stubber = Stubber(clients.client("sagemaker"))
    stubber.add_response(
        "describe_training_job",
        copy.deepcopy(description),
        {"TrainingJobName": description["TrainingJobName"]},
    )
    return stubber


def archive_listing(settings, job_id: str) -> dict[str, bytes]:
    s3 = boto3.client("s3", region_name=REGION)
    prefix = f"{settings.archive_prefix}{job_id}/"
    listed = s3.list_objects_v2(Bucket=settings.artifacts_bucket, Prefix=prefix).get("Contents", [])
    return {
        o["Key"][len(prefix) :]: s3.get_object(Bucket=settings.artifacts_bucket, Key=o["Key"])["Body"].read()
        for o in listed
    }


def test_three_deliveries_of_completed_archive_once_and_call_back_once(started):
    settings, name, job_id = started["settings"], started["name"], started["job_id"]
    description = completed_description(name)
    stubber = stub_describe(description)
    event = state_change(name, "Completed")

    with (
        stubber,
        calls_of(clients.client("stepfunctions")) as sfn_calls,
        calls_of(clients.client("s3")) as s3_calls,
    ):
        first = invoke("on_training_event", event)
        writes_after_first = [op for op, _ in s3_calls if op in WRITES]
        second = invoke("on_training_event", event)
        third = invoke("on_training_event", event)

    stubber.assert_no_pending_responses()
    assert first["callback"] == "send_task_success"
    assert second["duplicate"] is True and third["duplicate"] is True
    assert [op for op, _ in s3_calls if op in WRITES] == writes_after_first  # nothing archived again
    assert [op for op, _ in sfn_calls] == ["SendTaskSuccess"]
    params = sfn_calls[0][1]
    assert params["taskToken"] == TOKEN
    output = json.loads(params["output"])
    archive = f"s3://{settings.artifacts_bucket}/archive/{job_id}/"
    assert output == {
        "training_job_name": name,
        "status": "Completed",
        "archive_s3_uri": archive,
        "manifest_s3_uri": archive + "manifest.json",
        "model_artifacts": description["ModelArtifacts"]["S3ModelArtifacts"],
        "metrics": {"train_loss": 2.31, "tokens_per_second": 412000.0},
        "billable_seconds": 3512,
    }
    assert token_item(settings.tokens_table, name)["status"] == "callback_sent"


def test_the_manifest_lists_every_archived_object_with_its_size_and_s3s_checksum(started):
    """The model is archived where SageMaker uploaded it (under the archive's jobs/), nothing copied; each object
    is listed with its size and the checksum S3 keeps with it, which is the CRC64NVME of its bytes."""
    settings, name, job_id = started["settings"], started["name"], started["job_id"]
    with stub_describe(completed_description(name)), calls_of(clients.client("s3")) as s3_calls:
        invoke("on_training_event", state_change(name, "Completed"))

    stored = archive_listing(settings, job_id)
    manifest = json.loads(stored.pop("manifest.json"))
    job_output = f"jobs/{name}/output/"
    assert set(stored) == {
        job_output + "model.tar.gz",
        job_output + "output.tar.gz",
        "describe_training_job.json",
        "final_metrics.json",
    }
    listed = {entry["name"]: entry for entry in manifest["objects"]}
    assert set(listed) == set(stored)
    for key, body in stored.items():
        assert listed[key]["size"] == len(body)
        assert listed[key]["s3_uri"] == f"s3://{settings.artifacts_bucket}/archive/{job_id}/{key}"
        assert listed[key]["checksum"]["value"]
    for key in (job_output + "model.tar.gz", job_output + "output.tar.gz"):
        assert listed[key]["checksum"] == {
            "algorithm": "CRC64NVME",
            "value": crc64nvme_base64(stored[key]),
            "type": "FULL_OBJECT",
        }
    assert {listed[job_output + "model.tar.gz"]["role"], listed[job_output + "output.tar.gz"]["role"]} == {
        "model",
        "output",
    }
    assert stored[job_output + "model.tar.gz"] == MODEL and stored[job_output + "output.tar.gz"] == OUTPUT
    assert not [op for op, _ in s3_calls if op in {"CopyObject", "UploadPartCopy"}]
    description = json.loads(stored["describe_training_job.json"])
    assert description["TrainingJobName"] == name
    assert description["TrainingEndTime"] == "2026-11-21T06:35:00+00:00"
    assert manifest["job_id"] == job_id and manifest["missing"] == []


def test_a_planted_manifest_does_not_stop_the_real_archive(started):
    """A manifest.json put at the archive by anyone but the archive (naming this very job, listing objects that are
    not there) is not taken for the archive: the model is archived and the manifest written over it."""
    settings, name, job_id = started["settings"], started["name"], started["job_id"]
    archive = f"s3://{settings.artifacts_bucket}/archive/{job_id}/"
    planted = {
        "job_id": job_id,
        "training_job_name": name,
        "archive_s3_uri": archive,
        "objects": [
            {
                "name": "describe_training_job.json",
                "s3_uri": archive + "describe_training_job.json",
                "size": 2,
                "sha256": "0" * 64,
            }
        ],
        "missing": [],
    }
    boto3.client("s3", region_name=REGION).put_object(
        Bucket=settings.artifacts_bucket,
        Key=f"archive/{job_id}/manifest.json",
        Body=json.dumps(planted).encode(),
    )

    with stub_describe(completed_description(name)):
        answered = invoke("on_training_event", state_change(name, "Completed"))

    assert answered["callback"] == "send_task_success"
    stored = archive_listing(settings, job_id)
    manifest = json.loads(stored.pop("manifest.json"))
    assert stored[f"jobs/{name}/output/model.tar.gz"] == MODEL
    assert {entry["name"] for entry in manifest["objects"]} == set(stored)
    assert manifest != planted


def test_an_archive_found_complete_is_not_written_again(started):
    """The event repeated after the archive was written but before the callback was recorded (a crash between
    them): the manifest this archive wrote is recognised and nothing is written again."""
    settings, name, job_id = started["settings"], started["name"], started["job_id"]
    from lustrain_core.steps.archive import archive_training_job

    description = completed_description(name)
    s3 = clients.client("s3")
    target = f"s3://{settings.artifacts_bucket}/archive/{job_id}/"
    first = archive_training_job(s3, copy.deepcopy(description), target, job_id)

    with calls_of(s3) as s3_calls:
        again = archive_training_job(s3, copy.deepcopy(description), target, job_id)

    assert again == first
    assert not [op for op, _ in s3_calls if op in WRITES]


def test_failed_with_capacity_error_fails_the_task_as_capacity_error_once(started):
    settings, name = started["settings"], started["name"]
    reason = "CapacityError: Unable to provision requested ML compute capacity. Please retry using a different ML instance type."
    move_job(name, "Failed", "Failed", reason)
    event = state_change(name, "Failed", SecondaryStatus="Failed", FailureReason=reason)

    with calls_of(clients.client("stepfunctions")) as sfn_calls:
        result = invoke("on_training_event", event)
        repeat = invoke("on_training_event", event)

    assert result["error"] == "CapacityError" and repeat["duplicate"] is True
    assert sfn_calls == [("SendTaskFailure", {"taskToken": TOKEN, "error": "CapacityError", "cause": reason})]
    assert token_item(settings.tokens_table, name)["outcome"] == {"error": "CapacityError", "cause": reason}


def test_stopped_fails_the_task_as_training_stopped(started):
    move_job(started["name"], "Stopped", "MaxRuntimeExceeded")
    event = state_change(started["name"], "Stopped", SecondaryStatus="MaxRuntimeExceeded")
    with calls_of(clients.client("stepfunctions")) as sfn_calls:
        invoke("on_training_event", event)
    ((operation, params),) = sfn_calls
    assert (operation, params["error"]) == ("SendTaskFailure", "TrainingStopped")
    assert "MaxRuntimeExceeded" in params["cause"]


def test_in_progress_sends_a_heartbeat_and_notes_the_secondary_status(started):
    settings, name = started["settings"], started["name"]
    move_job(name, "InProgress", "Downloading")
    with calls_of(clients.client("stepfunctions")) as sfn_calls:
        result = invoke("on_training_event", state_change(name, "InProgress", SecondaryStatus="Starting"))
    assert sfn_calls == [("SendTaskHeartbeat", {"taskToken": TOKEN})]
    assert result["heartbeat"] == "sent"
    item = token_item(settings.tokens_table, name)
    assert (item["secondary_status"], item["status"]) == ("Downloading", "waiting")


def test_a_job_this_stack_did_not_start_is_ignored(aws):
    with calls_of(clients.client("stepfunctions")) as sfn_calls:
        result = invoke("on_training_event", state_change("someone-elses-job-1", "Completed"))
    assert result["ignored"] is True
    assert sfn_calls == []


def test_an_execution_that_already_ended_is_noted_not_raised(started):
    described = stub_describe(completed_description(started["name"]))
    sfn = Stubber(clients.client("stepfunctions"))
    sfn.add_client_error(
        "send_task_success",
        service_error_code="TaskTimedOut",
        expected_params={"taskToken": TOKEN, "output": ANY},
    )
    with described, sfn:
        result = invoke("on_training_event", state_change(started["name"], "Completed"))
    assert result["callback"] == "execution_gone" and result["reason"] == "TaskTimedOut"


def test_a_throttled_callback_is_retried_by_the_next_delivery_without_archiving_again(started):
    settings, name = started["settings"], started["name"]
    event = state_change(name, "Completed")
    sfn = Stubber(clients.client("stepfunctions"))
    sfn.add_client_error("send_task_success", service_error_code="ThrottlingException", http_status_code=400)
    with stub_describe(completed_description(name)), sfn, pytest.raises(AwsThrottled):
        invoke("on_training_event", event)
    assert token_item(settings.tokens_table, name)["status"] == "waiting"

    with (
        stub_describe(completed_description(name)),
        calls_of(clients.client("stepfunctions")) as sfn_calls,
        calls_of(clients.client("s3")) as s3_calls,
    ):
        result = invoke("on_training_event", event)
    assert result["callback"] == "send_task_success"
    assert [op for op, _ in sfn_calls] == ["SendTaskSuccess"]
    assert not [op for op, _ in s3_calls if op in WRITES]


def test_a_forged_capacity_error_for_a_live_job_changes_nothing(started):
    """The event says Failed / CapacityError; SageMaker says the job is InProgress: no callback, no heartbeat,
    the token still waits for the job's real end (and no second attempt can start beside it)."""
    settings, name = started["settings"], started["name"]
    reason = "CapacityError: Unable to provision requested ML compute capacity."
    event = state_change(name, "Failed", SecondaryStatus="Failed", FailureReason=reason)

    with calls_of(clients.client("stepfunctions")) as sfn_calls:
        result = invoke("on_training_event", event)

    assert result["ignored"] is True and result["sagemaker_status"] == "InProgress"
    assert "the event says Failed but SageMaker says" in result["reason"]
    assert sfn_calls == []
    item = token_item(settings.tokens_table, name)
    assert item["status"] == "waiting" and "outcome" not in item
    jobs = boto3.client("sagemaker", region_name=REGION).list_training_jobs(StatusEquals="InProgress")
    assert [j["TrainingJobName"] for j in jobs["TrainingJobSummaries"]] == [name]


def test_the_failure_answered_is_sagemakers_not_the_events(started):
    name = started["name"]
    move_job(name, "Failed", "Failed", "AlgorithmError: ExecuteUserScriptError: exit code 1")
    forged = state_change(
        name, "Failed", FailureReason="CapacityError: Unable to provision requested ML compute."
    )

    with calls_of(clients.client("stepfunctions")) as sfn_calls:
        result = invoke("on_training_event", forged)

    assert result["error"] == "TrainingFailed"
    ((operation, params),) = sfn_calls
    assert (operation, params["error"]) == ("SendTaskFailure", "TrainingFailed")
    assert params["cause"].startswith("AlgorithmError")


def test_a_replayed_end_after_the_callback_changes_nothing(started):
    name = started["name"]
    move_job(name, "Failed", "Failed", "InternalServerError: We encountered an internal error.")
    event = state_change(
        name, "Failed", FailureReason="InternalServerError: We encountered an internal error."
    )
    invoke("on_training_event", event)

    with calls_of(clients.client("stepfunctions")) as sfn_calls, calls_of(clients.client("sagemaker")) as sm:
        replay = invoke("on_training_event", event)
    assert replay["duplicate"] is True and sfn_calls == [] and sm == []


def _record_says(settings, job_id: str, expression: str, values: dict) -> None:
    clients.client("dynamodb").update_item(
        TableName=settings.jobs_table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression=expression,
        ExpressionAttributeValues=values,
    )


def test_an_event_for_an_attempt_the_run_has_left_changes_nothing(started):
    """The run's record has moved on to attempt 2: attempt 1's end, whatever SageMaker says of it, answers nothing
    (the token that waits belongs to attempt 2's task)."""
    settings, name, job_id = started["settings"], started["name"], started["job_id"]
    move_job(name, "Failed", "Failed", "CapacityError: Unable to provision requested ML compute capacity.")
    _record_says(settings, job_id, "SET training_attempts = :two", {":two": {"N": "2"}})

    with calls_of(clients.client("stepfunctions")) as sfn_calls:
        result = invoke("on_training_event", state_change(name, "Failed"))

    assert (
        result["ignored"] is True and "not run" in result["reason"] and "current attempt" in result["reason"]
    )
    assert sfn_calls == [] and token_item(settings.tokens_table, name)["status"] == "waiting"


def test_an_event_for_an_attempt_already_judged_changes_nothing(started):
    settings, name, job_id = started["settings"], started["name"], started["job_id"]
    move_job(name, "Failed", "Failed", "CapacityError: Unable to provision requested ML compute capacity.")
    _record_says(settings, job_id, "SET judged_attempt = :one", {":one": {"N": "1"}})

    with calls_of(clients.client("stepfunctions")) as sfn_calls:
        result = invoke("on_training_event", state_change(name, "Failed"))

    assert result["ignored"] is True and "judged already" in result["reason"]
    assert sfn_calls == []


def test_a_late_in_progress_event_for_an_ended_job_answers_its_end(started):
    """Events come out of order: an InProgress delivered after the job failed answers the failure SageMaker
    describes."""
    name = started["name"]
    move_job(name, "Failed", "Failed", "InternalServerError: We encountered an internal error.")
    with calls_of(clients.client("stepfunctions")) as sfn_calls:
        result = invoke("on_training_event", state_change(name, "InProgress", SecondaryStatus="Training"))
    assert result["error"] == "InfrastructureError"
    assert [op for op, _ in sfn_calls] == ["SendTaskFailure"]
