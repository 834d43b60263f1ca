"""start_training: the SageMaker training job of a run, started with the state machine's task token in hand.

The state machine invokes this step with `lambda:invoke.waitForTaskToken` and waits: the job's end arrives later
as an EventBridge event, and on_training_event answers the token. The token (up to 2048 chars, too long for a
tag) is kept in the tokens table under the training job's name, with the job id and where to archive, BEFORE
CreateTrainingJob: an event can never find a job it cannot answer for. The training job is recorded in the job's
`resources` before it is created too, so teardown can stop it on any failure path (a job never created is simply
not found there).

Names are unique forever in SageMaker, so every attempt gets a new one: `<spec name>-<8 hex of job id>-<attempt>`,
the attempt counted atomically in the job record.

A run never has two training jobs InProgress. A retried invocation (Lambda timed out, or its answer was lost, after
the job was created) adopts the job of the record's latest attempt, whatever its state and the state of its token,
as long as next_attempt has not judged that attempt (`judged_attempt` in the record):

- its token still waits (the job runs, or its end has not been answered yet): the token is moved to this task, and
  the job's events answer it;
- its end was answered already, to the token of the task's earlier try, which no longer waits: the end is given
  to this task as start_training's own error, the one on_training_event sent (CapacityError, TrainingStopped,
  ...), or TrainingJobCompleted carrying the training output for a completed job (the state machine takes it as
  the task's result); a job still running under an answered token gets the new token.

A new attempt starts only when no job of the run's earlier attempts is InProgress or Stopping: otherwise
TrainingJobStillRunning, and the run ends with its teardown stopping the live job.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from typing import Any

import boto3
from botocore.exceptions import ClientError

from lustrain_core import images, recovery, secrets_launcher
from lustrain_core.aws_errors import CONDITION_FAILED, QUOTA_REFUSED, error_code, training_job_missing
from lustrain_core.config import Settings
from lustrain_core.errors import (
    ALL_ERRORS,
    MISSING,
    BudgetExceeded,
    FieldError,
    LustrainError,
    QuotaExceeded,
    SpecInvalid,
    TrainingFailed,
    TrainingJobCompleted,
    TrainingJobStillRunning,
)
from lustrain_core.launch import RESUME_CHANNEL, RESUME_FROM_VARIABLE, RUN_ID_VARIABLE, TrainingPlan
from lustrain_core.prices import INSTANCE_TYPES
from lustrain_core.spec import JobSpec
from lustrain_core.steps import Job, Run, queue, records
from lustrain_core.steps.archive import JOBS_DIR
from lustrain_core.steps.budget import (
    MIN_RUNTIME_SECONDS,
    AttemptBudget,
    attempt_budget,
    attempt_cost_usd,
    billed_seconds,
)
from lustrain_core.steps.filesystem import checkpoint_path, directory_path, output_path

NAME_PATTERN = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
MAX_NAME = 63
TRAINING_CHANNEL = "training"
#: with output.to_filesystem the job writes under this channel (SM_CHANNEL_OUTPUT), exported to S3 at teardown
OUTPUT_CHANNEL = "output"
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
#: with checkpoints.to_filesystem the trainer writes its checkpoints under this read-write channel
#: (SM_CHANNEL_CHECKPOINTS) on the run's file system, and the job has no CheckpointConfig
CHECKPOINT_CHANNEL = "checkpoints"
#: SageMaker's own default volume; EBS-only instance types need one sized for model, output and checkpoints
DEFAULT_VOLUME_GIB = 30
#: the tokens item outlives the longest possible run by this much, then DynamoDB's TTL removes it
TOKEN_GRACE_SECONDS = 24 * 3600
#: the stack may set a KMS key for the job's output and (where AWS allows) its storage volume
KMS_KEY_SETTING = "LUSTRAIN_KMS_KEY_ID"
#: the stack may encrypt the traffic between a job's instances (it slows distributed training down)
INTER_CONTAINER_ENCRYPTION_SETTING = "LUSTRAIN_INTER_CONTAINER_ENCRYPTION"
RESOURCE_TYPE = "training_job"

WAITING = "waiting"
CALLBACK_SENT = "callback_sent"

#: the trainer's own variables (the run's id, the run it continues)
RESERVED_ENVIRONMENT_PREFIX = "LUSTRAIN_"


def job_hex(job_id: str, spec_name: str) -> str:
    """The 8 hex digits of a job id (`<spec name>-<8 hex>`, register_job's form)."""
    match = re.fullmatch(rf"{re.escape(spec_name)}-([0-9a-f]{{8}})", job_id)
    if match is None:
        raise SpecInvalid.one("job.job_id", job_id, f"a job id of the form {spec_name}-<8 hex digits>")
    return match[1]


def training_job_name(spec_name: str, job_id: str, attempt: int) -> str:
    """`<spec name>-<8 hex of job id>-<attempt>`: at most 40 + 1 + 8 + 1 + digits, well within SageMaker's 63."""
    name = f"{spec_name}-{job_hex(job_id, spec_name)}-{attempt}"
    if attempt < 1 or len(name) > MAX_NAME or not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"training job name {name!r} breaks SageMaker's rule: at most {MAX_NAME} characters matching "
            f"{NAME_PATTERN.pattern}"
        )
    return name


