"""The requests a run sends AWS, built purely: from the launch plan's decisions (lustrain_core.launch_plan), the ids
the steps before made (the run document's parts, lustrain_core.document) and the stack's settings.

No builder reads the spec or calls AWS: what a request carries is decided once, in the launch plan, and a builder
only puts it where AWS takes it. The steps send these requests (steps/training.py, preload.py, filesystem.py,
network.py), and the launch compiler (lustrain_core.launch) builds the same ones with placeholder ids to check each
against botocore's model before anything exists; SPEC_FIELDS tells it which spec field a refused value came from.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

from lustrain_core import prepare_plan, recovery, stop_request
from lustrain_core.config import Settings
from lustrain_core.document import Job, Network, Run
from lustrain_core.errors import MISSING, SpecInvalid
from lustrain_core.launch_plan import (
    DEFAULT_VOLUME_GIB,
    RESUME_CHANNEL,
    RESUME_FROM_VARIABLE,
    RUN_ID_VARIABLE,
    LaunchPlan,
    Link,
)

TRAINING_CHANNEL = "training"
#: with output.to_filesystem the job writes under this channel (SM_CHANNEL_OUTPUT), exported to S3 at teardown
OUTPUT_CHANNEL = "output"
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
#: TensorBoardOutputConfig: the trainer's rank 0 writes TensorBoard's event files here (told by the variable below)
#: and SageMaker uploads them to <S3OutputPath><training job>/tensorboard-output/ while the job runs; LocalPath's
#: default, named so that the trainer and the request cannot disagree
TENSORBOARD_LOCAL_PATH = "/opt/ml/output/tensorboard"
TENSORBOARD_DIR_VARIABLE = "LUSTRAIN_TENSORBOARD_DIR"
#: with checkpoints.to_filesystem the trainer writes its checkpoints under this read-write channel
#: (SM_CHANNEL_CHECKPOINTS) on the run's file system, and the job has no CheckpointConfig
CHECKPOINT_CHANNEL = "checkpoints"
#: the stack may set a KMS key for the job's output, its storage volume and a persistent file system
KMS_KEY_SETTING = "LUSTRAIN_KMS_KEY_ID"
#: the stack may encrypt the traffic between a job's instances (it slows distributed training down)
INTER_CONTAINER_ENCRYPTION_SETTING = "LUSTRAIN_INTER_CONTAINER_ENCRYPTION"

#: FileSystemTypeVersion of every file system lustrain creates (left out, FSx makes SCRATCH_2 a Lustre 2.10)
LUSTRE_VERSION = "2.15"
ALL_EVENTS = ["NEW", "CHANGED", "DELETED"]
#: On a file system the spec keeps (filesystem.keep), so that a sweep of a run whose record is gone keeps it too.
TAG_KEEP = "lustrain:keep"

#: data.preload's warm-up: the channel the data is mounted at, /opt/ml/input/data/<channel> in the container
PRELOAD_CHANNEL = "data"
PRELOAD_DATA_DIR = f"/opt/ml/input/data/{PRELOAD_CHANNEL}"
#: the warm-up container's command (each of ContainerEntrypoint's items is at most 256 characters): restore where
#: `lfs` exists (asynchronous), then read every file, 8 readers at a time, which loads and waits for each; a read
#: that fails fails the job; the log's last line counts the files
PRELOAD_SCRIPT = (
    'cd "$1" || exit 1; if command -v lfs >/dev/null; then find . -type f -print0 | xargs -0 -r -n 1000 '
    "lfs hsm_restore; fi; find . -type f -print0 | xargs -0 -r -n 64 -P 8 cat >/dev/null || exit 1; "
    'echo "warm-up: $(find . -type f | wc -l) files read"'
)
PRELOAD_ENTRYPOINT = ["/bin/sh", "-c", PRELOAD_SCRIPT, "warmup", PRELOAD_DATA_DIR]

#: The spec field behind each path of a request AWS may refuse a value at (the launch compiler's refusals name it).
SPEC_FIELDS: tuple[tuple[str, str], ...] = (
    ("TrainingJobName", "name"),
    ("GroupName", "name"),
    ("Description", "name"),
    ("ClientRequestToken", "name"),
    ("AlgorithmSpecification.TrainingImage", "image"),
    ("OutputDataConfig.S3OutputPath", "output.s3_uri"),
    ("CheckpointConfig.S3Uri", "checkpoints.s3_uri"),
    ("ResourceConfig.InstanceCount", "compute.instance_count"),
    ("ResourceConfig.InstanceType", "compute.instance_type"),
    ("ResourceConfig.VolumeSizeInGB", "output.expected_size_gib"),
    ("StoppingCondition.MaxRuntimeInSeconds", "compute.max_runtime_hours"),
    ("StoppingCondition.MaxWaitTimeInSeconds", "compute.max_wait_hours"),
    ("ResourceConfig.KeepAlivePeriodInSeconds", "compute.keep_alive_minutes"),
    ("StorageCapacity", "filesystem.storage_gib"),
    ("FileSystemPath", "filesystem.mount_path"),
    ("CidrBlock", "network.vpc_cidr"),
)


def directory_path(mount_name: str, mount_path: str) -> str:
    """SageMaker's FileSystemDataSource DirectoryPath for a path inside a Lustre file system: /<MountName><path>."""
    inside = mount_path.rstrip("/")
    return f"/{mount_name}{inside}"


