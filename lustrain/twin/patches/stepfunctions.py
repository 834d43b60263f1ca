"""Step Functions as AWS runs executions, where moto 5.2.5 differs in what lustrain relies on.

- SendTaskFailure keeps its cause: moto's StepFunctionResponse.send_task_failure passes only the error to the
  backend, so an execution failed by callback (on_training_event reporting TrainingFailed with SageMaker's
  FailureReason) ends with no Cause, where AWS keeps it. The ASL-executing backend already takes a cause.
- StartExecution without a name gets a generated one (a UUID, as AWS generates): moto's ASL backend names the
  execution "None", so every unnamed start after the first is ExecutionAlreadyExists (an EventBridge target, the
  console and `aws stepfunctions start-execution` start unnamed executions).
- StopExecution aborts the execution at once, keeping the error and cause it was given (the ExecutionAborted
  event holds them): DescribeExecution says ABORTED when StopExecution returns, and no Catch runs (the state
  machine stops where it is, as AWS's "StopExecution" reference says). moto drops the error and cause, and
  the status changed only once the worker noticed.
- Every change of an execution's status is put on the default event bus as AWS's "Step Functions Execution Status
  Change" event (source aws.states; detail executionArn, stateMachineArn, name, status RUNNING | SUCCEEDED |
  FAILED | TIMED_OUT | ABORTED, startDate and stopDate in epoch milliseconds, input, output, error, cause, with
  inputDetails/outputDetails {included}): moto emits none, and the teardown of a stopped run starts from it.
- GetExecutionHistory pages as AWS's does: at most maxResults events a call (0 or none: 100; at most 1000), a
  nextToken for the rest (a token of another request is InvalidToken), newest first with reverseOrder. moto answers
  every event in one page, whatever was asked: a watcher that wants only the newest events (`reverseOrder`,
  `maxResults` 1) had the whole history copied and serialized on every look; only the page answered is copied.
"""

from __future__ import annotations

import base64
import binascii
import copy
import datetime
import functools
import json
import logging
import threading
import time
import uuid
from typing import Any

from moto.core.responses import ActionResult, EmptyResult
from moto.stepfunctions.exceptions import ExecutionDoesNotExist, InvalidToken
from moto.stepfunctions.parser.api import ExecutionStatus
from moto.stepfunctions.parser.asl.component.program.program import Program
from moto.stepfunctions.parser.asl.eval.environment import Environment
from moto.stepfunctions.parser.asl.eval.program_state import ProgramStopped
from moto.stepfunctions.parser.backend.execution import BaseExecutionWorkerCommunication, Execution
from moto.stepfunctions.parser.models import StepFunctionsParserBackend
from moto.stepfunctions.responses import StepFunctionResponse

_PATCHED = "_lustrain_twin_cause"


def send_task_failure(self: StepFunctionResponse) -> ActionResult:
    backend = self.stepfunction_backend
    token, error = self._get_param("taskToken"), self._get_param("error")
    if isinstance(backend, StepFunctionsParserBackend):
        backend.send_task_failure(token, error=error, cause=self._get_param("cause"))
    else:
        backend.send_task_failure(token, error=error)
    return EmptyResult()


#: how long StopExecution waits for a just-started execution's worker to build its environment
ENVIRONMENT_STALL_S = 300.0


def stop_execution(self: StepFunctionResponse) -> ActionResult:
    backend = self.stepfunction_backend
    arn = str(self._get_param("executionArn"))
    if not isinstance(backend, StepFunctionsParserBackend):
        return ActionResult({"stopDate": backend.stop_execution(arn).stop_date})
    backend._validate_execution_arn(arn)
    machine = backend._get_state_machine_for_execution(arn)
    execution: Any = next((e for e in machine.executions if getattr(e, "exec_arn", None) == arn), None)
    if execution is None:
        raise ExecutionDoesNotExist("Execution Does Not Exist: '" + arn + "'")
    if execution.exec_status == ExecutionStatus.RUNNING:
        # moto builds the execution's environment in its worker thread, after parsing the definition: a stop right
        # after the start would find none (AttributeError); AWS stops an execution at any moment. The wait ends
        # when the worker has built it; its bound only guards against a worker that never starts (a busy machine
        # took more than the 10 s this once allowed, and the stop was lost)
        deadline = time.monotonic() + ENVIRONMENT_STALL_S
        while getattr(execution.exec_worker, "env", None) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        stopped = datetime.datetime.now(tz=datetime.UTC)
        execution.stop(stop_date=stopped, error=self._get_param("error"), cause=self._get_param("cause"))
        execution.exec_status = ExecutionStatus.ABORTED
        execution.stop_date = stopped
        # A task waiting for its callback would wait on (moto checks the stop only between states): wake it, so
        # the worker ends now and writes ExecutionAborted. The program is stopped: no Retry or Catch runs. A task
        # the worker enters just after the stop makes its callback later: until the worker has ended, a thread
        # wakes every callback the execution waits on (a stop is never lost to that moment)
        worker = execution.exec_worker
        if worker is not None and getattr(worker, "env", None) is not None:
            threading.Thread(
                target=_wake_until_ended, args=(worker.env,), name=f"stop-{execution.name}", daemon=True
            ).start()
    return ActionResult({"stopDate": execution.stop_date})


