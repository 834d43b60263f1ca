"""compute.training_plan: a run on a SageMaker training plan's reserved capacity.

A training plan (SageMaker Developer Guide, "SageMaker training plans"; API: DescribeTrainingPlan) reserves
instances of a type, in one availability zone, from a start time to an end time, paid up front. A plan is Pending
(being paid), Scheduled (paid, not started), Active (between its start and end), then Expired; or Failed. A training
job uses it by naming it in CreateTrainingJob's ResourceConfig.TrainingPlanArn. Its reserved capacities
(ReservedCapacitySummaries) each give an instance type, a count, a zone and a window; they "may be discontinuous"
(gaps between them), and the plan is Scheduled again between two of them.

How AWS runs a training job on a plan ("Training plans utilization for SageMaker training jobs"), which this module
follows:
- Only a plan whose TargetResources include `training-job` carries training jobs ("Training plans are specific to
  their target resource": a HyperPod plan provides instances to a cluster's instance group only).
- The instances a job may have at a moment are those of the reserved capacities active then: two capacities that do
  not overlap are never one fleet (`windows`).
- "You have full access to all reserved instances until 30 minutes before the Reserved Capacity end time", then
  SageMaker terminates them: a job's usable end is its capacity's end less TERMINATION_LEAD_S.
- A job created before its capacity starts waits Pending for it, "until the StoppingCondition is met, or the job has
  been Pending for capacity for 2 days", then ends with InsufficientCapacityError. That wait is not run time
  (MaxRuntimeInSeconds counts from training's start; a Scheduled plan does not increment MaxPendingTimeInSeconds),
  so `job_runtime_seconds` caps the runtime to the usable end counted from the capacity's start; and the job is
  created no earlier than CREATE_LEAD_S before its capacity starts.

- register_job (`find`) checks the run against the plan before anything exists, each refusal naming its field:
  the plan exists here (ResourceNotFound -> compute.training_plan), is not Expired or Failed, targets training jobs,
  reserves compute.instance_type, at least compute.instance_count of them at once, starts within
  compute.max_queue_hours, and has a window of compute.max_runtime_hours before a usable end. network.availability_zone,
  if given, must name the plan's zone (steps/zones.py). The launch plan carries what it found (launch_plan.TrainingPlan).
- The capacity queue (steps/queue.py) admits the run against the plan's instances (`measure`), not the on-demand
  quota, once its window starts within CREATE_LEAD_S: the network, the file system and its warm-up are built while
  the plan is still Scheduled, and the training job, created right after them, waits Pending for the capacity and
  starts at the reservation's start. A plan that expired or failed meanwhile ends the run QuotaExceeded.
- create_network puts the subnet in the plan's zone; CreateTrainingJob carries TrainingPlanArn, and its
  MaxRuntimeInSeconds is `job_runtime_seconds` (steps/training.py).
The instances a plan's jobs use do not count against the on-demand quota (steps/quota.py leaves them out).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core.aws_errors import error_code, explained
from lustrain_core.document import Job
from lustrain_core.errors import FieldError, QuotaExceeded, SpecInvalid
from lustrain_core.launch_plan import TrainingPlan
from lustrain_core.spec import MAX_RUNTIME_HOURS, JobSpec

FIELD = "compute.training_plan"
USABLE = frozenset({"Pending", "Scheduled", "Active"})
#: what a plan must target to carry a training job (DescribeTrainingPlan.TargetResources; botocore's
#: SageMakerResourceName: training-job | hyperpod-cluster | endpoint | studio-apps)
TARGET = "training-job"
#: "You have full access to all reserved instances until 30 minutes before the Reserved Capacity end time"
#: ("Training plans utilization for SageMaker training jobs", Important: Reserved Capacity termination process)
TERMINATION_LEAD_S = 30 * 60
#: "If a job has been pending for 2 days, it is terminated with an InsufficientCapacityError" (same page)
PENDING_LIMIT_S = 2 * 24 * 3600
#: a run's training job is created no earlier than this before its capacity starts: inside the 2 days a job may wait
#: Pending, with an hour to spare for the network, the file system and SageMaker's own start
CREATE_LEAD_S = PENDING_LIMIT_S - 3600
#: SageMaker's MaxRuntimeInSeconds ceiling, 28 days (spec.MAX_RUNTIME_HOURS)
MAX_RUNTIME_S = MAX_RUNTIME_HOURS * 3600
#: a reserved capacity that carries no job (ReservedCapacityStatus)
ENDED = frozenset({"Expired", "Failed"})


def _iso(moment: Any) -> str | None:
    if moment is None:
        return None
    if isinstance(moment, datetime):
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(moment)


def _moment(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def describe(sagemaker: Any, ref: str) -> dict[str, Any]:
    """DescribeTrainingPlan of a name or ARN; SpecInvalid naming compute.training_plan when there is none."""
    try:
        return dict(sagemaker.describe_training_plan(TrainingPlanName=ref))
    except ClientError as exc:
        if error_code(exc) in {"ResourceNotFound", "ValidationException"}:
            raise SpecInvalid.one(
                FIELD, ref, f"no such training plan in this region ({explained(exc)})"
            ) from None
        raise


def _capacities(described: dict[str, Any], instance_type: str) -> list[dict[str, Any]]:
    return [
        c for c in described.get("ReservedCapacitySummaries", []) if c.get("InstanceType") == instance_type
    ]


@dataclass(frozen=True)
class Block:
    """One reserved capacity of the run's instance type: its window and its instances."""

    start: float
    end: float
    instances: int

    @property
    def usable_end(self) -> float:
        """The moment SageMaker begins terminating its instances (TERMINATION_LEAD_S before its end)."""
        return self.end - TERMINATION_LEAD_S


