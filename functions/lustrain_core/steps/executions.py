"""An execution's status change as EventBridge tells it, and its end as Step Functions tells it.

Two functions act on "Step Functions Execution Status Change" events: on_execution_end (steps/execution_end.py)
tears down the run of an execution that ended without its teardown, and notify (steps/notify.py) tells the team's
chat that a run was cancelled, timed out or died. Either may be invoked with any event (by anyone allowed
lambda:InvokeFunction, or a rule someone else put on the bus), so neither acts on an end before `confirmed_end`:
the event must name this stack's own state machine (LUSTRAIN_STATE_MACHINE_ARN, which template.yaml sets) and an
execution of it, and DescribeExecution must show that execution ended with the status the event gives.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Literal

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lustrain_core.aws_errors import error_code, explained
from lustrain_core.config import Settings
from lustrain_core.steps import records
from lustrain_core.steps.sweep import STATE_MACHINE_SETTING

EXECUTION_ARN = r"^arn:aws[a-z-]*:states:[a-z0-9-]+:\d{12}:execution:[^:]+:[^:]+$"
STATE_MACHINE_ARN = r"^arn:aws[a-z-]*:states:[a-z0-9-]+:\d{12}:stateMachine:[^:]+$"
#: DescribeExecution's answer when the execution is not one Step Functions knows
NO_EXECUTION = frozenset({"ExecutionDoesNotExist", "InvalidArn"})


class ExecutionStatusChange(BaseModel):
    """The detail of the event (DescribeExecution's shape; dates in epoch milliseconds)."""

    model_config = ConfigDict(extra="ignore")

    executionArn: str = Field(pattern=EXECUTION_ARN)
    stateMachineArn: str = Field(pattern=STATE_MACHINE_ARN)
    name: str = Field(min_length=1, max_length=80)
    status: Literal["RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED", "PENDING_REDRIVE"]
    startDate: int | None = None
    stopDate: int | None = None
    error: str | None = None
    cause: str | None = None


def own_state_machine(settings: Settings) -> str:
    """The ARN of this stack's state machine (template.yaml gives it to the function)."""
    arn = settings.extra.get(STATE_MACHINE_SETTING, "").strip()
    if not re.fullmatch(STATE_MACHINE_ARN, arn):
        raise ValueError(
            f"stack setting {STATE_MACHINE_SETTING}={arn!r} must be the ARN of the stack's state machine "
            "(template.yaml sets it): without it no execution end can be verified"
        )
    return arn


def confirmed_end(change: ExecutionStatusChange, *, sfn: Any, machine: str) -> ExecutionStatusChange | str:
    """The execution's end as Step Functions tells it (DescribeExecution), or why the event is not acted on.

    `machine` is the stack's own state machine (`own_state_machine`). An execution Step Functions does not know is
    answered with the reason; any other error of DescribeExecution is raised."""
    if change.stateMachineArn != machine:
        return f"the event names state machine {change.stateMachineArn}, not this stack's ({machine})"
    if change.executionArn != records.execution_arn(machine, change.name):
        return f"execution {change.executionArn} is not the execution {change.name} of this stack's state machine"
    try:
        described = sfn.describe_execution(executionArn=change.executionArn)
    except ClientError as exc:
        if error_code(exc) in NO_EXECUTION:
            return f"DescribeExecution knows no execution {change.executionArn} ({error_code(exc)})"
        raise
    status = str(described["status"])
    if status != change.status:
        return f"the event says {change.status} but DescribeExecution says {status}: nothing ended as the event says"
    return ExecutionStatusChange(
        executionArn=change.executionArn,
        stateMachineArn=machine,
        name=str(described.get("name") or change.name),
        status=change.status,
        startDate=millis(described.get("startDate")),
        stopDate=millis(described.get("stopDate")),
        # DescribeExecution documents error and cause for a failed execution; where it gives none for a stopped
        # one, the event's words stand: on an end verified above they name who stopped it, and change nothing else
        error=described.get("error") or change.error,
        cause=described.get("cause") or change.cause,
    )


def millis(moment: Any) -> int | None:
    """A DescribeExecution date (botocore's datetime) in epoch milliseconds, as the event gives its dates."""
    return int(moment.timestamp() * 1000) if isinstance(moment, datetime) else None


#: how far the event's stop time may be from DescribeExecution's: the event gives epoch milliseconds, botocore a
#: datetime (its float seconds may lose the last millisecond on the way)
STOP_SLACK_MS = 1000


def _at(millis: int | None) -> str:
    if millis is None:
        return "no time"
    try:
        moment = datetime.fromtimestamp(millis / 1000, UTC)
    except (OverflowError, OSError, ValueError):  # an event's number no calendar holds
        return f"{millis} ms"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def verified_end(detail: dict[str, Any], *, sfn: Any, settings: Settings) -> ExecutionStatusChange | str:
    """The end an execution event tells of, as Step Functions bears it out, or why it does not: what notify (the
    chat notice) and the MLflow logging (steps/tracking.py) act on.

    on_execution_end's check (`confirmed_end`): the event must name this stack's state machine
    and an execution of it, and DescribeExecution must say that execution ended with the event's status. Then the
    event's stop time must be the execution's: a made-up one, or the event of an earlier end of an execution redriven
    since, names another. The end returned is DescribeExecution's (its error and cause where it gives them)."""
    try:
        change = ExecutionStatusChange.model_validate(detail)
    except ValidationError as exc:
        fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})
        return f"not a Step Functions execution's status change (detail {', '.join(fields)})"
    try:
        machine = own_state_machine(settings)
    except ValueError as exc:
        return str(exc)
    try:
        ended = confirmed_end(change, sfn=sfn, machine=machine)
    except ClientError as exc:
        # a notice never fails the invocation: what could not be asked is said, and nothing is posted
        return f"DescribeExecution of {change.executionArn} failed ({explained(exc)})"
    if isinstance(ended, str):
        return ended
    if (
        change.stopDate is None
        or ended.stopDate is None
        or abs(change.stopDate - ended.stopDate) > STOP_SLACK_MS
    ):
        return (
            f"the event says execution {change.name} stopped at {_at(change.stopDate)} but DescribeExecution says "
            f"{_at(ended.stopDate)}: not the execution's end"
        )
    return ended