def archive_target(settings: Settings, job_id: str) -> str:
    return f"s3://{settings.artifacts_bucket}/{settings.archive_prefix}{job_id}/"


def model_output_path(settings: Settings, job_id: str) -> str:
    """OutputDataConfig.S3OutputPath: under the run's archive, so that the model is archived where SageMaker
    uploads it and never copied (steps/archive.py); the execution role writes there only for its own run."""
    return archive_target(settings, job_id) + JOBS_DIR


def hyperparameters(spec: JobSpec, submit_directory: str, region: str) -> dict[str, str]:
    """Script mode's hyperparameters: every value JSON-encoded, as the SageMaker SDK sends them. Their limits
    (count, key and value lengths) are CreateTrainingJob's, checked by the launch compiler against its model."""
    values: dict[str, Any] = {
        # with code.secrets SageMaker starts the launcher upload_code adds, which reads them and runs the entry point
        "sagemaker_program": secrets_launcher.LAUNCHER_FILE if spec.code.secrets else spec.code.entry_point,
        "sagemaker_submit_directory": submit_directory,
        "sagemaker_region": region,
    }
    if spec.code.distribution == "torchrun":
        values["sagemaker_torch_distributed_enabled"] = True
    values.update(spec.code.hyperparameters)
    return {key: json.dumps(value) for key, value in values.items()}


#: The job's environment unless the spec sets them. On a stop SageMaker sends SIGTERM and allows 120 s
#: (StopTrainingJob's API reference); torchrun forwards the signal to its workers and kills them 30 s later, unless
#: TORCH_ELASTIC_SHUTDOWN_TIMEOUT (read from torch 2.12 on) says otherwise: 110 s leaves the trainer's stop-time
#: checkpoint the most of SageMaker's grace. (On older torch the 30 s stand: the memory plan says whether the
#: stop's checkpoint fits them, stop_within_torchrun_default_grace.)
ENVIRONMENT_DEFAULTS = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "110"}


def environment(spec: JobSpec) -> dict[str, str]:
    """The job's environment as the spec gives it, over ENVIRONMENT_DEFAULTS; LUSTRAIN_* names are lustrain's own
    (the run's identity)."""
    reserved = [key for key in spec.code.environment if key.upper().startswith(RESERVED_ENVIRONMENT_PREFIX)]
    if reserved:
        raise SpecInvalid(
            [
                FieldError(
                    f"code.environment.{key}", key, f"{RESERVED_ENVIRONMENT_PREFIX}* names are lustrain's own"
                )
                for key in reserved
            ]
        )
    return {**ENVIRONMENT_DEFAULTS, **spec.code.environment}


def training_image(spec: JobSpec, region: str) -> str:
    if spec.image.uri:
        return spec.image.uri
    assert spec.image.framework_version is not None  # the spec holds exactly one of the two
    return images.pytorch_training_image(spec.image.framework_version, region, spec.compute.instance_type)


