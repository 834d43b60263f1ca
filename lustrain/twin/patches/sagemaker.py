"""The twin's SageMaker training jobs: validated as AWS validates them, lived by the simulator, stoppable.

moto 5.2.5 stores a training job as Completed the moment it is created, drops part of the request (Environment,
RetryStrategy), invents a MetricDefinition, emits no event and has no StopTrainingJob. `install()` replaces
three of moto's SageMaker response methods and adds one:

- CreateTrainingJob checks, with AWS's error codes and messages, what hurts users when it slips through: the
  name (pattern, and unique forever: a finished job's name cannot be reused), the account's Service Quotas for
  training (the instance type's, and the account-wide ones: instances across all training jobs, per training job,
  longest run time; InProgress and Stopping jobs and Available warm pools hold instances) -> ResourceLimitExceeded,
  VolumeKmsKeyId on an instance type with local NVMe storage, and managed spot without MaxWaitTimeInSeconds >= MaxRuntimeInSeconds
  or without a CheckpointConfig. The full request is kept, and the job is handed to lustrain.twin.simulator,
  whose thread starts after CreateTrainingJob, and the Lambda invocation that called it, have returned.
- The execution role (RoleArn) as SageMaker checks it at CreateTrainingJob: SageMaker must be allowed to assume
  it (its trust policy, with aws:SourceAccount and aws:SourceArn), and for a VpcConfig the role must allow the
  EC2 actions SageMaker creates the instances' network interfaces with; else ValidationException, with AWS's
  text. The job's own calls are then made with the role's credentials (a session named "SageMaker").
  With SessionChainingConfig {EnableSessionTagChaining: true}, SageMaker takes the session tags of the session
  that called CreateTrainingJob and passes them when it assumes the execution role, whose trust policy must then
  also allow sts:TagSession ("Attribute-based access control (ABAC) for multi-tenancy training", SageMaker
  Developer Guide): the job's calls are authorized as a session carrying those tags (aws:PrincipalTag/<key>).
- DescribeTrainingJob returns the request as stored and the simulator's progress; ListTrainingJobs (moto's own)
  filters on the live status. A job that does not exist is ValidationException "Requested resource not found."
  (as AWS answers; moto says "Could not find training job ...").
- StopTrainingJob: InProgress -> Stopping -> Stopped; the trainer gets SIGTERM and the grace period.
- UpdateTrainingJob (moto has none) with ResourceConfig.KeepAlivePeriodInSeconds, as the warm pools guide
  describes it: allowed once the job is complete and its pool Available; 0 terminates the pool (WarmPoolStatus
  Terminated, its retained billable time stops). The Debugger and remote-debugging updates are refused with a
  message saying the twin does not model them.
"""

from __future__ import annotations

import copy
import functools
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import moto
from lustrain_core.instance_types import INSTANCE_TYPES
from lustrain_core.steps.quota import ACROSS_ALL, LONGEST_RUN, PER_JOB
from moto.core.responses import ActionResult, EmptyResult
from moto.ec2.exceptions import EC2ClientError
from moto.sagemaker.exceptions import SagemakerClientError, ValidationError
from moto.sagemaker.models import FakeTrainingJob, SageMakerModelBackend
from moto.sagemaker.responses import SageMakerResponse

from lustrain.twin import faults, simulator, training_plans
from lustrain.twin.iam import enforce
from lustrain.twin.patches import job_roles
from lustrain.twin.simulator import Collaborators, SimulatedJob
from lustrain.twin.simulator.mounts import LustreFiles

_PATCHED = "_lustrain_twin_sagemaker"
_STATE = "_lustrain_twin_training"
#: AWS's answer to DescribeTrainingJob and StopTrainingJob on a job that does not exist.
NOT_FOUND = "Requested resource not found."

#: Jobs in these statuses hold their instances against the quota.
_HOLDING = frozenset({"InProgress", "Stopping"})


class ResourceLimitExceeded(SagemakerClientError):
    code = "ResourceLimitExceeded"


class ResourceInUse(SagemakerClientError):
    """A job name already taken: CreateTrainingJob's and CreateProcessingJob's modelled error (moto says
    ValidationException)."""

    code = "ResourceInUse"


