"""check_quota: are there enough instances of the type left in the account's SageMaker quota for this run?

The quota is found by its name ("ml.p4d.24xlarge for training job usage"; spot jobs count against "... for spot
training job usage"), never by a hard-coded L- code: public sources disagree on the codes. Its value is the
account's applied quota, or AWS's default where none was ever applied. In use = the instances of that type held
by InProgress and Stopping training jobs of the same kind (spot or on-demand), and for on-demand the instances kept
in Available warm pools (they count against the training quota too), less those of a pool the run will take over.
A run with compute.keep_alive_minutes also needs its instances in "<type> for training warm pool usage" (0 by
default): `check_warm_pool` refuses it at once otherwise. The capacity queue (steps/queue.py)
measures with it and admits a run when its instances fit; a refusal (QuotaExceeded) carries the numbers and the
command that asks for more; with LUSTRAIN_REQUEST_QUOTA_INCREASE=true the request is filed too, and the error says
so.
"""

from __future__ import annotations

import math
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core.config import Settings
from lustrain_core.document import Job
from lustrain_core.errors import QuotaExceeded, SpecInvalid
from lustrain_core.steps import warm_pool

SERVICE_CODE = "sagemaker"
REQUEST_INCREASE = "LUSTRAIN_REQUEST_QUOTA_INCREASE"


def find_quota(quotas: Any, name: str) -> dict[str, Any] | None:
    """The quota with this name: the account's list first, then AWS's defaults (an account may list neither)."""
    for operation in ("list_service_quotas", "list_aws_default_service_quotas"):
        for page in quotas.get_paginator(operation).paginate(ServiceCode=SERVICE_CODE):
            for quota in page.get("Quotas", []):
                if quota.get("QuotaName") == name:
                    return dict(quota)
    return None


def quota_value(quotas: Any, code: str) -> float:
    try:
        return float(quotas.get_service_quota(ServiceCode=SERVICE_CODE, QuotaCode=code)["Quota"]["Value"])
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "NoSuchResourceException":
            raise
    return float(
        quotas.get_aws_default_service_quota(ServiceCode=SERVICE_CODE, QuotaCode=code)["Quota"]["Value"]
    )


#: the statuses of training jobs that hold instances: a Stopping job still has its fleet (and SageMaker counts it)
HOLDING_STATUSES = ("InProgress", "Stopping")


def instances_in_use(sagemaker: Any, instance_type: str, spot: bool) -> int:
    """Instances of the type held by InProgress and Stopping training jobs that count against the same quota."""
    used = 0
    for status in HOLDING_STATUSES:
        for page in sagemaker.get_paginator("list_training_jobs").paginate(StatusEquals=status):
            for summary in page.get("TrainingJobSummaries", []):
                job = sagemaker.describe_training_job(TrainingJobName=summary["TrainingJobName"])
                if bool(job.get("EnableManagedSpotTraining")) != spot:
                    continue
                resources = job.get("ResourceConfig", {})
                if resources.get("TrainingPlanArn"):
                    continue  # on a training plan's reserved instances (steps/training_plans.py)
                if resources.get("InstanceType") == instance_type:
                    used += int(resources.get("InstanceCount", 0))
                for group in resources.get("InstanceGroups", []):
                    if group.get("InstanceType") == instance_type:
                        used += int(group.get("InstanceCount", 0))
    return used


def instances_in_warm_pools(sagemaker: Any, instance_type: str) -> int:
    """Instances of the type kept in Available warm pools: they count against the training quota too ("All warm
    pool instance usage counts toward your SageMaker training resource limit")."""
    kept = 0
    for page in sagemaker.get_paginator("list_training_jobs").paginate(WarmPoolStatusEquals="Available"):
        for summary in page.get("TrainingJobSummaries", []):
            job = sagemaker.describe_training_job(TrainingJobName=summary["TrainingJobName"])
            if (job.get("WarmPoolStatus") or {}).get("Status") != "Available":
                continue
            resources = job.get("ResourceConfig", {})
            if resources.get("InstanceType") == instance_type:
                kept += int(resources.get("InstanceCount", 0))
    return kept


def increase_command(code: str, desired: int, region: str) -> str:
    return (
        f"aws service-quotas request-service-quota-increase --service-code {SERVICE_CODE} --quota-code {code} "
        f"--desired-value {desired} --region {region}"
    )