def verified_start(detail: dict[str, Any], *, sfn: Any, settings: Settings) -> dict[str, Any] | str:
    """DescribeExecution's answer for the start an execution event tells of, or why the event is not borne out: the
    event must name this stack's state machine and an execution of it that Step Functions knows, started at the
    event's start time (it may have ended since). The started notice is told from this answer (its input), never
    from the event's."""
    try:
        change = ExecutionStatusChange.model_validate(detail)
        machine = own_state_machine(settings)
    except ValidationError as exc:
        fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})
        return f"not a Step Functions execution's status change (detail {', '.join(fields)})"
    except ValueError as exc:
        return str(exc)
    if change.stateMachineArn != machine or change.executionArn != records.execution_arn(
        machine, change.name
    ):
        return (
            f"execution {change.executionArn} is not an execution of this stack's state machine ({machine})"
        )
    try:
        described: dict[str, Any] = sfn.describe_execution(executionArn=change.executionArn)
    except ClientError as exc:
        if error_code(exc) in NO_EXECUTION:
            return f"DescribeExecution knows no execution {change.executionArn} ({error_code(exc)})"
        return f"DescribeExecution of {change.executionArn} failed ({explained(exc)})"
    started = millis(described.get("startDate"))
    if change.startDate is None or started is None or abs(change.startDate - started) > STOP_SLACK_MS:
        return (
            f"the event says execution {change.name} started at {_at(change.startDate)} but DescribeExecution says "
            f"{_at(started)}: not the execution's start"
        )
    return described
