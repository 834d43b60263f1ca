"""sweep: find what runs of this stack left behind and tear it down, on a schedule.

A run cleans up after itself through the state machine's teardown. What escapes it: an execution stopped by hand
or killed mid-run (StopExecution, a timeout, a States.Runtime error no Catch sees), a teardown that gave up
(TeardownIncomplete after its retries), or a job record that is gone. The sweeper finds every resource tagged
`lustrain:created-by` = this stack, groups them by their `lustrain:job-id` tag, and judges each job by its record
in the jobs table and its execution (`judge`):

- no record at all: an orphan; swept;
- the execution is no longer RUNNING (SUCCEEDED, FAILED, TIMED_OUT, ABORTED, PENDING_REDRIVE, or gone): whatever
  still carries the job's tags escaped its teardown; swept;
- the execution is RUNNING: left alone, unless the run is past its deadline (its latest training attempt's start,
  or the record's created_at before the first, + the longest one attempt may take, compute.max_runtime_hours or
  for spot its MaxWait (Compute.wait_hours), + the run policy's longest wait before another attempt while
  compute.max_attempts leaves one, + the stack's grace): then the execution is stopped and the run swept;
- no execution recorded (a direct invoke): swept once the record is finished or past its deadline.

Sweeping reuses the teardown (steps/teardown.py `teardown_job`) with what was found by tags added to the job's
ledger: a training job still InProgress is stopped, file systems and the network deleted, and a kept file system
(filesystem.keep, or its `lustrain:keep` tag when the record is gone) stays with its network. A run the sweeper
ends gets status FAILED and the error RunAbandoned in its record; a finished run keeps its status.

A queued run has no resources, so it is never swept; the sweep then takes out of the capacity queue's lines every
run that ended or has no record (`queue.prune`), so a run no teardown saw end never blocks the runs behind it.

A record that says RUNNING though nothing of its run is left and no execution carries it (a function invoked alone
registered it, or its execution is gone) is ended the same way: FAILED with RunAbandoned
(`end_records_left_running`), so no run shows as live for ever.

The result (also logged) is {swept: [...], kept: [...], skipped: [...], released: [...], ended: [...]}: each
resource stopped or deleted and why its job was swept, each resource kept and why, each job left alone (or not
finished yet) and why, each run taken out of a queue and why, and each record ended that no execution carried.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError
from pydantic import ValidationError

from lustrain_core import leftovers, prepare_plan, recovery
from lustrain_core.aws_errors import error_code
from lustrain_core.config import Settings
from lustrain_core.errors import LustrainError, TeardownIncomplete
from lustrain_core.spec import Compute
from lustrain_core.steps import queue, records
from lustrain_core.steps.teardown import TRAINING_JOB, Clock, teardown_job

STATE_MACHINE_SETTING = "LUSTRAIN_STATE_MACHINE_ARN"
GRACE_SETTING = "LUSTRAIN_SWEEP_GRACE_HOURS"
DEFAULT_GRACE_HOURS = 6.0
#: The error a run ended by the sweeper gets in its record.
ABANDONED = "RunAbandoned"
FINISHED = records.FINISHED


# --------------------------------------------------------------------------- the stack's settings


@dataclass(frozen=True)
class SweepSettings:
    state_machine_arn: str
    grace_hours: float

    @classmethod
    def from_settings(cls, settings: Settings) -> SweepSettings:
        raw = settings.extra.get(GRACE_SETTING, "").strip()
        try:
            grace = float(raw) if raw else DEFAULT_GRACE_HOURS
        except ValueError:
            raise ValueError(f"stack setting {GRACE_SETTING}={raw!r} is not a number of hours") from None
        if grace <= 0:
            raise ValueError(f"stack setting {GRACE_SETTING}={raw!r} must be above 0 hours")
        return cls(settings.extra.get(STATE_MACHINE_SETTING, "").strip(), grace)

    def execution_arn(self, execution: str) -> str | None:
        return records.execution_arn(self.state_machine_arn, execution)


# --------------------------------------------------------------------------- finding what runs left


def find_tagged(
    ec2: Any, fsx: Any, sagemaker: Any, stack_name: str, *, iam: Any = None, settings: Settings | None = None
) -> dict[str, list[dict[str, str]]]:
    """Every resource a run of this stack created that still exists and that the sweeper tears down (the VPC's
    pieces, file systems and their links, InProgress training jobs; with `iam` and the stack's settings, the data
    preparations' own roles under the stack's path too), by job id (from its lustrain:job-id tag). Found through
    the registry (lustrain_core.leftovers, which `lustrain leftovers` reports from)."""
    found: dict[str, list[dict[str, str]]] = {}
    for resource in leftovers.stack_resources(
        ec2=ec2,
        fsx=fsx,
        sagemaker=sagemaker,
        stack_name=stack_name,
        iam=iam if settings is not None else None,
        region=settings.region if settings is not None else None,
        kinds=leftovers.SWEPT,
    ):
        found.setdefault(resource.job_id, []).append({"type": resource.kind.name, "id": resource.id})
    return found


# --------------------------------------------------------------------------- judging one job


@dataclass(frozen=True)
class Verdict:
    """What the sweeper does with one job: sweep it (stopping its execution first?) or leave it, and why."""

    sweep: bool
    reason: str
    stop_execution: bool = False


def deadline(record: records.JobRecord, grace_hours: float) -> float | None:
    """When a run still going counts as stuck (epoch seconds), or None when its record does not say.

    A run trains in attempts (the run policy, lustrain_core.recovery): the clock runs from the latest attempt's
    start (start_training's attempt_started_at; before the first, the capacity queue's admission, or the record's
    created_at), for the longest one attempt may take, plus the longest wait before another while attempts remain
    (compute.max_attempts), plus the stack's grace (and, before the first attempt, data.preload's warm-up's
    MaxRuntimeInSeconds). A second attempt is never stopped for the time the first one
    took, nor a run admitted late for the time it queued: while a run waits in the queue (`queue.state` queued),
    the clock starts at the end of the time it may still wait (`queue.since` + `queue.left_s`)."""
    started = record.started_at
    if started is None:
        return None
    if record.preparation:
        # a data preparation run: its stages one after the other, each for at most its MaxRuntimeInSeconds
        stages = len(prepare_plan.STAGES)
        longest_prepare = stages * (prepare_plan.MAX_RUNTIME_SECONDS + prepare_plan.STAGE_OVERHEAD_SECONDS)
        return started + longest_prepare + grace_hours * 3600
    try:
        compute = Compute.model_validate(record.compute)
    except ValidationError:
        return None
    moments = [
        started,
        records.moment(record.attempt_started_at),
        record.admitted_at,
        record.queue_wait_ends_at,
    ]
    anchor = max(m for m in moments if m is not None)
    longest = max(compute.max_runtime_hours, compute.wait_hours or 0) * 3600
    tried = record.attempt
    between = recovery.longest_wait() if tried < compute.max_attempts else 0
    # data.preload's warm-up runs after the admission and before the first attempt, for up to its
    # MaxRuntimeInSeconds (the launch plan's): a run warming its data up is not stuck for that long
    warm_up = 0.0 if tried else record.preload_max_runtime_s
    return anchor + longest + between + warm_up + grace_hours * 3600


def judge(
    record: records.JobRecord | None, execution_status: str | None, now: float, grace_hours: float
) -> Verdict:
    """Sweep or leave one job, from its record and its execution's status (None: none recorded, or gone)."""
    if record is None:
        return Verdict(True, "no job record: an orphan of this stack")
    execution = record.execution or ""
    due = deadline(record, grace_hours)
    late = due is not None and now > due
    past = (
        f"past its deadline ({_iso(due)}: its latest attempt's start + longest training + the wait before another "
        f"+ {grace_hours:g} h grace)"
        if late
        else ""
    )
    if execution_status == "RUNNING":
        if late:
            return Verdict(True, f"its execution {execution} is still RUNNING {past}", stop_execution=True)
        return Verdict(False, f"its execution {execution} is still running")
    if execution_status is not None:
        if record.finished:
            return Verdict(
                True, f"its teardown did not finish (execution {execution} ended {execution_status})"
            )
        return Verdict(True, f"its execution {execution} ended {execution_status} without a teardown")
    if execution:
        return Verdict(True, f"its execution {execution} no longer exists")
    if record.finished:
        return Verdict(True, "its teardown did not finish (no execution recorded)")
    if late:
        return Verdict(True, f"no execution recorded and {past}")
    return Verdict(False, "no execution recorded and not past its deadline")


