"""next_attempt: a training attempt ended without a model; does the run try again? The run policy decides.

The state machine's Catch on the training task puts the attempt's end in $.failure and calls this step, which:

1. finds the attempt: the job record counts attempts (start_training's `training_attempts`), so its training job
   is `<spec name>-<8 hex>-<attempt>`; DescribeTrainingJob gives its status, billable time and last metrics (the
   trainer logs `step` and `resumed_from`, SageMaker keeps their last values);
2. classifies the error with the run policy (lustrain_core.recovery) and decides, in this order: an error that is
   no attempt's end, or a class not retried, ends the run; so does the last of `compute.max_attempts`; so does a
   budget (budget.max_usd, or the stack's LUSTRAIN_MAX_BUDGET_USD) that, after what the attempts so far cost, leaves
   another attempt under a minute of training (steps/budget.py; start_training shortens the attempt's
   MaxRuntimeInSeconds to what the budget leaves);
3. returns $.recovery: the attempts so far with this one appended, `retry`, and `wait_seconds` (the class's
   wait, capped by the stack's LUSTRAIN_ATTEMPT_WAIT_MAX_SECONDS);
4. with checkpoints.to_filesystem, starts the export of the run's checkpoint directory to S3 (steps/exports.py)
   once the attempt's job has ended, and names its task in $.recovery.checkpoint_export: the next attempt resumes
   from Lustre and does not wait for it; teardown's own export, which it does wait for, comes last;
5. notes in the record that the attempt was judged (`judged_attempt`): a later event of its job is a replay
   (on_training_event ignores it) and the next start_training starts a new attempt rather than adopting this one.

No attempt starts beside a live one. If DescribeTrainingJob says the attempt's job is still InProgress or
Stopping, next_attempt refuses another attempt and the run ends: the run's teardown stops the job (the trainer
checkpoints when its stop request asks, and a new run can resume from it). It does not wait: on_training_event answers only an end
SageMaker confirms, so a live job reaches here only when its events stopped coming (States.Timeout,
States.HeartbeatTimeout) or its token was answered by someone else; when, or whether, it ends is unknown, and a
wait loop would only spend the execution's history while the fleet runs unwatched.

On retry the state machine waits, then the run goes through the capacity queue again (steps/queue.py) and runs
start_training once admitted: a new training job on the same network and file system, whose trainer resumes from the newest checkpoint in the run's own checkpoint location. The network
and the file system are torn down once, when the run ends.
"""

from __future__ import annotations

from typing import Any

from lustrain_core import recovery
from lustrain_core.config import Settings
from lustrain_core.document import Attempt, Recovery, Run
from lustrain_core.launch_plan import training_job_name
from lustrain_core.steps import exports, records
from lustrain_core.steps.budget import MIN_RUNTIME_SECONDS, attempt_budget, attempt_cost_usd, billed_seconds
from lustrain_core.steps.training import describe_training_job

#: the stack's ceiling on the wait between two attempts (seconds); unset: the policy's waits as they are
WAIT_MAX_SETTING = "LUSTRAIN_ATTEMPT_WAIT_MAX_SECONDS"
#: the trainer's metrics that say how far an attempt got (trainer/lustrain_trainer/metrics.py)
STEP_METRIC = "step"
RESUMED_METRIC = "resumed_from"
#: a training job in one of these still holds (or is releasing) its instances
LIVE = frozenset({"InProgress", "Stopping"})


def _wait_cap(settings: Settings) -> int | None:
    return settings.whole_seconds(WAIT_MAX_SETTING, least=0)


def _metric(description: dict[str, Any], name: str) -> int | None:
    for metric in description.get("FinalMetricDataList") or []:
        if metric.get("MetricName") == name:
            return max(0, int(float(metric["Value"])))
    return None


