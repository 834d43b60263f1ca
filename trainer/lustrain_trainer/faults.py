"""Faults of the machine under the trainer, told apart from the trainer's own errors, and a pre-flight that finds
them before training starts.

A fault of the infrastructure (an NCCL or EFA error or timeout, a CUDA fault such as an uncorrectable ECC error, a
rank that went away) makes the trainer exit with INFRASTRUCTURE_EXIT_CODE and a last line starting with
INFRASTRUCTURE_MARK. SageMaker puts the script's exit code and the end of its error output in the job's
FailureReason, where lustrain's run policy (functions/lustrain_core/recovery.py, which keeps the same two values)
recognises it: the run starts a new attempt on new instances, from the newest checkpoint. Any other exception is
the code's own, and is not retried.

The pre-flight, on start: counts the GPUs this host has against SM_NUM_GPUS, and all-reduces a buffer across all
ranks, logging the bus bandwidth it got. A host with a missing GPU, or ranks that cannot all-reduce, fail fast as
infrastructure instead of training slowly (or not at all).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lustrain_trainer.distributed import Dist

INFRASTRUCTURE_EXIT_CODE = 75
INFRASTRUCTURE_MARK = "lustrain: infrastructure fault"
#: the pre-flight's all-reduce: this many MiB (GPU) or a small buffer (CPU, where the twin runs it)
PREFLIGHT_MIB_GPU = 64
PREFLIGHT_MIB_CPU = 1
PREFLIGHT_ROUNDS = 3

#: (kind, pattern over the exception's type name and message), first match wins. An out-of-memory error is the
#: code's (its batch size), never the machine's.
_CODE_ERRORS = re.compile(r"out of memory|OutOfMemoryError", re.I)
_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("ecc", re.compile(r"\bECC\b|uncorrectable", re.I)),
    ("efa", re.compile(r"\bEFA\b|libfabric|\bofi\b", re.I)),
    ("nccl", re.compile(r"NCCL|DistBackendError|ProcessGroupNCCL|Watchdog caught collective operation timeout", re.I)),
    (
        "lost-rank",
        re.compile(
            r"DistNetworkError|Connection (reset|closed) by peer|Broken pipe|ProcessGroupGloo|"
            r"Gloo connectFullMesh|RendezvousConnectionError|rank \d+ (exited|is gone|lost)",
            re.I,
        ),
    ),
    (
        "cuda",
        re.compile(
            r"CUDA error: (an illegal memory access|unspecified launch failure|device-side assert|"
            r"uncorrectable|misaligned address|the launch timed out|unknown error)|cudaErrorDevicesUnavailable|"
            r"CUDA driver|no CUDA-capable device",
            re.I,
        ),
    ),
)


class InfrastructureFault(RuntimeError):
    """Raised by the pre-flight when this host or the ranks' network cannot carry the run."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def kind_of(exc: BaseException) -> str | None:
    """The infrastructure fault an exception is (nccl, efa, ecc, cuda, lost-rank, preflight), or None: the code's."""
    if isinstance(exc, InfrastructureFault):
        return exc.kind
    text = f"{type(exc).__name__}: {exc}"
    if _CODE_ERRORS.search(text):
        return None
    for kind, pattern in _KINDS:
        if pattern.search(text):
            return kind
    return None


def last_line(kind: str, exc: BaseException) -> str:
    message = " ".join(str(exc).split())[:400]
    return f"{INFRASTRUCTURE_MARK} ({kind}): {type(exc).__name__}: {message}"


def report(kind: str, exc: BaseException, write: Callable[[str], object] | None = None) -> int:
    """Say what failed, as the last line of the error output, and give the exit code that says so."""
    (write or sys.stderr.write)(last_line(kind, exc) + "\n")
    sys.stderr.flush()
    return INFRASTRUCTURE_EXIT_CODE


@dataclass(frozen=True)
class Preflight:
    gpus: int
    expected_gpus: int | None
    ranks: int
    mib: float
    seconds: float
    #: the all-reduce's bus bandwidth (GB/s): bytes x 2(n-1)/n per rank over the time, as nccl-tests reports it
    bus_gb_s: float | None

    def line(self) -> str:
        expected = f" of {self.expected_gpus} expected" if self.expected_gpus is not None else ""
        if self.bus_gb_s is None:
            reduce = "no all-reduce (1 rank)"
        else:
            reduce = (
                f"all-reduce of {self.mib:g} MiB across {self.ranks} ranks in {self.seconds * 1000:.1f} ms, "
                f"bus bandwidth {self.bus_gb_s:.2f} GB/s"
            )
        return f"pre-flight: {self.gpus} GPU(s) on this host{expected}; {reduce}"


def preflight(info: Dist, env: Mapping[str, str] | None = None) -> Preflight:
    """Count this host's GPUs and all-reduce across every rank; InfrastructureFault when either falls short."""
    env = os.environ if env is None else env
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    raw = env.get("SM_NUM_GPUS")
    expected = int(raw) if raw and raw.isdigit() else None
    if expected is not None and gpus < expected:
        raise InfrastructureFault(
            "preflight", f"this host has {gpus} usable GPU(s) of the {expected} its instance type has (SM_NUM_GPUS)"
        )
    if not info.active:
        return Preflight(gpus, expected, 1, 0.0, 0.0, None)
    mib = PREFLIGHT_MIB_GPU if info.device.type == "cuda" else PREFLIGHT_MIB_CPU
    buffer = torch.ones(int(mib * 2**20) // 4, dtype=torch.float32, device=info.device)
    dist.all_reduce(buffer)  # warm-up: the first collective sets up the connections
    if info.device.type == "cuda":
        torch.cuda.synchronize(info.device)
    started = time.perf_counter()
    for _ in range(PREFLIGHT_ROUNDS):
        buffer.fill_(1.0)
        dist.all_reduce(buffer)
    if info.device.type == "cuda":
        torch.cuda.synchronize(info.device)
    seconds = (time.perf_counter() - started) / PREFLIGHT_ROUNDS
    total = float(buffer[0].item())
    if total != float(info.world_size):
        raise InfrastructureFault(
            "preflight", f"the pre-flight all-reduce summed to {total:g} across {info.world_size} ranks"
        )
    n = info.world_size
    bus = buffer.numel() * 4 * 2 * (n - 1) / n / max(seconds, 1e-9) / 1e9
    return Preflight(gpus, expected, n, float(mib), seconds, bus)
