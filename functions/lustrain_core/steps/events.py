"""on_training_event: SageMaker's "Training Job State Change" events, answered to the waiting state machine.

EventBridge delivers every training job's changes in the account; only jobs start_training started (their name
is in the tokens table) are answered, the rest are ignored. Per status:

    InProgress, Stopping   SendTaskHeartbeat; the secondary status is noted in the tokens item
    Completed              archive (steps/archive.py), then SendTaskSuccess with the archive and the metrics
    Failed                 SendTaskFailure, error = the error of the failure's class (lustrain_core.recovery:
                           CapacityError, QuotaExceeded, InfrastructureError, MountFailed, TrainingFailed),
                           cause = FailureReason
    Stopped                SendTaskFailure, error = TrainingStopped, or SpotInterrupted for a spot job whose
                           capacity did not come back within its MaxWait

Events can repeat and arrive out of order. The tokens item's status moves from "waiting" to "callback_sent" in
one conditional UpdateItem, and only the delivery that made that move calls back; if its SendTask* call then
fails for a reason worth retrying, the move is undone and the error raised, so the next delivery tries again. An
execution that already ended (TaskTimedOut, InvalidToken, TaskDoesNotExist) is noted and left alone.

Nothing an event says is believed. EventBridge delivers SageMaker's events, but the function can be invoked with
any event (by whoever may invoke it, or a rule put on the bus by someone else), and events repeat and come late.
So before anything is done:

- the job must be the run's current attempt: the tokens item names the run and the attempt, and the run's record
  (its `training_attempts`, and `judged_attempt`, the last attempt next_attempt has judged) must say this job,
  named `<spec name>-<8 hex of the job id>-<attempt>`, is the one the run waits for; an older attempt's event, or
  one whose attempt was judged already, changes nothing (a replay);
- a token already answered changes nothing (a replay);
- DescribeTrainingJob says what happened: its status, SecondaryStatus and FailureReason are what the handler acts
  on, not the event's. An event that claims an end for a job SageMaker says is still InProgress or Stopping (a
  forged "Failed / CapacityError") changes nothing, not even a heartbeat; a late InProgress event for a job that
  has ended answers the end SageMaker describes.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lustrain_core import recovery, stop_request
from lustrain_core.aws_errors import CONDITION_FAILED, error_code
from lustrain_core.config import Settings
from lustrain_core.errors import EventInvalid
from lustrain_core.spec import field_errors
from lustrain_core.steps import records
from lustrain_core.steps.archive import MANIFEST, archive_training_job
from lustrain_core.steps.training import (
    CALLBACK_SENT,
    WAITING,
    describe_training_job,
    get_token_item,
    token_key,
)

DETAIL_TYPE = "SageMaker Training Job State Change"
#: SendTask* answers meaning the execution is no longer waiting for this token
GONE_CODES = frozenset({"TaskTimedOut", "InvalidToken", "TaskDoesNotExist"})
MAX_ERROR_CHARS = 256
MAX_CAUSE_CHARS = 32768
#: a job in one of these holds (or is releasing) its instances: no end to answer yet
LIVE = frozenset({"InProgress", "Stopping"})
#: the ends a task is answered for
ENDED = frozenset({"Completed", "Failed", "Stopped"})


class TrainingModelArtifacts(BaseModel):
    S3ModelArtifacts: str | None = None


class TrainingJobStateChange(BaseModel):
    """The detail of the event: DescribeTrainingJob's shape, times as epoch milliseconds (strings or numbers)."""

    model_config = ConfigDict(extra="ignore")

    TrainingJobName: str = Field(min_length=1, max_length=63)
    TrainingJobArn: str | None = None
    TrainingJobStatus: Literal["InProgress", "Completed", "Failed", "Stopping", "Stopped"]
    SecondaryStatus: str | None = None
    FailureReason: str | None = None
    ModelArtifacts: TrainingModelArtifacts | None = None
    BillableTimeInSeconds: int | None = None
    CreationTime: datetime | None = None
    TrainingStartTime: datetime | None = None
    TrainingEndTime: datetime | None = None
    LastModifiedTime: datetime | None = None

    @field_validator(
        "CreationTime", "TrainingStartTime", "TrainingEndTime", "LastModifiedTime", mode="before"
    )
    @classmethod
    def _epoch_ms(cls, value: Any) -> Any:
        if isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?", value):
            value = float(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                return datetime.fromtimestamp(value / 1000, tz=UTC)
            except (OverflowError, OSError, ValueError):
                # pydantic reports a ValueError as the field's error; the others would escape it
                raise ValueError(f"epoch milliseconds out of range: {value!r}") from None
        return value


class TrainingJobStateChangeEvent(EventBridgeModel):
    source: Literal["aws.sagemaker"]
    detail_type: Literal["SageMaker Training Job State Change"] = Field(alias="detail-type")
    detail: TrainingJobStateChange


def parse_state_change(event: Any) -> TrainingJobStateChangeEvent:
    """The event, checked. The stack's rule sends SageMaker's events only, but a function can be invoked with
    anything: what is not one fails with EventInvalid naming each wrong field."""
    try:
        return TrainingJobStateChangeEvent.model_validate(event)
    except ValidationError as exc:
        raise EventInvalid(
            field_errors(exc, note=" (not a SageMaker Training Job State Change event)")
        ) from None


def classify_failure(reason: str | None) -> str:
    """The error a Failed training job's FailureReason names (the run policy's classes: lustrain_core.recovery)."""
    return recovery.POLICY[recovery.classify("Failed", reason)].error


def _claim(ddb: Any, settings: Settings, name: str, outcome: dict[str, Any]) -> dict[str, Any] | None:
    """Move the tokens item from waiting to callback_sent; the item (with the token to answer) if this call did."""
    try:
        answer = ddb.update_item(
            TableName=settings.tokens_table,
            Key=token_key(name),
            UpdateExpression="SET #status = :sent, outcome = :outcome, answered_at = :now",
            ConditionExpression="#status = :waiting",
            ExpressionAttributeNames={"#status": "status"},
            ExpressionAttributeValues={
                ":sent": {"S": CALLBACK_SENT},
                ":waiting": {"S": WAITING},
                ":outcome": records.to_attribute(outcome),
                ":now": {"S": records.now_iso()},
            },
            ReturnValues="ALL_NEW",
        )
    except ClientError as exc:
        if error_code(exc) == CONDITION_FAILED:
            return None
        raise
    return records.from_item(answer["Attributes"])


def _release(ddb: Any, settings: Settings, name: str) -> None:
    ddb.update_item(
        TableName=settings.tokens_table,
        Key=token_key(name),
        UpdateExpression="SET #status = :waiting REMOVE outcome, answered_at",
        ConditionExpression="#status = :sent",
        ExpressionAttributeNames={"#status": "status"},
        ExpressionAttributeValues={":sent": {"S": CALLBACK_SENT}, ":waiting": {"S": WAITING}},
    )


def _call_back(
    sfn: Any, ddb: Any, settings: Settings, name: str, outcome: dict[str, Any], send: str, **params: Any
) -> dict[str, Any]:
    """Claim the one callback of this job and make it; what happened, for the handler's result."""
    item = _claim(ddb, settings, name, outcome)
    if item is None:
        return {"duplicate": True}
    try:
        getattr(sfn, send)(taskToken=item["token"], **params)
    except ClientError as exc:
        if error_code(exc) in GONE_CODES:
            return {"callback": "execution_gone", "reason": error_code(exc)}
        _release(ddb, settings, name)
        raise
    return {"callback": send}


def not_current(ddb: Any, settings: Settings, item: dict[str, Any], name: str) -> str | None:
    """Why the job is not the attempt its run waits for (None when it is): the run's record decides."""
    job_id = str(item.get("job_id") or "")
    record = records.get(ddb, settings.jobs_table, job_id) if job_id else None
    if record is None:
        return f"the tokens item names run {job_id or '(none)'}, which has no job record"
    attempts = record.attempt
    current = record.current_training_job
    if current != name or int(item.get("attempt") or 0) != attempts:
        return f"{name} is not run {job_id}'s current attempt (attempt {attempts}: {current})"
    if record.attempt_judged:
        return f"attempt {attempts} of run {job_id} was judged already (next_attempt): a replayed event"
    return None


def _heartbeat(
    sfn: Any, ddb: Any, settings: Settings, item: dict[str, Any], description: dict[str, Any]
) -> dict[str, Any]:
    try:
        sfn.send_task_heartbeat(taskToken=item["token"])
    except ClientError as exc:
        if error_code(exc) in GONE_CODES:
            return {"heartbeat": "execution_gone", "reason": error_code(exc)}
        raise
    secondary = str(description.get("SecondaryStatus") or "")
    try:
        ddb.update_item(
            TableName=settings.tokens_table,
            Key=token_key(str(description["TrainingJobName"])),
            UpdateExpression="SET secondary_status = :secondary, job_status = :status, updated_at = :now",
            ConditionExpression="#status = :waiting",
            ExpressionAttributeNames={"#status": "status"},
            ExpressionAttributeValues={
                ":secondary": {"S": secondary},
                ":status": {"S": str(description["TrainingJobStatus"])},
                ":now": {"S": records.now_iso()},
                ":waiting": {"S": WAITING},
            },
        )
    except ClientError as exc:
        if error_code(exc) != CONDITION_FAILED:
            raise
    return {"heartbeat": "sent", "secondary_status": secondary}


def completed_output(
    description: dict[str, Any], manifest: dict[str, Any], manifest_uri: str
) -> dict[str, Any]:
    """The training task's output ($.training) for a completed job."""
    return {
        "training_job_name": description["TrainingJobName"],
        "status": description["TrainingJobStatus"],
        "archive_s3_uri": manifest["archive_s3_uri"],
        "manifest_s3_uri": manifest_uri,
        "model_artifacts": (description.get("ModelArtifacts") or {}).get("S3ModelArtifacts"),
        "metrics": {m["MetricName"]: m["Value"] for m in description.get("FinalMetricDataList", [])},
        "billable_seconds": description.get("BillableTimeInSeconds"),
    }


def on_training_event(
    event: TrainingJobStateChangeEvent, *, sfn: Any, ddb: Any, s3: Any, sagemaker: Any, settings: Settings
) -> dict[str, Any]:
    """Answer one state change of a training job, as SageMaker describes it; returns what was done (for the log)."""
    detail = event.detail
    name = detail.TrainingJobName
    result: dict[str, Any] = {"training_job_name": name, "status": detail.TrainingJobStatus}
    item = get_token_item(ddb, settings, name)
    if item is None:
        return {**result, "ignored": True, "reason": "not started by this stack's start_training"}
    result["job_id"] = item.get("job_id")
    if item.get("status") == CALLBACK_SENT:
        return {**result, "duplicate": True, "reason": "the job's end was answered already"}
    why = not_current(ddb, settings, item, name)
    if why is not None:
        return {**result, "ignored": True, "reason": why}
    description = describe_training_job(sagemaker, name)
    if description is None:
        return {**result, "ignored": True, "reason": f"SageMaker knows no training job {name}"}
    return {**result, **answer(description, item, sfn=sfn, ddb=ddb, s3=s3, settings=settings, claimed=detail)}


def answer(
    description: dict[str, Any],
    item: dict[str, Any],
    *,
    sfn: Any,
    ddb: Any,
    s3: Any,
    settings: Settings,
    claimed: TrainingJobStateChange | None = None,
) -> dict[str, Any]:
    """Act on the job as DescribeTrainingJob gives it: a heartbeat while it runs, the callback once it ended.
    `claimed`: what the event said, which decides nothing (an end SageMaker does not confirm changes nothing)."""
    name, status = str(description["TrainingJobName"]), str(description["TrainingJobStatus"])
    said = claimed.TrainingJobStatus if claimed is not None else status
    seen: dict[str, Any] = {"sagemaker_status": status}
    if status in LIVE:
        if said in ENDED:
            return {
                **seen,
                "ignored": True,
                "reason": f"the event says {said} but SageMaker says {name} is {status}: nothing done",
            }
        return {**seen, **_heartbeat(sfn, ddb, settings, item, description)}
    if status not in ENDED:
        return {**seen, "ignored": True, "reason": f"SageMaker says {name} is {status}: nothing to answer"}

    asked = stop_request.read(s3, settings, str(item["job_id"])) if status == "Completed" else {}
    if asked.get("stop") is True:
        # the stack asked it to stop (a cancel, a failed or aborted run's teardown) and its trainer saved and exited:
        # the model did not finish training, whatever the exit code says (stop_request.py)
        error = recovery.POLICY[recovery.FailureClass.STOPPED].error
        cause = (
            f"training job {name} saved its checkpoint and exited when the stack asked it to stop "
            f"({asked.get('reason') or 'no reason given'})"
        )
        done = _call_back(
            sfn, ddb, settings, name, {"error": error, "cause": cause}, "send_task_failure",
            error=error[:MAX_ERROR_CHARS], cause=cause[:MAX_CAUSE_CHARS],
        )
        return {**seen, **done, "output": {"error": error, "cause": cause}}

    if status == "Completed":
        manifest = archive_training_job(s3, description, str(item["archive_target"]), str(item["job_id"]))
        output = completed_output(description, manifest, manifest["archive_s3_uri"] + MANIFEST)
        done = _call_back(sfn, ddb, settings, name, output, "send_task_success", output=json.dumps(output))
        return {**seen, **done, "output": output}

    secondary = description.get("SecondaryStatus")
    reason = description.get("FailureReason")
    failure = recovery.classify(
        status,
        reason,
        secondary_status=secondary,
        spot=bool(item.get("spot")),
        budget_bound=bool((item.get("budget") or {}).get("binds")),
    )
    error = recovery.POLICY[failure].error
    if status == "Failed":
        cause = reason or "SageMaker gave no FailureReason"
    else:
        cause = f"training job {name} was stopped ({secondary or 'Stopped'})"
    outcome: dict[str, Any] = {"error": error, "cause": cause}
    if failure is recovery.FailureClass.BUDGET:
        # SageMaker uploaded what the job wrote when it stopped it (the trainer saved before its deadline): keep it
        manifest = archive_training_job(s3, description, str(item["archive_target"]), str(item["job_id"]))
        budget = item.get("budget") or {}
        cause = (
            f"training job {name} reached the {budget.get('runtime_seconds')} s of MaxRuntimeInSeconds the budget "
            f"left it (${budget.get('limit_usd')} {budget.get('source')}, ${budget.get('spent_usd')} spent by "
            f"earlier attempts); what it wrote is archived at {manifest['archive_s3_uri']}"
        )
        outcome = {"error": error, "cause": cause, "archive_s3_uri": manifest["archive_s3_uri"]}
    done = _call_back(
        sfn,
        ddb,
        settings,
        name,
        outcome,
        "send_task_failure",
        error=error[:MAX_ERROR_CHARS],
        cause=cause[:MAX_CAUSE_CHARS],
    )
    return {**seen, **done, **outcome}