def _this_attempt(run: Run, sagemaker: Any, number: int) -> Attempt:
    failure = run.failure
    failure_class = recovery.class_of_error(failure.Error)
    if number < 1:
        return Attempt(attempt=1, outcome="NotStarted", error=failure.Error, failure_class=failure_class)
    name = training_job_name(run.job.spec.name, run.job.job_id, number)
    description = describe_training_job(sagemaker, name)
    if description is None:
        return Attempt(attempt=number, outcome="NotStarted", error=failure.Error, failure_class=failure_class)
    billable = billed_seconds(description)
    return Attempt(
        attempt=number,
        training_job_name=name,
        outcome=str(description.get("TrainingJobStatus", "Unknown")),
        error=failure.Error,
        failure_class=failure_class,
        step_reached=_metric(description, STEP_METRIC),
        resumed_from=_metric(description, RESUMED_METRIC),
        billable_seconds=billable,
        cost_usd=attempt_cost_usd(run, billable),
    )


def decide(
    run: Run, attempt: Attempt, spent_usd: float, settings: Settings, ran: int | None = None
) -> tuple[bool, int, str]:
    """(retry?, wait seconds, why): the run policy applied to the attempt that just ended. `ran`: the training jobs
    the run has started so far (SageMaker's refusals are none); the attempt's number when not given."""
    failure_class = recovery.class_of_error(attempt.error)
    if failure_class is None:
        return False, 0, f"{attempt.error} is not a training attempt's end: the run ends"
    policy = recovery.POLICY[failure_class]
    if not policy.retried:
        return False, 0, f"{failure_class} ({policy.error}) is not retried: {policy.why}"
    most = run.job.spec.compute.max_attempts
    ran = attempt.attempt if ran is None else ran
    if ran >= most:
        return False, 0, f"{failure_class}: attempt {ran} was the last of compute.max_attempts={most}"
    left = attempt_budget(run, spent_usd, settings)
    if left is not None and left.runtime_seconds < MIN_RUNTIME_SECONDS:
        return (
            False,
            0,
            f"{failure_class}: the attempts so far cost ${spent_usd:,.2f}; the budget of ${left.limit_usd:,.2f} "
            f"({left.source}) leaves another attempt {left.runtime_seconds} s of training, under the "
            f"{MIN_RUNTIME_SECONDS} s worth starting a fleet for",
        )
    wait = policy.wait_seconds
    cap = _wait_cap(settings)
    if cap is not None:
        wait = min(wait, cap)
    return True, wait, f"{failure_class} is retried: attempt {ran + 1} of {most} in {wait} s"


def next_attempt(
    document: dict[str, Any], *, sagemaker: Any, ddb: Any, settings: Settings, fsx: Any = None
) -> Recovery:
    """The run's attempts with the one that just ended, and whether another starts (and after how long)."""
    run = Run.parse(document, "failure")
    record = records.require(ddb, settings.jobs_table, run.job.job_id)
    number = record.attempt
    earlier = [a for a in run.recovery.attempts if a.attempt != number]
    attempt = _this_attempt(run, sagemaker, number)
    decided = _decided(run, attempt, earlier, settings)
    task = _export_checkpoints(run, attempt, fsx, settings)
    if task is not None:
        decided = decided.model_copy(update={"checkpoint_export": task})
    if number >= 1:
        records.set_fields(ddb, settings.jobs_table, run.job.job_id, judged_attempt=number)
    return decided


def _export_checkpoints(run: Run, attempt: Attempt, fsx: Any, settings: Settings) -> str | None:
    """Start the export of the run's checkpoints on Lustre to S3 after an attempt that ran and ended; its task id."""
    spec = run.job.spec
    fs = run.sections.filesystem
    if not spec.checkpoints.to_filesystem or fs is None or fs.checkpoint_path is None:
        return None
    if attempt.training_job_name is None or attempt.outcome in LIVE:
        # no job wrote there, or one still does (an export now would take a checkpoint half written)
        return None
    if fsx is None:
        raise ValueError("next_attempt needs an FSx client to export checkpoints.to_filesystem's checkpoints")
    label = exports.ATTEMPT_LABEL.format(number=attempt.attempt)
    return exports.start_export(
        fsx, fs.file_system_id, [fs.checkpoint_path], run.job.job_id, settings.stack_name, label
    )


