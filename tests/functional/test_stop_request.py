"""A run's stop request on moto and the twin: written before the job exists, asked by teardown before any
StopTrainingJob, and a job that Completed because it was asked is a stopped run, not a trained one.

SageMaker's PyTorch image passes no SIGTERM on to the entry point (lustrain_core/stop_request.py): these are the
control plane's halves; tests/e2e/test_cancel.py runs the whole of it with the real trainer on the twin.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from infra_support import REGION, invoke, register
from lustrain_core import clients, stop_request
from lustrain_core.config import Settings
from lustrain_core.steps.teardown_base import Clock
from lustrain_core.steps.teardown_compute import TrainingJobs
from test_on_training_event import completed_description, state_change, stub_describe
from training_support import calls_of, held_training_jobs, training_input


def request_of(settings: Settings, job_id: str) -> dict[str, Any]:
    body = boto3.client("s3", region_name=REGION).get_object(
        Bucket=settings.artifacts_bucket, Key=stop_request.key(job_id)
    )["Body"].read()
    return dict(json.loads(body))


def test_upload_code_writes_the_request_asking_nothing_and_never_overwrites_one_made(aws):
    document = register()
    job_id = document["job"]["job_id"]
    invoke("upload_code", document)
    assert request_of(aws, job_id) == {"stop": False}
    # a cancel that came first (a retried upload_code after it) is kept
    stop_request.ask(clients.client("s3"), aws, job_id, "cancelled")
    invoke("upload_code", document)
    assert request_of(aws, job_id)["stop"] is True


@pytest.fixture
def training(aws):
    from lustrain.twin.patches import service_quotas

    service_quotas.set_quota("ml.p4d.24xlarge", 4, REGION)
    with held_training_jobs():
        document = training_input()
        name = invoke("start_training", document)["training_job_name"]
        yield aws, document["job"]["job_id"], name


def described(name: str, **changes: Any) -> dict[str, Any]:
    found = boto3.client("sagemaker", region_name=REGION).describe_training_job(TrainingJobName=name)
    found.pop("ResponseMetadata")
    # what SageMaker's answer always holds (the model's place, once there is one)
    found.setdefault("ModelArtifacts", {"S3ModelArtifacts": ""})
    return {**found, **changes}


def scope(settings: Settings, job_id: str, budget_s: float = 5.0) -> TrainingJobs:
    return TrainingJobs(
        ec2=None, fsx=None, job_id=job_id, settings=settings, clock=Clock(budget_s, interval=0.01, max_interval=0.01)
    )


def test_teardown_asks_a_training_trainer_first_and_stops_nothing_when_it_saves_and_exits(training):
    settings, job_id, name = training
    work = scope(settings, job_id)
    client = work.sagemaker
    job = described(name, SecondaryStatus="Training")
    assert stop_request.STOP_REQUEST_VARIABLE in job["Environment"]
    tags = client.list_tags(ResourceArn=job["TrainingJobArn"])["Tags"]
    with Stubber(client) as stub:
        stub.add_response("describe_training_job", copy.deepcopy(job), {"TrainingJobName": name})
        stub.add_response("list_tags", {"Tags": tags}, {"ResourceArn": job["TrainingJobArn"]})
        # the trainer heard the request, saved and exited: the job Completed by itself
        stub.add_response("describe_training_job", {**copy.deepcopy(job), "TrainingJobStatus": "Completed",
                                                     "SecondaryStatus": "Completed"}, {"TrainingJobName": name})
        assert work.stop_training_job(name) is None
        stub.assert_no_pending_responses()  # and no StopTrainingJob was called
    asked = request_of(settings, job_id)
    assert asked["stop"] is True and name in asked["reason"]
    assert work.report.stopped == [{"type": "training_job", "id": name}]


def test_a_trainer_that_does_not_hear_gets_the_plans_wait_across_invocations_then_a_stop(training):
    settings, job_id, name = training
    job = described(name, SecondaryStatus="Training")
    job["Environment"][stop_request.STOP_WAIT_VARIABLE] = "3600"
    first = scope(settings, job_id, budget_s=0.0)  # an invocation whose time is up at once
    tags = first.sagemaker.list_tags(ResourceArn=job["TrainingJobArn"])["Tags"]
    with Stubber(first.sagemaker) as stub:
        stub.add_response("describe_training_job", copy.deepcopy(job), {"TrainingJobName": name})
        stub.add_response("list_tags", {"Tags": tags}, {"ResourceArn": job["TrainingJobArn"]})
        problem = first.stop_training_job(name)
    assert problem and "was asked to stop and is saving" in problem  # teardown retries; nothing stopped yet
    asked_at = request_of(settings, job_id)["requested_at"]

    # the next invocation, after the wait the job's Environment names: the first request's time bounds it
    later = scope(settings, job_id)
    later.wall_clock = lambda: datetime.fromisoformat(asked_at).timestamp() + 3601
    assert later.stop_training_job(name) is None
    assert request_of(settings, job_id)["requested_at"] == asked_at  # asked once
    assert described(name)["TrainingJobStatus"] == "Stopped"
    assert later.report.stopped == [{"type": "training_job", "id": name}]


def test_a_job_not_yet_training_is_stopped_without_waiting_for_a_trainer_that_is_not_there(training):
    settings, job_id, name = training
    assert described(name)["SecondaryStatus"] != "Training"
    work = scope(settings, job_id)
    assert work.stop_training_job(name) is None
    assert described(name)["TrainingJobStatus"] == "Stopped"
    assert stop_request.read(clients.client("s3"), settings, job_id).get("stop") is not True  # nobody was asked


def test_a_job_that_completed_because_the_stack_asked_is_a_stopped_run_not_a_trained_one(aws):
    from lustrain.twin.patches import service_quotas

    service_quotas.set_quota("ml.p4d.24xlarge", 4, REGION)
    with held_training_jobs():
        event = training_input()
        name = invoke("start_training", event)["training_job_name"]
        job_id = event["job"]["job_id"]
        stop_request.ask(clients.client("s3"), aws, job_id, "cancelled by someone")
        with stub_describe(completed_description(name)), calls_of(clients.client("stepfunctions")) as sfn_calls:
            invoke("on_training_event", state_change(name, "Completed"))
    ((operation, params),) = sfn_calls
    assert (operation, params["error"]) == ("SendTaskFailure", "TrainingStopped")
    assert "asked it to stop (cancelled by someone)" in params["cause"]
    archived = boto3.client("s3", region_name=REGION).list_objects_v2(
        Bucket=aws.artifacts_bucket, Prefix=f"{aws.archive_prefix}{job_id}/manifest.json"
    )
    assert archived.get("KeyCount", 0) == 0  # no manifest calls it a trained model