@dataclass
class _TrainingState:
    """What the twin adds to one account and region's SageMaker backend."""

    jobs: dict[str, SimulatedJob] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _state(backend: SageMakerModelBackend) -> _TrainingState:
    state: _TrainingState = backend.__dict__.setdefault(_STATE, _TrainingState())
    return state


# --- validation ---------------------------------------------------------------------------------------------


def _family(instance_type: str) -> str:
    return instance_type.removeprefix("ml.").split(".")[0]


def has_local_nvme(instance_type: str) -> bool:
    """Whether an ml.* instance type's storage is local NVMe (encrypted by the instance, no EBS volume to give a KMS
    key, so it takes no VolumeKmsKeyId): its row in lustrain's instance catalogue; a type outside it when its family
    has a "d" (p4d, g4dn, c5d, ...: the SageMaker Python SDK's rule) or a catalogued type of its family has NVMe."""
    row = INSTANCE_TYPES.get(instance_type)
    if row is not None:
        return row.local_nvme
    family = _family(instance_type)
    return "d" in family or any(_family(t.name) == family and t.local_nvme for t in INSTANCE_TYPES.values())


def _check_volume_key(resources: dict[str, Any]) -> None:
    instance_type = str(resources.get("InstanceType", ""))
    if resources.get("VolumeKmsKeyId") and has_local_nvme(instance_type):
        raise ValidationError(
            f"Instance type {instance_type} has local storage, which is encrypted by a hardware module on the "
            "instance. You can't request a VolumeKmsKeyId when using an instance type with local storage: "
            "remove ResourceConfig.VolumeKmsKeyId."
        )


def _check_spot(request: dict[str, Any]) -> None:
    stopping = request.get("StoppingCondition") or {}
    max_wait = stopping.get("MaxWaitTimeInSeconds")
    max_runtime = stopping.get("MaxRuntimeInSeconds", 86400)
    if not request.get("EnableManagedSpotTraining"):
        if max_wait is not None:
            raise ValidationError(
                "Invalid MaxWaitTimeInSeconds. It is only supported when EnableManagedSpotTraining is set to true"
            )
        return
    if max_wait is None or int(max_wait) < int(max_runtime):
        raise ValidationError(
            "Invalid MaxWaitTimeInSeconds. It must be present and be greater than or equal to "
            f"MaxRuntimeInSeconds ({max_runtime}) when EnableManagedSpotTraining is set to true "
            f"(got {max_wait})"
        )
    if not (request.get("CheckpointConfig") or {}).get("S3Uri"):
        # Stricter than AWS, which only recommends it: a spot interruption without checkpoints restarts the
        # job from step 0 and bills the lost work again, which is the harm this project exists to prevent.
        raise ValidationError(
            "CheckpointConfig.S3Uri is required when EnableManagedSpotTraining is set to true: after a spot "
            "interruption the job resumes from the checkpoints SageMaker copies back from it"
        )


def _quota_value(account: str, region: str, instance_type: str, spot: bool) -> tuple[str, float] | None:
    """The applied quota (name, value) for the instance type, from the twin's Service Quotas; None if unknown."""
    from lustrain.twin.patches import service_quotas

    name = service_quotas.quota_name(instance_type, spot)
    value = _named_quota(account, region, name)
    return None if value is None else (name, value)


def _named_quota(account: str, region: str, name: str) -> float | None:
    """The applied (else default) value of the SageMaker quota with this name; None for one the twin does not list."""
    from moto.servicequotas.models import servicequotas_backends

    from lustrain.twin.patches import service_quotas

    for quota in service_quotas.CATALOG["sagemaker"]:
        if quota.name == name:
            applied = servicequotas_backends[account][region].get_service_quota("sagemaker", quota.code)
            return float(applied["Value"])
    return None


#: The account-wide quotas of SageMaker training CreateTrainingJob checks, by purchase option (spot = True), as
#: Service Quotas names them: one list, the control plane's (steps/quota.py), which checks them first.
#: LONGEST_RUN is in seconds, against StoppingCondition.MaxRuntimeInSeconds (SageMaker's default for it: a day).
DEFAULT_MAX_RUNTIME_S = 86400


