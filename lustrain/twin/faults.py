"""Faults the twin can inject into a run (`lustrain rehearse --inject STEP:FAULT`).

A fault is armed for one step of the state machine (a handler module's name). Most fire once:
`consume(step, fault)` reports it and disarms it, so the step's retry, or the next run, is clean.
`throttling-always` stays armed until `clear()`; `active(step, fault)` only looks, and is how `quota` is read.

Who fires what:
- the twin's FSx (patches/fsx.py): `fsx-failed`, the file system created by create_filesystem goes FAILED;
- the twin's Service Quotas (patches/service_quotas.py): `quota`, every SageMaker quota reads 0 while it is
  armed (it looks with `active`: a quota stays low for the whole run, and for every read of it);
- the SageMaker simulator, for the job start_training creates: `capacity-error` (every attempt of the run gets
  no capacity), `capacity-error-once` (the first attempt gets none), `hardware-failure` (the job fails with
  SageMaker's InternalServerError after its trainer has written a checkpoint and logged a step past it, before it
  ends: its checkpoints are in S3, as SageMaker syncs them), `user-error` (the user's script raises), `stopped`
  (MaxRuntime), `silent` (the job never reports: it sends no event and holds its instances until it is stopped
  or reaches MaxRuntime) and `repeat-events` (each of its events is delivered three times); the twin's SageMaker
  itself: `quota-taken-once` (the first CreateTrainingJob is refused ResourceLimitExceeded, as if another workload
  had taken the quota since the capacity queue admitted the run);
- the botocore hook (patches/throttling.py): `throttling` / `throttling-always` (a ThrottlingException) and
  `service-error` (a 500 InternalError), from the handler of STEP's next AWS call; `lost-create`, STEP's first
  Create* call reaches AWS and is done, but its answer is a 500 (AWS committed, the response was lost): the
  retry must find what the lost answer created rather than create it twice; `lost-create-subnet`,
  `lost-create-route-table`, `lost-create-group` and `lost-create-endpoint` do the same to create_network's
  later creates (CreateSubnet, CreateRouteTable, CreateSecurityGroup, CreateVpcEndpoint), of which only the
  endpoint takes an idempotency token: the retry must find the others by the run's tags;
- the in-process Lambda runner (patches/lambda_invoke.py): `lambda-timeout`, the handler of STEP runs to its
  end (what it did stays done) but the invocation answers `Sandbox.Timedout`, as Lambda does when a function
  is stopped at its Timeout; `timeout-mid-delete` (teardown), the invocation answers `Sandbox.Timedout` the moment
  the handler makes its first Delete* call, and the handler goes on deleting in the background while Step
  Functions retries the step: two teardowns at work at once, the first one cut off mid-delete; `twice-at-once`
  (teardown), the handler runs twice at once on the same event (the state machine's teardown and another
  teardown of the same run racing it). The runner also marks each invocation with `running_step`, which is how the
  botocore hook, FSx, Service Quotas and the simulator know whose fault is theirs.

on_training_event runs once per SageMaker event. A fault armed there waits for the event that ends the job
(Completed, Failed or Stopped): handling that one (archive, callback) is what the fault puts at risk; a
heartbeat that fails changes nothing.

Several runs can share one twin (the fault matrix, the load bench): `inject(step, fault, run=NAME)` arms a
fault for the run of the spec named NAME only. The runner reads the run of each invocation from its event
(`run_of`); a fault armed without `run` fires in whichever run reaches the step first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

#: The states of the run, by handler module name (functions/handlers/).
STEPS: tuple[str, ...] = (
    "register_job",
    "check_quota",
    "create_network",
    "create_filesystem",
    "check_filesystem",
    "upload_code",
    "start_training",
    "next_attempt",
    "on_training_event",
    "teardown",
    "notify",
)

_THROTTLING = ("throttling", "throttling-always")
#: Faults of the handler's own invocation or AWS calls: they can happen at any step.
ANY_STEP: tuple[str, ...] = (*_THROTTLING, "service-error", "lambda-timeout")
TRAINING_JOB_FAULTS: tuple[str, ...] = (
    "capacity-error",
    "capacity-error-once",
    "hardware-failure",
    "user-error",
    "stopped",
    "silent",
)

#: Each fault and the steps it can be injected at.
FAULTS: dict[str, tuple[str, ...]] = {
    "fsx-failed": ("create_filesystem",),
    **{name: ("start_training",) for name in (*TRAINING_JOB_FAULTS, "repeat-events")},
    "quota": ("check_quota",),
    # another workload takes the quota between the admission and CreateTrainingJob: SageMaker refuses the first
    # create (ResourceLimitExceeded); the run goes back to the capacity queue
    "quota-taken-once": ("start_training",),
    # the steps whose Create* calls make what a run pays for
    "lost-create": ("create_network", "create_filesystem", "check_filesystem", "start_training"),
    **{
        name: ("create_network",)
        for name in (
            "lost-create-subnet",
            "lost-create-route-table",
            "lost-create-group",
            "lost-create-endpoint",
        )
    },
    "timeout-mid-delete": ("teardown",),
    "twice-at-once": ("teardown",),
    **{name: STEPS for name in ANY_STEP},
}

#: The Create* call each lost-create fault loses the answer of (None: the step's first Create* call).
LOST_CREATES: dict[str, str | None] = {
    "lost-create": None,
    "lost-create-subnet": "CreateSubnet",
    "lost-create-route-table": "CreateRouteTable",
    "lost-create-group": "CreateSecurityGroup",
    "lost-create-endpoint": "CreateVpcEndpoint",
}

#: faults that stay armed once fired: `capacity-error` refuses every attempt of the run, as a region with no
#: capacity for the type would
_PERSISTENT = frozenset({"throttling-always", "capacity-error"})
#: SageMaker statuses after which a training job sends no more events.
_JOB_ENDED = frozenset({"Completed", "Failed", "Stopped"})


class FaultSpecInvalid(ValueError):
    """An --inject value names an unknown step or fault, or a fault that cannot happen at that step."""


@dataclass(frozen=True)
class Fault:
    step: str
    fault: str
    #: the spec name of the one run the fault is armed for; None: any run
    run: str | None = None

    def __str__(self) -> str:
        return f"{self.step}:{self.fault}" + (f"@{self.run}" if self.run else "")


@dataclass(frozen=True)
class _Invocation:
    step: str
    run: str | None
    eligible: bool
    #: the runner's way to answer the invocation now, as if it had timed out (`timeout-mid-delete`)
    cut: Callable[[], None] | None = None


_lock = threading.Lock()
_armed: set[Fault] = set()
_fired: list[Fault] = []
_current: ContextVar[_Invocation | None] = ContextVar("lustrain_twin_current_invocation", default=None)


def parse(spec: str) -> Fault:
    """Read one `STEP:FAULT` value, as given to --inject."""
    step, sep, fault = spec.partition(":")
    if not sep:
        raise FaultSpecInvalid(f"--inject {spec!r}: expected STEP:FAULT, for example check_quota:quota")
    return _validated(step.strip(), fault.strip())


def _validated(step: str, fault: str, run: str | None = None) -> Fault:
    if fault not in FAULTS:
        specific = sorted(name for name in FAULTS if name not in ANY_STEP)
        raise FaultSpecInvalid(
            f"unknown fault {fault!r}; faults: {', '.join(specific)}; at any step: {', '.join(sorted(ANY_STEP))}"
        )
    if step not in STEPS:
        raise FaultSpecInvalid(f"unknown step {step!r}; steps: {', '.join(STEPS)}")
    if step not in FAULTS[fault]:
        raise FaultSpecInvalid(
            f"fault {fault!r} cannot happen at step {step!r}; it happens at: {', '.join(FAULTS[fault])}"
        )
    return Fault(step, fault, run)


def inject(step: str, fault: str, run: str | None = None) -> Fault:
    """Arm `fault` for `step` (validated: a typo in --inject must not pass silently), for one run or any."""
    armed = _validated(step, fault, run)
    with _lock:
        _armed.add(armed)
    return armed


def clear() -> None:
    """Disarm every fault and forget which fired."""
    with _lock:
        _armed.clear()
        _fired.clear()


def _candidates(step: str, fault: str) -> list[Fault]:
    """The armed faults that may fire here: for any run, and for the run of the invocation in this thread."""
    invocation = _current.get()
    if invocation is not None and invocation.step == step and not invocation.eligible:
        return []
    keys = [Fault(step, fault)]
    if invocation is not None and invocation.run:
        keys.insert(0, Fault(step, fault, invocation.run))
    return keys


def active(step: str, fault: str) -> bool:
    """Whether `fault` is armed for `step` (and this thread's run), without firing it."""
    with _lock:
        return any(key in _armed for key in _candidates(step, fault))


def consume(step: str, fault: str) -> bool:
    """Fire `fault` at `step` if armed: True once (always, for a persistent fault), then False."""
    with _lock:
        for key in _candidates(step, fault):
            if key in _armed:
                if fault not in _PERSISTENT:
                    _armed.discard(key)
                _fired.append(key)
                return True
        return False


def armed() -> list[Fault]:
    with _lock:
        return sorted(_armed, key=str)


def fired() -> list[Fault]:
    """Every firing so far, in order (a persistent fault appears once per firing)."""
    with _lock:
        return list(_fired)


def current_step() -> str | None:
    """The step whose handler is running in this thread, if any."""
    invocation = _current.get()
    return None if invocation is None else invocation.step


@contextmanager
def running_step(step: str, event: Any = None, cut: Callable[[], None] | None = None) -> Iterator[None]:
    """Mark the handler of `step` as running in this thread (and threads copying its context).

    With the invocation's `event`, the run it serves is known (scoped faults fire in it only), and so is
    whether the step's faults may fire at all (on_training_event: only at the event that ends the job). `cut`
    answers the invocation at once as timed out while its handler goes on (`cut_short`).
    """
    token = _current.set(_Invocation(step, run_of(event), _eligible(step, event), cut))
    try:
        yield
    finally:
        _current.reset(token)


def cut_short_at(operation: str) -> None:
    """`timeout-mid-delete`: at the handler's first Delete* call, its invocation answers as timed out (the
    handler itself goes on, as a Lambda's does not: the retry then races what is still deleting)."""
    invocation = _current.get()
    if (
        invocation is not None
        and invocation.cut is not None
        and operation.startswith("Delete")
        and consume(invocation.step, "timeout-mid-delete")
    ):
        invocation.cut()


def consume_lost_create(step: str, operation: str) -> bool:
    """Fire the lost-create fault armed for `step` whose Create* call `operation` is (see LOST_CREATES)."""
    if not operation.startswith("Create"):
        return False
    return any(
        consume(step, name) for name, target in LOST_CREATES.items() if target is None or target == operation
    )


def consume_throttling(step: str) -> bool:
    """Fire a throttling fault armed for `step`: the one-shot one first, else the persistent one."""
    return any(consume(step, name) for name in _THROTTLING)


def _eligible(step: str, event: Any) -> bool:
    if step != "on_training_event" or not isinstance(event, Mapping):
        return True
    detail = event.get("detail")
    return isinstance(detail, Mapping) and detail.get("TrainingJobStatus") in _JOB_ENDED


def spec_name_of(training_job_name: str) -> str:
    """The spec name in a training job's name, `<spec name>-<8 hex>-<attempt>`."""
    return training_job_name.rsplit("-", 2)[0]


def run_of(event: Any) -> str | None:
    """The spec name of the run an invocation serves, read from its event (the state document's contract).

    The state document carries $.job (spec.name, or job_id "<name>-<8 hex>"); register_job gets the execution
    input (a dropped spec "jobs/<name>.yaml", or an inline spec); on_training_event gets SageMaker's event,
    whose TrainingJobName is "<name>-<8 hex>-<attempt>".
    """
    if not isinstance(event, Mapping):
        return None
    job = event.get("job")
    if isinstance(job, Mapping):
        spec = job.get("spec")
        if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
            return str(spec["name"])
        if isinstance(job.get("job_id"), str):
            return str(job["job_id"]).rsplit("-", 1)[0]
    detail = event.get("detail")
    if isinstance(detail, Mapping) and isinstance(detail.get("TrainingJobName"), str):
        return spec_name_of(str(detail["TrainingJobName"]))
    start = event.get("input")
    if isinstance(start, Mapping):
        spec = start.get("spec")
        if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
            return str(spec["name"])
        detail = start.get("detail")
        obj = detail.get("object") if isinstance(detail, Mapping) else None
        if isinstance(obj, Mapping) and isinstance(obj.get("key"), str):
            return PurePosixPath(str(obj["key"])).stem
    return None
