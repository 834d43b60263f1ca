"""Every error a run can end with. The class names are the ErrorEquals of the state machine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class LustrainError(Exception):
    """Base of every error lustrain raises on purpose; `details` travels in the error's cause. Whether a run
    tries again after one is the run policy's decision (lustrain_core.recovery), not the error's."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "message": self.message, **self.details}


@dataclass(frozen=True)
class FieldError:
    """One problem with one field of a job spec: where, what was given, what is allowed."""

    path: str
    value: Any
    message: str

    def __str__(self) -> str:
        shown = repr(self.value)
        if _hidden(self.path):
            shown = "a value not shown"
        elif len(shown) > 80:
            shown = shown[:77] + "..."
        where = self.path or "(spec)"
        return (
            f"{where}: {self.message} (got {shown})"
            if self.value is not _MISSING
            else f"{where}: {self.message}"
        )


#: Fields whose values no message repeats: an environment value may be a token, and messages reach the run's
#: cause, its notice and the execution history.
HIDDEN_VALUES = ("code.environment",)


def _hidden(path: str) -> bool:
    """Whether a value at `path` is, or holds, a hidden field's value."""
    return any(
        path == field or path.startswith(field + ".") or field.startswith(path + ".")
        for field in HIDDEN_VALUES
    )


_MISSING: Any = object()
MISSING = _MISSING


class SpecInvalid(LustrainError):
    """The job spec cannot run: every problem found, each naming its field."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        lines = "\n".join(f"  - {e}" for e in errors)
        noun = "problem" if len(errors) == 1 else "problems"
        super().__init__(
            f"invalid job spec, {len(errors)} {noun}:\n{lines}",
            fields=[{"path": e.path, "message": e.message} for e in errors],
        )

    @classmethod
    def one(cls, path: str, value: Any, message: str) -> SpecInvalid:
        return cls([FieldError(path, value, message)])


class EventInvalid(SpecInvalid):
    """An event a function was given is not the one it handles: every problem found, each naming the event's field
    (detail.executionArn, detail.TrainingJobStatus, ...)."""

    WHAT = "event"

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__(errors)
        lines = "\n".join(f"  - {e}" for e in errors)
        noun = "problem" if len(errors) == 1 else "problems"
        self.message = f"invalid {self.WHAT}, {len(errors)} {noun}:\n{lines}"
        self.args = (self.message,)


class UsageInvalid(EventInvalid):
    """A command's argument names nothing it can act on (RUN, --stack): the argument, the value, what is allowed."""

    WHAT = "usage"


class SpecForbidden(LustrainError):
    """The spec is valid but steps outside what this stack allows (a rule of the stack's parameters)."""


class QuotaExceeded(LustrainError):
    """More instances requested than the account's SageMaker quota leaves free: the run can never fit, its time in
    the capacity queue (compute.max_queue_hours) ran out, or SageMaker refused the job (ResourceLimitExceeded, which
    sends the run back to the queue)."""


class QueueFailed(LustrainError):
    """The capacity queue's answer (check_quota's $.quota) said neither admitted nor how long to wait. Raised by the
    state machine's "The queue gave no answer" state."""


class NetworkInvalid(LustrainError):
    """An existing subnet or security group given in the spec cannot carry the run."""


class FileSystemFailed(LustrainError):
    """FSx reported FAILED or MISCONFIGURED, or the file system to reuse cannot serve the run."""


class CapacityError(LustrainError):
    """SageMaker could not provision the requested instances (InsufficientCapacity)."""


class MountFailed(LustrainError):
    """The training job could not mount the Lustre file system."""


class InfrastructureError(LustrainError):
    """The training job failed under the code: an instance, GPU, EFA or NCCL fault, or SageMaker's internal error."""


class SpotInterrupted(LustrainError):
    """A managed spot job lost its capacity and did not get it back within its MaxWait (SageMaker's retries spent)."""


class TrainingFailed(LustrainError):
    """The training job ran and failed (the algorithm's error, or an internal one)."""


class TrainingStopped(LustrainError):
    """The training job was stopped: by hand, or when it reached its maximum runtime."""


class TrainingJobStillRunning(LustrainError):
    """Another training job of the run is still InProgress or Stopping: no second one starts beside it (a run never
    pays for two fleets at once). start_training raises it; the run ends and its teardown stops the live job."""


class TrainingJobCompleted(LustrainError):
    """A retried start_training found its attempt's job Completed and its end already answered to the token of the
    task's earlier try, which no longer waits: its message is the training task's output ($.training), which the
    state machine takes as the task's result."""


class PrepareFailed(LustrainError):
    """A stage of a data preparation run (a SageMaker Processing job) ended Failed or Stopped, without its output."""


class BudgetExceeded(LustrainError):
    """The run's budget is spent: its training job reached the MaxRuntimeInSeconds the budget left it (what it
    wrote is archived), or the budget left a next attempt too little time to start one."""


class TrainingTimedOut(LustrainError):
    """The training job stopped reporting (no heartbeat in time) or outlived the task's timeout.

    Raised by the state machine, not by a handler: Step Functions names it States.Timeout, a name a Fail state may
    not re-raise; the original error and cause are in the run's Cause."""


class StepFunctionsError(LustrainError):
    """Step Functions itself failed a task (any other States.* error); the run's Cause keeps its name and cause."""


class AwsThrottled(LustrainError):
    """AWS asked us to slow down; Step Functions retries this with backoff (recovery.AWS_TRANSIENT)."""


class AwsUnavailable(LustrainError):
    """A transient AWS service error (5xx); Step Functions retries this with backoff (recovery.AWS_TRANSIENT)."""


class TeardownIncomplete(LustrainError):
    """Some resources of the run could not be deleted yet; teardown is retried, then reported."""


class RunCancelled(LustrainError):
    """The run's execution was stopped (StopExecution: the console, the AWS CLI, `lustrain cancel`) and its
    teardown started from the execution's status change. Recorded in the job record; no state raises it."""


class RunTimedOut(LustrainError):
    """The run's execution outlived the state machine's TimeoutSeconds; its teardown started from the execution's
    status change. Recorded in the job record; no state raises it."""


#: Every error class the state machine may name, by name.
ALL_ERRORS: dict[str, type[LustrainError]] = {
    cls.__name__: cls
    for cls in (
        SpecInvalid,
        SpecForbidden,
        QuotaExceeded,
        QueueFailed,
        NetworkInvalid,
        FileSystemFailed,
        CapacityError,
        MountFailed,
        InfrastructureError,
        SpotInterrupted,
        TrainingFailed,
        TrainingStopped,
        TrainingJobStillRunning,
        TrainingJobCompleted,
        BudgetExceeded,
        TrainingTimedOut,
        StepFunctionsError,
        AwsThrottled,
        AwsUnavailable,
        TeardownIncomplete,
    )
}