@dataclass(frozen=True)
class Window:
    """Where a job of the run's instances can run: from `start` (a capacity's start, or now) to `usable_end` (the
    earliest usable end of the capacities it takes), on `instances` reserved instances active together."""

    start: float
    usable_end: float
    instances: int

    @property
    def seconds(self) -> float:
        return self.usable_end - self.start


def blocks(described: dict[str, Any], instance_type: str) -> list[Block]:
    """The plan's reserved capacities of `instance_type` that can still carry a job, with their windows (a capacity
    without times takes the plan's)."""
    found = []
    for capacity in _capacities(described, instance_type):
        if str(capacity.get("Status")) in ENDED:
            continue
        start = _moment(capacity.get("StartTime") or described.get("StartTime"))
        end = _moment(capacity.get("EndTime") or described.get("EndTime"))
        if start is None or end is None:
            continue
        found.append(Block(start, end, int(capacity.get("TotalInstanceCount") or 0)))
    return found


def instances_at(described: dict[str, Any], instance_type: str, moment: float) -> int:
    """The reserved instances of `instance_type` a job may use at `moment`: those of the capacities active then
    (until their usable end), never those of a capacity before or after."""
    return sum(b.instances for b in blocks(described, instance_type) if b.start <= moment < b.usable_end)


def most_at_once(described: dict[str, Any], instance_type: str) -> int:
    """The most reserved instances of `instance_type` active together at any moment of the plan."""
    found = blocks(described, instance_type)
    return max((instances_at(described, instance_type, b.start) for b in found), default=0)


def windows(described: dict[str, Any], instance_type: str, count: int, now: float) -> list[Window]:
    """Every start, from `now` on, where `count` instances are reserved together, with the usable end of the
    capacities the job would take (those that last longest first: a job ends when the first of its capacities
    does)."""
    found = blocks(described, instance_type)
    moments = sorted({max(now, b.start) for b in found if max(now, b.start) < b.usable_end})
    answer = []
    for moment in moments:
        active = sorted((b for b in found if b.start <= moment < b.usable_end), key=lambda b: -b.end)
        taken: list[Block] = []
        for block in active:
            taken.append(block)
            if sum(b.instances for b in taken) >= count:
                answer.append(
                    Window(moment, min(b.usable_end for b in taken), sum(b.instances for b in active))
                )
                break
    return answer


def window(
    described: dict[str, Any], instance_type: str, count: int, now: float, runtime_s: float | None = None
) -> Window | None:
    """The window a job of the run runs in: the first that lasts `runtime_s` (register_job checked there is one),
    else the first that carries its instances at all (its runtime is then capped to it); None when none does."""
    found = windows(described, instance_type, count, now)
    if runtime_s is not None:
        for candidate in found:
            if candidate.seconds >= runtime_s:
                return candidate
    return found[0] if found else None


def _targets_training_jobs(described: dict[str, Any]) -> bool:
    return TARGET in [str(t) for t in described.get("TargetResources") or []]


