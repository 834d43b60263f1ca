"""A training job on a training plan whose capacity has not started, on the twin as on SageMaker ("Training plans
utilization for SageMaker training jobs"): it waits InProgress/Pending until the capacity is available, its
StoppingCondition is met, or it has been Pending for 2 days (then InsufficientCapacityError).

The plan's clock is moved with `training_plans.shift` instead of waiting: moving a capacity nearer by an hour is an
hour of the job's wait gone by."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from twinhelpers import client, role_arn

from lustrain.twin import simulator, training_plans

pytestmark = pytest.mark.usefixtures("moto_twin")

PLAN = "reserved-p4d"
HOUR = 3600
DAY = 24 * HOUR
#: the longest a test waits for the job to move (the simulator looks at the plan's clock every 0.05 s)
TIMEOUT_S = 30.0


@pytest.fixture
def sagemaker() -> Iterator[Any]:
    previous = simulator.settings()
    simulator.configure(start_delay_s=0.05)
    yield client("sagemaker")
    simulator.reset()
    simulator.configure(**dataclasses.asdict(previous))


def plan(starts_in: float, hours: float = 10) -> str:
    return training_plans.create_training_plan(
        PLAN,
        instance_type="ml.p4d.24xlarge",
        instance_count=4,
        availability_zone="us-east-1c",
        start=time.time() + starts_in,
        hours=hours,
    )


def create(sagemaker: Any, name: str, arn: str, max_runtime_s: int) -> None:
    sagemaker.create_training_job(
        TrainingJobName=name,
        RoleArn=role_arn("plan-test-sagemaker", service="sagemaker.amazonaws.com"),
        AlgorithmSpecification={
            "TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8-gpu-py312",
            "TrainingInputMode": "File",
        },
        OutputDataConfig={"S3OutputPath": "s3://plan-test/results/"},
        ResourceConfig={
            "InstanceType": "ml.p4d.24xlarge",
            "InstanceCount": 2,
            "VolumeSizeInGB": 100,
            "TrainingPlanArn": arn,
        },
        StoppingCondition={"MaxRuntimeInSeconds": max_runtime_s},
    )


def until(sagemaker: Any, name: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """DescribeTrainingJob once the job has got where `done` says (or fail, naming where it is)."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        described: dict[str, Any] = sagemaker.describe_training_job(TrainingJobName=name)
        if done(described):
            return described
        assert time.monotonic() < deadline, (described["TrainingJobStatus"], described["SecondaryStatus"])
        time.sleep(0.02)


def pending_announced(sagemaker: Any, name: str) -> dict[str, Any]:
    """The job once its Pending event has gone out (what a user's EventBridge rule sees first)."""
    described = until(
        sagemaker,
        name,
        lambda _: ("InProgress", "Pending") in next(j for j in simulator.jobs() if j.name == name).events,
    )
    assert (described["TrainingJobStatus"], described["SecondaryStatus"]) == ("InProgress", "Pending")
    return described


def test_a_job_waits_pending_for_its_capacity_and_starts_when_it_starts(sagemaker: Any) -> None:
    arn = plan(starts_in=DAY)
    create(sagemaker, "waits-a-day", arn, max_runtime_s=2 * DAY)
    described = pending_announced(sagemaker, "waits-a-day")
    first = described["SecondaryStatusTransitions"][0]
    assert (first["Status"], first["StatusMessage"]) == ("Pending", "Training job waiting for capacity")

    training_plans.shift(PLAN, -(DAY - 2))  # a day of waiting gone by: the capacity starts 2 s from now
    starts = client("sagemaker").describe_training_plan(TrainingPlanName=PLAN)["StartTime"]
    assert sagemaker.describe_training_job(TrainingJobName="waits-a-day")["SecondaryStatus"] == "Pending"

    started = until(sagemaker, "waits-a-day", lambda d: d["SecondaryStatus"] != "Pending")
    moved = started["SecondaryStatusTransitions"][1]
    assert (started["TrainingJobStatus"], moved["Status"]) == ("InProgress", "Starting")
    assert moved["StartTime"] >= starts


def test_a_job_on_a_capacity_active_now_starts_at_once(sagemaker: Any) -> None:
    arn = plan(starts_in=-HOUR)
    create(sagemaker, "starts-now", arn, max_runtime_s=HOUR)
    described = sagemaker.describe_training_job(TrainingJobName="starts-now")
    assert described["SecondaryStatusTransitions"][0]["Status"] == "Starting"


def test_a_job_pending_for_two_days_fails_with_insufficient_capacity(sagemaker: Any) -> None:
    arn = plan(starts_in=3 * DAY)
    create(sagemaker, "waits-too-long", arn, max_runtime_s=4 * DAY)
    pending_announced(sagemaker, "waits-too-long")

    training_plans.shift(PLAN, -2 * DAY)  # two days Pending; the capacity is still a day away
    ended = until(sagemaker, "waits-too-long", lambda d: d["TrainingJobStatus"] != "InProgress")
    assert (ended["TrainingJobStatus"], ended["SecondaryStatus"]) == ("Failed", "Failed")
    assert ended["FailureReason"].startswith("InsufficientCapacityError: ")
    assert "TrainingStartTime" not in ended


def test_the_wait_pending_is_not_run_time(sagemaker: Any) -> None:
    # MaxRuntimeInSeconds is how long a job can run; a Scheduled plan's wait is not counted against it (nor against
    # MaxPendingTimeInSeconds: botocore's StoppingCondition)
    arn = plan(starts_in=DAY)
    create(sagemaker, "waits-longer-than-it-runs", arn, max_runtime_s=HOUR)
    pending_announced(sagemaker, "waits-longer-than-it-runs")

    training_plans.shift(PLAN, -(DAY - 2))  # most of a day Pending, 23 times its MaxRuntimeInSeconds
    started = until(sagemaker, "waits-longer-than-it-runs", lambda d: d["SecondaryStatus"] != "Pending")
    assert started["TrainingJobStatus"] == "InProgress" and started["SecondaryStatus"] != "MaxRuntimeExceeded"


def test_a_job_stopped_while_pending_never_starts(sagemaker: Any) -> None:
    arn = plan(starts_in=DAY)
    create(sagemaker, "stopped-waiting", arn, max_runtime_s=2 * DAY)
    pending_announced(sagemaker, "stopped-waiting")

    sagemaker.stop_training_job(TrainingJobName="stopped-waiting")
    ended = until(sagemaker, "stopped-waiting", lambda d: d["TrainingJobStatus"] == "Stopped")
    assert [t["Status"] for t in ended["SecondaryStatusTransitions"]] == ["Pending", "Stopping", "Stopped"]
