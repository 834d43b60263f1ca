"""What each family of teardown shares: the step's clock, its report, and the scope of one job's teardown (the
clients, the job, whether a resource is this job's). steps/teardown.py composes the families:
teardown_compute (training jobs), teardown_storage (file systems, their links and exports) and teardown_network
(the VPC's pieces), over the registry of resource kinds (lustrain_core.resources)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lustrain_core import clients
from lustrain_core import resources as registry
from lustrain_core.config import Settings
from lustrain_core.launch_plan import TAG_CREATED_BY, TAG_JOB_ID, tag_dict

TRAINING_JOB = registry.TRAINING_JOB.name
PROCESSING_JOB = registry.PROCESSING_JOB.name
#: the kinds of job a run starts, which hold instances and interfaces in its subnet until they have stopped
JOBS = frozenset({TRAINING_JOB, PROCESSING_JOB})
NETWORK_ORDER = registry.NETWORK_ORDER
#: A training job in these statuses still holds instances (and mounts the file system).
TRAINING_RUNNING = frozenset({"InProgress", "Stopping"})
#: Errors that mean "not yet": something still uses the resource, or FSx is busy with it.
BUSY = frozenset(
    {"DependencyViolation", "BadRequest", "DataRepositoryTaskExecuting", "IncompatibleParameterError"}
)
#: The longest teardown waits in one invocation; the state machine's Retry on TeardownIncomplete waits longer.
MAX_BUDGET_SECONDS = 600.0
#: Kept back from the function's remaining time to write the job record and answer before Lambda stops it.
RESERVE_SECONDS = 30.0
POLL_SETTING = "LUSTRAIN_TEARDOWN_POLL_SECONDS"
DEFAULT_INTERVAL_SECONDS = 2.0
MAX_INTERVAL_SECONDS = 15.0
RUNNING_TASK = frozenset({"PENDING", "EXECUTING", "CANCELING"})
SETTLING_FS = frozenset({"CREATING", "UPDATING"})


@dataclass
class Clock:
    """The step's time budget; `sleep` waits between attempts, doubling up to `max_interval`."""

    budget_seconds: float
    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    max_interval: float = 15.0
    interval: float = 1.0
    started: float = field(default=-1.0)

    def __post_init__(self) -> None:
        self.started = self.now()

    @property
    def left(self) -> float:
        return self.budget_seconds - (self.now() - self.started)

    def wait(self) -> bool:
        """Sleep before the next attempt; False when the budget does not allow another."""
        if self.left <= 0:
            return False
        self.sleep(min(self.interval, max(self.left, 0.0)))
        self.interval = min(self.interval * 2, self.max_interval)
        return True


def clock_for(context: Any, settings: Settings) -> Clock:
    """The clock of one Lambda invocation: its remaining time less a reserve (at most MAX_BUDGET_SECONDS), and
    the first pause between attempts from LUSTRAIN_TEARDOWN_POLL_SECONDS (the local twin sets it small)."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    budget = MAX_BUDGET_SECONDS
    if remaining is not None:
        budget = max(0.0, min(MAX_BUDGET_SECONDS, float(remaining()) / 1000 - RESERVE_SECONDS))
    raw = settings.extra.get(POLL_SETTING, "").strip()
    try:
        interval = float(raw) if raw else DEFAULT_INTERVAL_SECONDS
    except ValueError:
        raise ValueError(f"stack setting {POLL_SETTING}={raw!r} is not a number of seconds") from None
    return Clock(budget, interval=interval, max_interval=max(interval, MAX_INTERVAL_SECONDS))


@dataclass
class Report:
    deleted: list[dict[str, str]] = field(default_factory=list)
    kept: list[dict[str, str]] = field(default_factory=list)
    already_gone: list[dict[str, str]] = field(default_factory=list)
    remaining: list[dict[str, str]] = field(default_factory=list)
    #: training jobs this teardown stopped (a stopped job is not deleted: SageMaker keeps its record)
    stopped: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stopped": self.stopped,
            "deleted": self.deleted,
            "kept": self.kept,
            "already_gone": self.already_gone,
            "remaining": self.remaining,
        }


class Scope:
    """One job's teardown: its clients, its clock, what it has done so far."""

    def __init__(
        self,
        *,
        ec2: Any,
        fsx: Any,
        job_id: str,
        settings: Settings,
        clock: Clock,
        sagemaker: Any = None,
    ) -> None:
        self.ec2, self.fsx, self.job_id, self.settings, self.clock = ec2, fsx, job_id, settings, clock
        self._sagemaker = sagemaker
        self._s3: Any = None
        #: seconds since the epoch: a stop request's wait is measured from its time, across invocations
        self.wall_clock: Callable[[], float] = time.time
        self.report = Report()

    @property
    def sagemaker(self) -> Any:
        # built only for a run that has a training job: most failures happen before one exists
        if self._sagemaker is None:
            self._sagemaker = clients.client("sagemaker")
        return self._sagemaker

    @property
    def s3(self) -> Any:
        # built only to ask a running training job's trainer to stop (stop_request.py)
        if self._s3 is None:
            self._s3 = clients.client("s3")
        return self._s3

    def ours(self, tags: list[dict[str, str]] | None) -> bool:
        found = tag_dict(tags)
        return found.get(TAG_JOB_ID) == self.job_id and found.get(TAG_CREATED_BY) == self.settings.stack_name

    def handled(self, entry: dict[str, str]) -> bool:
        return any(
            (r["type"], r["id"]) == (entry["type"], entry["id"])
            for r in self.report.deleted + self.report.already_gone + self.report.kept
        )
