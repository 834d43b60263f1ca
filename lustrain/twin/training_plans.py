"""SageMaker training plans on the twin (moto 5.2.5 has none): reserved capacity a run's training job names.

A plan reserves instances in reserved capacities (ReservedCapacitySummaries), each of one type, count and
availability zone from its start to its end; by default one, `instance_count` from `start` for `hours`, and more with
`capacities` ("Multiple Reserved Capacity blocks in a single training plan may be discontinuous"). Its TargetResources
say what it carries (`training-job` by default; a HyperPod plan, `hyperpod-cluster`, carries no training job). Its
status follows the clock as AWS's does ("View training plan details": paid -> Scheduled, a capacity's start -> Active,
"the status reverts to Scheduled between active periods", after the plan's end -> Expired), unless the test fixes one
(Pending, Failed). `create_training_plan` is how the rehearsal and the tests make one (AWS makes a plan from a
purchased offering, SearchTrainingPlanOfferings + CreateTrainingPlan, which the twin does not sell).

The API, with botocore's shapes and error codes:
- DescribeTrainingPlan(TrainingPlanName: name or ARN): the plan, its TotalInstanceCount (every capacity's),
  AvailableInstanceCount (those of the capacities active now, less what its jobs use) and InUseInstanceCount counted
  from the twin's InProgress and Stopping training jobs that name it; a plan that does not exist is ResourceNotFound
  (the error botocore's model gives the operation; the wording is the twin's).
- CreateTrainingJob with ResourceConfig.TrainingPlanArn (lustrain.twin.patches.sagemaker calls `check_job`): the plan
  exists (ResourceNotFound), is Scheduled or Active, targets training jobs, reserves the job's instance type and at
  least its count at once (ValidationException), and the job's subnets lie in the plan's zone (ValidationException).
  Such a job does not count against the account's on-demand quota. IAM authorizes it against the plan and its
  reserved capacities (`reserved_capacity_ids`; Service Authorization Reference: CreateTrainingJob's training-plan
  and reserved-capacity resource types). A job created before its capacity starts waits InProgress/Pending
  ("Training plans utilization for SageMaker training jobs": until the capacity is available, its StoppingCondition is
  met, or it has been Pending for 2 days, then InsufficientCapacityError): `capacity_wait` says where it stands, the
  simulator (simulator/lifecycle.py) waits. A plan's time is the twin's clock less the plan's `shift`s, so moving a
  capacity nearer also passes the time its jobs have waited. What AWS does with a job asking more than the plan has
  free (it waits in the plan's queue) the twin's simulator does not model: lustrain's capacity queue admits only what
  fits.
- A job on a plan gets SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP in its environment (`capacity_environment`):
  "Training plans utilization for SageMaker training jobs" names it for the checkpoint before the capacity expires,
  and its example reads it as whole seconds since the epoch (`datetime.fromtimestamp(int(value))`) compared with a
  30-minute threshold, the capacity's termination lead: the twin sets the end of the job's reserved capacity.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.sagemaker.exceptions import SagemakerClientError, ValidationError

REGION = "us-east-1"

#: the jobs of a plan holding its instances
_HOLDING = frozenset({"InProgress", "Stopping"})


class ResourceNotFound(SagemakerClientError):
    code = "ResourceNotFound"


#: what a plan carries unless the test says otherwise (botocore's SageMakerResourceName)
TRAINING_JOB = "training-job"
#: the variable "Training plans utilization for SageMaker training jobs" names
EXPIRATION_VARIABLE = "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
#: "Training plans utilization for SageMaker training jobs": a job Pending for its capacity this long "is terminated
#: with an InsufficientCapacityError"
PENDING_LIMIT_S = 2 * 24 * 3600.0


@dataclass
class _Capacity:
    instance_type: str
    instance_count: int
    availability_zone: str
    availability_zone_id: str | None
    start: float
    end: float

    def status(self, now: float) -> str:
        return "Scheduled" if now < self.start else "Active" if now < self.end else "Expired"


@dataclass
class _Plan:
    name: str
    arn: str
    capacities: list[_Capacity]
    target_resources: tuple[str, ...] = (TRAINING_JOB,)
    fixed_status: str | None = None
    #: the seconds `shift` moved its capacities by, in all: the plan's clock is the twin's less this
    shifted: float = 0.0

    @property
    def start(self) -> float:
        return min(c.start for c in self.capacities)

    @property
    def end(self) -> float:
        return max(c.end for c in self.capacities)

    def status(self, now: float) -> str:
        if self.fixed_status:
            return self.fixed_status
        if now >= self.end:
            return "Expired"
        return "Active" if any(c.start <= now < c.end for c in self.capacities) else "Scheduled"

    def capacity_status(self, capacity: _Capacity, now: float) -> str:
        return self.fixed_status if self.fixed_status in {"Pending", "Failed", "Expired"} else capacity.status(now)

    def capacity_arn(self, index: int) -> str:
        return f"{self.arn.replace(':training-plan/', ':reserved-capacity/')}-{index + 1}"


_lock = threading.Lock()
_PLANS = "_lustrain_twin_training_plans"


def _plans(account: str, region: str) -> dict[str, _Plan]:
    """The plans of one account and region, kept on moto's SageMaker backend (reset with it)."""
    from moto.sagemaker.models import sagemaker_backends

    plans: dict[str, _Plan] = sagemaker_backends[account][region].__dict__.setdefault(_PLANS, {})
    return plans