def kms_key(settings: Settings) -> str | None:
    """The stack's KMS key, if it sets one."""
    return settings.extra.get(KMS_KEY_SETTING, "").strip() or None


def inter_container_encryption(settings: Settings) -> bool:
    raw = settings.extra.get(INTER_CONTAINER_ENCRYPTION_SETTING, "").strip().lower()
    if raw not in {"", "true", "false"}:
        raise ValueError(
            f"stack setting {INTER_CONTAINER_ENCRYPTION_SETTING}={raw!r} must be true or false: fix the stack's "
            "parameter"
        )
    return raw == "true"


# --------------------------------------------------------------------------- SageMaker


def stopping_condition(launch: LaunchPlan, budget_runtime_seconds: int | None = None) -> dict[str, int]:
    """compute.max_runtime_hours, or less where the budget left pays for less (steps/budget.py). On a training plan
    start_training gives the job's whole time instead (steps/training.attempt_runtime): MaxRuntimeInSeconds counts
    the job's wait Pending for its reserved capacity, so it is that wait plus the runtime, capped to the capacity's
    usable end (steps/training_plans.job_runtime_seconds), and may exceed compute.max_runtime_hours by the wait."""
    runtime = launch.max_runtime_seconds
    if budget_runtime_seconds is not None:
        planned = launch.training_plan is not None
        runtime = budget_runtime_seconds if planned else min(runtime, budget_runtime_seconds)
    condition = {"MaxRuntimeInSeconds": runtime}
    if launch.max_wait_seconds is not None:
        condition["MaxWaitTimeInSeconds"] = launch.max_wait_seconds
    return condition


def resource_config(launch: LaunchPlan, settings: Settings) -> dict[str, Any]:
    """The run's ResourceConfig, with the stack's volume key: also what its warm pool is matched by."""
    instances = launch.instances
    config: dict[str, Any] = {
        "InstanceType": instances.instance_type,
        "InstanceCount": instances.instance_count,
    }
    if (
        launch.training_plan is not None
    ):  # the reserved capacity the instances come from (compute.training_plan)
        config["TrainingPlanArn"] = launch.training_plan.arn
    if launch.keep_alive_seconds:
        # the instances stay in a warm pool this long after the job, for the next job of the same shape
        config["KeepAlivePeriodInSeconds"] = launch.keep_alive_seconds
    if instances.volume_size_gib is None:
        # SageMaker puts everything on the instance's NVMe and refuses a volume key there
        return config
    config["VolumeSizeInGB"] = instances.volume_size_gib
    key = kms_key(settings)
    if key:
        config["VolumeKmsKeyId"] = key
    return config


def _file_system_channel(run: Run, name: str, path: str, mode: str) -> dict[str, Any]:
    mount_name = run.filesystem.mount_name
    if not mount_name:
        raise SpecInvalid.one(
            "filesystem.mount_name", MISSING, "the file system's MountName (check_filesystem's)"
        )
    source = {
        "FileSystemId": run.filesystem.file_system_id,
        "FileSystemType": "FSxLustre",
        "FileSystemAccessMode": mode,
        "DirectoryPath": directory_path(mount_name, path),
    }
    return {"ChannelName": name, "DataSource": {"FileSystemDataSource": source}}