def _iso(moment: float | None) -> str:
    return datetime.fromtimestamp(moment or 0, UTC).strftime(records.ISO_FORMAT)


def execution_status(sfn: Any, arn: str | None) -> str | None:
    if arn is None:
        return None
    try:
        return str(sfn.describe_execution(executionArn=arn)["status"])
    except ClientError as exc:
        if error_code(exc) == "ExecutionDoesNotExist":
            return None
        raise


# --------------------------------------------------------------------------- the sweep


@dataclass
class SweepReport:
    swept: list[dict[str, Any]]
    kept: list[dict[str, Any]]
    skipped: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"swept": self.swept, "kept": self.kept, "skipped": self.skipped}


def sweep(
    *,
    ec2: Any,
    fsx: Any,
    sagemaker: Any,
    sfn: Any,
    ddb: Any,
    settings: Settings,
    clock: Clock,
    now: Callable[[], float] = time.time,
    iam: Any = None,
) -> dict[str, Any]:
    """One sweep over every job that has resources left; {swept, kept, skipped}."""
    config = SweepSettings.from_settings(settings)
    report = SweepReport([], [], [])
    aws = {"ec2": ec2, "fsx": fsx, "sagemaker": sagemaker, "sfn": sfn, "ddb": ddb}
    found = find_tagged(ec2, fsx, sagemaker, settings.stack_name, iam=iam, settings=settings)
    for job_id, resources in sorted(found.items()):
        try:
            _sweep_job(job_id, resources, report, config, now=now(), settings=settings, clock=clock, **aws)
        except (ClientError, LustrainError) as exc:
            # one job's failure (a permission, a throttle) must not keep the sweeper from the others
            report.skipped.append(
                {"job_id": job_id, "reason": f"could not be swept: {exc}", "resources": resources}
            )
    result = report.to_dict()

    def running(record: records.JobRecord) -> bool:
        arn = config.execution_arn(record.execution or "")
        return arn is None or execution_status(sfn, arn) == "RUNNING"

    result["released"] = queue.prune(ddb, settings, running)
    result["ended"] = end_records_left_running(ddb, sfn, settings, config, now(), holding=set(found))
    return result


