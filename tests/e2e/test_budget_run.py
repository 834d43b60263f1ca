"""A budget that acts, on the twin: a run whose first attempt dies of a hardware fault gets a second attempt as long
as what is left of budget.max_usd pays for (less than compute.max_runtime_hours); SageMaker stops that job there,
and the run ends BudgetExceeded with what it wrote archived and 0 resources left.

The spec: one ml.p4d.24xlarge for 90 s (0.025 h) with a budget a cent above the plan's estimate; the first attempt
spends a few seconds of the instance's $37.688/h, so the second gets about 90 s less those. The trainer is the
stand-in of checkpointing_trainer/ (the real one's checkpoint, resume, stop and metrics contract, sleeping where it
would compute): the minute the budget must leave the second attempt costs the suite no CPU. SageMaker's stop at that
MaxRuntimeInSeconds kills the stand-in, which saved before its deadline, after a 20 s grace here (quick_stops; 120 s
on AWS). The real trainer's own stop within SageMaker's grace is tests/unit/trainer's (test_sigterm_*), under the
twin's SageMaker test_cancel's.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from lustrain_core.launch import compile_offline
from lustrain_core.prices import PriceTable
from lustrain_core.spec import load_spec_file
from lustrain_core.steps.budget import filesystem_hourly_usd
from lustrain_core.trainer.plan import SAGEMAKER_STOP_GRACE_S

from lustrain.twin.rehearse import operator_session, rehearse

pytestmark = pytest.mark.slow

QUICK = Path(__file__).with_name("quick.yaml")
STAND_IN = Path(__file__).with_name("checkpointing_trainer")


def test_a_run_whose_budget_runs_out_ends_budget_exceeded_with_its_work_archived_and_nothing_left(
    tmp_path, quick_stops
):
    doc = yaml.safe_load(QUICK.read_text())
    doc["name"] = "budgeted"
    doc["compute"].update(instance_count=1, max_runtime_hours=0.025)
    doc["code"] = {
        "source": f"{STAND_IN}/",
        "entry_point": "train.py",
        "distribution": "none",
        "hyperparameters": {"step_s": 0.1, "checkpoint_interval": 10},
    }
    path = tmp_path / "budgeted.yaml"
    path.write_text(yaml.safe_dump(doc))
    # the plan's estimate, to the hundredth of a cent: whatever the first attempt's seconds, the second is cut short
    cost = compile_offline(load_spec_file(path))[0].cost
    doc["budget"] = {"max_usd": math.ceil(cost.total_usd * 1e4) / 1e4}
    path.write_text(yaml.safe_dump(doc))
    jobs: dict[str, dict] = {}

    def describe_jobs(stack, result):
        sagemaker = operator_session().client("sagemaker")
        for attempt in result.attempts:
            jobs[attempt["training_job_name"]] = sagemaker.describe_training_job(
                TrainingJobName=attempt["training_job_name"]
            )

    run = rehearse(path, inject=["start_training:hardware-failure"], inspect=describe_jobs)

    assert (run.status, run.error) == ("FAILED", "BudgetExceeded"), run.cause
    first, second = run.attempts
    assert first["failure_class"] == "infrastructure"
    assert second["failure_class"] == "budget" and second["outcome"] == "Stopped"
    assert "MaxRuntimeInSeconds the budget left it" in (run.cause or "")
    # the second job was given what the budget left: the budget less the first attempt's cost (its billable seconds
    # at list price), the file system's hour outside training and the control plane, at the run's hourly price
    spent = PriceTable().billed_compute_usd("ml.p4d.24xlarge", 1, first["billable_seconds"])
    left = (
        doc["budget"]["max_usd"]
        - spent
        - filesystem_hourly_usd({"cost": {"filesystem_usd": cost.filesystem_usd}}, 0.025)
        - cost.control_plane_usd
    )
    runtime = jobs[second["training_job_name"]]["StoppingCondition"]["MaxRuntimeInSeconds"]
    assert runtime == math.floor(left / cost.hourly_usd * 3600) and 60 <= runtime < 90, (
        runtime,
        run.attempts,
    )
    assert jobs[first["training_job_name"]]["StoppingCondition"]["MaxRuntimeInSeconds"] == 90
    # and ran until SageMaker stopped it there (the stop's checkpoint within SageMaker's 120 s after the signal)
    assert runtime <= second["billable_seconds"] <= runtime + SAGEMAKER_STOP_GRACE_S, (runtime, run.attempts)
    assert second["step_reached"] > first["step_reached"]
    assert run.archive and {o["key"].rsplit("/", 1)[-1] for o in run.archive_objects} >= {"manifest.json", "model.tar.gz"}
    assert run.resources_left == 0, run.leftovers
