"""data.preload: the data's contents brought into Lustre before the GPUs start.

Why a job: FSx for Lustre linked to S3 (a data repository association or ImportPath) imports metadata only; a file's
contents are copied in from S3 when it is first read (FSx for Lustre User Guide, "Importing changes from your data
repository"), so a cold first epoch reads at the pace FSx loads from S3 while the whole fleet bills. No data
repository task loads contents: botocore's DataRepositoryTaskType is EXPORT_TO_REPOSITORY,
IMPORT_METADATA_FROM_REPOSITORY, RELEASE_DATA_FROM_FILESYSTEM and AUTO_RELEASE_DATA only. The guide's way to preload
("Preloading files into your file system") is `lfs hsm_restore` run on a client that mounts the file system, and any
read of a file loads it as well.

So the warm-up is a small SageMaker training job on the run's file system: one CPU instance
(planner.PRELOAD_INSTANCE_TYPE) in the run's subnet and security group, mounting the data path read-only (a
FileSystemDataSource channel, as the training job does), whose container runs SCRIPT instead of a training script
(AlgorithmSpecification.ContainerEntrypoint): `lfs hsm_restore` on every file where the image has the Lustre client,
then a read of every file, which loads what the restore has not yet and waits for what it is loading.

How it fits the state machine with no new state: check_filesystem's poll loop goes on once the file system and its
links are AVAILABLE: it starts the warm-up (recorded in the run's ledger as a training_job before it is created, so
teardown stops it and the sweeper finds it by its tags like any training job of the run), reports the lifecycle
PRELOADING while it runs, and AVAILABLE when it has Completed. A warm-up that Failed or Stopped fails the file
system (FileSystemFailed: the Parallel state's Catch tears the run down). Its looks are the poll loop's looks,
counted in FilesystemPollMaxCount with the file system's own (the history budget's bound): the wait between two
is stretched so the looks left outlast the warm-up's MaxRuntimeInSeconds, after which SageMaker stops it.

A later attempt of the run reuses the file system, whose data is then loaded: it does not warm up again. A reused
file system (filesystem.file_system_id) is warmed up too: files already loaded are read from Lustre at its own
pace, and files FSx released (AUTO_RELEASE_DATA, RELEASE_DATA_FROM_FILESYSTEM) are loaded again.
"""

from __future__ import annotations

import math
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core import images, planner
from lustrain_core.config import Settings
from lustrain_core.errors import FileSystemFailed
from lustrain_core.launch import Preload
from lustrain_core.spec import JobSpec
from lustrain_core.steps import Run, records
from lustrain_core.steps.filesystem import directory_path

#: the warm-up job's name: <spec name>-<8 hex of the job id>-warmup (at most 40 + 1 + 8 + 7 characters)
SUFFIX = "warmup"
#: the channel the data is mounted at: /opt/ml/input/data/<channel> in the container
CHANNEL = "data"
CONTAINER_DATA_DIR = f"/opt/ml/input/data/{CHANNEL}"
#: the PyTorch image's version the warm-up runs when the spec brings its own image (image.uri): any image with a
#: POSIX shell, find, xargs and cat would do, and this one is SageMaker's own
IMAGE_VERSION = "2.8"
#: the container's command (each of ContainerEntrypoint's items is at most 256 characters): restore where `lfs`
#: exists (asynchronous), then read every file, 8 readers at a time, which loads and waits for each; a read that
#: fails fails the job; the log's last line counts the files
SCRIPT = (
    'cd "$1" || exit 1; if command -v lfs >/dev/null; then find . -type f -print0 | xargs -0 -r -n 1000 '
    "lfs hsm_restore; fi; find . -type f -print0 | xargs -0 -r -n 64 -P 8 cat >/dev/null || exit 1; "
    'echo "warm-up: $(find . -type f | wc -l) files read"'
)
ENTRYPOINT = ["/bin/sh", "-c", SCRIPT, "warmup", CONTAINER_DATA_DIR]
RUNNING = frozenset({"InProgress", "Stopping"})
PRELOADING = "PRELOADING"


def job_name(spec_name: str, job_id: str) -> str:
    from lustrain_core.steps.training import job_hex

    return f"{spec_name}-{job_hex(job_id, spec_name)}-{SUFFIX}"


def decide(spec: JobSpec, job_id: str, region: str, plan: dict[str, Any]) -> Preload:
    """The launch plan's warm-up: its name, instance type, image (the run's PyTorch version, in its CPU build) and
    MaxRuntimeInSeconds (PRELOAD_RUNTIME_FACTOR times the plan's expected time, at least PRELOAD_MIN_SECONDS)."""
    expected = (plan.get("preload") or {}).get("max_runtime_seconds") or planner.PRELOAD_UNKNOWN_SECONDS
    return Preload(
        name=job_name(spec.name, job_id),
        instance_type=planner.PRELOAD_INSTANCE_TYPE,
        image_uri=images.pytorch_training_image(
            spec.image.framework_version or IMAGE_VERSION, region, planner.PRELOAD_INSTANCE_TYPE
        ),
        max_runtime_seconds=int(expected),
    )


