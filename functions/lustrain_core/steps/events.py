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
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lustrain_core import recovery
from lustrain_core.aws_errors import CONDITION_FAILED, error_code
from lustrain_core.config import Settings
from lustrain_core.errors import EventInvalid
from lustrain_core.spec import field_errors
from lustrain_core.steps import records
from lustrain_core.steps.archive import MANIFEST, archive_training_job
from lustrain_core.steps.training import CALLBACK_SENT, WAITING, get_token_item, token_key

DETAIL_TYPE = "SageMaker Training Job State Change"
#: SendTask* answers meaning the execution is no longer waiting for this token
GONE_CODES = frozenset({"TaskTimedOut", "InvalidToken", "TaskDoesNotExist"})
MAX_ERROR_CHARS = 256
MAX_CAUSE_CHARS = 32768


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


def _heartbeat(
    sfn: Any, ddb: Any, settings: Settings, item: dict[str, Any], detail: TrainingJobStateChange
) -> dict[str, Any]:
    try:
        sfn.send_task_heartbeat(taskToken=item["token"])
    except ClientError as exc:
        if error_code(exc) in GONE_CODES:
            return {"heartbeat": "execution_gone", "reason": error_code(exc)}
        raise
    try:
        ddb.update_item(
            TableName=settings.tokens_table,
            Key=token_key(detail.TrainingJobName),
            UpdateExpression="SET secondary_status = :secondary, job_status = :status, updated_at = :now",
            ConditionExpression="#status = :waiting",
            ExpressionAttributeNames={"#status": "status"},
            ExpressionAttributeValues={
                ":secondary": {"S": detail.SecondaryStatus or ""},
                ":status": {"S": detail.TrainingJobStatus},
                ":now": {"S": records.now_iso()},
                ":waiting": {"S": WAITING},
            },
        )
    except ClientError as exc:
        if error_code(exc) != CONDITION_FAILED:
            raise
    return {"heartbeat": "sent", "secondary_status": detail.SecondaryStatus}


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
    """Answer one state change of a training job; returns what was done (for the log)."""
    detail = event.detail
    name, status = detail.TrainingJobName, detail.TrainingJobStatus
    result: dict[str, Any] = {"training_job_name": name, "status": status}
    item = get_token_item(ddb, settings, name)
    if item is None:
        return {**result, "ignored": True, "reason": "not started by this stack's start_training"}
    result["job_id"] = item.get("job_id")
    if item.get("status") == CALLBACK_SENT:
        return {**result, "duplicate": True}

    if status in ("InProgress", "Stopping"):
        return {**result, **_heartbeat(sfn, ddb, settings, item, detail)}

    if status == "Completed":
        description = sagemaker.describe_training_job(TrainingJobName=name)
        manifest = archive_training_job(s3, description, str(item["archive_target"]), str(item["job_id"]))
        output = completed_output(description, manifest, manifest["archive_s3_uri"] + MANIFEST)
        done = _call_back(sfn, ddb, settings, name, output, "send_task_success", output=json.dumps(output))
        return {**result, **done, "output": output}

    failure = recovery.classify(
        status,
        detail.FailureReason,
        secondary_status=detail.SecondaryStatus,
        spot=bool(item.get("spot")),
        budget_bound=bool((item.get("budget") or {}).get("binds")),
    )
    error = recovery.POLICY[failure].error
    if status == "Failed":
        cause = detail.FailureReason or "SageMaker gave no FailureReason"
    else:
        cause = f"training job {name} was stopped ({detail.SecondaryStatus or 'Stopped'})"
    outcome: dict[str, Any] = {"error": error, "cause": cause}
    if failure is recovery.FailureClass.BUDGET:
        # SageMaker uploaded what the job wrote when it stopped it (the trainer saved on SIGTERM): keep it
        description = sagemaker.describe_training_job(TrainingJobName=name)
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
    return {**result, **done, **outcome}