def channels(run: Run) -> list[dict[str, Any]]:
    """The training job's InputDataConfig: the data on the file system (read-write where the job writes output
    there), the output and checkpoint directories the launch plan puts on it, the checkpoint it resumes from."""
    launch = run.job.launch
    mode = "rw" if launch.output_path else "ro"
    found = [_file_system_channel(run, TRAINING_CHANNEL, launch.data_path, mode)]
    if launch.output_path:
        found.append(_file_system_channel(run, OUTPUT_CHANNEL, launch.output_path, "rw"))
    if launch.checkpoint_path:
        # the same directory for every attempt of the run: a new attempt resumes from what the last one wrote
        found.append(_file_system_channel(run, CHECKPOINT_CHANNEL, launch.checkpoint_path, "rw"))
    if launch.resume is not None:
        # the checkpoint this run continues (its manifest step-N.json and shards), copied to every instance at start
        s3 = {
            "S3DataType": "S3Prefix",
            "S3Uri": launch.resume.s3_uri,
            "S3DataDistributionType": "FullyReplicated",
        }
        found.append({"ChannelName": RESUME_CHANNEL, "DataSource": {"S3DataSource": s3}, "InputMode": "File"})
    return found


def training_job(
    run: Run, training_job_name: str, settings: Settings, budget_runtime_seconds: int | None = None
) -> dict[str, Any]:
    """The whole CreateTrainingJob request: the launch plan's decisions, and the ids of the steps before
    (network, file system, code bundle), with the stack's own settings (role, KMS key, encryption); its
    MaxRuntimeInSeconds no longer than `budget_runtime_seconds`, what the budget left pays for."""
    job = run.job
    launch = job.launch
    key = kms_key(settings)

    algorithm: dict[str, Any] = {"TrainingImage": launch.image_uri, "TrainingInputMode": "File"}
    if run.code.metric_definitions:
        algorithm["MetricDefinitions"] = [
            {"Name": m.Name, "Regex": m.Regex} for m in run.code.metric_definitions
        ]
    # under the run's own archive, the only part of it its role may write (steps/training.run_session_tags)
    output: dict[str, Any] = {
        "S3OutputPath": launch.model_output_s3_uri,
        "CompressionType": launch.output_compression,
    }
    if key:
        output["KmsKeyId"] = key
    environment = {**launch.environment, RUN_ID_VARIABLE: job.job_id, TENSORBOARD_DIR_VARIABLE: TENSORBOARD_LOCAL_PATH}
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
        "InputDataConfig": channels(run),
        "OutputDataConfig": output,
        "ResourceConfig": resource_config(launch, settings),
        "VpcConfig": {
            "Subnets": [run.network.subnet_id],
            "SecurityGroupIds": list(run.network.security_group_ids),
        },
        "StoppingCondition": stopping_condition(launch, budget_runtime_seconds),
        "EnableInterContainerTrafficEncryption": inter_container_encryption(settings),
        "EnableManagedSpotTraining": launch.instances.spot,
        "Environment": environment,
        # beside the model, under the run's own jobs/ (the only part of the archive the job's role may write):
        # `tensorboard --logdir` that prefix shows every attempt of the run
        "TensorBoardOutputConfig": {"S3OutputPath": launch.model_output_s3_uri, "LocalPath": TENSORBOARD_LOCAL_PATH},
        "Tags": job.tags("training_job"),
        # SageMaker assumes the execution role with the session tags of the session that creates the job (the
        # launcher's, run_session_tags): the role's S3 grants name them, so the job reaches only its own run's
        # code, checkpoints and results
        "SessionChainingConfig": {"EnableSessionTagChaining": True},
    }
    # how the stack asks the trainer to stop, and the deadline it stops itself before (stop_request.py); a region
    # the spec's code.environment sets is its own
    stops = stop_request.environment(
        settings, job.job_id, job.plan, request["StoppingCondition"]["MaxRuntimeInSeconds"]
    )
    for name, value in stops.items():
        environment.setdefault(name, value)
    if launch.checkpoint_path is None:
        # SageMaker syncs LocalPath to S3 while the job runs and back at its start (and at a spot restart)
        request["CheckpointConfig"] = {"S3Uri": launch.checkpoint_s3_uri, "LocalPath": CHECKPOINT_LOCAL_PATH}
    if launch.instances.spot:
        # spot capacity can be reclaimed: SageMaker restarts the job in place from its last checkpoint this many
        # times before the run's own attempts (the run policy) count
        request["RetryStrategy"] = {"MaximumRetryAttempts": recovery.SAGEMAKER_SPOT_RETRIES}
    if launch.instances.infra_check:
        request["InfraCheckConfig"] = {"EnableInfraCheck": True}
    return request


