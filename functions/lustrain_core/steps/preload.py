"""data.preload: the data's contents brought into Lustre before the GPUs start.

Why a job: FSx for Lustre linked to S3 (a data repository association or ImportPath) imports metadata only; a file's
contents are copied in from S3 when it is first read (FSx for Lustre User Guide, "Importing changes from your data
repository"), so a cold first epoch reads at the pace FSx loads from S3 while the whole fleet bills. No data
repository task loads contents: botocore's DataRepositoryTaskType is EXPORT_TO_REPOSITORY,
IMPORT_METADATA_FROM_REPOSITORY, RELEASE_DATA_FROM_FILESYSTEM and AUTO_RELEASE_DATA only. The guide's way to preload
("Preloading files into your file system") is `lfs hsm_restore` run on a client that mounts the file system, and any
read of a file loads it as well.

So the warm-up is a small SageMaker training job on the run's file system: one CPU instance
(planner.PRELOAD_INSTANCE_TYPE; its request: aws_requests.preload_job) in the run's subnet and security group, mounting the data path read-only (a
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

from lustrain_core import aws_requests
from lustrain_core.config import Settings
from lustrain_core.document import Run
from lustrain_core.errors import FileSystemFailed
from lustrain_core.steps import records
from lustrain_core.steps.training import RESOURCE_TYPE, describe_training_job, launcher

RUNNING = frozenset({"InProgress", "Stopping"})
PRELOADING = "PRELOADING"


def _describe(sagemaker: Any, name: str) -> dict[str, Any] | None:
    return describe_training_job(sagemaker, name)


def advance(
    run: Run, *, sagemaker: Any, ddb: Any, settings: Settings, sts: Any, polls: int, poll: dict[str, int]
) -> tuple[str, int]:
    """One look at the warm-up of a run whose file system is ready: start it (once), or read how it is doing.
    Returns (lifecycle, wait_seconds): PRELOADING and the wait before the next look, or AVAILABLE once it has
    Completed. FileSystemFailed when it Failed or Stopped."""
    job = run.job
    warm = job.launch.preload
    assert warm is not None
    described = _describe(sagemaker, warm.name)
    if described is None:
        records.add_resources(
            ddb, settings.jobs_table, job.job_id, [{"type": RESOURCE_TYPE, "id": warm.name}]
        )
        try:
            launcher(sts, sagemaker, settings, job, warm.name).create_training_job(
                **aws_requests.preload_job(run, settings)
            )
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