def _stopping_condition(job: Job, budget_runtime_seconds: int | None = None) -> dict[str, int]:
    """compute.max_runtime_hours, or less where the budget left pays for less (steps/budget.py)."""
    runtime = job.launch.max_runtime_seconds
    if budget_runtime_seconds is not None:
        runtime = min(runtime, budget_runtime_seconds)
    condition = {"MaxRuntimeInSeconds": runtime}
    if job.launch.max_wait_seconds is not None:
        condition["MaxWaitTimeInSeconds"] = job.launch.max_wait_seconds
    return condition


def _resource_config(
    spec: JobSpec, kms_key_id: str | None, training_plan: TrainingPlan | None = None, keep_alive_seconds: int = 0
) -> dict[str, Any]:
    itype = INSTANCE_TYPES.get(spec.compute.instance_type)
    if itype is None:
        raise SpecInvalid.one(
            "compute.instance_type",
            spec.compute.instance_type,
            f"unknown to lustrain; known: {', '.join(sorted(INSTANCE_TYPES))}",
        )
    config: dict[str, Any] = {
        "InstanceType": spec.compute.instance_type,
        "InstanceCount": spec.compute.instance_count,
    }
    if training_plan is not None:  # the reserved capacity the instances come from (compute.training_plan)
        config["TrainingPlanArn"] = training_plan.arn
    if keep_alive_seconds:
        # the instances stay in a warm pool this long after the job, for the next job of the same shape
        config["KeepAlivePeriodInSeconds"] = keep_alive_seconds
    if itype.local_nvme:
        # SageMaker puts everything on the instance's NVMe and refuses a volume key there
        return config
    on_volume = 0.0 if spec.output.to_filesystem else spec.output.expected_size_gib
    # the model, its output and the local checkpoint copies all live on the volume
    config["VolumeSizeInGB"] = max(DEFAULT_VOLUME_GIB, math.ceil(2 * on_volume))
    if kms_key_id:
        config["VolumeKmsKeyId"] = kms_key_id
    return config


def resource_config_of(job: Job, settings: Settings) -> dict[str, Any]:
    """The run's ResourceConfig, with the stack's volume key: also what its warm pool is matched by."""
    kms_key_id = settings.extra.get(KMS_KEY_SETTING) or None
    return _resource_config(job.spec, kms_key_id, job.launch.training_plan, job.launch.keep_alive_seconds)


def inter_container_encryption(settings: Settings) -> bool:
    raw = settings.extra.get(INTER_CONTAINER_ENCRYPTION_SETTING, "").strip().lower()
    if raw not in {"", "true", "false"}:
        raise ValueError(
            f"stack setting {INTER_CONTAINER_ENCRYPTION_SETTING}={raw!r} must be true or false: fix the stack's "
            "parameter"
        )
    return raw == "true"


def _channels(run: Run) -> list[dict[str, Any]]:
    job = run.job
    spec = job.spec
    fs_id = run.filesystem.file_system_id
    mount_name = run.filesystem.mount_name
    if not mount_name:
        raise SpecInvalid.one(
            "filesystem.mount_name", MISSING, "the file system's MountName (check_filesystem's)"
        )

    def channel(name: str, path: str, mode: str) -> dict[str, Any]:
        source = {
            "FileSystemId": fs_id,
            "FileSystemType": "FSxLustre",
            "FileSystemAccessMode": mode,
            "DirectoryPath": directory_path(mount_name, path),
        }
        return {"ChannelName": name, "DataSource": {"FileSystemDataSource": source}}

    to_fs = spec.output.to_filesystem
    channels = [channel(TRAINING_CHANNEL, spec.filesystem.mount_path, "rw" if to_fs else "ro")]
    if to_fs:
        channels.append(channel(OUTPUT_CHANNEL, output_path(job.job_id), "rw"))
    if spec.checkpoints.to_filesystem:
        # the same directory for every attempt of the run: a new attempt resumes from what the last one wrote
        channels.append(channel(CHECKPOINT_CHANNEL, checkpoint_path(job.job_id), "rw"))
    resume = job.launch.resume
    if resume is not None:
        # the checkpoint this run continues (its manifest step-N.json and shards), copied to every instance at start
        s3 = {"S3DataType": "S3Prefix", "S3Uri": resume.s3_uri, "S3DataDistributionType": "FullyReplicated"}
        channels.append(
            {"ChannelName": RESUME_CHANNEL, "DataSource": {"S3DataSource": s3}, "InputMode": "File"}
        )
    return channels