def request_from(run: Run, settings: Settings) -> dict[str, Any]:
    """The warm-up's CreateTrainingJob request: the launch plan's decisions, the run's network and file system."""
    from lustrain_core.steps.training import DEFAULT_VOLUME_GIB, KMS_KEY_SETTING

    job = run.job
    warm = job.launch.preload
    assert warm is not None
    kms_key_id = settings.extra.get(KMS_KEY_SETTING) or None
    mount = run.filesystem.mount_name or ""
    source = {
        "FileSystemId": run.filesystem.file_system_id,
        "FileSystemType": "FSxLustre",
        "FileSystemAccessMode": "ro",
        "DirectoryPath": directory_path(mount, job.spec.filesystem.mount_path),
    }
    output: dict[str, Any] = {"S3OutputPath": f"{job.spec.output.s3_uri.rstrip('/')}/{job.job_id}/{SUFFIX}/"}
    resources: dict[str, Any] = {
        "InstanceType": warm.instance_type,
        "InstanceCount": 1,
        "VolumeSizeInGB": DEFAULT_VOLUME_GIB,
    }
    if kms_key_id:
        output["KmsKeyId"] = kms_key_id
        resources["VolumeKmsKeyId"] = kms_key_id
    return {
        "TrainingJobName": warm.name,
        "RoleArn": settings.sagemaker_role_arn,
        "AlgorithmSpecification": {
            "TrainingImage": warm.image_uri,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ENTRYPOINT,
        },
        "InputDataConfig": [{"ChannelName": CHANNEL, "DataSource": {"FileSystemDataSource": source}}],
        "OutputDataConfig": output,
        "ResourceConfig": resources,
        "VpcConfig": {
            "Subnets": [run.network.subnet_id],
            "SecurityGroupIds": list(run.network.security_group_ids),
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": warm.max_runtime_seconds},
        "Tags": job.launch.tags_named(warm.name),
        "SessionChainingConfig": {"EnableSessionTagChaining": True},
    }


def _describe(sagemaker: Any, name: str) -> dict[str, Any] | None:
    from lustrain_core.steps.training import describe_training_job

    return describe_training_job(sagemaker, name)


def advance(
    run: Run, *, sagemaker: Any, ddb: Any, settings: Settings, sts: Any, polls: int, poll: dict[str, int]
) -> tuple[str, int]:
    """One look at the warm-up of a run whose file system is ready: start it (once), or read how it is doing.
    Returns (lifecycle, wait_seconds): PRELOADING and the wait before the next look, or AVAILABLE once it has
    Completed. FileSystemFailed when it Failed or Stopped."""
    from lustrain_core.steps.training import RESOURCE_TYPE, launcher

    job = run.job
    warm = job.launch.preload
    assert warm is not None
    described = _describe(sagemaker, warm.name)
    if described is None:
        records.add_resources(
            ddb, settings.jobs_table, job.job_id, [{"type": RESOURCE_TYPE, "id": warm.name}]
        )
        try:
            launcher(sts, sagemaker, settings, job).create_training_job(**request_from(run, settings))
        except ClientError:
            if _describe(sagemaker, warm.name) is None:
                raise
        status = "InProgress"
    else:
        status = described["TrainingJobStatus"]
    if status == "Completed":
        return "AVAILABLE", 0
    if status not in RUNNING:
        raise FileSystemFailed(
            f"the data warm-up job {warm.name} {status}: "
            f"{(described or {}).get('FailureReason') or 'SageMaker gave no reason'} (data.preload)",
            file_system_id=run.filesystem.file_system_id,
            lifecycle=PRELOADING,
            training_job_name=warm.name,
        )
    if polls >= poll["max_polls"]:
        # the state machine's Choice stops here too; teardown stops the job
        raise FileSystemFailed(
            f"the data warm-up job {warm.name} is still {status} after {polls} looks at the file system",
            file_system_id=run.filesystem.file_system_id,
            lifecycle=PRELOADING,
            training_job_name=warm.name,
        )
    return PRELOADING, wait_seconds(warm.max_runtime_seconds, polls, poll)


def wait_seconds(max_runtime_seconds: int, polls: int, poll: dict[str, int]) -> int:
    """The wait before the next look at a running warm-up: the steady interval, or longer where the looks left
    (of the poll loop's max_polls) would run out before the warm-up's MaxRuntimeInSeconds."""
    left = max(1, poll["max_polls"] - polls - 1)
    return max(poll["max_seconds"], math.ceil(max_runtime_seconds / left))