def end_records_left_running(
    ddb: Any, sfn: Any, settings: Settings, config: SweepSettings, now: float, holding: set[str]
) -> list[dict[str, str]]:
    """End the records that say RUNNING though no execution carries their run and nothing of it is left (`holding`:
    the jobs that still have resources, which the sweep above judged): a run registered by a function invoked alone
    (`sam local invoke`, `lustrain local invoke RegisterJobFunction`) or whose execution is gone. Judged as any
    other job (`judge`): its execution no longer exists, or none is recorded and the run is past its deadline. An
    execution that ended is left to its own teardown (on_execution_end ends the record; the write is conditional
    on RUNNING either way). Each record ends FAILED with RunAbandoned; [{job_id, reason}]."""
    ended: list[dict[str, str]] = []
    for record in records.scan_running(ddb, settings.jobs_table):
        if record.job_id in holding:
            continue
        arn = config.execution_arn(record.execution or "")
        status = execution_status(sfn, arn)
        if status is not None:  # RUNNING: a live run (late ones hold resources); ended: its teardown ends it
            continue
        verdict = judge(record, status, now, config.grace_hours)
        if not verdict.sweep:
            continue
        if records.end_if_running(
            ddb, settings.jobs_table, record.job_id, {"Error": ABANDONED, "Cause": f"swept: {verdict.reason}"}
        ):
            ended.append({"job_id": record.job_id, "reason": verdict.reason})
    return ended


def _sweep_job(
    job_id: str,
    resources: list[dict[str, str]],
    report: SweepReport,
    config: SweepSettings,
    *,
    now: float,
    sfn: Any,
    ddb: Any,
    settings: Settings,
    **teardown_args: Any,
) -> None:
    """Judge one job and, when it is to go, tear it down; what happened goes into `report`."""
    record = records.get(ddb, settings.jobs_table, job_id)
    arn = config.execution_arn((record.execution if record is not None else None) or "")
    verdict = judge(record, execution_status(sfn, arn), now, config.grace_hours)
    if not verdict.sweep:
        report.skipped.append({"job_id": job_id, "reason": verdict.reason, "resources": resources})
        return
    if verdict.stop_execution and arn is not None:
        _stop_execution(sfn, arn, verdict.reason)
    finished = record is not None and record.finished
    status = record.status if record is not None and finished else "FAILED"
    error = None if finished else {"Error": ABANDONED, "Cause": f"swept: {verdict.reason}"}
    try:
        result = teardown_job(
            job_id, status=status, error=error, found=resources, ddb=ddb, settings=settings, **teardown_args
        )
    except TeardownIncomplete as exc:
        # deleting goes on at the next sweep; what this one did is reported now
        done = exc.details.get("stopped", []) + exc.details.get("deleted", [])
        report.swept += [_swept(job_id, r, verdict.reason) for r in done]
        report.skipped.append(
            {
                "job_id": job_id,
                "reason": f"not finished: {exc.message}",
                "resources": exc.details["remaining"],
            }
        )
        return
    report.swept += [_swept(job_id, r, verdict.reason) for r in result["stopped"] + result["deleted"]]
    report.kept += [{"job_id": job_id, **r} for r in result["kept"]]


def _stop_execution(sfn: Any, arn: str, reason: str) -> None:
    try:
        sfn.stop_execution(
            executionArn=arn, error=ABANDONED, cause=f"stopped by the sweeper: {reason}"[:32768]
        )
    except ClientError as exc:
        if error_code(exc) != "ExecutionDoesNotExist":
            raise


def _swept(job_id: str, resource: dict[str, str], reason: str) -> dict[str, Any]:
    action = "stopped" if resource["type"] == TRAINING_JOB else "deleted"
    return {"job_id": job_id, **resource, "action": action, "reason": reason}