def create_training_plan(
    name: str,
    *,
    instance_type: str,
    instance_count: int,
    availability_zone: str,
    start: float | None = None,
    hours: float = 24.0,
    status: str | None = None,
    account: str = DEFAULT_ACCOUNT_ID,
    region: str = REGION,
    availability_zone_id: str | None = None,
    capacities: list[dict[str, Any]] | None = None,
    target_resources: tuple[str, ...] | list[str] = (TRAINING_JOB,),
) -> str:
    """A paid training plan of the twin's account and region (starting now unless `start` says otherwise); its ARN.
    Its first reserved capacity is `instance_count` x `instance_type` from `start` for `hours`; each of `capacities`
    adds one, given by `start` and `hours` (and, where they differ from the first's, `instance_count`,
    `instance_type`, `availability_zone`)."""
    begin = time.time() if start is None else start
    arn = f"arn:aws:sagemaker:{region}:{account}:training-plan/{name}"
    first = _Capacity(
        instance_type, instance_count, availability_zone, availability_zone_id, begin, begin + hours * 3600
    )
    more = [
        _Capacity(
            str(c.get("instance_type", instance_type)),
            int(c.get("instance_count", instance_count)),
            str(c.get("availability_zone", availability_zone)),
            c.get("availability_zone_id", availability_zone_id),
            float(c["start"]),
            float(c["start"]) + float(c.get("hours", hours)) * 3600,
        )
        for c in capacities or []
    ]
    plan = _Plan(name, arn, [first, *more], tuple(target_resources), status)
    with _lock:
        _plans(account, region)[name] = plan
    return arn


def set_status(
    name: str, status: str | None, *, account: str = DEFAULT_ACCOUNT_ID, region: str = REGION
) -> None:
    """Fix a plan's status (Failed, Expired), or let it follow the clock again (None)."""
    with _lock:
        _plans(account, region)[name].fixed_status = status


def shift(name: str, seconds: float, *, account: str = DEFAULT_ACCOUNT_ID, region: str = REGION) -> None:
    """Move every reserved capacity of a plan by `seconds` (negative: earlier), as if that much time had passed
    the other way: how a test brings a plan's start near without waiting for it."""
    with _lock:
        plan = _plans(account, region)[name]
        plan.shifted += seconds
        for capacity in plan.capacities:
            capacity.start += seconds
            capacity.end += seconds


