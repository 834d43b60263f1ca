"""start_training on moto with the twin's SageMaker: the token is kept first, then the job is created; a retried
start (its earlier try's answer lost: Lambda's timeout, a lost response) adopts its attempt's job whatever its
state, a new attempt starts only once next_attempt judged the last and no job of the run is live, and SageMaker's
refusals become the errors the state machine catches."""

from __future__ import annotations

import json
import time

import boto3
import pytest
from infra_support import REGION, invoke, job_record, spec
from lustrain_core import clients
from lustrain_core.errors import (
    AwsThrottled,
    CapacityError,
    QuotaExceeded,
    TrainingJobCompleted,
    TrainingJobStillRunning,
)
from training_support import TOKEN, calls_of, held_training_jobs, move_job, token_item, training_input


@pytest.fixture
def p4d_quota(aws):
    from lustrain.twin.patches import service_quotas

    service_quotas.set_quota("ml.p4d.24xlarge", 4, REGION)
    with held_training_jobs():
        yield aws


def test_the_job_is_created_with_the_whole_request_and_the_token_is_kept(p4d_quota):
    settings = p4d_quota
    event = training_input()
    job_id = event["job"]["job_id"]
    before = time.time()

    result = invoke("start_training", event)

    name = f"tiny-{job_id.rsplit('-', 1)[1]}-1"
    assert result["training_job_name"] == name and result["attempt"] == 1 and result["adopted"] is False
    described = boto3.client("sagemaker", region_name=REGION).describe_training_job(TrainingJobName=name)
    assert described["TrainingJobStatus"] == "InProgress"
    assert described["RoleArn"] == settings.sagemaker_role_arn
    assert described["AlgorithmSpecification"]["TrainingImage"].endswith("/pytorch-training:2.8-gpu-py312")
    source = described["InputDataConfig"][0]["DataSource"]["FileSystemDataSource"]
    assert source["DirectoryPath"] == "/abcdef12/data" and source["FileSystemAccessMode"] == "ro"
    assert described["HyperParameters"]["sagemaker_program"] == '"train.py"'
    assert described["VpcConfig"]["Subnets"] == ["subnet-0f1e2d3c4b5a69788"]

    item = token_item(settings.tokens_table, name)
    assert item["token"] == TOKEN and item["job_id"] == job_id and item["status"] == "waiting"
    assert item["archive_target"] == f"s3://{settings.artifacts_bucket}/archive/{job_id}/"
    # max_runtime_hours is 1: the item lives an hour and a day
    assert int(before) + 3600 + 86400 <= item["expires_at"] <= time.time() + 3600 + 86400 + 1

    assert {"type": "training_job", "id": name} in job_record(settings.jobs_table, job_id)["resources"]


def test_the_job_is_created_in_a_launcher_session_tagged_with_the_run(p4d_quota, monkeypatch):
    """The session that calls CreateTrainingJob is the launcher role's, tagged lustrain-run = <job id>, its team and
    the SageMaker job's name, and the request chains its tags to the job's session of the execution role (whose S3
    grants name the run and the team, and whose log grants the job's name)."""
    launcher = "arn:aws:iam::123456789012:role/lustrain-launcher/lustrain-test/launcher"
    monkeypatch.setenv("LUSTRAIN_LAUNCHER_ROLE_ARN", launcher)
    event = training_input()
    job_id = event["job"]["job_id"]

    with calls_of(clients.client("sts")) as sts_calls, calls_of(clients.client("sagemaker")) as lambda_calls:
        result = invoke("start_training", event)

    assert [op for op, _ in sts_calls] == ["AssumeRole"]
    params = sts_calls[0][1]
    assert params["RoleArn"] == launcher
    assert params["Tags"] == [
        {"Key": "lustrain-run", "Value": job_id},
        {"Key": "lustrain-team", "Value": "default"},
        {"Key": "lustrain-job", "Value": result["training_job_name"]},
    ]
    # the function's own client describes; the launcher session's creates
    assert "CreateTrainingJob" not in [op for op, _ in lambda_calls]
    described = boto3.client("sagemaker", region_name=REGION).describe_training_job(
        TrainingJobName=result["training_job_name"]
    )
    assert described["OutputDataConfig"]["S3OutputPath"].endswith(f"/archive/{job_id}/jobs/")