def request_from(
    run: Run, training_job_name: str, settings: Settings, budget_runtime_seconds: int | None = None
) -> dict[str, Any]:
    """The whole CreateTrainingJob request: the launch plan's decisions, and the ids of the steps before
    (network, file system, code bundle), with the stack's own settings (role, KMS key, encryption); its
    MaxRuntimeInSeconds no longer than `budget_runtime_seconds`, what the budget left pays for."""
    job = run.job
    launch = job.launch
    spec = job.spec
    kms_key_id = settings.extra.get(KMS_KEY_SETTING) or None

    algorithm: dict[str, Any] = {"TrainingImage": launch.image_uri, "TrainingInputMode": "File"}
    if run.code.metric_definitions:
        algorithm["MetricDefinitions"] = [
            {"Name": m.Name, "Regex": m.Regex} for m in run.code.metric_definitions
        ]
    # under the run's own archive (launch.model_output_s3_uri), the only part of it its role may write
    # (run_session_tags); a run registered before that was decided: its results location's <job id>/
    output: dict[str, Any] = {
        "S3OutputPath": launch.model_output_s3_uri or f"{spec.output.s3_uri.rstrip('/')}/{job.job_id}/",
        "CompressionType": launch.output_compression,
    }
    if kms_key_id:
        output["KmsKeyId"] = kms_key_id
    environment = {**launch.environment, RUN_ID_VARIABLE: job.job_id}
    if launch.resume is not None and launch.resume.run:
        environment[RESUME_FROM_VARIABLE] = launch.resume.run
    request: dict[str, Any] = {
        "TrainingJobName": training_job_name,
        "RoleArn": settings.sagemaker_role_arn,
        "AlgorithmSpecification": algorithm,
        "HyperParameters": {
            **launch.hyperparameters,
            "sagemaker_submit_directory": json.dumps(run.code.submit_directory),
        },
        "InputDataConfig": _channels(run),
        "OutputDataConfig": output,
        "ResourceConfig": resource_config_of(job, settings),
        "VpcConfig": {
            "Subnets": [run.network.subnet_id],
            "SecurityGroupIds": list(run.network.security_group_ids),
        },
        "StoppingCondition": _stopping_condition(job, budget_runtime_seconds),
        "EnableInterContainerTrafficEncryption": inter_container_encryption(settings),
        "EnableManagedSpotTraining": spec.compute.spot,
        "Environment": environment,
        "Tags": job.tags("training_job"),
        # SageMaker assumes the execution role with the session tags of the session that creates the job (the
        # launcher's, run_session_tags): the role's S3 grants name them, so the job reaches only its own run's
        # code, checkpoints and results
        "SessionChainingConfig": {"EnableSessionTagChaining": True},
    }
    if not spec.checkpoints.to_filesystem:
        # SageMaker syncs LocalPath to S3 while the job runs and back at its start (and at a spot restart)
        request["CheckpointConfig"] = {"S3Uri": launch.checkpoint_s3_uri, "LocalPath": CHECKPOINT_LOCAL_PATH}
    if spec.compute.spot:
        # spot capacity can be reclaimed: SageMaker restarts the job in place from its last checkpoint this many
        # times before the run's own attempts (the run policy) count
        request["RetryStrategy"] = {"MaximumRetryAttempts": recovery.SAGEMAKER_SPOT_RETRIES}
    if infra_check(spec):
        request["InfraCheckConfig"] = {"EnableInfraCheck": True}
    return request


#: the stack's role start_training creates training jobs from, in a session tagged with the run (run_session_tags)
LAUNCHER_ROLE_SETTING = "LUSTRAIN_LAUNCHER_ROLE_ARN"
RUN_TAG = "lustrain-run"
RESUME_TAG = "lustrain-resume"


def run_session_tags(job: Job) -> list[dict[str, str]]:
    """The launcher session's tags, which SageMaker chains to the job's session of its execution role: the run's
    id and, for a run continuing another's checkpoint, that run's id (read-only there)."""
    tags = [{"Key": RUN_TAG, "Value": job.job_id}]
    if job.launch.resume is not None and job.launch.resume.run:
        tags.append({"Key": RESUME_TAG, "Value": job.launch.resume.run})
    return tags


