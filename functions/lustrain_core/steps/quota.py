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

The account-wide quotas of SageMaker training are measured too, by name like the type's (AWS General Reference,
"Amazon SageMaker AI endpoints and quotas"; the Service Quotas console): "Number of instances across all training
jobs" (spot: "... across all spot training jobs"), against the instances of every type that InProgress and Stopping
jobs of the same kind hold and, for on-demand, that Available warm pools keep (ListTrainingJobs with StatusEquals and
WarmPoolStatusEquals, then DescribeTrainingJob for the counts, which the listing's summaries lack); "Maximum number of
instances per training job" (spot: "... per spot training job"), against compute.instance_count; and "Longest run
time for a training job" (seconds; 432,000 by default), against the job's MaxRuntimeInSeconds. The quota that binds
is the one the answer names: a run the per-job or run-time quota can never admit, or more instances than a quota's
whole value, is refused at once; otherwise the run waits in the queue for the quota with the fewest instances free.
The queue's holds are those of the run's own line (its type and kind): instances promised to runs of other types
are not counted against the account-wide quota, and SageMaker's ResourceLimitExceeded sends such a run back to the
line. An account-wide quota that Service Quotas does not list for the account is named in the answer's `unchecked`.
Jobs on a training plan's reserved instances are left out of every count, as of the type's.
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

#: The account-wide quotas of SageMaker training, by purchase option (spot = True), named as Service Quotas lists them
#: for ServiceCode sagemaker (AWS General Reference, "Amazon SageMaker AI endpoints and quotas")
ACROSS_ALL = {
    False: "Number of instances across all training jobs",
    True: "Number of instances across all spot training jobs",
}
PER_JOB = {
    False: "Maximum number of instances per training job",
    True: "Maximum number of instances per spot training job",
}
#: in seconds (AWS's default 432,000: 5 days), for on-demand and spot jobs alike
LONGEST_RUN = "Longest run time for a training job"


def find_quota(quotas: Any, name: str) -> dict[str, Any] | None:
    """The quota with this name: the account's list first, then AWS's defaults (an account may list neither)."""
    return find_quotas(quotas, [name]).get(name)


def find_quotas(quotas: Any, names: list[str]) -> dict[str, dict[str, Any]]:
    """The quotas with these names that Service Quotas lists, each found as `find_quota` finds it; the listings
    (hundreds of SageMaker quotas, in pages) are read once for all of them, and no further than the last found."""
    found: dict[str, dict[str, Any]] = {}
    for operation in ("list_service_quotas", "list_aws_default_service_quotas"):
        for page in quotas.get_paginator(operation).paginate(ServiceCode=SERVICE_CODE):
            for quota in page.get("Quotas", []):
                name = quota.get("QuotaName")
                if name in names and name not in found:
                    found[name] = dict(quota)
            if len(found) == len(set(names)):
                return found
    return found


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


def holding_jobs(sagemaker: Any) -> list[dict[str, Any]]:
    """DescribeTrainingJob of every InProgress and Stopping job, less those on a training plan's reserved instances
    (steps/training_plans.py), which count against no quota here."""
    jobs: list[dict[str, Any]] = []
    for status in HOLDING_STATUSES:
        for page in sagemaker.get_paginator("list_training_jobs").paginate(StatusEquals=status):
            for summary in page.get("TrainingJobSummaries", []):
                job = sagemaker.describe_training_job(TrainingJobName=summary["TrainingJobName"])
                if not job.get("ResourceConfig", {}).get("TrainingPlanArn"):
                    jobs.append(job)
    return jobs


def pooled_jobs(sagemaker: Any) -> list[dict[str, Any]]:
    """DescribeTrainingJob of every job whose warm pool is Available."""
    jobs: list[dict[str, Any]] = []
    for page in sagemaker.get_paginator("list_training_jobs").paginate(WarmPoolStatusEquals="Available"):
        for summary in page.get("TrainingJobSummaries", []):
            job = sagemaker.describe_training_job(TrainingJobName=summary["TrainingJobName"])
            if (job.get("WarmPoolStatus") or {}).get("Status") == "Available":
                jobs.append(job)
    return jobs


def instance_count(job: dict[str, Any], instance_type: str | None = None) -> int:
    """The instances a described job holds: of `instance_type`, or of every type (None), its instance groups
    included."""
    resources = job.get("ResourceConfig", {})
    groups = [resources, *resources.get("InstanceGroups", [])]
    return sum(
        int(group.get("InstanceCount", 0))
        for group in groups
        if group.get("InstanceType") and (instance_type is None or group.get("InstanceType") == instance_type)
    )


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
    for it: of the type's quota and the account-wide ones, the one that binds (the module's docstring)."""
    compute = job.spec.compute
    name = job.launch.quota.name
    account_wide = [ACROSS_ALL[compute.spot], PER_JOB[compute.spot], LONGEST_RUN]
    found = find_quotas(quotas, [name, *account_wide])
    if name not in found:
        raise SpecInvalid.one(
            "compute.instance_type",
            compute.instance_type,
            f"SageMaker in {settings.region} has no quota named {name!r}: the instance type is not offered for "
            "training here (check the type and the region)",
        )

    def numbers(quota_name: str, in_use: int, requested: int, taken: int, **extra: Any) -> dict[str, Any]:
        code = str(found[quota_name]["QuotaCode"])
        limit = quota_value(quotas, code)
        return {
            "quota_code": code,
            "quota_name": quota_name,
            "limit": limit,
            "in_use": in_use,
            "held": taken,
            "requested": requested,
            "available": max(0, math.floor(limit) - in_use - taken),
            **extra,
        }

    unchecked = [n for n in account_wide if n not in found]
    extra: dict[str, Any] = {"unchecked": unchecked} if unchecked else {}
    # what no wait can change: the job's own size and length
    if PER_JOB[compute.spot] in found:
        per_job = numbers(PER_JOB[compute.spot], 0, compute.instance_count, 0, **extra)
        if not fits_ever(per_job):
            return per_job
    if LONGEST_RUN in found:
        runtime = numbers(LONGEST_RUN, 0, job.launch.max_runtime_seconds, 0, unit="seconds", **extra)
        if not fits_ever(runtime):
            return runtime

    jobs = [j for j in holding_jobs(sagemaker) if bool(j.get("EnableManagedSpotTraining")) == compute.spot]
    type_in_use = sum(instance_count(j, compute.instance_type) for j in jobs)
    all_in_use = sum(instance_count(j) for j in jobs)
    if not compute.spot:
        # spot jobs keep no warm pools, and count against quotas of their own
        pools = pooled_jobs(sagemaker)
        type_in_use += max(0, instances_in_pools(pools, compute.instance_type) - reusable)
        all_in_use += max(0, instances_in_pools(pools, None) - reusable)
    candidates = [numbers(name, type_in_use, compute.instance_count, held, **extra)]
    if ACROSS_ALL[compute.spot] in found:
        candidates.append(
            numbers(ACROSS_ALL[compute.spot], all_in_use, compute.instance_count, held, **extra)
        )
    never = [m for m in candidates if not fits_ever(m)]
    # the type's quota where both leave as much
    return never[0] if never else min(candidates, key=lambda m: int(m["available"]))


def instances_in_pools(pools: list[dict[str, Any]], instance_type: str | None) -> int:
    """The instances of the type (of every type: None) in these Available warm pools: they count against the training
    quotas too ("All warm pool instance usage counts toward your SageMaker training resource limit")."""
    return sum(
        int(job.get("ResourceConfig", {}).get("InstanceCount", 0))
        for job in pools
        if instance_type is None or job.get("ResourceConfig", {}).get("InstanceType") == instance_type
    )


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
    quota = f"quota {limit:g} ({name}, {code}) in {settings.region}"
    if measured.get("unit") == "seconds":
        message = (
            f"compute.max_runtime_hours={compute.max_runtime_hours:g} asks for a MaxRuntimeInSeconds of "
            f"{requested}, above the {quota} (seconds: {limit / 3600:g} h): SageMaker refuses the job. Set "
            f"compute.max_runtime_hours to at most {math.floor(limit) // 3600}, or ask for at least {desired}"
        )
    elif name in PER_JOB.values():
        message = (
            f"{requested} x {compute.instance_type} requested in one training job, above the {quota}: SageMaker "
            f"refuses the job. Ask for at least {desired}"
        )
    else:
        used = (
            f"{in_use} of every type in use by running training jobs and warm pools"
            if name in ACROSS_ALL.values()
            else f"{in_use} in use by running training jobs"
        )
        message = (
            f"{requested} x {compute.instance_type} requested, {used}{promised}, {quota}: "
            f"{measured['available']} free" + (f"; {why}" if why else "") + f". Ask for at least {desired}"
        )
    message += f": {increase_command(code, desired, settings.region)}"
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
