"""on_execution_end: a run whose execution ended without its teardown is torn down at once.

On AWS a stopped execution (StopExecution: the console's Stop, `aws stepfunctions stop-execution`,
`lustrain cancel`, the sweeper) ends ABORTED and runs no Catch, so the state machine's teardown never starts;
neither does it for an execution that outlived its TimeoutSeconds (TIMED_OUT) or died of an error no Catch sees
(States.Runtime: FAILED). Step Functions announces every such end on EventBridge ("Step Functions Execution Status
Change", source aws.states), and the stack's rule sends ABORTED, TIMED_OUT and FAILED of its own state machine
here. Per event:

- the event is verified before anything is done: it must name this stack's own state machine (its ARN is the
  function's LUSTRAIN_STATE_MACHINE_ARN, set by template.yaml) and an execution of it, and DescribeExecution must
  show that execution ended with the status the event gives. The function may be invoked with any event (by
  anyone allowed lambda:InvokeFunction, or a rule someone else added): an event for another state machine, or
  one whose execution still runs or ended otherwise, changes nothing and the result says why. The end that is
  acted on (status, stop date, and error and cause where DescribeExecution gives them) is DescribeExecution's;
- the run is found by its execution name (the jobs table's by-execution index); an execution that recorded no run
  (it failed in register_job, or was a duplicate start) created nothing: nothing to do;
- a run whose record is finished with nothing left (a FAILED execution whose Catch already ran the teardown) is
  left as it is;
- any other is torn down with the state machine's own teardown (steps/teardown.py `teardown_job`): its training
  job is asked to stop (stop_request.py: the trainer checkpoints and exits), then stopped, and waited for, the file system and then the network are
  deleted once their interfaces are gone, and what the spec keeps stays; a warm pool the stopped job left is ended
  (steps/warm_pool.py: nothing bills after the run) unless a queued run of its shape takes it over. The record
  ends FAILED with RunCancelled
  (ABORTED), RunTimedOut (TIMED_OUT) or the execution's own error, and the cause says who stopped it as far as
  the event tells: StopExecution's error and cause (`lustrain cancel` names its caller there; the console and the
  AWS CLI give none, and then CloudTrail's StopExecution record names the caller);
- the run's notice (steps/notify.py) says it was cancelled, why, and what was stopped, deleted and kept.

TeardownIncomplete (interfaces still draining when the function's time ran short) fails the invocation: Lambda
retries the event (EventInvokeConfig) and the sweeper (steps/sweep.py) remains the backstop.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import Field, ValidationError

from lustrain_core.config import Settings
from lustrain_core.errors import EventInvalid, RunCancelled, RunTimedOut
from lustrain_core.spec import field_errors
from lustrain_core.steps import notify as notify_step
from lustrain_core.steps import records
from lustrain_core.steps.executions import ExecutionStatusChange, confirmed_end, own_state_machine
from lustrain_core.steps.sweep import ABANDONED
from lustrain_core.steps.teardown import Clock, teardown_job

DETAIL_TYPE = "Step Functions Execution Status Change"
#: The ends after which no teardown of the state machine's may have run.
WITHOUT_TEARDOWN = frozenset({"ABORTED", "TIMED_OUT", "FAILED"})
#: The error StopExecution is given by `lustrain cancel` (its cause names the caller).
CANCEL_ERROR = RunCancelled.__name__


class ExecutionStatusChangeEvent(EventBridgeModel):
    source: Literal["aws.states"]
    detail_type: Literal["Step Functions Execution Status Change"] = Field(alias="detail-type")
    detail: ExecutionStatusChange


def parse_status_change(event: Any) -> ExecutionStatusChangeEvent:
    """The event, checked; anything else fails with EventInvalid naming each wrong field of the event."""
    try:
        return ExecutionStatusChangeEvent.model_validate(event)
    except ValidationError as exc:
        raise EventInvalid(field_errors(exc, note=f" (not a {DETAIL_TYPE} event)")) from None


def _when(millis: int | None) -> str:
    if millis is None:
        return "an unknown time"
    return datetime.fromtimestamp(millis / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_error(change: ExecutionStatusChange) -> dict[str, str]:
    """The error the run's record and notice get: which end, who stopped it as far as the event says, and why."""
    given = ": ".join(part for part in (change.error, change.cause) if part)
    if change.status == "ABORTED":
        who = (
            f"with {given}"
            if given
            else "with no error or cause given (the console and the AWS CLI give none; CloudTrail's "
            "StopExecution record names the caller)"
        )
        return {
            # the sweeper stops a stuck run's execution with its own error, which stays the run's
            "Error": ABANDONED if change.error == ABANDONED else RunCancelled.__name__,
            "Cause": f"execution {change.name} was stopped (StopExecution) at {_when(change.stopDate)} {who}",
        }
    if change.status == "TIMED_OUT":
        return {
            "Error": RunTimedOut.__name__,
            "Cause": f"execution {change.name} timed out at {_when(change.stopDate)}"
            + (f" ({given})" if given else ""),
        }
    return {
        "Error": change.error or "ExecutionFailed",
        "Cause": f"execution {change.name} failed at {_when(change.stopDate)} without its teardown"
        + (f": {notify_step.cause_text(change.cause)}" if change.cause else ""),
    }


def verified_end(
    change: ExecutionStatusChange, *, sfn: Any, settings: Settings
) -> ExecutionStatusChange | str:
    """The execution's end as Step Functions tells it (DescribeExecution), or why the event is not acted on."""
    return confirmed_end(change, sfn=sfn, machine=own_state_machine(settings))


def on_execution_end(
    event: Any,
    *,
    sfn: Any,
    ec2: Any,
    fsx: Any,
    sagemaker: Any,
    ddb: Any,
    sns: Any,
    settings: Settings,
    clock: Clock,
) -> dict[str, Any]:
    """Tear down the run of an execution that ended without its teardown; what was done, and why."""
    change = parse_status_change(event).detail
    base = {"execution": change.executionArn, "status": change.status}
    if change.status not in WITHOUT_TEARDOWN:
        return {**base, "action": "none", "reason": f"a {change.status} execution ends with its own teardown"}
    verified = verified_end(change, sfn=sfn, settings=settings)
    if isinstance(verified, str):
        return {**base, "action": "none", "reason": f"not verified: {verified}"}
    change = verified
    record = records.find_by_execution(ddb, settings.jobs_table, change.name)
    if record is None:
        return {**base, "action": "none", "reason": "the execution recorded no run, so it created nothing"}
    job_id = record.job_id
    if record.finished and not record.resources:
        return {
            **base,
            "job_id": job_id,
            "action": "none",
            "reason": f"the run's teardown already ran (record {record.status}, nothing left)",
        }
    error = record.error if record.finished else None
    error = error if isinstance(error, dict) and error.get("Error") else run_error(change)
    result = teardown_job(
        job_id,
        status="FAILED",
        error=error,
        ec2=ec2,
        fsx=fsx,
        ddb=ddb,
        sagemaker=sagemaker,
        settings=settings,
        clock=clock,
    )
    document = {
        "execution": change.name,
        "job": {
            "job_id": job_id,
            "kind": record.kind,
            "spec": record.spec or None,
            "plan": record.plan or None,
            "source": record.source or None,
        },
        "error": error,
        "training": {"training_job_name": record.latest_training_job},
        "teardown": result,
    }
    notice = notify_step.notify(document, sns=sns, settings=settings, ddb=ddb)
    return {
        **base,
        "job_id": job_id,
        "action": "torn down",
        "error": error,
        "teardown": result,
        "notify": notice,
    }