def _targets(described: dict[str, Any]) -> str:
    return ", ".join(str(t) for t in described.get("TargetResources") or []) or "nothing"


def usable_runtime_seconds(
    described: dict[str, Any],
    now: float,
    *,
    instance_type: str,
    instance_count: int,
    runtime_s: float | None = None,
) -> int | None:
    """Seconds from `now` to the usable end of the window a job created now runs in (its capacity's end less
    TERMINATION_LEAD_S), counting the time it waits Pending for the capacity; None when no window carries it."""
    found = window(described, instance_type, instance_count, now, runtime_s)
    if found is None:
        return None
    return max(0, math.floor(found.usable_end - now))


def job_runtime_seconds(
    described: dict[str, Any], now: float, *, instance_type: str, instance_count: int, runtime_s: int
) -> int | None:
    """MaxRuntimeInSeconds of a job created now on the plan: `runtime_s` (what the spec or the budget allows it to
    train), never past its window's usable end counted from when the window starts (or now, inside it) nor
    SageMaker's 28 days; None when no window carries it. The time the job waits Pending for a Scheduled capacity is
    not run time: MaxRuntimeInSeconds is how long a job "can run" and the wait has its own counter,
    MaxPendingTimeInSeconds, which a plan's Scheduled state does not increment (botocore's StoppingCondition). The
    trainer measures the same runtime from its own start (trainer/lustrain_trainer/stopping.py)."""
    found = window(described, instance_type, instance_count, now, runtime_s)
    if found is None:
        return None
    begins = max(now, found.start)
    return max(0, min(runtime_s, math.floor(found.usable_end - begins), MAX_RUNTIME_S))


def _at(moment: float) -> str:
    return str(_iso(datetime.fromtimestamp(moment, UTC)))


def check(described: dict[str, Any], spec: JobSpec, now: float) -> TrainingPlan:
    """The plan as the run will use it, or SpecInvalid with every way the run does not fit it."""
    compute = spec.compute
    ref = str(compute.training_plan)
    status = str(described.get("Status"))
    name = str(described.get("TrainingPlanName", ref))
    if status not in USABLE:
        message = str(described.get("StatusMessage") or "")
        raise SpecInvalid.one(
            FIELD, ref, f"the plan {name} is {status}{f' ({message})' if message else ''}: no job can use it"
        )
    if not _targets_training_jobs(described):
        raise SpecInvalid.one(
            FIELD,
            ref,
            f"the plan {name} targets {_targets(described)} (TargetResources): only a plan for {TARGET} carries a "
            "training job (a plan is specific to its target resource)",
        )
    capacities = _capacities(described, compute.instance_type)
    if not capacities:
        reserved = sorted(
            {str(c.get("InstanceType")) for c in described.get("ReservedCapacitySummaries", [])}
        )
        raise SpecInvalid.one(
            "compute.instance_type",
            compute.instance_type,
            f"the training plan {name} reserves {', '.join(reserved) or 'no instances'}, not this type",
        )
    errors: list[FieldError] = []
    most = most_at_once(described, compute.instance_type)
    if compute.instance_count > most:
        spread = "; ".join(
            f"{b.instances} from {_at(b.start)} to {_at(b.end)}" for b in blocks(described, compute.instance_type)
        )
        errors.append(
            FieldError(
                "compute.instance_count",
                compute.instance_count,
                f"the training plan {name} reserves at most {most} x {compute.instance_type} at once ({spread or 'none left'}; "
                f"capacities that do not overlap are never one fleet): at most {most}",
            )
        )
    zones = sorted({str(c.get("AvailabilityZone")) for c in capacities if c.get("AvailabilityZone")})
    if len(zones) != 1:
        errors.append(
            FieldError(
                FIELD,
                ref,
                f"the plan's {compute.instance_type} capacity lies in {', '.join(zones) or 'no zone'}: a run's "
                "instances share one subnet, in one zone",
            )
        )
    runtime_s = compute.max_runtime_hours * 3600
    found = windows(described, compute.instance_type, min(compute.instance_count, max(most, 1)), now)
    fits = [w for w in found if w.seconds >= runtime_s]
    chosen = fits[0] if fits else (found[0] if found else None)
    start = chosen.start if chosen is not None else _moment(described.get("StartTime"))
    if start is not None and start - now > compute.max_queue_hours * 3600:
        errors.append(
            FieldError(
                "compute.max_queue_hours",
                compute.max_queue_hours,
                f"the training plan {name} starts at {_at(start)}, "
                f"{(start - now) / 3600:.1f} h from now: the run would wait longer than this (raise it to at least "
                f"{math.ceil((start - now) / 3600)})",
            )
        )
    if not fits:
        longest = max((w.seconds for w in found), default=0.0) / 3600
        errors.append(
            FieldError(
                "compute.max_runtime_hours",
                compute.max_runtime_hours,
                f"the training plan {name} reserves {compute.instance_count} x {compute.instance_type} for at most "
                f"{max(longest, 0):.1f} h in one go (each reserved capacity ends for its jobs "
                f"{TERMINATION_LEAD_S // 60} minutes before its end): at most that",
            )
        )
    if errors:
        raise SpecInvalid(errors)
    assert chosen is not None  # a window that fits, else the errors above
    return TrainingPlan(
        arn=str(described["TrainingPlanArn"]),
        name=name,
        status=status,
        instance_type=compute.instance_type,
        instance_count=chosen.instances,
        availability_zone=zones[0],
        start_time=_at(chosen.start),
        end_time=_at(chosen.usable_end + TERMINATION_LEAD_S),
    )


