"""The run policy for failures (lustrain_core.recovery): one place, read by the classifier, the decision between
attempts, the state machine's retriers and docs/failures-and-queue.md; pure, no AWS."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from lustrain_core import recovery
from lustrain_core.config import Settings
from lustrain_core.document import Attempt, Failure, Run, Sections
from lustrain_core.errors import ALL_ERRORS
from lustrain_core.launch import job_of
from lustrain_core.spec import validate_spec
from lustrain_core.steps.attempts import decide, final_attempt, goodput
from lustrain_core.steps.budget import attempt_budget, attempt_cost_usd, budget_limit
from lustrain_core.steps.events import classify_failure
from lustrain_trainer import faults as trainer_faults

REPO = Path(__file__).resolve().parents[2]
FailureClass = recovery.FailureClass


def _render_module():
    spec = importlib.util.spec_from_file_location("render_asl", REPO / "scripts" / "render_asl.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_every_task_state_of_the_definition_retries_as_the_policy_says():
    render = _render_module()
    text = render.DEFINITION.read_text()
    assert render.rendered(text) == text, "run scripts/render_asl.py"
    states = render.parsed(text)["States"]
    # and the check can fail: a retrier changed by hand is found
    changed = text.replace('"MaxAttempts": 5', '"MaxAttempts": 4', 1)
    assert render.rendered(changed) != changed
    assert list(render.tasks_with_retry(states))  # every Task state has one


def test_the_docs_table_of_failure_classes_is_the_policys():
    doc = (REPO / "docs" / "failures-and-queue.md").read_text()
    table = doc.split("<!-- failure-classes -->\n")[1].split("<!-- /failure-classes -->")[0]
    assert table == recovery.markdown_table(), "regenerate: python -m lustrain_core.recovery"


def test_each_class_ends_the_task_with_an_error_of_its_own_that_the_state_machine_knows():
    errors = [policy.error for policy in recovery.POLICY.values()]
    assert len(set(errors)) == len(errors)
    assert set(errors) <= set(ALL_ERRORS)
    assert set(recovery.POLICY) == set(FailureClass)
    for policy in recovery.POLICY.values():
        assert recovery.class_of_error(policy.error) is policy.failure_class


def test_what_is_retried_and_what_is_not():
    retried = {cls for cls, policy in recovery.POLICY.items() if policy.retried}
    assert retried == {FailureClass.CAPACITY, FailureClass.QUOTA, FailureClass.INFRASTRUCTURE, FailureClass.SPOT_RECLAIM}
    assert recovery.class_of_error("States.Timeout") is FailureClass.UNRESPONSIVE
    assert recovery.class_of_error("States.TaskFailed") is None


def test_the_trainer_and_the_classifier_agree_on_how_an_infrastructure_fault_is_said():
    assert trainer_faults.INFRASTRUCTURE_EXIT_CODE == recovery.INFRASTRUCTURE_EXIT_CODE
    assert trainer_faults.INFRASTRUCTURE_MARK == recovery.INFRASTRUCTURE_MARK
    line = trainer_faults.last_line("nccl", RuntimeError("NCCL communicator was aborted on rank 3"))
    # as SageMaker's toolkit reports a script that failed: its exit code and the end of its error output
    reason = f'AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage "{line}"\nCommand "torchrun"'
    assert classify_failure(reason) == "InfrastructureError"


@pytest.mark.parametrize(
    ("status", "secondary", "spot", "expected"),
    [
        ("Stopped", "MaxWaitTimeExceeded", True, FailureClass.SPOT_RECLAIM),
        ("Stopped", "Interrupted", True, FailureClass.SPOT_RECLAIM),
        ("Stopped", "MaxRuntimeExceeded", True, FailureClass.STOPPED),
        ("Stopped", "MaxWaitTimeExceeded", False, FailureClass.STOPPED),
        ("Stopped", "Stopped", False, FailureClass.STOPPED),
    ],
)
def test_a_stopped_job_is_a_spot_reclaim_only_when_spot_capacity_did_not_come_back(status, secondary, spot, expected):
    assert recovery.classify(status, None, secondary_status=secondary, spot=spot) is expected


# --------------------------------------------------------------------------- the decision between attempts


def run_of(error: str, **compute: object) -> Run:
    spec = validate_spec(
        {
            "name": "gpt",
            "compute": {"instance_count": 2, "max_runtime_hours": 2, **compute},
            "data": {"s3_uri": "s3://data/x/", "size_gib": 10},
            "output": {"s3_uri": "s3://out/x/"},
            "budget": {"max_usd": 1000},
        }
    )
    job = job_of(spec, "gpt-0badc0de", data_gib=10)
    return Run(job, Sections(failure=Failure(Error=error, Cause="...")))


def attempt(number: int, error: str, **fields: object) -> Attempt:
    return Attempt(attempt=number, outcome="Failed", error=error, failure_class=recovery.class_of_error(error), **fields)  # type: ignore[arg-type]


def test_an_infrastructure_fault_starts_another_attempt_after_the_policys_wait_capped_by_the_stack():
    run = run_of("InfrastructureError")
    retry, wait, why = decide(run, attempt(1, "InfrastructureError"), 0.0, Settings())
    assert (retry, wait) == (True, recovery.POLICY[FailureClass.INFRASTRUCTURE].wait_seconds)
    assert "attempt 2 of 3" in why
    capped = Settings(extra={"LUSTRAIN_ATTEMPT_WAIT_MAX_SECONDS": "1"})
    assert decide(run_of("CapacityError"), attempt(1, "CapacityError"), 0.0, capped)[:2] == (True, 1)


def test_the_users_own_error_and_a_job_that_stopped_reporting_are_not_retried():
    for error in ("TrainingFailed", "MountFailed", "TrainingStopped", "States.Timeout"):
        retry, _, why = decide(run_of(error), attempt(1, error), 0.0, Settings())
        assert not retry and "not retried" in why
    retry, _, why = decide(run_of("States.Runtime"), attempt(1, "States.Runtime"), 0.0, Settings())
    assert not retry and "not a training attempt's end" in why


def test_attempts_are_bounded_by_compute_max_attempts():
    run = run_of("CapacityError", max_attempts=2)
    assert decide(run, attempt(1, "CapacityError"), 0.0, Settings())[0]
    retry, _, why = decide(run, attempt(2, "CapacityError"), 0.0, Settings())
    assert not retry and "compute.max_attempts=2" in why


def spent_leaving(run: Run, seconds: float, settings: Settings | None = None) -> float:
    """What the attempts so far must have cost for the budget to leave the next one `seconds` of training."""
    cost = run.job.plan["cost"]
    fs_hourly = cost["filesystem_usd"] / (run.job.spec.compute.max_runtime_hours + 1)
    limit = budget_limit(run, settings or Settings())
    assert limit is not None
    return limit[0] - fs_hourly - cost["control_plane_usd"] - cost["hourly_usd"] * seconds / 3600


def test_attempts_are_bounded_by_the_budget_counting_every_attempt_so_far():
    run = run_of("InfrastructureError")
    assert decide(run, attempt(1, "InfrastructureError"), spent_leaving(run, 61), Settings())[0]
    retry, _, why = decide(run, attempt(1, "InfrastructureError"), spent_leaving(run, 59), Settings())
    assert not retry and "budget of $1,000.00 (budget.max_usd)" in why and "under the 60 s" in why
    # the stack's own limit counts when it is the smaller
    whole = float(run.job.plan["cost"]["total_usd"])
    stack = Settings(extra={"LUSTRAIN_MAX_BUDGET_USD": str(whole + 10)})
    retry, _, why = decide(run, attempt(1, "InfrastructureError"), spent_leaving(run, 30, stack), stack)
    assert not retry and "LUSTRAIN_MAX_BUDGET_USD" in why


def test_the_budget_left_sets_the_next_attempts_runtime_when_it_is_shorter():
    run = run_of("InfrastructureError")
    assert run.job.launch.max_runtime_seconds == 7200
    roomy = attempt_budget(run, 0.0, Settings())
    assert roomy is not None and not roomy.binds and roomy.runtime_seconds > 7200
    tight = attempt_budget(run, spent_leaving(run, 1800), Settings())
    assert tight is not None and tight.binds and abs(tight.runtime_seconds - 1800) <= 1


def test_an_attempts_cost_is_its_billable_time_at_the_list_price():
    # 2 x ml.p4d.24xlarge at $37.688/h for half an hour
    assert attempt_cost_usd(run_of("CapacityError"), 1800) == round(2 * 37.688 / 2, 2)


def test_goodput_counts_the_steps_computed_again_after_a_failure():
    failed = attempt(1, "InfrastructureError", step_reached=130, resumed_from=0)
    done = final_attempt(
        {
            "training_job_name": "gpt-0badc0de-2",
            "status": "Completed",
            "metrics": {"step": 300, "resumed_from": 100, "train_loss": 2.1},
        }
    )
    assert done is not None and (done.attempt, done.resumed_from, done.step_reached) == (2, 100, 300)
    # 130 + 200 steps computed, 300 kept: the 30 after the checkpoint at 100 were lost
    assert goodput([failed, done]) == round(300 / 330, 4)
    assert goodput([failed]) == 0
    assert goodput([attempt(1, "CapacityError")]) is None
    assert final_attempt({"training_job_name": "gpt-0badc0de-1", "status": "Failed"}) is None


def test_a_job_stopped_at_max_runtime_is_budget_only_where_the_budget_set_that_runtime():
    stopped = {"secondary_status": "MaxRuntimeExceeded"}
    assert recovery.classify("Stopped", None, **stopped, budget_bound=True) is FailureClass.BUDGET
    assert recovery.classify("Stopped", None, **stopped) is FailureClass.STOPPED
    assert recovery.classify("Stopped", None, secondary_status="Stopped", budget_bound=True) is FailureClass.STOPPED
    assert not recovery.POLICY[FailureClass.BUDGET].retried
