"""The budget a run is held to, and how long its next training attempt may run within it.

`budget.max_usd` (and the stack's MaxBudgetUsdPerRun, whichever is smaller) is checked against the plan's estimate
before anything exists (steps/policy.py). While the run goes, it binds each attempt: start_training gives the
training job a MaxRuntimeInSeconds no longer than what the budget left pays for:

    left     = the budget - what the earlier attempts cost (their BillableTimeInSeconds, and their warm pools'
                            ResourceRetainedBillableTimeInSeconds, at list price)
                          - the file system's hour outside training (its creation and teardown, the planner's "+1 h")
                          - the control plane's estimate
                          - the warm pool the job keeps after it (compute.keep_alive_minutes: billed like training)
    runtime  = left / (the instances' hourly price + the file system's hourly price), at most compute.max_runtime_hours

A job that reaches such a shortened MaxRuntime is stopped by SageMaker, which uploads what it wrote (the trainer
saved a checkpoint before it: the job carries its MaxRuntimeInSeconds, stop_request.py); on_training_event archives it and the run ends BudgetExceeded (the run policy's
`budget` class: not retried). An attempt the budget leaves less than MIN_RUNTIME_SECONDS is not started at all.
next_attempt counts the same costs (attempt_cost_usd) when it decides on another attempt.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from lustrain_core.config import Settings
from lustrain_core.document import Run
from lustrain_core.prices import PriceTable
from lustrain_core.steps.policy import MAX_BUDGET, Policy
from lustrain_core.steps.records import JobRecord

#: An attempt the budget leaves less training time than this is not started: it would pay for the start of a
#: fleet that cannot train.
MIN_RUNTIME_SECONDS = 60


def filesystem_hourly_usd(plan: dict[str, Any], max_runtime_hours: float) -> float:
    """The file system's price per hour, from the plan, which prices it for max_runtime_hours + 1 (its creation and
    teardown besides the training)."""
    return float((plan.get("cost") or {}).get("filesystem_usd") or 0.0) / (max_runtime_hours + 1)


def budget_limit(run: Run, settings: Settings) -> tuple[float, str] | None:
    """The budget the run is held to, and where it comes from: the smaller of budget.max_usd and the stack's."""
    limits = []
    if run.job.spec.budget.max_usd is not None:
        limits.append((run.job.spec.budget.max_usd, "budget.max_usd"))
    stack = Policy.from_env(settings.extra).max_budget_usd
    if stack is not None:
        limits.append((float(stack), MAX_BUDGET))
    return min(limits) if limits else None


def attempt_cost_usd(run: Run, billable_seconds: int, prices: PriceTable | None = None) -> float:
    """What one attempt's instances cost: its billable seconds (SageMaker's, spot savings included) at the list
    price of the instance type."""
    compute = run.job.spec.compute
    billed = (prices or PriceTable()).billed_compute_usd(
        compute.instance_type, compute.instance_count, billable_seconds
    )
    return billed if billed is not None else 0.0


def billed_seconds(description: dict[str, Any]) -> int:
    """The seconds SageMaker bills a job's instances for: its BillableTimeInSeconds and the time its warm pool kept
    them (WarmPoolStatus.ResourceRetainedBillableTimeInSeconds, billed x InstanceCount like the training)."""
    pool = description.get("WarmPoolStatus") or {}
    return int(description.get("BillableTimeInSeconds") or 0) + int(
        pool.get("ResourceRetainedBillableTimeInSeconds") or 0
    )


@dataclass(frozen=True)
class AttemptBudget:
    """What the budget leaves the next attempt."""

    limit_usd: float
    source: str
    spent_usd: float
    left_usd: float
    #: the MaxRuntimeInSeconds the budget pays for (before compute.max_runtime_hours caps it)
    runtime_seconds: int
    #: True when the budget, not compute.max_runtime_hours, sets the attempt's MaxRuntimeInSeconds
    binds: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def attempt_budget(run: Run, spent_usd: float, settings: Settings) -> AttemptBudget | None:
    """The budget left for the next attempt and the runtime it pays for; None when the run has no budget."""
    limit = budget_limit(run, settings)
    if limit is None:
        return None
    cost = run.job.plan.get("cost") or {}
    # the planner prices the file system for the run's hours + 1 (creation and teardown): the hour outside
    # training is set aside, the rest runs with the instances
    fs_hourly = filesystem_hourly_usd(run.job.plan, run.job.spec.compute.max_runtime_hours)
    hourly = float(cost.get("hourly_usd") or 0.0)
    set_aside = (
        fs_hourly + float(cost.get("control_plane_usd") or 0.0) + float(cost.get("warm_pool_usd") or 0.0)
    )
    left = limit[0] - spent_usd - set_aside
    runtime = math.floor(max(0.0, left) / hourly * 3600) if hourly > 0 else run.job.launch.max_runtime_seconds
    return AttemptBudget(
        limit_usd=limit[0],
        source=limit[1],
        spent_usd=round(spent_usd, 2),
        left_usd=round(left, 2),
        runtime_seconds=runtime,
        binds=runtime < run.job.launch.max_runtime_seconds,
    )


def cost_so_far_usd(record: JobRecord, jobs: list[dict[str, Any]], now: float) -> float:
    """What the run has cost until now, at list prices: each training attempt's billable time (or, while it
    trains, the time since it started) x its instances, plus the file system's hours at the plan's hourly rate.
    `jobs` are the attempts' DescribeTrainingJob answers (times as datetimes); `lustrain status` and the run's
    notices (steps/notices.py) both count with it."""
    prices = PriceTable()
    total = 0.0
    for job in jobs:
        seconds = job.get("BillableTimeInSeconds")
        if seconds is None and job.get("TrainingStartTime") is not None:
            end = job.get("TrainingEndTime") or datetime.fromtimestamp(now, UTC)
            seconds = max(0.0, (end - job["TrainingStartTime"]).total_seconds())
        billed = prices.billed_compute_usd(
            record.instance_type, float(record.instance_count or 1), float(seconds or 0)
        )
        total += billed or 0.0
    # the file system bills from its creation until its teardown (the record's end): only a run that created one
    # pays for it, from its admission out of the capacity queue (nothing is created before it; a run cancelled
    # while queued created nothing and pays nothing)
    fs_hourly = filesystem_hourly_usd(record.plan, float(record.compute.get("max_runtime_hours") or 0))
    started = record.admitted_at or record.started_at
    if record.created_file_system and started is not None:
        total += fs_hourly * max(0.0, (record.ended_at or now) - started) / 3600
    return round(total, 2)
