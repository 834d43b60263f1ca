"""Faults the twin can inject into a run (`lustrain rehearse --inject STEP:FAULT`).

A fault is armed for one step of the state machine (a handler module's name). Most fire once:
`consume(step, fault)` reports it and disarms it, so the step's retry, or the next run, is clean.
`throttling-always` stays armed until `clear()`; `active(step, fault)` only looks, and is how `quota` is read.

Who fires what:
- the twin's FSx (patches/fsx.py): `fsx-failed`, the file system created by create_filesystem goes FAILED;
- the twin's Service Quotas (patches/service_quotas.py): `quota`, every SageMaker quota reads 0 while it is
  armed (it looks with `active`: a quota stays low for the whole run, and for every read of it);
- the SageMaker simulator: `capacity-error`, `training-error`, `stopped` (MaxRuntime) for start_training;
- the botocore hook (patches/throttling.py): `throttling` / `throttling-always`, the handler of STEP gets a
  ThrottlingException ClientError from its next AWS call. The hook knows which handler is running
  because the in-process Lambda runner (patches/lambda_invoke.py) wraps each invocation in `running_step`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

#: The states of the run, by handler module name (functions/handlers/).
STEPS: tuple[str, ...] = (
    "register_job",
    "check_quota",
    "create_network",
    "create_filesystem",
    "check_filesystem",
    "upload_code",
    "start_training",
    "on_training_event",
    "teardown",
    "notify",
)

_THROTTLING = ("throttling", "throttling-always")

#: Each fault and the steps it can be injected at.
FAULTS: dict[str, tuple[str, ...]] = {
    "fsx-failed": ("create_filesystem",),
    "capacity-error": ("start_training",),
    "training-error": ("start_training",),
    "stopped": ("start_training",),
    "quota": ("check_quota",),
    **{name: STEPS for name in _THROTTLING},
}

_PERSISTENT = frozenset({"throttling-always"})


class FaultSpecInvalid(ValueError):
    """An --inject value names an unknown step or fault, or a fault that cannot happen at that step."""


@dataclass(frozen=True)
class Fault:
    step: str
    fault: str

    def __str__(self) -> str:
        return f"{self.step}:{self.fault}"


_lock = threading.Lock()
_armed: set[Fault] = set()
_fired: list[Fault] = []
_current_step: ContextVar[str | None] = ContextVar("lustrain_twin_current_step", default=None)


def parse(spec: str) -> Fault:
    """Read one `STEP:FAULT` value, as given to --inject."""
    step, sep, fault = spec.partition(":")
    if not sep:
        raise FaultSpecInvalid(f"--inject {spec!r}: expected STEP:FAULT, for example check_quota:quota")
    return _validated(step.strip(), fault.strip())


def _validated(step: str, fault: str) -> Fault:
    if fault not in FAULTS:
        raise FaultSpecInvalid(f"unknown fault {fault!r}; faults: {', '.join(sorted(FAULTS))}")
    if step not in STEPS:
        raise FaultSpecInvalid(f"unknown step {step!r}; steps: {', '.join(STEPS)}")
    if step not in FAULTS[fault]:
        raise FaultSpecInvalid(
            f"fault {fault!r} cannot happen at step {step!r}; it happens at: {', '.join(FAULTS[fault])}"
        )
    return Fault(step, fault)


def inject(step: str, fault: str) -> Fault:
    """Arm `fault` for `step` (validated: a typo in --inject must not pass silently)."""
    armed = _validated(step, fault)
    with _lock:
        _armed.add(armed)
    return armed


def clear() -> None:
    """Disarm every fault and forget which fired."""
    with _lock:
        _armed.clear()
        _fired.clear()


def active(step: str, fault: str) -> bool:
    """Whether `fault` is armed for `step`, without firing it."""
    with _lock:
        return Fault(step, fault) in _armed


def consume(step: str, fault: str) -> bool:
    """Fire `fault` at `step` if armed: True once (always, for a persistent fault), then False."""
    key = Fault(step, fault)
    with _lock:
        if key not in _armed:
            return False
        if fault not in _PERSISTENT:
            _armed.discard(key)
        _fired.append(key)
        return True


def armed() -> list[Fault]:
    with _lock:
        return sorted(_armed, key=str)


def fired() -> list[Fault]:
    """Every firing so far, in order (a persistent fault appears once per firing)."""
    with _lock:
        return list(_fired)


def current_step() -> str | None:
    """The step whose handler is running in this thread, if any."""
    return _current_step.get()


@contextmanager
def running_step(step: str) -> Iterator[None]:
    """Mark the handler of `step` as running in this thread (and threads copying its context)."""
    token = _current_step.set(step)
    try:
        yield
    finally:
        _current_step.reset(token)


def consume_throttling(step: str) -> bool:
    """Fire a throttling fault armed for `step`: the one-shot one first, else the persistent one."""
    return any(consume(step, name) for name in _THROTTLING)