def test_the_token_and_the_ledger_entry_are_written_before_the_job_exists(p4d_quota):
    settings = p4d_quota
    event = training_input()
    seen_at_create = {}

    def look(params, **_):
        name = params["TrainingJobName"]
        seen_at_create["token"] = token_item(settings.tokens_table, name)
        seen_at_create["ledger"] = job_record(settings.jobs_table, event["job"]["job_id"])["resources"]

    sagemaker = clients.client("sagemaker")
    sagemaker.meta.events.register("provide-client-params.sagemaker.CreateTrainingJob", look)
    result = invoke("start_training", event)

    assert seen_at_create["token"]["token"] == TOKEN
    assert {"type": "training_job", "id": result["training_job_name"]} in seen_at_create["ledger"]


def test_a_retry_while_the_job_runs_adopts_it_with_the_new_token(p4d_quota):
    settings = p4d_quota
    event = training_input()
    first = invoke("start_training", event)

    sagemaker = clients.client("sagemaker")
    with calls_of(sagemaker) as calls:
        again = invoke("start_training", {**event, "task_token": "AQCEAAAA-second-token"})

    assert again["training_job_name"] == first["training_job_name"] and again["adopted"] is True
    assert [op for op, _ in calls] == ["DescribeTrainingJob"]  # no second fleet of p4d instances
    assert token_item(settings.tokens_table, first["training_job_name"])["token"] == "AQCEAAAA-second-token"


def in_progress() -> list[str]:
    jobs = boto3.client("sagemaker", region_name=REGION).list_training_jobs(StatusEquals="InProgress")
    return [j["TrainingJobName"] for j in jobs["TrainingJobSummaries"]]


def judged(settings, job_id: str, attempt: int) -> None:
    """What next_attempt leaves in the record once it has judged an attempt."""
    clients.client("dynamodb").update_item(
        TableName=settings.jobs_table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression="SET judged_attempt = :n",
        ExpressionAttributeValues={":n": {"N": str(attempt)}},
    )


def answered(settings, name: str, outcome: dict) -> None:
    """What on_training_event leaves once it answered the job's end (to a token that may no longer wait)."""
    from lustrain_core.steps import records

    clients.client("dynamodb").update_item(
        TableName=settings.tokens_table,
        Key={"training_job_name": {"S": name}},
        UpdateExpression="SET #status = :sent, outcome = :outcome",
        ExpressionAttributeNames={"#status": "status"},
        ExpressionAttributeValues={
            ":sent": {"S": "callback_sent"},
            ":outcome": records.to_attribute(outcome),
        },
    )


def test_repeated_lost_answers_adopt_the_one_job_whatever_its_state(p4d_quota):
    """start_training's answer lost three times (Lambda's timeout each time, the handler having run to its end):
    one job, whose token is the last try's, through its end."""
    settings = p4d_quota
    event = training_input()
    first = invoke("start_training", event)
    name = first["training_job_name"]

    second = invoke("start_training", {**event, "task_token": "AQCEAAAA-second-token"})
    move_job(name, "Stopped", "Stopped")  # the job ends before the third try; its event is not yet handled
    third = invoke("start_training", {**event, "task_token": "AQCEAAAA-third-token"})

    assert [r["training_job_name"] for r in (first, second, third)] == [name] * 3
    assert (second["adopted"], third["adopted"], third["status"]) == (True, True, "Stopped")
    jobs = boto3.client("sagemaker", region_name=REGION).list_training_jobs()["TrainingJobSummaries"]
    assert [j["TrainingJobName"] for j in jobs] == [name]
    item = token_item(settings.tokens_table, name)
    assert (item["token"], item["status"]) == (
        "AQCEAAAA-third-token",
        "waiting",
    )  # its event answers this try
    assert job_record(settings.jobs_table, event["job"]["job_id"])["training_attempts"] == 1


def test_a_retry_after_the_end_was_answered_to_the_earlier_token_gets_that_end(p4d_quota):
    """The job failed and on_training_event answered the first try's token, which no longer waits (the try timed
    out): the retry fails with that end, for next_attempt to judge, and starts nothing."""
    settings = p4d_quota
    event = training_input()
    name = invoke("start_training", event)["training_job_name"]
    reason = "CapacityError: Unable to provision requested ML compute capacity."
    move_job(name, "Failed", "Failed", reason)
    answered(settings, name, {"error": "CapacityError", "cause": reason})

    with pytest.raises(CapacityError, match="Unable to provision") as info:
        invoke("start_training", {**event, "task_token": "AQCEAAAA-second-token"})

    assert info.value.details == {"training_job_name": name, "adopted": True}
    assert (
        len(boto3.client("sagemaker", region_name=REGION).list_training_jobs()["TrainingJobSummaries"]) == 1
    )
    assert job_record(settings.jobs_table, event["job"]["job_id"])["training_attempts"] == 1