def _limit_exceeded(
    name: str, limit: float, in_use: int, delta: int, unit: str = "Instances"
) -> ResourceLimitExceeded:
    """SageMaker's refusal of a request above an account-level quota, in its words: seen for the type quotas and the
    account-wide ones alike ("The account-level service limit 'Number of instances across all processing jobs' is 4
    Instances, with current utilization of 0 Instances and a request delta of 11 Instances", data-science-on-aws
    issue #200), with today's closing sentences. No refusal by the run-time quota is on record: the twin words it
    the same way, in Seconds."""
    return ResourceLimitExceeded(
        f"The account-level service limit '{name}' is {_count(limit)} {unit}, with current utilization of {in_use} "
        f"{unit} and a request delta of {delta} {unit}. Please use AWS Service Quotas to request an increase for this "
        "quota. If AWS Service Quotas is not available, contact AWS support to request an increase for this quota."
    )


def _pool_taken_over(backend: SageMakerModelBackend, request: dict[str, Any]) -> SimulatedJob | None:
    """The Available warm pool the requested job will take over (`_take_warm_pool`), whose instances move to it
    rather than add to what the account uses."""
    if not (request.get("ResourceConfig") or {}).get("KeepAlivePeriodInSeconds"):
        return None
    key = SimulatedJob.match_key(cast(SimulatedJob, SimpleNamespace(request=request)))
    return next(
        (j for j in _state(backend).jobs.values() if j.pool_available() and j.match_key() == key), None
    )