def preload_job(run: Run, settings: Settings) -> dict[str, Any]:
    """The data warm-up's CreateTrainingJob request (data.preload): the launch plan's decisions, the run's network
    and file system; the data path mounted read-only."""
    launch = run.job.launch
    warm = launch.preload
    assert warm is not None
    key = kms_key(settings)
    output: dict[str, Any] = {"S3OutputPath": warm.output_s3_uri}
    resources: dict[str, Any] = {
        "InstanceType": warm.instance_type,
        "InstanceCount": 1,
        "VolumeSizeInGB": DEFAULT_VOLUME_GIB,
    }
    if key:
        output["KmsKeyId"] = key
        resources["VolumeKmsKeyId"] = key
    channel = _file_system_channel(run, PRELOAD_CHANNEL, launch.data_path, "ro")
    return {
        "TrainingJobName": warm.name,
        "RoleArn": settings.sagemaker_role_arn,
        "AlgorithmSpecification": {
            "TrainingImage": warm.image_uri,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": PRELOAD_ENTRYPOINT,
        },
        "InputDataConfig": [channel],
        "OutputDataConfig": output,
        "ResourceConfig": resources,
        "VpcConfig": {
            "Subnets": [run.network.subnet_id],
            "SecurityGroupIds": list(run.network.security_group_ids),
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": warm.max_runtime_seconds},
        "Tags": launch.tags_named(warm.name),
        "SessionChainingConfig": {"EnableSessionTagChaining": True},
    }


# --------------------------------------------------------------------------- FSx


def file_system(job: Job, network: Network, settings: Settings) -> dict[str, Any]:
    """The CreateFileSystem request of a run's file system, as planned."""
    planned = job.planned.filesystem
    kind = planned.deployment_type
    lustre: dict[str, Any] = {
        "DeploymentType": kind,
        "DataCompressionType": "LZ4" if job.spec.filesystem.compression == "lz4" else "NONE",
    }
    if kind == "PERSISTENT_2":
        lustre["PerUnitStorageThroughput"] = int(planned.per_unit_storage_throughput or 0)
    tags = job.tags("filesystem")
    if job.spec.filesystem.keep:
        tags.append({"Key": TAG_KEEP, "Value": "true"})
    request: dict[str, Any] = {
        "ClientRequestToken": job.job_id,
        "FileSystemType": "LUSTRE",
        "StorageCapacity": int(planned.storage_gib or 0),
        "StorageType": "SSD",
        "FileSystemTypeVersion": LUSTRE_VERSION,
        "SubnetIds": [network.subnet_id],
        "SecurityGroupIds": list(network.security_group_ids),
        "Tags": tags,
        "LustreConfiguration": lustre,
    }
    key = kms_key(settings)
    if key and kind.startswith("PERSISTENT"):
        # FSx takes a customer key on persistent file systems only; scratch ones use an FSx-managed key
        request["KmsKeyId"] = key
    if job.launch.link_method == "import_path":
        data = next(link for link in job.launch.links if link.purpose == "data")
        lustre["ImportPath"] = data.s3_uri
        lustre["AutoImportPolicy"] = "NEW_CHANGED_DELETED"
    return request


def data_repository_association(
    job: Job, file_system_id: str, link: Link, settings: Settings
) -> dict[str, Any]:
    """CreateDataRepositoryAssociation for one link: data is imported (and kept current), output exported."""
    s3: dict[str, Any] = {"AutoImportPolicy": {"Events": ALL_EVENTS}}
    if link.purpose == "output":
        s3 = {"AutoExportPolicy": {"Events": ALL_EVENTS}}
    if link.purpose == "checkpoints":
        # neither way automatically: a checkpoint burst must not turn into S3 traffic while the job trains; the
        # exports (EXPORT_TO_REPOSITORY) send them at the end of each attempt and before the file system goes
        s3 = {"AutoImportPolicy": {"Events": []}, "AutoExportPolicy": {"Events": []}}
    token = hashlib.sha256(f"{job.job_id}:{file_system_id}:{link.path}".encode()).hexdigest()[:32]
    return {
        "FileSystemId": file_system_id,
        "FileSystemPath": link.path,
        "DataRepositoryPath": link.s3_uri,
        "BatchImportMetaDataOnCreate": link.purpose == "data",
        "S3": s3,
        "ClientRequestToken": token,
        "Tags": job.tags(f"link_{link.purpose}"),
    }


# --------------------------------------------------------------------------- EC2


class Tagged(Protocol):
    """What the network's requests read of a run (a Job, or steps/network.NetworkFor): its id, and each of its
    resources' name and tags (Name included)."""

    @property
    def job_id(self) -> str: ...

    def tags(self, resource: str) -> list[dict[str, str]]: ...

    def name_of(self, resource: str) -> str: ...


def tag_spec(job: Tagged, resource: str, resource_type: str) -> list[dict[str, Any]]:
    return [{"ResourceType": resource_type, "Tags": job.tags(resource)}]


def security_group(job: Tagged, vpc_id: str) -> dict[str, Any]:
    """CreateSecurityGroup of the run's group (its name from the launch plan)."""
    return {
        "GroupName": job.name_of("security_group"),
        "Description": f"lustrain {job.job_id}: EFA and Lustre between the training instances and the file system",
        "VpcId": vpc_id,
        "TagSpecifications": tag_spec(job, "security_group", "security-group"),
    }


def vpc(job: Tagged, cidr: str) -> dict[str, Any]:
    """CreateVpc of the run's network (its CIDR block from the plan)."""
    return {"CidrBlock": cidr, "TagSpecifications": tag_spec(job, "vpc", "vpc")}


# --------------------------------------------------------------------------- SageMaker Processing: data preparation


def prepare_job(
    run: prepare_plan.PrepareRun,
    stage: str,
    *,
    role_arn: str,
    image_uri: str,
    code_s3_uri: str,
    subnet_id: str,
    security_group_ids: list[str],
    tags: list[dict[str, str]],
    settings: Settings,
) -> dict[str, Any]:
    """The CreateProcessingJob request of one stage of a preparation run (lustrain_core.prepare_plan): the trainer
    package's bundle as the job's code, the stage's command line, in the run's subnet (which reaches S3 through its
    gateway endpoint), with the role given. The job reads SRC and writes OUT itself (boto3): no data input or
    output is declared."""
    code = code_s3_uri.rsplit("/", 1)[0] + "/" if code_s3_uri.endswith("/sourcedir.tar.gz") else code_s3_uri
    cluster: dict[str, Any] = {
        "InstanceCount": run.instances_of(stage),
        "InstanceType": run.instance_type,
        "VolumeSizeInGB": prepare_plan.VOLUME_GIB,
    }
    key = kms_key(settings)
    if key:
        cluster["VolumeKmsKeyId"] = key
    return {
        "ProcessingJobName": run.job_name(stage),
        "ProcessingResources": {"ClusterConfig": cluster},
        "AppSpecification": {
            "ImageUri": image_uri,
            "ContainerEntrypoint": prepare_plan.ENTRYPOINT,
            "ContainerArguments": run.arguments(stage),
        },
        "ProcessingInputs": [_processing_input("code", code, prepare_plan.CODE_DIR)],
        # the container's own boto3 reads SRC and writes OUT: its region is the stack's, so its S3 calls go to
        # the regional endpoint the run's subnet reaches through its gateway endpoint (no NAT: s3.amazonaws.com,
        # a client's default without a region, is not reachable from it)
        "Environment": {"AWS_DEFAULT_REGION": settings.region},
        "NetworkConfig": {
            "VpcConfig": {"Subnets": [subnet_id], "SecurityGroupIds": list(security_group_ids)},
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": prepare_plan.MAX_RUNTIME_SECONDS},
        "RoleArn": role_arn,
        "Tags": tags,
    }


def _processing_input(name: str, s3_uri: str, local_path: str) -> dict[str, Any]:
    return {
        "InputName": name,
        "S3Input": {
            "S3Uri": s3_uri,
            "LocalPath": local_path,
            "S3DataType": "S3Prefix",
            "S3InputMode": "File",
            "S3DataDistributionType": "FullyReplicated",
        },
    }
