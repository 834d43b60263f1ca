"""A budget that acts, on moto with the twin's SageMaker: after an attempt has spent part of budget.max_usd, the next
one's MaxRuntimeInSeconds is what the rest pays for; a job stopped there ends the run BudgetExceeded with what it
wrote archived; an attempt the budget leaves under a minute is never started."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path

import boto3
import pytest
from infra_support import REGION, invoke, spec
from lustrain_core.errors import BudgetExceeded
from lustrain_core.prices import PriceTable
from training_support import held_training_jobs, token_item, training_input

from lustrain.twin.patches.sagemaker import _state

EVENTS = Path(__file__).resolve().parents[2] / "events"
BUDGET = 200.0


@pytest.fixture
def started(aws):
    from lustrain.twin.patches import service_quotas

    service_quotas.set_quota("ml.p4d.24xlarge", 4, REGION)
    with held_training_jobs():
        yield aws


def jobs():
    from moto.sagemaker.models import sagemaker_backends

    return _state(sagemaker_backends["123456789012"][REGION]).jobs


def ended(name: str, status: str, secondary: str, billable_seconds: int, reason: str | None = None) -> None:
    """The job ended as SageMaker would have it, after `billable_seconds` of training."""
    job = jobs()[name]
    job._move(status, secondary, reason)
    job.training_start_time = job.training_end_time - timedelta(seconds=billable_seconds)


def state_change(name: str, status: str, secondary: str) -> dict:
    event = json.loads((EVENTS / "on_training_event.json").read_text())
    event["detail"] = {**event["detail"], "TrainingJobName": name, "TrainingJobStatus": status,
                       "SecondaryStatus": secondary}
    event["detail"].pop("ModelArtifacts", None)
    return event


def test_the_budget_left_after_an_attempt_shortens_the_next_and_ends_the_run_when_it_is_reached(started):
    document = training_input(spec(budget={"max_usd": BUDGET}))
    cost = document["job"]["plan"]["cost"]
    sagemaker = boto3.client("sagemaker", region_name=REGION)

    first = invoke("start_training", document)
    assert first["max_runtime_seconds"] == 3600 and first["budget"]["binds"] is False
    # two hours of 2 x ml.p4d.24xlarge (an attempt of a run whose spec allowed it, and then failed)
    ended(first["training_job_name"], "Failed", "Failed", 7200, "InternalServerError: We encountered an internal error.")
    spent = PriceTable().billed_compute_usd("ml.p4d.24xlarge", 2, 7200)
    assert spent is not None
    # the state machine's order: next_attempt judges the attempt before the next start_training
    retried = invoke("next_attempt", {
        **{k: v for k, v in document.items() if k != "task_token"},
        "failure": {"Error": "InfrastructureError", "Cause": "InternalServerError: We encountered an internal error."},
        "recovery": {"attempts": []},
    })
    assert retried["retry"] is True

    second = invoke("start_training", document)
    fs_hourly = cost["filesystem_usd"] / 2  # priced for 1 h of runtime + 1 h of creation and teardown
    expected = math.floor((BUDGET - spent - fs_hourly - cost["control_plane_usd"]) / cost["hourly_usd"] * 3600)
    assert second["attempt"] == 2 and second["max_runtime_seconds"] == expected
    assert 60 <= expected < 3600
    described = sagemaker.describe_training_job(TrainingJobName=second["training_job_name"])
    assert described["StoppingCondition"]["MaxRuntimeInSeconds"] == expected
    item = token_item(started.tokens_table, second["training_job_name"])
    assert item is not None and item["budget"]["binds"] is True and item["budget"]["spent_usd"] == spent

    # SageMaker stops it there, uploading what it wrote: the run ends BudgetExceeded, the job archived
    ended(second["training_job_name"], "Stopped", "MaxRuntimeExceeded", expected)
    answer = invoke("on_training_event", state_change(second["training_job_name"], "Stopped", "MaxRuntimeExceeded"))
    assert answer["error"] == "BudgetExceeded"
    assert f"{expected} s of MaxRuntimeInSeconds the budget left it" in answer["cause"]
    archive = answer["archive_s3_uri"]
    bucket, _, prefix = archive.removeprefix("s3://").partition("/")
    keys = {o["Key"] for o in boto3.client("s3", region_name=REGION).list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]}
    assert prefix + "manifest.json" in keys and prefix + "describe_training_job.json" in keys

    decided = invoke("next_attempt", {
        **{k: v for k, v in document.items() if k != "task_token"},
        "failure": {"Error": "BudgetExceeded", "Cause": answer["cause"]},
        "recovery": {"attempts": []},
    })
    assert decided["retry"] is False and "budget (BudgetExceeded) is not retried" in decided["reason"]

    # an attempt the rest of the budget cannot pay a minute for is refused before SageMaker is asked
    with pytest.raises(BudgetExceeded, match="under the 60 s"):
        invoke("start_training", document)
    assert not any(name.endswith("-3") for name in jobs())
