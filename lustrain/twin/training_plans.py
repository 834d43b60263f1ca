"""SageMaker training plans on the twin (moto 5.2.5 has none): reserved capacity a run's training job names.

A plan reserves `instance_count` instances of one type in one availability zone from `start` to `end` (one reserved
capacity, ReservedCapacitySummaries[0]). Its status follows the clock as AWS's does (CreateTrainingPlan's reference:
paid -> Scheduled, its start arrives -> Active, its end passes -> Expired), unless the test fixes one (Pending,
Failed). `create_training_plan` is how the rehearsal and the tests make one (AWS makes a plan from a purchased
offering, SearchTrainingPlanOfferings + CreateTrainingPlan, which the twin does not sell).

The API, with botocore's shapes and error codes:
- DescribeTrainingPlan(TrainingPlanName: name or ARN): the plan, its AvailableInstanceCount and InUseInstanceCount
  counted from the twin's InProgress and Stopping training jobs that name it; a plan that does not exist is
  ResourceNotFound (the error botocore's model gives the operation; the wording is the twin's).
- CreateTrainingJob with ResourceConfig.TrainingPlanArn (lustrain.twin.patches.sagemaker calls `check_job`): the plan
  exists (ResourceNotFound), is Scheduled or Active, reserves the job's instance type and at least its count
  (ValidationException), and the job's subnets lie in the plan's zone (ValidationException). Such a job does not
  count against the account's on-demand quota. What AWS does with a job asking more than the plan has free (it
  waits in the plan's queue) the twin does not model: lustrain's capacity queue admits only what fits.
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


@dataclass
class _Plan:
    name: str
    arn: str
    instance_type: str
    instance_count: int
    availability_zone: str
    availability_zone_id: str | None
    start: float
    end: float
    fixed_status: str | None = None

    def status(self, now: float) -> str:
        if self.fixed_status:
            return self.fixed_status
        return "Scheduled" if now < self.start else "Active" if now < self.end else "Expired"


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
) -> str:
    """A paid training plan of the twin's account and region (starting now unless `start` says otherwise); its ARN."""
    begin = time.time() if start is None else start
    arn = f"arn:aws:sagemaker:{region}:{account}:training-plan/{name}"
    plan = _Plan(
        name,
        arn,
        instance_type,
        instance_count,
        availability_zone,
        availability_zone_id,
        begin,
        begin + hours * 3600,
        status,
    )
    with _lock:
        _plans(account, region)[name] = plan
    return arn


def set_status(
    name: str, status: str | None, *, account: str = DEFAULT_ACCOUNT_ID, region: str = REGION
) -> None:
    """Fix a plan's status (Failed, Expired), or let it follow the clock again (None)."""
    with _lock:
        _plans(account, region)[name].fixed_status = status


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


def describe(account: str, region: str, ref: str, jobs: list[Any]) -> dict[str, Any]:
    plan = _find(account, region, ref)
    now = time.time()
    status = plan.status(now)
    used = in_use(plan.arn, jobs) if status == "Active" else 0
    hours, rest = divmod(int(plan.end - plan.start), 3600)
    capacity: dict[str, Any] = {
        "ReservedCapacityArn": f"arn:aws:sagemaker:{region}:{account}:reserved-capacity/{plan.name}-1",
        "ReservedCapacityType": "Instance",
        "InstanceType": plan.instance_type,
        "TotalInstanceCount": plan.instance_count,
        "Status": status,
        "AvailabilityZone": plan.availability_zone,
        "DurationHours": hours,
        "DurationMinutes": rest // 60,
        "StartTime": _iso(plan.start),
        "EndTime": _iso(plan.end),
    }
    if plan.availability_zone_id:
        capacity["AvailabilityZoneId"] = plan.availability_zone_id
    return {
        "TrainingPlanArn": plan.arn,
        "TrainingPlanName": plan.name,
        "Status": status,
        "DurationHours": hours,
        "DurationMinutes": rest // 60,
        "StartTime": _iso(plan.start),
        "EndTime": _iso(plan.end),
        "UpfrontFee": "0",
        "CurrencyCode": "USD",
        "TotalInstanceCount": plan.instance_count,
        "AvailableInstanceCount": max(0, plan.instance_count - used) if status == "Active" else 0,
        "InUseInstanceCount": used,
        "TargetResources": ["training-job"],
        "ReservedCapacitySummaries": [capacity],
    }


def check_job(account: str, region: str, request: dict[str, Any], subnet_zones: list[str]) -> None:
    """CreateTrainingJob's checks of a job on a plan (see the module's docstring)."""
    resources = request.get("ResourceConfig") or {}
    plan = _find(account, region, str(resources["TrainingPlanArn"]))
    status = plan.status(time.time())
    if status not in {"Scheduled", "Active"}:
        raise ValidationError(f"Training plan {plan.arn} is {status} and cannot be used.")
    if resources.get("InstanceType") != plan.instance_type:
        raise ValidationError(
            f"Instance type {resources.get('InstanceType')} does not match the instance type "
            f"{plan.instance_type} of training plan {plan.arn}."
        )
    if int(resources.get("InstanceCount", 1)) > plan.instance_count:
        raise ValidationError(
            f"Instance count {resources.get('InstanceCount')} exceeds the {plan.instance_count} instances of "
            f"training plan {plan.arn}."
        )
    elsewhere = sorted({z for z in subnet_zones if z != plan.availability_zone})
    if elsewhere:
        raise ValidationError(
            f"The subnets of the training job are in {', '.join(elsewhere)}; training plan {plan.arn} reserves "
            f"its capacity in {plan.availability_zone}."
        )