def _request_increase(quotas: Any, code: str, desired: int) -> str:
    try:
        answer = quotas.request_service_quota_increase(
            ServiceCode=SERVICE_CODE, QuotaCode=code, DesiredValue=float(desired)
        )
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") == "ResourceAlreadyExistsException":
            return "an increase request for this quota is already open; it was not filed again"
        return f"filing the increase request failed ({error.get('Code')}: {error.get('Message', '')})"
    change = answer.get("RequestedQuota", {})
    return f"an increase to {desired} was requested (request {change.get('Id', '?')}, {change.get('Status', '?')})"


def measure(
    job: Job, *, quotas: Any, sagemaker: Any, settings: Settings, held: int = 0, reusable: int = 0
) -> dict[str, Any]:
    """The quota the run counts against, what running jobs and on-demand warm pools use of it (and `held`:
    instances the capacity queue has promised to runs whose jobs do not exist yet; `reusable`: instances of a warm
    pool the run will take over, which move to it rather than add to it), what the run asks for and what is left
    for it."""
    compute = job.spec.compute
    name = job.launch.quota.name
    quota = find_quota(quotas, name)
    if quota is None:
        raise SpecInvalid.one(
            "compute.instance_type",
            compute.instance_type,
            f"SageMaker in {settings.region} has no quota named {name!r}: the instance type is not offered for "
            "training here (check the type and the region)",
        )
    code = str(quota["QuotaCode"])
    limit = quota_value(quotas, code)
    in_use = instances_in_use(sagemaker, compute.instance_type, compute.spot)
    if not compute.spot:
        # spot jobs keep no warm pools, and count against a quota of their own
        in_use += max(0, instances_in_warm_pools(sagemaker, compute.instance_type) - reusable)
    return {
        "quota_code": code,
        "quota_name": name,
        "limit": limit,
        "in_use": in_use,
        "held": held,
        "requested": compute.instance_count,
        "available": max(0, math.floor(limit) - in_use - held),
    }


def fits_now(measured: dict[str, Any]) -> bool:
    """Do the run's instances fit what the quota leaves free now?"""
    return int(measured["requested"]) <= int(measured["available"])


def fits_ever(measured: dict[str, Any]) -> bool:
    """Could the run's instances fit the quota at all, with nothing else running?"""
    return int(measured["requested"]) <= math.floor(float(measured["limit"]))


def refusal(
    job: Job, measured: dict[str, Any], settings: Settings, *, quotas: Any, why: str = ""
) -> QuotaExceeded:
    """QuotaExceeded with the numbers and the command that asks for more (filed too where the stack says so)."""
    compute = job.spec.compute
    code, name, limit = measured["quota_code"], measured["quota_name"], float(measured["limit"])
    in_use, held, requested = (
        int(measured["in_use"]),
        int(measured.get("held") or 0),
        int(measured["requested"]),
    )
    desired = in_use + held + requested
    promised = f", {held} promised to queued runs" if held else ""
    message = (
        f"{requested} x {compute.instance_type} requested, {in_use} in use by running training jobs{promised}, "
        f"quota {limit:g} ({name}, {code}) in {settings.region}: {measured['available']} free"
        + (f"; {why}" if why else "")
        + f". Ask for at least {desired}: {increase_command(code, desired, settings.region)}"
    )
    filed = None
    if settings.extra.get(REQUEST_INCREASE, "").strip().lower() == "true":
        filed = _request_increase(quotas, code, desired)
        message += f"; {filed}"
    return QuotaExceeded(message, **measured, desired=desired, increase_requested=filed)


def check_warm_pool(job: Job, *, quotas: Any, settings: Settings) -> None:
    """A run with compute.keep_alive_minutes needs its instances in the "<type> for training warm pool usage"
    quota (0 until an increase is granted): SageMaker would run the job and keep no pool, so the run is refused
    before anything exists, with the command that asks for the quota."""
    compute = job.spec.compute
    if not compute.keep_alive_minutes:
        return
    name = warm_pool.quota_name(compute.instance_type)
    found = find_quota(quotas, name)
    code = str(found["QuotaCode"]) if found is not None else None
    limit = quota_value(quotas, code) if code is not None else 0.0
    if compute.instance_count <= math.floor(limit):
        return
    ask = (
        increase_command(code, compute.instance_count, settings.region)
        if code is not None
        else f"ask AWS Support for the quota '{name}' in {settings.region}"
    )
    raise QuotaExceeded(
        f"compute.keep_alive_minutes={compute.keep_alive_minutes} keeps {compute.instance_count} x "
        f"{compute.instance_type} in a warm pool, but the quota '{name}' is {limit:g} in {settings.region} "
        f"(SageMaker would keep no pool). Set compute.keep_alive_minutes: 0, or ask for at least "
        f"{compute.instance_count}: {ask}",
        quota_name=name,
        quota_code=code,
        limit=limit,
        requested=compute.instance_count,
    )
