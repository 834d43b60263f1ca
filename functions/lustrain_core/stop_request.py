"""A run's stop request: how the stack asks its trainer to save and exit, since no signal reaches it.

SageMaker's PyTorch training images never pass a stop's SIGTERM on to the entry point (the container's first process
is bash, which drops it; trainer/lustrain_trainer/stopping.py has the sources): a StopTrainingJob alone kills the
trainer at the end of SageMaker's 120 s and loses every step since its last checkpoint. So every stop the stack
causes asks first, through one S3 object of the stack's own bucket:

    s3://<artifacts bucket>/control/<job id>/stop-request.json     {"stop": false}
                                                                   {"stop": true, "reason": ..., "requested_at": ...}

- upload_code writes it, not asking, before the run's training job exists: the job's role (GetObject on
  control/${aws:PrincipalTag/lustrain-run}/*, nothing else there) then always finds it; a missing key answers a role
  without s3:ListBucket with 403, which would tell no request from a refusal.
- The trainer's rank 0 reads it every LUSTRAIN_STOP_POLL_SECONDS (the stack's StopPollSeconds); when it asks, every
  rank leaves the loop at the same step, the checkpoint is committed and the process exits 0.
- Teardown (a cancel, a failed or aborted run) asks (`ask`), then waits for the job to end by itself for at most
  LUSTRAIN_STOP_WAIT_SECONDS (the plan's goodput.stop_wait_s, carried in the job's Environment), and only then calls
  StopTrainingJob. Asking again changes nothing: the first request's time bounds the wait across retries.
- A deadline (MaxRuntimeInSeconds, the budget's or the run's) needs no request: the trainer knows it
  (LUSTRAIN_MAX_RUNTIME_SECONDS) and stops LUSTRAIN_STOP_RESERVE_SECONDS before it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core.aws_errors import error_code
from lustrain_core.config import CONTROL_PREFIX, Settings

FILE_NAME = "stop-request.json"

#: The job's Environment (the names the trainer reads: trainer/lustrain_trainer/stopping.py).
STOP_REQUEST_VARIABLE = "LUSTRAIN_STOP_REQUEST"
STOP_POLL_VARIABLE = "LUSTRAIN_STOP_POLL_SECONDS"
MAX_RUNTIME_VARIABLE = "LUSTRAIN_MAX_RUNTIME_SECONDS"
STOP_RESERVE_VARIABLE = "LUSTRAIN_STOP_RESERVE_SECONDS"
#: for teardown, which reads it back from DescribeTrainingJob: how long the trainer may take to stop when asked
STOP_WAIT_VARIABLE = "LUSTRAIN_STOP_WAIT_SECONDS"

#: Stack settings: the trainer's poll, and the time SageMaker's runtime clock runs before the entry point starts
#: (TrainingStartTime is when the instances start; the image's start and the downloads come before the entry point:
#: DescribeTrainingJob's TrainingStartTime). Unset, the allowance is the plan's goodput.resume_s.
POLL_SETTING = "LUSTRAIN_STOP_POLL_SECONDS"
START_ALLOWANCE_SETTING = "LUSTRAIN_START_ALLOWANCE_SECONDS"
DEFAULT_POLL_SECONDS = 10
#: teardown's wait for a job whose Environment names no figure of its own
DEFAULT_STOP_WAIT_SECONDS = 120
#: What SageMaker's runtime clock counts before the entry point starts besides the plan's checkpoint read: the
#: image's start on the instances and torchrun's rendezvous. No figure is published; an assumption, which the stack's
#: StartAllowanceSeconds replaces (the trainer logs its deadline at start). A trainer that stops itself late still
#: has SageMaker's 120 s between the stop and SIGKILL.
IMAGE_START_ALLOWANCE_SECONDS = 120
#: a stop's save where the plan cannot say (an entry point of the team's own, whose checkpoint lustrain does not
#: know): the poll, then this long for the step in flight and the save
UNKNOWN_SAVE_SECONDS = 30


def key(job_id: str) -> str:
    return f"{CONTROL_PREFIX}{job_id}/{FILE_NAME}"


def uri(settings: Settings, job_id: str) -> str:
    return f"s3://{settings.artifacts_bucket}/{key(job_id)}"


def poll_seconds(settings: Settings) -> int:
    return settings.whole_seconds(POLL_SETTING, least=1) or DEFAULT_POLL_SECONDS


def not_asked(s3: Any, settings: Settings, job_id: str) -> None:
    """The run's stop request, asking nothing yet (upload_code, before the job exists). One already there (a
    retried upload_code, a cancel that came first) is kept: the write is conditional (If-None-Match: *), so a request
    made between any read and this write is never overwritten."""
    try:
        s3.put_object(
            Bucket=settings.artifacts_bucket,
            Key=key(job_id),
            Body=json.dumps({"stop": False}).encode(),
            ContentType="application/json",
            IfNoneMatch="*",
        )
    except ClientError as exc:
        if error_code(exc) not in {"PreconditionFailed", "412", "ConditionalRequestConflict"}:
            raise


def read(s3: Any, settings: Settings, job_id: str) -> dict[str, Any]:
    """The request as it stands ({} where there is none)."""
    try:
        body = s3.get_object(Bucket=settings.artifacts_bucket, Key=key(job_id))["Body"].read()
    except ClientError as exc:
        if error_code(exc) in {"NoSuchKey", "404", "NotFound"}:
            return {}
        raise
    try:
        document = json.loads(body or b"{}")
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def ask(s3: Any, settings: Settings, job_id: str, reason: str, now: datetime | None = None) -> datetime:
    """Ask the run's trainer to save and exit; when it was first asked (a second ask keeps the first's time)."""
    found = read(s3, settings, job_id)
    if found.get("stop") is True:
        try:
            return datetime.fromisoformat(str(found.get("requested_at")))
        except ValueError:
            pass
    at = now or datetime.now(UTC)
    _put(s3, settings, job_id, {"stop": True, "reason": reason, "requested_at": at.isoformat()})
    return at


def _put(s3: Any, settings: Settings, job_id: str, document: dict[str, Any]) -> None:
    s3.put_object(
        Bucket=settings.artifacts_bucket,
        Key=key(job_id),
        Body=json.dumps(document).encode(),
        ContentType="application/json",
    )


def _goodput(plan: dict[str, Any] | None) -> dict[str, Any]:
    found = (plan or {}).get("goodput")
    return found if isinstance(found, dict) else {}


def stop_wait_seconds(plan: dict[str, Any] | None, settings: Settings) -> int:
    """How long teardown waits for an asked trainer before StopTrainingJob: the plan's goodput.stop_wait_s, or for a
    trainer the plan cannot say of, a poll and UNKNOWN_SAVE_SECONDS."""
    value = _goodput(plan).get("stop_wait_s")
    if isinstance(value, int | float) and value > 0:
        return round(float(value))
    return poll_seconds(settings) + UNKNOWN_SAVE_SECONDS


def reserve_seconds(plan: dict[str, Any] | None, settings: Settings) -> int:
    """How long before MaxRuntimeInSeconds the trainer stops itself: the plan's time from a stop to a committed
    checkpoint (goodput.stop_to_saved_s), and the time SageMaker's clock ran before the entry point started (the
    stack's StartAllowanceSeconds, else the plan's goodput.resume_s)."""
    goodput = _goodput(plan)
    saved = goodput.get("stop_to_saved_s")
    allowance = settings.whole_seconds(START_ALLOWANCE_SETTING, least=0)
    if allowance is None:
        resume = goodput.get("resume_s")
        allowance = IMAGE_START_ALLOWANCE_SECONDS + (round(float(resume)) if isinstance(resume, int | float) else 0)
    stop = float(saved) if isinstance(saved, int | float) else poll_seconds(settings) + UNKNOWN_SAVE_SECONDS
    return round(stop) + allowance


def environment(settings: Settings, job_id: str, plan: dict[str, Any] | None, max_runtime_seconds: int
                ) -> dict[str, str]:
    """The job's Environment for its stops: where its stop request is, how often to read it, its deadline, and
    the region to read it in."""
    return {
        # the trainer's S3 client needs the region: without one it would ask s3.amazonaws.com, which the run's
        # subnet (an S3 gateway endpoint, no internet) does not reach
        "AWS_DEFAULT_REGION": settings.region,
        STOP_REQUEST_VARIABLE: uri(settings, job_id),
        STOP_POLL_VARIABLE: str(poll_seconds(settings)),
        MAX_RUNTIME_VARIABLE: str(max_runtime_seconds),
        STOP_RESERVE_VARIABLE: str(reserve_seconds(plan, settings)),
        STOP_WAIT_VARIABLE: str(stop_wait_seconds(plan, settings)),
    }
