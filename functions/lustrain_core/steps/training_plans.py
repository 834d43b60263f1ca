"""compute.training_plan: a run on a SageMaker training plan's reserved capacity.

A training plan (SageMaker Developer Guide, "SageMaker training plans"; API: DescribeTrainingPlan) reserves
instances of a type, in one availability zone, from a start time to an end time, paid up front. A plan is Pending
(being paid), Scheduled (paid, not started), Active (between its start and end), then Expired; or Failed. A training
job uses it by naming it in CreateTrainingJob's ResourceConfig.TrainingPlanArn. Its reserved capacities
(ReservedCapacitySummaries) each give an instance type, a count, a zone and a window.

- register_job (`find`) checks the run against the plan before anything exists, each refusal naming its field:
  the plan exists here (ResourceNotFound -> compute.training_plan), is not Expired or Failed, reserves
  compute.instance_type, at least compute.instance_count of them, starts within compute.max_queue_hours, and
  leaves compute.max_runtime_hours between its start (or now) and its end. network.availability_zone, if given, must
  name the plan's zone (steps/zones.py). The launch plan carries what it found (launch_plan.TrainingPlan).
- The capacity queue (steps/queue.py) admits the run against the plan's instances (`measure`: the plan's
  AvailableInstanceCount, less what the queue holds for other runs of the plan), not the on-demand quota, and only
  once the plan is Active: the network and the file system, which bill, are made after the admission. A plan that
  expired or failed meanwhile ends the run QuotaExceeded.
- create_network puts the subnet in the plan's zone; CreateTrainingJob carries TrainingPlanArn.
The instances a plan's jobs use do not count against the on-demand quota (steps/quota.py leaves them out).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core.aws_errors import error_code, explained
from lustrain_core.document import Job
from lustrain_core.errors import FieldError, QuotaExceeded, SpecInvalid
from lustrain_core.launch_plan import TrainingPlan
from lustrain_core.spec import JobSpec

FIELD = "compute.training_plan"
USABLE = frozenset({"Pending", "Scheduled", "Active"})


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
    total = sum(int(c.get("TotalInstanceCount") or 0) for c in capacities)
    if compute.instance_count > total:
        errors.append(
            FieldError(
                "compute.instance_count",
                compute.instance_count,
                f"the training plan {name} reserves {total} x {compute.instance_type}: at most {total}",
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
    starts = [m for m in (_moment(c.get("StartTime")) for c in capacities) if m is not None]
    ends = [m for m in (_moment(c.get("EndTime")) for c in capacities) if m is not None]
    start = min(starts) if starts else _moment(described.get("StartTime"))
    end = max(ends) if ends else _moment(described.get("EndTime"))
    if start is not None and start - now > compute.max_queue_hours * 3600:
        errors.append(
            FieldError(
                "compute.max_queue_hours",
                compute.max_queue_hours,
                f"the training plan {name} starts at {_iso(datetime.fromtimestamp(start, UTC))}, "
                f"{(start - now) / 3600:.1f} h from now: the run would wait longer than this (raise it to at least "
                f"{math.ceil((start - now) / 3600)})",
            )
        )
    if end is not None:
        left_h = (end - max(now, start or now)) / 3600
        if left_h < compute.max_runtime_hours:
            errors.append(
                FieldError(
                    "compute.max_runtime_hours",
                    compute.max_runtime_hours,
                    f"the training plan {name} ends at {_iso(datetime.fromtimestamp(end, UTC))}, "
                    f"{max(left_h, 0):.1f} h after the run could start: at most that",
                )
            )
    if errors:
        raise SpecInvalid(errors)
    return TrainingPlan(
        arn=str(described["TrainingPlanArn"]),
        name=name,
        status=status,
        instance_type=compute.instance_type,
        instance_count=total,
        availability_zone=zones[0],
        start_time=_iso(datetime.fromtimestamp(start, UTC)) if start is not None else None,
        end_time=_iso(datetime.fromtimestamp(end, UTC)) if end is not None else None,
    )


def find(sagemaker: Any, spec: JobSpec, now: float) -> TrainingPlan | None:
    """compute.training_plan, checked against the run (register_job); None for a run without one."""
    if spec.compute.training_plan is None:
        return None
    return check(describe(sagemaker, spec.compute.training_plan), spec, now)


def measure(job: Job, *, sagemaker: Any, held: int = 0) -> dict[str, Any]:
    """The capacity queue's numbers for a run on a plan, in the quota's terms: `limit` the instances the plan
    reserves of the type, `in_use` those its jobs use now, `available` what is free for this run (0 until the plan is
    Active: nothing of the run is made before). An Expired or Failed plan has a limit of 0: the run can never fit."""
    plan = job.launch.training_plan
    if plan is None:
        raise ValueError("the run has no training plan")
    described = describe(sagemaker, plan.arn)
    status = str(described.get("Status"))
    total = plan.instance_count if status in USABLE else 0
    free = int(described.get("AvailableInstanceCount") or 0) if status == "Active" else 0
    return {
        "quota_code": "training-plan",
        "quota_name": f"training plan {plan.name}",
        "plan_status": status,
        "limit": total,
        "in_use": max(0, total - free) if status == "Active" else 0,
        "held": held,
        "requested": job.spec.compute.instance_count,
        "available": max(0, free - held),
    }


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
    )
    return QuotaExceeded(message, **measured)