def test_a_retry_after_a_completed_end_was_answered_gets_the_training_output(p4d_quota):
    settings = p4d_quota
    event = training_input()
    name = invoke("start_training", event)["training_job_name"]
    move_job(name, "Completed", "Completed")
    output = {"training_job_name": name, "status": "Completed", "archive_s3_uri": "s3://a/archive/x/"}
    answered(settings, name, output)

    with pytest.raises(TrainingJobCompleted) as info:
        invoke("start_training", {**event, "task_token": "AQCEAAAA-second-token"})

    assert json.loads(str(info.value)) == output  # the state machine takes it as $.training
    assert (
        len(boto3.client("sagemaker", region_name=REGION).list_training_jobs()["TrainingJobSummaries"]) == 1
    )


def test_after_next_attempt_judged_the_ended_job_a_new_attempt_starts_with_a_new_name(p4d_quota):
    settings = p4d_quota
    event = training_input()
    first = invoke("start_training", event)
    move_job(
        first["training_job_name"],
        "Failed",
        "Failed",
        "InternalServerError: We encountered an internal error.",
    )
    judged(settings, event["job"]["job_id"], 1)

    again = invoke("start_training", {**event, "task_token": "AQCEAAAA-second-token"})

    assert again["attempt"] == 2 and again["adopted"] is False
    assert again["training_job_name"] == first["training_job_name"][:-1] + "2"
    assert in_progress() == [again["training_job_name"]]


@pytest.mark.parametrize("status", ["InProgress", "Stopping"])
def test_no_new_attempt_starts_while_a_job_of_the_run_is_live(p4d_quota, status):
    """Attempt 1 was judged (say on a forged failure) but its job still runs: the next start refuses."""
    settings = p4d_quota
    event = training_input()
    name = invoke("start_training", event)["training_job_name"]
    move_job(name, status, "Training" if status == "InProgress" else "Stopping")
    judged(settings, event["job"]["job_id"], 1)

    with pytest.raises(TrainingJobStillRunning, match=f"{name} \\({status}\\)"):
        invoke("start_training", {**event, "task_token": "AQCEAAAA-second-token"})

    jobs = boto3.client("sagemaker", region_name=REGION).list_training_jobs()["TrainingJobSummaries"]
    assert [j["TrainingJobName"] for j in jobs] == [name]
    assert job_record(settings.jobs_table, event["job"]["job_id"])["training_attempts"] == 1


def test_resource_limit_exceeded_is_quota_exceeded_and_leaves_no_token(aws):
    # the twin's default quota for ml.p4d.24xlarge training, as AWS's, is 0
    event = training_input()
    with held_training_jobs(), pytest.raises(QuotaExceeded) as info:
        invoke("start_training", event)
    name = info.value.details["training_job_name"]
    assert "ml.p4d.24xlarge for training job usage" in str(info.value)
    assert info.value.details["instance_count"] == 2
    assert token_item(aws.tokens_table, name) is None


def test_spot_jobs_are_checked_against_the_spot_quota(aws):
    event = training_input(spec(compute={"spot": True, "max_runtime_hours": 1, "max_wait_hours": 2}))
    with held_training_jobs(), pytest.raises(QuotaExceeded, match="for spot training job usage"):
        invoke("start_training", event)


def test_throttling_becomes_aws_throttled_for_the_state_machines_retry(aws):
    from lustrain.twin import faults

    event = training_input()
    faults.inject("start_training", "throttling")
    try:
        with faults.running_step("start_training"), pytest.raises(AwsThrottled):
            invoke("start_training", event)
    finally:
        faults.clear()
    assert boto3.client("sagemaker", region_name=REGION).list_training_jobs()["TrainingJobSummaries"] == []


def test_a_job_created_though_sagemaker_answered_an_error_is_kept_not_started_twice(p4d_quota, monkeypatch):
    from botocore.exceptions import ClientError

    settings = p4d_quota
    event = training_input()
    sagemaker = clients.client("sagemaker")
    create = sagemaker.create_training_job

    def committed_then_500(**request):
        create(**request)  # SageMaker committed the job; the answer is a 500 (or botocore's retry meets it)
        raise ClientError({"Error": {"Code": "InternalFailure", "Message": "try again"}}, "CreateTrainingJob")

    monkeypatch.setattr(sagemaker, "create_training_job", committed_then_500)
    result = invoke("start_training", event)

    name = result["training_job_name"]
    assert (result["attempt"], result["adopted"]) == (1, True)
    assert token_item(settings.tokens_table, name)["token"] == TOKEN  # the job's end will find its token
    jobs = boto3.client("sagemaker", region_name=REGION).list_training_jobs()["TrainingJobSummaries"]
    assert [j["TrainingJobName"] for j in jobs] == [name]