def find(sagemaker: Any, spec: JobSpec, now: float) -> TrainingPlan | None:
    """compute.training_plan, checked against the run (register_job); None for a run without one."""
    if spec.compute.training_plan is None:
        return None
    return check(describe(sagemaker, spec.compute.training_plan), spec, now)


def measure(job: Job, *, sagemaker: Any, held: int = 0, now: float | None = None) -> dict[str, Any]:
    """The capacity queue's numbers for a run on a plan, in the quota's terms: `limit` the instances reserved
    together in the window the run's job runs in (0 when none can carry it: an Expired or Failed plan, a plan for
    other resources), `in_use` those its jobs use now, `available` what is free for this run: 0 until the window
    starts within CREATE_LEAD_S (the run's network, file system and job are made then, its job waits Pending for
    the capacity), then the window's instances less what SageMaker counts in use in it and the queue holds for
    other runs."""
    plan = job.launch.training_plan
    if plan is None:
        raise ValueError("the run has no training plan")
    compute = job.spec.compute
    moment = time.time() if now is None else now
    described = describe(sagemaker, plan.arn)
    status = str(described.get("Status"))
    carries = status in USABLE and _targets_training_jobs(described)
    found = (
        window(described, compute.instance_type, compute.instance_count, moment, compute.max_runtime_hours * 3600)
        if carries
        else None
    )
    total = found.instances if found is not None else 0
    in_use, free = 0, 0
    if found is not None and moment >= found.start - CREATE_LEAD_S:
        if found.start <= moment and status == "Active":
            # SageMaker's count of the plan's instances free now (its jobs' hold the rest)
            free = min(total, int(described.get("AvailableInstanceCount") or 0))
            in_use = total - free
        else:
            free = total  # a capacity not started yet: no job runs on it
    measured: dict[str, Any] = {
        "quota_code": "training-plan",
        "quota_name": f"training plan {plan.name}",
        "plan_status": status,
        "limit": total,
        "in_use": in_use,
        "held": held,
        "requested": compute.instance_count,
        "available": max(0, free - held),
    }
    if found is not None:
        measured["capacity_start"] = _at(found.start)
        measured["capacity_usable_end"] = _at(found.usable_end)
    return measured


def refusal(job: Job, measured: dict[str, Any], why: str = "") -> QuotaExceeded:
    """QuotaExceeded of a run its training plan cannot carry: the plan ended, or the wait for its instances ran out."""
    plan = job.launch.training_plan
    if plan is None:
        raise ValueError("the run has no training plan")
    compute = job.spec.compute
    message = (
        f"{compute.instance_count} x {compute.instance_type} requested of the training plan {plan.name} "
        f"({measured.get('plan_status')}, {measured['limit']} reserved, {measured['in_use']} in use, "
        f"{measured.get('held') or 0} promised to queued runs, {measured['available']} free)"
        + (f"; {why}" if why else "")
        + (
            ""
            if measured.get("capacity_start")
            else f"; no reserved capacity of the plan carries {compute.instance_count} x {compute.instance_type} "
            "from now on"
        )
    )
    return QuotaExceeded(message, **measured)