def launcher(sts: Any, sagemaker: Any, settings: Settings, job: Job) -> Any:
    """A SageMaker client signed by a session of the stack's launcher role tagged with the run (sts:AssumeRole with
    Tags); `sagemaker` itself where the stack names no launcher role (its jobs' role then reaches no run's objects)."""
    role_arn = settings.extra.get(LAUNCHER_ROLE_SETTING, "").strip()
    if not role_arn or sts is None:
        return sagemaker
    credentials = sts.assume_role(
        RoleArn=role_arn, RoleSessionName=job.job_id[:64], Tags=run_session_tags(job), DurationSeconds=900
    )["Credentials"]
    return boto3.session.Session().client(
        "sagemaker",
        region_name=sagemaker.meta.region_name,
        endpoint_url=sagemaker.meta.endpoint_url,
        config=sagemaker.meta.config,
        aws_access_key_id=credentials["AccessKeyId"],
        aws_secret_access_key=credentials["SecretAccessKey"],
        aws_session_token=credentials["SessionToken"],
    )


def infra_check(spec: JobSpec) -> bool:
    """SageMaker's health check of the instances' hardware and their network before the script starts: for jobs
    of several instances of a type that has it (INSTANCE_TYPES' infra_check), where one bad host stalls them all."""
    itype = INSTANCE_TYPES.get(spec.compute.instance_type)
    return spec.compute.instance_count > 1 and itype is not None and itype.infra_check


def build_training_request(
    document: dict[str, Any],
    *,
    training_job_name: str,
    settings: Settings,
) -> dict[str, Any]:
    """The whole CreateTrainingJob request of a run, from the state document (job, network, filesystem, code)."""
    return request_from(Run.parse(document, "network", "filesystem", "code"), training_job_name, settings)


# --------------------------------------------------------------------------- the tokens table


def token_key(name: str) -> dict[str, Any]:
    """The tokens table's key of a training job."""
    return {"training_job_name": {"S": name}}


def get_token_item(ddb: Any, settings: Settings, name: str) -> dict[str, Any] | None:
    answer = ddb.get_item(TableName=settings.tokens_table, Key=token_key(name), ConsistentRead=True)
    item = answer.get("Item")
    return records.from_item(item) if item else None


def _next_attempt(ddb: Any, settings: Settings, job_id: str) -> int:
    """Count one more attempt in the job record, and when it started (the sweeper's deadline runs from there)."""
    answer = ddb.update_item(
        TableName=settings.jobs_table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression="ADD training_attempts :one SET attempt_started_at = :now",
        ConditionExpression="attribute_exists(job_id)",
        ExpressionAttributeValues={":one": {"N": "1"}, ":now": {"S": records.now_iso()}},
        ReturnValues="UPDATED_NEW",
    )
    return int(answer["Attributes"]["training_attempts"]["N"])


def describe_training_job(sagemaker: Any, name: str) -> dict[str, Any] | None:
    """DescribeTrainingJob's answer, or None where SageMaker knows no such job."""
    try:
        return dict(sagemaker.describe_training_job(TrainingJobName=name))
    except ClientError as exc:
        if training_job_missing(exc):
            return None
        raise


def _job_status(sagemaker: Any, name: str) -> str | None:
    description = describe_training_job(sagemaker, name)
    return None if description is None else str(description["TrainingJobStatus"])


#: a training job in one of these still holds (or is releasing) its instances
LIVE = frozenset({"InProgress", "Stopping"})


