"""The twin's warm pools, as SageMaker's guide describes them: kept after a job that ended well (or failed by its
own algorithm), for KeepAlivePeriodInSeconds, moved to a matching job only, never kept beyond the warm pool quota."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from lustrain.twin.simulator.job import SimulatedJob

ARN = "arn:aws:sagemaker:us-east-1:123456789012:training-job/"


def job(name: str, keep_alive: int = 600, **changes: Any) -> SimulatedJob:
    request: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/run",
        "ResourceConfig": {
            "InstanceType": "ml.p4d.24xlarge",
            "InstanceCount": 2,
            "KeepAlivePeriodInSeconds": keep_alive,
        },
        "VpcConfig": {"Subnets": ["subnet-1"], "SecurityGroupIds": ["sg-1"]},
        "EnableInterContainerTrafficEncryption": False,
    }
    for path, value in changes.items():
        section, _, key = path.partition("__")
        if key:
            request[section] = {**request[section], key: value}
        else:
            request[section] = value
    simulated = SimulatedJob(request=request, arn=ARN + name, account="123456789012", region="us-east-1")
    simulated.pool_granted = True
    return simulated


def ended(simulated: SimulatedJob, status: str = "Completed", reason: str | None = None) -> SimulatedJob:
    simulated.training_start_time = simulated.creation_time
    simulated._move(status, status, reason)
    return simulated


def test_a_completed_job_keeps_its_pool_available_for_its_keep_alive_then_terminated():
    first = ended(job("a"))
    assert first.describe()["WarmPoolStatus"]["Status"] == "Available"
    assert first.pool_available(first.training_end_time + timedelta(seconds=599))
    assert not first.pool_available(first.training_end_time + timedelta(seconds=600))
    assert first.terminate_pool()
    status = first.describe()["WarmPoolStatus"]
    assert status["Status"] == "Terminated" and status["ResourceRetainedBillableTimeInSeconds"] >= 0


@pytest.mark.parametrize(
    ("status", "reason", "kept"),
    [
        ("Failed", "AlgorithmError: exit 1", True),
        ("Failed", "ClientError: bad input", True),
        ("Failed", "InternalServerError: We encountered an internal error.", False),
        ("Stopped", None, True),
    ],
)
def test_a_pool_is_kept_after_an_algorithm_or_client_error_or_a_stop_only(status, reason, kept):
    assert ended(job("a"), status, reason).pool_available() is kept


def test_no_pool_beyond_the_warm_pool_quota_nor_without_a_keep_alive():
    over = job("a")
    over.pool_granted = False
    assert ended(over).describe()["WarmPoolStatus"] == {
        "Status": "Terminated",
        "ResourceRetainedBillableTimeInSeconds": 0,
    }
    assert "WarmPoolStatus" not in ended(job("b", keep_alive=0)).describe()


@pytest.mark.parametrize(
    "change",
    [
        {"RoleArn": "arn:aws:iam::123456789012:role/other"},
        {"ResourceConfig__InstanceCount": 3},
        {"ResourceConfig__InstanceType": "ml.p5.48xlarge"},
        {"ResourceConfig__VolumeSizeInGB": 100},
        {"VpcConfig__Subnets": ["subnet-2"]},
        {"VpcConfig__SecurityGroupIds": ["sg-2"]},
        {"EnableInterContainerTrafficEncryption": True},
        {"EnableNetworkIsolation": True},
    ],
)
def test_only_a_job_of_the_same_shape_matches(change):
    assert job("a").match_key() != job("b", **change).match_key()
    assert job("a").match_key() == job("b", ResourceConfig__KeepAlivePeriodInSeconds=60).match_key()


def test_a_reused_pool_names_the_job_that_took_it_and_the_taker_shows_in_use_while_it_runs():
    first = ended(job("a"))
    second = job("b")
    first.hand_pool_to("b")
    second.took_pool = True
    assert first.describe()["WarmPoolStatus"]["Status"] == "Reused"
    assert first.describe()["WarmPoolStatus"]["ReusedByJob"] == "b"
    assert not first.pool_available()
    assert second.describe()["WarmPoolStatus"] == {"Status": "InUse"}
    assert ended(second).describe()["WarmPoolStatus"]["Status"] == "Available"