#: the history's last event once an execution's worker has ended
ENDED_EVENTS = frozenset({"ExecutionAborted", "ExecutionFailed", "ExecutionSucceeded", "ExecutionTimedOut"})
#: how often a stopped execution's callbacks are woken until its worker ends
WAKE_EVERY_S = 0.02


def _wake_until_ended(env: Any) -> None:
    deadline = time.monotonic() + ENVIRONMENT_STALL_S
    while time.monotonic() < deadline:
        for endpoint in list(env.callback_pool_manager._pool.values()):
            endpoint.interrupt_all()
        with env.event_manager._mutex:
            events = env.event_manager._history_event_list
            last = events[-1].get("type") if events else None
        if last in ENDED_EVENTS:
            return
        time.sleep(WAKE_EVERY_S)


#: GetExecutionHistory's page size when maxResults is 0 or absent, and its largest (botocore's PageSize, max 1000)
HISTORY_PAGE_DEFAULT = 100
HISTORY_PAGE_MAX = 1000


def _history_token(arn: str, reverse: bool, offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps([arn, reverse, offset]).encode()).decode()


def _history_offset(token: str | None, arn: str, reverse: bool) -> int:
    if not token:
        return 0
    try:
        token_arn, token_reverse, offset = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (binascii.Error, ValueError, TypeError) as exc:
        raise InvalidToken(f"{token} is not a token of GetExecutionHistory") from exc
    if (token_arn, token_reverse) != (arn, reverse) or not isinstance(offset, int) or offset < 0:
        raise InvalidToken("the token was given for other arguments: keep all other arguments unchanged")
    return offset


def get_execution_history(self: StepFunctionResponse) -> ActionResult:
    arn = str(self._get_param("executionArn"))
    reverse = bool(self._get_param("reverseOrder", False))
    size = min(self._get_int_param("maxResults") or HISTORY_PAGE_DEFAULT, HISTORY_PAGE_MAX)
    offset = _history_offset(self._get_param("nextToken"), arn, reverse)
    events = _events(self.stepfunction_backend, arn)
    if reverse:
        events.reverse()
    page: dict[str, Any] = {"events": copy.deepcopy(events[offset : offset + size])}
    if offset + size < len(events):
        page["nextToken"] = _history_token(arn, reverse, offset + size)
    return ActionResult(page)


def _events(backend: Any, arn: str) -> list[Any]:
    """The execution's events as its history holds them (not copied: the caller copies the page it answers).
    moto deep-copied the whole history at every look, and a watcher that asks for the newest event alone looks
    several times a second."""
    execution = backend.describe_execution(execution_arn=arn)
    env = execution.exec_worker.env if execution.exec_worker is not None else None
    if env is None:  # not started yet
        return []
    manager = env.event_manager
    with manager._mutex:
        return list(manager._history_event_list)