def _adopt(
    ddb: Any, sagemaker: Any, settings: Settings, job: Job, token: str, record: dict[str, Any]
) -> dict[str, Any] | None:
    """A retried invocation: the job of the latest attempt not yet judged, whatever its state, now answers to this
    task's token (or its answered end is given to this task). None when there is no such job."""
    attempts = int(record.get("training_attempts") or 0)
    if attempts < 1 or int(record.get("judged_attempt") or 0) >= attempts:
        return None
    name = training_job_name(job.spec.name, job.job_id, attempts)
    status = _job_status(sagemaker, name)
    if status is None:
        return None  # the attempt's start never created its job (SageMaker refused it, or it stopped before)
    for _ in range(2):  # a second look when the token's state changed under us
        item = get_token_item(ddb, settings, name)
        if item is not None and item.get("status") == CALLBACK_SENT and status not in LIVE:
            _answered_end(item, name, status)
        if _move_token(ddb, settings, job, name, attempts, token, item):
            return {"training_job_name": name, "attempt": attempts, "adopted": True, "status": status}
    raise RuntimeError(f"the tokens item of {name} kept changing while start_training adopted the job")


def _move_token(
    ddb: Any, settings: Settings, job: Job, name: str, attempt: int, token: str, item: dict[str, Any] | None
) -> bool:
    """The job's tokens item now waits with `token`; False when the item changed since it was read."""
    if item is None:  # a job without its item (it outlived the item's TTL): the item is made again
        try:
            _store_token(ddb, settings, job, name, attempt, token, time.time())
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                return False
            raise
        return True
    try:
        ddb.update_item(
            TableName=settings.tokens_table,
            Key=token_key(name),
            UpdateExpression="SET #token = :token, #status = :waiting, adopted_at = :now REMOVE outcome, answered_at",
            ConditionExpression="#token = :was AND #status = :status",
            ExpressionAttributeNames={"#token": "token", "#status": "status"},
            ExpressionAttributeValues={
                ":token": {"S": token},
                ":was": {"S": str(item.get("token"))},
                ":status": {"S": str(item.get("status"))},
                ":now": {"S": records.now_iso()},
                ":waiting": {"S": WAITING},
            },
        )
    except ClientError as exc:
        if error_code(exc) == CONDITION_FAILED:
            return False
        raise
    return True


def _answered_end(item: dict[str, Any], name: str, status: str) -> None:
    """Give this task the end on_training_event answered to the earlier try's token: raise it."""
    outcome = item.get("outcome") or {}
    if status == "Completed" and outcome.get("training_job_name") == name:
        raise TrainingJobCompleted(json.dumps(outcome))
    error = ALL_ERRORS.get(str(outcome.get("error")), TrainingFailed)
    cause = str(outcome.get("cause") or f"training job {name} ended {status}")
    raise error(cause, training_job_name=name, adopted=True)


def _live_jobs(sagemaker: Any, run: Run, upto: int) -> tuple[list[str], float]:
    """The run's jobs of attempts 1..upto still InProgress or Stopping, and what those attempts cost."""
    live: list[str] = []
    spent = 0.0
    for earlier in range(1, upto + 1):
        name = training_job_name(run.job.spec.name, run.job.job_id, earlier)
        try:
            described = sagemaker.describe_training_job(TrainingJobName=name)
        except ClientError as exc:
            if training_job_missing(exc):
                continue  # an attempt SageMaker refused: nothing billed
            raise
        if described.get("TrainingJobStatus") in LIVE:
            live.append(f"{name} ({described['TrainingJobStatus']})")
        spent += attempt_cost_usd(run, billed_seconds(described))
    return live, spent


def _store_token(
    ddb: Any,
    settings: Settings,
    job: Job,
    name: str,
    attempt: int,
    token: str,
    now: float,
    budget: AttemptBudget | None = None,
) -> None:
    compute = job.spec.compute
    longest = max(compute.max_runtime_hours, compute.wait_hours or 0) * 3600
    item = {
        "training_job_name": name,
        "token": token,
        "job_id": job.job_id,
        "attempt": attempt,
        "archive_target": archive_target(settings, job.job_id),
        "spot": job.spec.compute.spot,
        # what the budget left this attempt; where it `binds` (it set MaxRuntimeInSeconds), reaching that runtime
        # ends the run BudgetExceeded
        "budget": budget.to_dict() if budget is not None else None,
        "status": WAITING,
        "created_at": records.now_iso(),
        "expires_at": int(now + longest + TOKEN_GRACE_SECONDS),
    }
    ddb.put_item(
        TableName=settings.tokens_table,
        Item={key: records.to_attribute(value) for key, value in item.items()},
        ConditionExpression="attribute_not_exists(training_job_name)",
    )


