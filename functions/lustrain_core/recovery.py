"""The run policy for failures: what failed (its class), and whether the run tries again, after what wait, how often.

This module is the one place that decides. Everything else reads it:

- on_training_event (steps/events.py) names a training job's end with `classify(...)`: the error it sends back
  to the waiting state machine is its class's `error`;
- next_attempt (steps/attempts.py) reads the error a training attempt ended with, looks up its class here and
  decides: another attempt on the same network and file system after `wait_seconds`, or the teardown;
- start_training (steps/training.py) asks SageMaker for its own retries (`sagemaker_retries`) of spot jobs;
- the state machine's per-call retriers (Lambda's own errors, throttling and 5xx, an incomplete teardown) are
  `CALL_RETRIERS`: tests/unit/test_recovery_policy.py holds every Task state of the definition to them;
- the sweeper's deadline counts `compute.max_attempts` attempts and the waits between them (`longest_wait`);
- the README's table of failure classes is generated from `POLICY` (`python -m lustrain_core.recovery`) and a test
  keeps it equal.

Two kinds of retry, kept apart on purpose. A *call* retry repeats one Lambda invocation of one state after a
transient error (the step is idempotent, nothing is lost). An *attempt* is a whole new training job (a new
name: SageMaker names are unique forever) on the same network and file system, resuming from the newest
checkpoint, started by the state machine after the previous job ended with a retryable class.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from enum import StrEnum

#: compute.max_attempts when the spec does not say: training jobs per run, the first one included
DEFAULT_MAX_ATTEMPTS = 3
#: compute.max_attempts at most (each attempt is a full training job: a loop of them is a bill)
MAX_ATTEMPTS = 10
#: SageMaker's refusals of a run's training jobs (ResourceLimitExceeded after the capacity queue admitted the run)
#: before the run ends QuotaExceeded: each one means the quota SageMaker enforces was not free though the queue
#: counted it so (another workload between the two, or SageMaker's list of running jobs behind); each sends the
#: run back to its place in the queue, where it waits at least one look before it is admitted again
MAX_REFUSALS = 10
#: the trainer's exit code for a fault of the machine under it (NCCL, EFA, CUDA, ECC, a lost rank), with its last
#: line starting INFRASTRUCTURE_MARK; the trainer (trainer/lustrain_trainer/faults.py) keeps the same two values
INFRASTRUCTURE_EXIT_CODE = 75
INFRASTRUCTURE_MARK = "lustrain: infrastructure fault"


class FailureClass(StrEnum):
    CAPACITY = "capacity"
    QUOTA = "quota"
    INFRASTRUCTURE = "infrastructure"
    SPOT_RECLAIM = "spot-reclaim"
    UNRESPONSIVE = "unresponsive"
    STOPPED = "stopped"
    BUDGET = "budget"
    USER_ERROR = "user-error"
    CONFIGURATION = "configuration"


@dataclass(frozen=True)
class ClassPolicy:
    """What the run does when a training attempt ends with this class of failure."""

    failure_class: FailureClass
    #: the error the training task fails with (an ErrorEquals name of the state machine; lustrain_core.errors)
    error: str
    retried: bool
    #: seconds between the failure and the next attempt's CreateTrainingJob (the stack may cap it:
    #: AttemptWaitMaxSeconds)
    wait_seconds: int
    #: how the class is recognised, for the README
    recognised_by: str
    #: why it is (not) retried, for the README
    why: str
    #: a refusal before any job ran (SageMaker's ResourceLimitExceeded) is no attempt: compute.max_attempts does not
    #: count it, and the capacity queue bounds its wait (compute.max_queue_hours)
    counts_as_attempt: bool = True


POLICY: dict[FailureClass, ClassPolicy] = {
    policy.failure_class: policy
    for policy in (
        ClassPolicy(
            FailureClass.CAPACITY,
            "CapacityError",
            retried=True,
            wait_seconds=300,
            recognised_by="FailureReason CapacityError / InsufficientCapacity / Unable to provision",
            why="capacity comes back within minutes as other jobs end; the next attempt asks again",
        ),
        ClassPolicy(
            FailureClass.QUOTA,
            "QuotaExceeded",
            retried=True,
            wait_seconds=0,
            recognised_by="CreateTrainingJob's ResourceLimitExceeded, or that FailureReason",
            why=(
                "another workload took the quota after the capacity queue admitted the run: the run goes back to the "
                "queue in its place (no job ran, so it is no attempt), and waits there at most compute.max_queue_hours"
            ),
            counts_as_attempt=False,
        ),
        ClassPolicy(
            FailureClass.INFRASTRUCTURE,
            "InfrastructureError",
            retried=True,
            wait_seconds=15,
            recognised_by=(
                "FailureReason InternalServerError, or the trainer's exit code "
                f"{INFRASTRUCTURE_EXIT_CODE} and last line '{INFRASTRUCTURE_MARK}' (NCCL, EFA, CUDA, ECC, a lost "
                "rank, a failed pre-flight), or NCCL / EFA / ECC / Xid words in the script's error"
            ),
            why="a new job gets new instances; it resumes from the newest checkpoint",
        ),
        ClassPolicy(
            FailureClass.SPOT_RECLAIM,
            "SpotInterrupted",
            retried=True,
            wait_seconds=300,
            recognised_by="a spot job Stopped with MaxWaitTimeExceeded or Interrupted, after SageMaker's own retries",
            why="spot capacity returns; SageMaker's own retries (RetryStrategy) were spent first",
        ),
        ClassPolicy(
            FailureClass.UNRESPONSIVE,
            "TrainingTimedOut",
            retried=False,
            wait_seconds=0,
            recognised_by="no state-change event within TrainingHeartbeatSeconds (States.Timeout, States.HeartbeatTimeout)",
            why="the job may still hold its instances and has used the run's time: the teardown stops it",
        ),
        ClassPolicy(
            FailureClass.STOPPED,
            "TrainingStopped",
            retried=False,
            wait_seconds=0,
            recognised_by="the job Stopped: by StopTrainingJob or at MaxRuntimeInSeconds",
            why="someone stopped it, or it used all the runtime it was given",
        ),
        ClassPolicy(
            FailureClass.BUDGET,
            "BudgetExceeded",
            retried=False,
            wait_seconds=0,
            recognised_by="the job Stopped at the MaxRuntimeInSeconds the budget left it (start_training shortens the "
            "runtime when the budget binds; steps/budget.py)",
            why="the budget is spent; what the job wrote is archived: raise budget.max_usd and resume from it",
        ),
        ClassPolicy(
            FailureClass.USER_ERROR,
            "TrainingFailed",
            retried=False,
            wait_seconds=0,
            recognised_by="any other FailureReason (AlgorithmError: the script's own exception, CUDA out of memory)",
            why="the same code fails the same way again: fix it and drop the spec again",
        ),
        ClassPolicy(
            FailureClass.CONFIGURATION,
            "MountFailed",
            retried=False,
            wait_seconds=0,
            recognised_by="FailureReason Unable to mount / mount.lustre / mounting the FSx file system",
            why="the network or file system cannot serve the job: retrying on the same ones fails the same way",
        ),
    )
}

#: each class by the error name its training task fails with
BY_ERROR: dict[str, FailureClass] = {policy.error: cls for cls, policy in POLICY.items()}
#: the names Step Functions itself gives a training task that stopped reporting
BY_ERROR.update({"States.Timeout": FailureClass.UNRESPONSIVE, "States.HeartbeatTimeout": FailureClass.UNRESPONSIVE})

#: FailureReason patterns, checked in order; the first match names the class. Texts are SageMaker's wordings,
#: and the trainer's own (INFRASTRUCTURE_MARK). A script's out-of-memory error is its own (before CUDA words).
_REASONS: tuple[tuple[re.Pattern[str], FailureClass], ...] = (
    (re.compile(r"CapacityError|InsufficientCapacity|Unable to provision requested ML compute", re.I), FailureClass.CAPACITY),
    (re.compile(r"ResourceLimitExceeded|resource limit", re.I), FailureClass.QUOTA),
    (
        re.compile(r"(unable|failed) to mount|mount\.lustre|mount(ing)? (the )?(FSx|Lustre|file ?system)", re.I),
        FailureClass.CONFIGURATION,
    ),
    # the script's exit code as SageMaker's toolkit reports it (ExitCode 75), or torchrun's summary of a worker's
    (
        re.compile(
            re.escape(INFRASTRUCTURE_MARK)
            + rf"|\bExitCode {INFRASTRUCTURE_EXIT_CODE}\b|\bexitcode\s*:\s*{INFRASTRUCTURE_EXIT_CODE}\b"
        ),
        FailureClass.INFRASTRUCTURE,
    ),
    (re.compile(r"out of memory|OutOfMemoryError", re.I), FailureClass.USER_ERROR),
    (
        re.compile(
            r"^InternalServerError\b|\bNCCL (error|WARN|timeout)|DistBackendError|\bEFA\b|libfabric|uncorrectable ECC"
            r"|\bECC error|\bXid\b|CUDA error: (an illegal memory access|unspecified launch failure|uncorrectable)",
            re.I,
        ),
        FailureClass.INFRASTRUCTURE,
    ),
)
#: secondary statuses of a Stopped spot job whose capacity was taken back and not returned in time
_SPOT_SECONDARY = frozenset({"MaxWaitTimeExceeded", "Interrupted"})


def classify(
    status: str,
    reason: str | None,
    *,
    secondary_status: str | None = None,
    spot: bool = False,
    budget_bound: bool = False,
) -> FailureClass:
    """The class of a training job that ended Failed or Stopped, from what SageMaker says of it (and, for a job
    whose MaxRuntimeInSeconds the budget set, `budget_bound`)."""
    if status == "Stopped":
        if spot and secondary_status in _SPOT_SECONDARY:
            return FailureClass.SPOT_RECLAIM
        if budget_bound and secondary_status == "MaxRuntimeExceeded":
            return FailureClass.BUDGET
        return FailureClass.STOPPED
    for pattern, failure_class in _REASONS:
        if reason and pattern.search(reason):
            return failure_class
    return FailureClass.USER_ERROR


def class_of_error(error: str | None) -> FailureClass | None:
    """The class of the error a training task failed with; None for an error that is no attempt's end (a failed
    start_training invocation, a Step Functions error): those end the run."""
    return BY_ERROR.get(error or "")


def longest_wait() -> int:
    """The longest wait between two attempts the policy asks for (the sweeper's deadline counts it per attempt)."""
    return max(policy.wait_seconds for policy in POLICY.values() if policy.retried)


#: SageMaker's own retries of a managed spot job (RetryStrategy.MaximumRetryAttempts, 1..30): it restarts the
#: job in place after an interruption or an InternalServerError, before the run's own attempts count
SAGEMAKER_SPOT_RETRIES = 2


# --------------------------------------------------------------------------- per-call retries (the state machine)


@dataclass(frozen=True)
class Retrier:
    """One Retry rule of a Task state. `interval` and `max_delay` name a DefinitionSubstitutions parameter."""

    errors: tuple[str, ...]
    interval: str
    max_attempts: int
    backoff: float = 2
    jitter: bool = False
    max_delay: str | None = None
    comment: str | None = None

    def asl(self) -> dict[str, object]:
        """The rule as the definition writes it, each parameter as its `${Name}` placeholder."""
        rule: dict[str, object] = {}
        if self.comment:
            rule["Comment"] = self.comment
        rule.update(
            ErrorEquals=list(self.errors),
            IntervalSeconds=f"${{{self.interval}}}",
            MaxAttempts=self.max_attempts,
            BackoffRate=self.backoff,
        )
        if self.max_delay:
            rule["MaxDelaySeconds"] = f"${{{self.max_delay}}}"
        if self.jitter:
            rule["JitterStrategy"] = "FULL"
        return rule


LAMBDA_TIMEOUT = Retrier(
    ("Sandbox.Timedout",),
    "RetryIntervalSeconds",
    1,
    comment=(
        "Lambda ended the invocation at the function's timeout. Every handler is idempotent (what it did stays done "
        "and is found again), so one more try is safe; a second timeout is a real hang and goes to the Catch."
    ),
)
LAMBDA_SERVICE = Retrier(
    ("Lambda.ServiceException", "Lambda.AWSLambdaException", "Lambda.SdkClientException", "Lambda.TooManyRequestsException"),
    "RetryIntervalSeconds",
    6,
    jitter=True,
)
AWS_TRANSIENT = Retrier(("AwsThrottled", "AwsUnavailable"), "RetryIntervalSeconds", 5, jitter=True)
TEARDOWN_INCOMPLETE = Retrier(
    ("TeardownIncomplete",),
    "TeardownRetryIntervalSeconds",
    8,
    max_delay="TeardownRetryMaxDelaySeconds",
)

#: the Retry of each kind of Task state, in the order the definition lists them
CALL_RETRIERS: dict[str, tuple[Retrier, ...]] = {
    "step": (LAMBDA_TIMEOUT, LAMBDA_SERVICE, AWS_TRANSIENT),
    "teardown": (LAMBDA_TIMEOUT, TEARDOWN_INCOMPLETE, LAMBDA_SERVICE, AWS_TRANSIENT),
}


def retriers_for(state_name: str) -> tuple[Retrier, ...]:
    """The Retry a Task state of the definition must have."""
    return CALL_RETRIERS["teardown" if state_name.startswith("Tear down") else "step"]


# --------------------------------------------------------------------------- the README's table


def markdown_table() -> str:
    rows = [
        "| class | the run ends with | retried | wait before the next attempt | recognised by | why |",
        "|---|---|---|---|---|---|",
    ]
    for policy in POLICY.values():
        wait = f"{policy.wait_seconds} s" if policy.retried else "-"
        retried = "no"
        if policy.retried:
            retried = (
                "yes, up to `compute.max_attempts`"
                if policy.counts_as_attempt
                else "yes, through the capacity queue, within `compute.max_queue_hours`"
            )
        rows.append(
            f"| {policy.failure_class} | `{policy.error}` | {retried} | {wait} | {policy.recognised_by} | {policy.why} |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