def _check_quota(backend: SageMakerModelBackend, request: dict[str, Any]) -> None:
    """CreateTrainingJob against the account's training quotas (ResourceLimitExceeded, in SageMaker's words):
    the type's ("<type> for training job usage", spot: "... for spot training job usage"), then the account-wide
    ones: InstanceCount against "Maximum number of instances per training job", MaxRuntimeInSeconds against
    "Longest run time for a training job", and every type's instances against "Number of instances across all
    training jobs" (spot jobs against the spot quotas). In use: the instances of InProgress and Stopping jobs of the
    same purchase option, and of Available warm pools ("All warm pool instance usage counts toward your SageMaker
    training resource limit", SageMaker guide, "Request a warm pool quota increase"), less the pool the job takes
    over. Jobs on a training plan's reserved instances count against none of these. SageMaker does not document
    which quota it checks first; the twin names the type's, as it did before it knew the others."""
    account, region = backend.account_id, backend.region_name
    resources = request.get("ResourceConfig") or {}
    instance_type = str(resources.get("InstanceType", ""))
    requested = int(resources.get("InstanceCount", 1))
    spot = bool(request.get("EnableManagedSpotTraining"))
    taken = _pool_taken_over(backend, request)
    holding: list[SimulatedJob] = [
        job
        for job in _state(backend).jobs.values()
        if (job.status in _HOLDING or (job.pool_available() and job is not taken))
        and bool(job.request.get("EnableManagedSpotTraining")) == spot
        and not (job.request.get("ResourceConfig") or {}).get("TrainingPlanArn")
    ]
    quota = _quota_value(account, region, instance_type, spot)
    if quota is not None:
        name, limit = quota
        in_use = sum(job.instance_count for job in holding if job.instance_type == instance_type)
        if in_use + requested > limit:
            raise _limit_exceeded(name, limit, in_use, requested)
    per_job = _named_quota(account, region, PER_JOB[spot])
    if per_job is not None and requested > per_job:
        raise _limit_exceeded(PER_JOB[spot], per_job, 0, requested)
    runtime = int((request.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds", DEFAULT_MAX_RUNTIME_S))
    longest = _named_quota(account, region, LONGEST_RUN)
    if longest is not None and runtime > longest:
        raise _limit_exceeded(LONGEST_RUN, longest, 0, runtime, unit="Seconds")
    across_all = _named_quota(account, region, ACROSS_ALL[spot])
    in_use = sum(job.instance_count for job in holding)
    if across_all is not None and in_use + requested > across_all:
        raise _limit_exceeded(ACROSS_ALL[spot], across_all, in_use, requested)


#: the fault: another workload took the whole quota between the capacity queue's admission and CreateTrainingJob
QUOTA_TAKEN_ONCE = "quota-taken-once"


def _refuse_as_taken(backend: SageMakerModelBackend, request: dict[str, Any]) -> None:
    """SageMaker's refusal of a job whose instances another workload holds: the quota's whole limit in use."""
    resources = request.get("ResourceConfig") or {}
    instance_type = str(resources.get("InstanceType", ""))
    spot = bool(request.get("EnableManagedSpotTraining"))
    name, limit = _quota_value(backend.account_id, backend.region_name, instance_type, spot) or (instance_type, 0.0)
    raise ResourceLimitExceeded(
        f"The account-level service limit '{name}' is {_count(limit)} Instances, with current utilization "
        f"of {_count(limit)} Instances and a request delta of {int(resources.get('InstanceCount', 1))} Instances. "
        "Please use AWS Service Quotas to request an increase for this quota. If AWS Service Quotas is not "
        "available, contact AWS support to request an increase for this quota."
    )


def _take_warm_pool(backend: SageMakerModelBackend, job: SimulatedJob) -> None:
    """A job with KeepAlivePeriodInSeconds: whether the warm pool quota lets SageMaker keep its pool ("A warm pool
    is only created if your warm pool limit has sufficient resources": the twin counts the job's own instances
    against it), and the Available pool of a matching job it takes over (that job's pool becomes Reused)."""
    from lustrain.twin.patches import service_quotas

    job.keep_alive_scale = simulator.settings().keep_alive_scale
    if not job.keep_alive_s:
        return
    limit = service_quotas.warm_pool_quota(backend.account_id, backend.region_name, job.instance_type)
    job.pool_granted = job.instance_count <= limit
    key = job.match_key()
    for other in _state(backend).jobs.values():
        if other.pool_available() and other.match_key() == key:
            other.hand_pool_to(job.name)
            job.took_pool = True
            return


def terminate_warm_pool(name: str, account: str = "123456789012", region: str = "us-east-1") -> bool:
    """End a job's Available warm pool now, as SageMaker's patch update does (or UpdateTrainingJob with a
    KeepAlivePeriodInSeconds of 0); False when it has none."""
    from moto.sagemaker.models import sagemaker_backends

    job = _state(sagemaker_backends[account][region]).jobs.get(name)
    return job is not None and job.terminate_pool()


def _count(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _check_unique(backend: SageMakerModelBackend, name: str) -> None:
    if name in _state(backend).jobs or name in backend.training_jobs:
        arn = FakeTrainingJob.arn_formatter(name, backend.account_id, backend.region_name)
        raise ResourceInUse(
            "Training job names must be unique within an AWS account and region, and a training job with "
            f"this name already exists ({arn})"
        )


def _describe_file_system(account: str, region: str, fs_id: str) -> dict[str, Any] | None:
    from moto.fsx.models import fsx_backends

    fs = fsx_backends[account][region].file_systems.get(fs_id)
    return None if fs is None else dict(fs.to_dict())


def collaborators() -> Collaborators:
    """What the simulator uses of the twin: its EventBridge, FSx, the environment, and IAM."""
    from lustrain.twin.patches import eventbridge, fsx, lambda_invoke

    def emit(
        source: str, detail_type: str, detail: dict[str, Any], region: str, account: str, resources: list[str]
    ) -> Any:
        return eventbridge.emit(source, detail_type, detail, region, account, resources=resources)

    return Collaborators(
        emit=emit,
        describe_file_system=_describe_file_system,
        linked_paths=fsx.linked_paths,
        environment=lambda_invoke.environment_copy,
        authorize=job_roles.authorize_job,
        lustre_files=LustreFiles(
            read=fsx.stored_files, store=fsx.store_files, auto_exported=fsx.auto_exported_paths
        ),
    )


# --- the patched API ------------------------------------------------------------------------------------------


def _create_training_job(original: Any, self: SageMakerResponse) -> ActionResult:
    request = copy.deepcopy(dict(self.params))
    request.pop("Action", None)
    request.pop("Version", None)
    name = str(request.get("TrainingJobName", ""))
    _check_volume_key(request.get("ResourceConfig") or {})
    _check_spot(request)
    backend = self.sagemaker_backend
    state = _state(backend)
    with state.lock:  # two concurrent creates must not both fit in the last free instances
        _check_unique(backend, name)
        arn = FakeTrainingJob.arn_formatter(name, backend.account_id, backend.region_name)
        credentials = job_roles.check_role(backend, request, arn, enforce.principal_of(self.get_access_key()))
        if faults.consume("start_training", QUOTA_TAKEN_ONCE):
            _refuse_as_taken(backend, request)
        if (request.get("ResourceConfig") or {}).get("TrainingPlanArn"):
            # reserved capacity: checked against its plan, not the on-demand quota
            training_plans.check_job(backend.account_id, backend.region_name, request, _subnet_zones(backend, request))
        else:
            _check_quota(backend, request)
        result = original(self)
        job = SimulatedJob(
            request=request,
            arn=backend.training_jobs[name].arn,
            account=backend.account_id,
            region=backend.region_name,
        )
        _take_warm_pool(backend, job)
        fake = backend.training_jobs[name]
        job.credentials = credentials
        if faults.current_step() is not None:
            # Called from a handler run in-process (mock_aws): the job's first event waits for it to return.
            job.created_by = threading.current_thread()
        state.jobs[name] = job
        _sync(fake, job)
    simulator.launch(job)
    return result  # type: ignore[no-any-return]


def _describe_training_job(original: Any, self: SageMakerResponse) -> ActionResult:
    job = _state(self.sagemaker_backend).jobs.get(str(self._get_param("TrainingJobName")))
    if job is None:
        if str(self._get_param("TrainingJobName")) not in self.sagemaker_backend.training_jobs:
            raise ValidationError(NOT_FOUND)
        return original(self)  # type: ignore[no-any-return]
    return ActionResult(job.describe())


def _subnet_zones(backend: SageMakerModelBackend, request: dict[str, Any]) -> list[str]:
    """The availability zones of a job's VpcConfig subnets (those the twin's EC2 knows)."""
    from moto.ec2.models import ec2_backends

    ec2 = ec2_backends[backend.account_id][backend.region_name]
    zones = []
    for subnet_id in (request.get("VpcConfig") or {}).get("Subnets", []):
        try:
            zones.append(str(ec2.get_subnet(subnet_id).availability_zone))
        except EC2ClientError:
            continue  # a subnet the twin does not know: SageMaker's own VPC checks are elsewhere
    return zones


def describe_training_plan(self: SageMakerResponse) -> ActionResult:
    backend = self.sagemaker_backend
    state = _state(backend)
    with state.lock:
        jobs = list(state.jobs.values())
    return ActionResult(
        training_plans.describe(
            backend.account_id, backend.region_name, str(self._get_param("TrainingPlanName")), jobs
        )
    )


def stop_training_job(self: SageMakerResponse) -> EmptyResult:
    backend = self.sagemaker_backend
    name = str(self._get_param("TrainingJobName"))
    job = _state(backend).jobs.get(name)
    if job is None:
        raise ValidationError(NOT_FOUND)
    if not job.request_stop():
        raise ValidationError(f"The request was rejected because the training job is in status {job.status}.")
    _sync(backend.training_jobs[name], job)
    return EmptyResult()


#: UpdateTrainingJob's members the twin does not model (SageMaker Debugger, remote debugging)
_UNMODELLED_UPDATES = ("ProfilerConfig", "ProfilerRuleConfigurations", "RemoteDebugConfig")


def update_training_job(self: SageMakerResponse) -> ActionResult:
    """UpdateTrainingJob: a warm pool's KeepAlivePeriodInSeconds (0 ends the pool now)."""
    backend = self.sagemaker_backend
    name = str(self._get_param("TrainingJobName"))
    unmodelled = [member for member in _UNMODELLED_UPDATES if self._get_param(member) is not None]
    if unmodelled:
        raise ValidationError(
            f"the twin models only ResourceConfig.KeepAlivePeriodInSeconds of UpdateTrainingJob, not "
            f"{', '.join(unmodelled)}"
        )
    resources = self._get_param("ResourceConfig")
    if not isinstance(resources, dict) or "KeepAlivePeriodInSeconds" not in resources:
        raise ValidationError(
            "1 validation error detected: ResourceConfig.KeepAlivePeriodInSeconds is required to update a "
            "training job's warm pool"
        )
    # its range (botocore's 0..21600) is checked with every request against the model, as AWS checks it
    seconds = int(resources["KeepAlivePeriodInSeconds"])
    job = _state(backend).jobs.get(name)
    if job is None:
        raise ValidationError(NOT_FOUND)
    refused = job.update_keep_alive(seconds)
    if refused:
        raise ValidationError(refused)
    _sync(backend.training_jobs[name], job)
    return ActionResult({"TrainingJobArn": job.arn})


def _list_training_jobs(original: Any, self: SageMakerModelBackend, *args: Any, **kwargs: Any) -> Any:
    state = _state(self)
    with state.lock:  # a run's CreateTrainingJob (another thread) may be adding its job meanwhile
        jobs = list(state.jobs.items())
    for name, job in jobs:
        if name in self.training_jobs:
            _sync(self.training_jobs[name], job)
    return original(self, *args, **kwargs)


def _list_training_jobs_response(original: Any, self: SageMakerResponse) -> ActionResult:
    """ListTrainingJobs with each summary's WarmPoolStatus and the WarmPoolStatusEquals filter, which moto ignores
    (a filter that drops summaries leaves moto's NextToken as it was: pages may come back short, as AWS's may)."""
    answer = original(self)
    wanted = self._get_param("WarmPoolStatusEquals")
    result = dict(answer.result)
    jobs = _state(self.sagemaker_backend).jobs
    summaries = []
    for summary in result.get("TrainingJobSummaries", []):
        job = jobs.get(str(summary.get("TrainingJobName")))
        pool = job.warm_pool_status() if job is not None else None
        if pool is not None:
            summary = {**summary, "WarmPoolStatus": pool}
        if wanted is None or (pool or {}).get("Status") == wanted:
            summaries.append(summary)
    result["TrainingJobSummaries"] = summaries
    return ActionResult(result)


def _sync(fake: FakeTrainingJob, job: SimulatedJob) -> None:
    """Copy the live status onto moto's record, which moto's own ListTrainingJobs filters and shows."""
    described = job.describe()
    fake.training_job_status = described["TrainingJobStatus"]
    fake.secondary_status = described["SecondaryStatus"]
    fake.last_modified_time = described["LastModifiedTime"]
    # None until the job ends: moto set an end time at creation, which ListTrainingJobs would show.
    fake.training_end_time = described.get("TrainingEndTime")  # type: ignore[assignment]


def wrap(cls: type, name: str, replacement: Any) -> None:
    """Replace cls.name by replacement(original, self, *args, **kwargs): the twin's way into a moto method."""
    original = getattr(cls, name)

    @functools.wraps(original)
    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        return replacement(original, self, *args, **kwargs)

    setattr(cls, name, patched)


def install() -> None:
    """Patch moto's SageMaker (once per process). Fails loudly on another moto: the patch reads its internals."""
    from lustrain.twin.patches import check_moto_version

    if getattr(SageMakerResponse, _PATCHED, False):
        return
    check_moto_version()
    for cls, method in (
        (SageMakerResponse, "create_training_job"),
        (SageMakerResponse, "describe_training_job"),
        (SageMakerModelBackend, "list_training_jobs"),
        (SageMakerResponse, "list_training_jobs"),
    ):
        if not hasattr(cls, method):
            raise RuntimeError(
                f"moto {moto.__version__}: {cls.__name__}.{method} is gone; the twin cannot patch it"
            )
    wrap(SageMakerResponse, "create_training_job", _create_training_job)
    wrap(SageMakerResponse, "describe_training_job", _describe_training_job)
    wrap(SageMakerModelBackend, "list_training_jobs", _list_training_jobs)
    wrap(SageMakerResponse, "list_training_jobs", _list_training_jobs_response)
    SageMakerResponse.stop_training_job = stop_training_job  # type: ignore[attr-defined]
    SageMakerResponse.update_training_job = update_training_job  # type: ignore[attr-defined]
    SageMakerResponse.describe_training_plan = describe_training_plan  # type: ignore[attr-defined]
    simulator.connect(collaborators())
    setattr(SageMakerResponse, _PATCHED, True)