def _start_execution(
    self: StepFunctionsParserBackend,
    original: Any,
    state_machine_arn: str,
    name: Any = None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    return original(self, state_machine_arn, name or str(uuid.uuid4()), *args, **kwargs)


def _set_error(self: Environment, original: Any, *args: Any, **kwargs: Any) -> None:
    # A stopped execution stays stopped: the error of the task the stop interrupted does not make it FAILED.
    if isinstance(self._program_state, ProgramStopped):
        return
    original(self, *args, **kwargs)


DETAIL_TYPE = "Step Functions Execution Status Change"


class _NoComponentDumps(logging.Filter):
    """moto logs every failing ASL component's repr (a page of text) at ERROR, also for a failure a Catch handles
    and for the task a StopExecution interrupts; the execution's history keeps each failure as AWS's does."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("%s at '%s'")


def _millis(moment: Any) -> int | None:
    return int(moment.timestamp() * 1000) if isinstance(moment, datetime.datetime) else None


def status_change_detail(execution: Any) -> dict[str, Any]:
    """The detail of AWS's "Step Functions Execution Status Change" event for an execution as it is now."""
    status = str(execution.exec_status.value)
    error, cause = execution.error, execution.cause
    worker = execution.exec_worker
    state = worker.env.program_state() if worker is not None and status == "ABORTED" else None
    if isinstance(state, ProgramStopped):
        # StopExecution's error and cause, which the ExecutionAborted event holds
        error, cause = state.error, state.cause
    succeeded = status == "SUCCEEDED"
    return {
        "executionArn": execution.exec_arn,
        "stateMachineArn": execution.state_machine.arn,
        "name": execution.name,
        "status": status,
        "startDate": _millis(execution.start_date),
        "stopDate": None if status == "RUNNING" else _millis(execution.stop_date),
        "input": json.dumps(execution.input_data, separators=(",", ":")),
        "output": json.dumps(execution.output, separators=(",", ":")) if succeeded else None,
        "inputDetails": {"included": True},
        "outputDetails": {"included": True} if succeeded else None,
        "error": error,
        "cause": cause,
    }


def _announce(execution: Any) -> None:
    from lustrain.twin.patches import eventbridge

    detail = status_change_detail(execution)
    eventbridge.emit(
        "aws.states",
        DETAIL_TYPE,
        detail,
        region=execution.region_name,
        account=execution.account_id,
        resources=[execution.exec_arn],
    )


#: set on an execution's environment once its program's body has run (Program._eval_body)
_BODY_RAN = "_lustrain_body_ran"


def _program_body(self: Program, original: Any, env: Environment) -> None:
    setattr(env, _BODY_RAN, True)
    original(self, env)


def _program_eval(self: Program, original: Any, env: Environment) -> None:
    """Program.eval, and an execution stopped before its first state still ends with ExecutionAborted: moto's
    EvalComponent.eval skips the body of a program that is no longer running ("Pruning"), and the body is what
    writes the termination event, so such an execution's history stopped at ExecutionStarted. AWS stops an
    execution at any moment; its body is run here once, with no state to run, to write the event."""
    original(self, env)
    if not env.is_frame() and not getattr(env, _BODY_RAN, False) and not env.is_running():
        self._eval_body(env)


def _started(self: Execution, original: Any) -> None:
    original(self)
    _announce(self)


def _terminated(self: BaseExecutionWorkerCommunication, original: Any) -> None:
    original(self)
    _announce(self.execution)


def install() -> None:
    if getattr(StepFunctionResponse, _PATCHED, False):
        return
    logging.getLogger("moto.stepfunctions.parser.asl.component.eval_component").addFilter(_NoComponentDumps())
    Execution.start = functools.partialmethod(_started, Execution.start)  # type: ignore[method-assign,assignment]
    BaseExecutionWorkerCommunication.terminated = functools.partialmethod(  # type: ignore[method-assign,assignment]
        _terminated, BaseExecutionWorkerCommunication.terminated
    )
    Environment.set_error = functools.partialmethod(_set_error, Environment.set_error)  # type: ignore[method-assign,assignment]
    Program.eval = functools.partialmethod(_program_eval, Program.eval)  # type: ignore[method-assign,assignment]
    Program._eval_body = functools.partialmethod(_program_body, Program._eval_body)  # type: ignore[method-assign,assignment]
    StepFunctionResponse.send_task_failure = send_task_failure  # type: ignore[method-assign]
    StepFunctionResponse.stop_execution = stop_execution  # type: ignore[method-assign]
    StepFunctionResponse.get_execution_history = get_execution_history  # type: ignore[method-assign]
    original = StepFunctionsParserBackend.start_execution
    StepFunctionsParserBackend.start_execution = functools.partialmethod(  # type: ignore[method-assign,assignment]
        _start_execution, original
    )
    setattr(StepFunctionResponse, _PATCHED, True)