def _find(account: str, region: str, ref: str) -> _Plan:
    name = ref.rsplit("training-plan/", 1)[-1]
    with _lock:
        plan = _plans(account, region).get(name)
    if plan is None or (ref.startswith("arn:") and ref != plan.arn):
        raise ResourceNotFound(f"Training plan {ref} does not exist.")
    return plan


def _iso(moment: float) -> datetime:
    return datetime.fromtimestamp(moment, UTC)


def in_use(plan_arn: str, jobs: list[Any]) -> int:
    return sum(
        int(job.instance_count)
        for job in jobs
        if job.status in _HOLDING
        and (job.request.get("ResourceConfig") or {}).get("TrainingPlanArn") == plan_arn
    )


def _duration(seconds: float) -> tuple[int, int]:
    hours, rest = divmod(int(seconds), 3600)
    return hours, rest // 60


def describe(account: str, region: str, ref: str, jobs: list[Any]) -> dict[str, Any]:
    plan = _find(account, region, ref)
    now = time.time()
    status = plan.status(now)
    used = in_use(plan.arn, jobs) if status == "Active" else 0
    active = sum(c.instance_count for c in plan.capacities if plan.capacity_status(c, now) == "Active")
    summaries = []
    for index, c in enumerate(plan.capacities):
        hours, minutes = _duration(c.end - c.start)
        capacity: dict[str, Any] = {
            "ReservedCapacityArn": plan.capacity_arn(index),
            "ReservedCapacityType": "Instance",
            "InstanceType": c.instance_type,
            "TotalInstanceCount": c.instance_count,
            "Status": plan.capacity_status(c, now),
            "AvailabilityZone": c.availability_zone,
            "DurationHours": hours,
            "DurationMinutes": minutes,
            "StartTime": _iso(c.start),
            "EndTime": _iso(c.end),
        }
        if c.availability_zone_id:
            capacity["AvailabilityZoneId"] = c.availability_zone_id
        summaries.append(capacity)
    hours, minutes = _duration(plan.end - plan.start)
    return {
        "TrainingPlanArn": plan.arn,
        "TrainingPlanName": plan.name,
        "Status": status,
        "DurationHours": hours,
        "DurationMinutes": minutes,
        "StartTime": _iso(plan.start),
        "EndTime": _iso(plan.end),
        "UpfrontFee": "0",
        "CurrencyCode": "USD",
        "TotalInstanceCount": sum(c.instance_count for c in plan.capacities),
        "AvailableInstanceCount": max(0, active - used) if status == "Active" else 0,
        "InUseInstanceCount": used,
        "TargetResources": list(plan.target_resources),
        "ReservedCapacitySummaries": summaries,
    }


def _plan_of(request: dict[str, Any]) -> _Plan | None:
    """The plan a CreateTrainingJob request names (its account and region read from the ARN), if the twin has it."""
    arn = str((request.get("ResourceConfig") or {}).get("TrainingPlanArn") or "")
    parts = arn.split(":")
    if len(parts) < 6:
        return None
    try:
        return _find(parts[4], parts[3], arn)
    except ResourceNotFound:
        return None


def reserved_capacity_ids(request: dict[str, Any]) -> list[str] | None:
    """The ids (ARN's last part) of the reserved capacities a CreateTrainingJob request's plan holds of the job's
    instance type: what the twin's IAM authorizes the call against (CreateTrainingJob's reserved-capacity resource
    type); None for a job on no plan the twin knows."""
    plan = _plan_of(request)
    if plan is None:
        return None
    kind = (request.get("ResourceConfig") or {}).get("InstanceType")
    return [
        plan.capacity_arn(i).rsplit("reserved-capacity/", 1)[-1]
        for i, c in enumerate(plan.capacities)
        if c.instance_type == kind
    ] or None


def _most_at_once(plan: _Plan, instance_type: str) -> int:
    """The most instances of a type the plan's capacities hold together at one moment (non-overlapping ones are
    never one fleet)."""
    of_type = [c for c in plan.capacities if c.instance_type == instance_type]
    return max(
        (sum(o.instance_count for o in of_type if o.start <= c.start < o.end) for c in of_type), default=0
    )