def start_training(
    document: dict[str, Any],
    *,
    sagemaker: Any,
    ddb: Any,
    settings: Settings,
    clock: Callable[[], float] = time.time,
    sts: Any = None,
) -> dict[str, Any]:
    """Start (or adopt) the run's training job; returns {training_job_name, attempt} while the task waits.
    The job is created in a launcher session tagged with the run (`launcher`, with `sts`)."""
    run = Run.parse(document, "network", "filesystem", "code")
    job = run.job
    token = document.get("task_token")
    if not token or not isinstance(token, str):
        raise SpecInvalid.one(
            "task_token",
            token or MISSING,
            "start_training runs as a waitForTaskToken task: pass $$.Task.Token",
        )
    record = records.require(ddb, settings.jobs_table, job.job_id)
    try:
        adopted = _adopt(ddb, sagemaker, settings, job, token, record)
    except LustrainError:
        queue.release_hold(ddb, settings, job.spec.compute, job.job_id)
        raise
    if adopted is not None:
        queue.release_hold(ddb, settings, job.spec.compute, job.job_id)
        return adopted

    live, spent = _live_jobs(sagemaker, run, int(record.get("training_attempts") or 0))
    if live:
        queue.release_hold(ddb, settings, job.spec.compute, job.job_id)
        raise TrainingJobStillRunning(
            f"run {job.job_id} still has {', '.join(live)}: no other training job starts beside a live one",
            training_jobs=live,
        )
    attempt = _next_attempt(ddb, settings, job.job_id)
    name = training_job_name(job.spec.name, job.job_id, attempt)
    budget = attempt_budget(run, spent, settings)
    if budget is not None and budget.runtime_seconds < MIN_RUNTIME_SECONDS:
        raise BudgetExceeded(
            f"the budget of ${budget.limit_usd:,.2f} ({budget.source}) leaves attempt {attempt} "
            f"{budget.runtime_seconds} s of training after ${budget.spent_usd:,.2f} spent by the attempts before "
            f"it: under the {MIN_RUNTIME_SECONDS} s worth starting a fleet for",
            **budget.to_dict(),
        )
    request = request_from(run, name, settings, budget.runtime_seconds if budget is not None else None)
    _store_token(ddb, settings, job, name, attempt, token, clock(), budget)
    records.add_resources(ddb, settings.jobs_table, job.job_id, [{"type": RESOURCE_TYPE, "id": name}])
    try:
        launcher(sts, sagemaker, settings, job).create_training_job(**request)
    except ClientError as exc:
        if _job_status(sagemaker, name) is not None:
            # The job exists though the answer was an error: a 5xx after SageMaker committed it, or botocore's
            # retry meeting the job its first try created. It is this run's, and its token already waits for it:
            # starting another attempt would pay for a second fleet.
            queue.release_hold(ddb, settings, job.spec.compute, job.job_id)
            return {"training_job_name": name, "attempt": attempt, "adopted": True}
        ddb.delete_item(TableName=settings.tokens_table, Key=token_key(name))
        if error_code(exc) == QUOTA_REFUSED:
            # another workload took the quota since the admission: the run goes back to the queue, in its place
            # (the run policy's quota class; next_attempt does not count it as an attempt)
            queue.release_hold(ddb, settings, job.spec.compute, job.job_id)
            compute = job.spec.compute
            raise QuotaExceeded(
                f"SageMaker refused {compute.instance_count} x {compute.instance_type}: "
                f"{exc.response.get('Error', {}).get('Message', '')} (quota "
                f"'{job.launch.quota.name}'; back to the capacity queue)",
                training_job_name=name,
                instance_type=compute.instance_type,
                instance_count=compute.instance_count,
            ) from exc
        raise
    # the job exists and holds its instances in SageMaker's count: the queue's promise is kept
    queue.release_hold(ddb, settings, job.spec.compute, job.job_id)
    return {
        "training_job_name": name,
        "attempt": attempt,
        "adopted": False,
        "image": request["AlgorithmSpecification"]["TrainingImage"],
        "max_runtime_seconds": request["StoppingCondition"]["MaxRuntimeInSeconds"],
        "budget": budget.to_dict() if budget is not None else None,
    }
