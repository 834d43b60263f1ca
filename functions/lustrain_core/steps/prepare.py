"""Data preparation's processing jobs: start each stage once, in order, and read how it ended.

A stage's job (lustrain_core.prepare_plan, its request aws_requests.prepare_job) is started idempotently, as the
training job is: a retried start that finds the job already there carries on with it. Its end comes as
EventBridge's "SageMaker Processing Job State Change" (source aws.sagemaker), whose detail is DescribeProcessingJob's
answer: ProcessingJobName, ProcessingJobStatus (InProgress | Completed | Failed | Stopping | Stopped),
FailureReason, ExitMessage. `outcome` reads either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core import resources as registry
from lustrain_core.aws_errors import error_code
from lustrain_core.config import Settings
from lustrain_core.errors import PrepareFailed
from lustrain_core.prepare_plan import PrepareRun, next_stage
from lustrain_core.steps import records

#: the resource type a stage's job is recorded under in the run's ledger (teardown stops what is still running)
RESOURCE_TYPE = registry.PROCESSING_JOB.name
EVENT_DETAIL_TYPE = "SageMaker Processing Job State Change"
RUNNING = frozenset({"InProgress", "Stopping"})


def describe(sagemaker: Any, name: str) -> dict[str, Any] | None:
    """DescribeProcessingJob, or None for a job that does not exist (ValidationException on AWS)."""
    try:
        return dict(sagemaker.describe_processing_job(ProcessingJobName=name))
    except ClientError as error:
        if error_code(error) == "ValidationException" and "not found" in str(error).lower():
            return None
        raise


def start(sagemaker: Any, request: dict[str, Any]) -> str:
    """Create the stage's job unless it exists (a retry); returns its status."""
    name = request["ProcessingJobName"]
    found = describe(sagemaker, name)
    if found is not None:
        return str(found["ProcessingJobStatus"])
    try:
        sagemaker.create_processing_job(**request)
    except ClientError:
        # a create that went through before a lost answer: the job is there, and ours
        if describe(sagemaker, name) is None:
            raise
    return "InProgress"


def outcome(detail: dict[str, Any]) -> str:
    """The status of an event's detail or a description: InProgress/Stopping (go on waiting) or Completed; raises
    PrepareFailed, naming the job and SageMaker's reason, for Failed and Stopped."""
    status = str(detail.get("ProcessingJobStatus", ""))
    if status == "Completed" or status in RUNNING:
        return status
    name = detail.get("ProcessingJobName", "?")
    reason = detail.get("FailureReason") or detail.get("ExitMessage") or "SageMaker gave no reason"
    raise PrepareFailed(f"the data preparation job {name} {status or 'ended'}: {reason}")


def advance(
    run: PrepareRun,
    done: list[str],
    *,
    sagemaker: Any,
    ddb: Any,
    settings: Settings,
    request_of: Callable[[str], dict[str, Any]],
) -> dict[str, Any]:
    """One look at a preparation run: its next stage's job is started (recorded in the run's ledger before it is
    created, so that teardown stops it whatever happens next), or the running one is read; a stage that Completed
    is added to `done` and the next one started at once. Returns {"done", "stage", "status"}: stage None and
    status Completed once every stage has; PrepareFailed for a stage that Failed or was Stopped."""
    done = list(done)
    while (stage := next_stage(run, done)) is not None:
        request = request_of(stage)
        name = request["ProcessingJobName"]
        found = describe(sagemaker, name)
        if found is None:
            records.add_resources(ddb, settings.jobs_table, run.job_id, [{"type": RESOURCE_TYPE, "id": name}])
            status = start(sagemaker, request)
        else:
            status = outcome(found)
        if status != "Completed":
            return {"done": done, "stage": stage, "status": status}
        done.append(stage)
    return {"done": done, "stage": None, "status": "Completed"}