def _job_capacity(plan: _Plan, request: dict[str, Any], now: float) -> _Capacity | None:
    """The reserved capacity a job created now runs in: the active one of its type that lasts longest, else the next
    to start."""
    kind = (request.get("ResourceConfig") or {}).get("InstanceType")
    of_type = [c for c in plan.capacities if c.instance_type == kind and now < c.end]
    active = [c for c in of_type if c.start <= now]
    if active:
        return max(active, key=lambda c: c.end)
    return min(of_type, key=lambda c: c.start, default=None)


@dataclass(frozen=True)
class CapacityWait:
    """Where a job on a plan stands against its reserved capacity."""

    #: the plan's clock now (seconds since the epoch, less the plan's shifts): what the job's wait is measured in
    clock: float
    #: seconds until the capacity the job runs in starts (0: active now); None when none of its type is left
    starts_in: float | None


def capacity_wait(request: dict[str, Any]) -> CapacityWait | None:
    """How long a CreateTrainingJob request's job waits for its capacity, on the plan's clock (the module's docstring);
    None for a job on no plan the twin knows."""
    plan = _plan_of(request)
    if plan is None:
        return None
    now = time.time()
    with _lock:
        capacity = None if plan.fixed_status in {"Failed", "Expired"} else _job_capacity(plan, request, now)
        shifted = plan.shifted
    starts_in = None if capacity is None else max(0.0, capacity.start - now)
    return CapacityWait(clock=now - shifted, starts_in=starts_in)


def waits_for_capacity(request: dict[str, Any]) -> bool:
    """Whether a job created now on its plan starts Pending: its capacity has not started (or none is left)."""
    wait = capacity_wait(request)
    return wait is not None and wait.starts_in != 0


def capacity_environment(request: dict[str, Any], now: float | None = None) -> dict[str, str]:
    """What SageMaker adds to the environment of a job on a training plan: SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION
    _TIMESTAMP, the end of the reserved capacity the job runs in, in whole seconds since the epoch (see the module's
    docstring); {} for a job on no plan. The simulator's training environment (simulator/container.training_env)
    merges it."""
    plan = _plan_of(request)
    if plan is None:
        return {}
    capacity = _job_capacity(plan, request, time.time() if now is None else now)
    if capacity is None:
        return {}
    return {EXPIRATION_VARIABLE: str(int(capacity.end))}


def check_job(account: str, region: str, request: dict[str, Any], subnet_zones: list[str]) -> None:
    """CreateTrainingJob's checks of a job on a plan (see the module's docstring)."""
    resources = request.get("ResourceConfig") or {}
    plan = _find(account, region, str(resources["TrainingPlanArn"]))
    status = plan.status(time.time())
    if status not in {"Scheduled", "Active"}:
        raise ValidationError(f"Training plan {plan.arn} is {status} and cannot be used.")
    if TRAINING_JOB not in plan.target_resources:
        raise ValidationError(
            f"Training plan {plan.arn} targets {', '.join(plan.target_resources)} and cannot be used by a "
            "training job."
        )
    kind = resources.get("InstanceType")
    if kind not in {c.instance_type for c in plan.capacities}:
        raise ValidationError(
            f"Instance type {kind} does not match the instance type "
            f"{plan.capacities[0].instance_type} of training plan {plan.arn}."
        )
    most = _most_at_once(plan, str(kind))
    if int(resources.get("InstanceCount", 1)) > most:
        raise ValidationError(
            f"Instance count {resources.get('InstanceCount')} exceeds the {most} instances of "
            f"training plan {plan.arn}."
        )
    zones = {c.availability_zone for c in plan.capacities if c.instance_type == kind}
    elsewhere = sorted({z for z in subnet_zones if z not in zones})
    if elsewhere:
        raise ValidationError(
            f"The subnets of the training job are in {', '.join(elsewhere)}; training plan {plan.arn} reserves "
            f"its capacity in {', '.join(sorted(zones))}."
        )