def _decided(run: Run, attempt: Attempt, earlier: list[Attempt], settings: Settings) -> Recovery:
    refusal = _refusal(run, attempt, earlier)
    if refusal is not None:
        return refusal
    attempts = [*earlier, attempt]
    spent = round(sum(a.cost_usd for a in attempts), 2)
    ran = sum(1 for a in attempts if a.training_job_name is not None)
    retry, wait, reason = decide(run, attempt, spent, settings, ran)
    if retry and attempt.outcome in LIVE:
        retry, wait = False, 0
        reason = (
            f"{attempt.error} ended attempt {attempt.attempt}, but SageMaker says its training job "
            f"{attempt.training_job_name} is {attempt.outcome}: no other attempt starts beside a live one, so the "
            "run ends and its teardown stops the job (its trainer checkpoints when the stop request asks)"
        )
    return Recovery(
        attempts=attempts,
        retry=retry,
        wait_seconds=wait,
        reason=reason,
        spent_usd=spent,
        refusals=run.recovery.refusals,
    )


def _refusal(run: Run, attempt: Attempt, earlier: list[Attempt]) -> Recovery | None:
    """SageMaker refused the job (no job exists): no attempt, the run goes back to the capacity queue, in its
    place; after recovery.MAX_REFUSALS of them the run ends. None for any other end."""
    failure_class = recovery.class_of_error(attempt.error)
    if failure_class is None or attempt.training_job_name is not None:
        return None
    policy = recovery.POLICY[failure_class]
    if policy.counts_as_attempt or not policy.retried:
        return None
    refusals = run.recovery.refusals + 1
    base = {"attempts": earlier, "spent_usd": run.recovery.spent_usd, "refusals": refusals, "refused": True}
    if refusals > recovery.MAX_REFUSALS:
        reason = (
            f"SageMaker refused the run's job {refusals} times though the capacity queue saw room: the quota it "
            f"enforces is not what Service Quotas and the running jobs show (recovery.MAX_REFUSALS="
            f"{recovery.MAX_REFUSALS})"
        )
        return Recovery(retry=False, wait_seconds=0, reason=reason, **base)
    reason = f"{failure_class}: SageMaker refused the job (refusal {refusals}); back to the capacity queue, in its place"
    return Recovery(retry=True, wait_seconds=policy.wait_seconds, reason=reason, **base)


def final_attempt(training: dict[str, Any]) -> Attempt | None:
    """The attempt that trained the model, from the training task's output ($.training), or None."""
    name = training.get("training_job_name")
    if not isinstance(name, str) or training.get("status") != "Completed":
        return None
    metrics = training.get("metrics") or {}

    def step(key: str) -> int | None:
        value = metrics.get(key)
        return max(0, int(float(value))) if isinstance(value, int | float) else None

    return Attempt(
        attempt=int(name.rsplit("-", 1)[1]),
        training_job_name=name,
        outcome="Completed",
        error="",
        step_reached=step(STEP_METRIC),
        resumed_from=step(RESUMED_METRIC),
        billable_seconds=int(training.get("billable_seconds") or 0),
    )


def goodput(attempts: list[Attempt]) -> float | None:
    """Useful steps over steps computed: the model's last step, over every attempt's steps from where it resumed to
    where it got (steps an attempt computed past its last checkpoint are computed again by the next). None when
    no attempt says how far it got; 0 when none trained a model."""
    computed = sum(
        max(0, a.step_reached - (a.resumed_from or 0)) for a in attempts if a.step_reached is not None
    )
    if computed == 0:
        return None
    done = next((a for a in attempts if a.outcome == "Completed"), None)
    useful = (done.step_reached or 0) if done is not None else 0
    return round(useful / computed, 4)
