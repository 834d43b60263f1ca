"""Checkpoints: sharded and written in the background, committed by their manifest, found newest-first on start,
corrupt ones skipped and set aside.

A checkpoint (version 2, "sharded") is a torch.distributed.checkpoint directory step-<step>-<save id>/ in which
every rank writes its own shards (replicated tensors once), beside its manifest step-<step>.json: the run that
wrote it, its model's shape, the tokens seen and the global batch, readable without torch (lustrain's register_job
reads it to check that a run told to continue this one, checkpoints.resume_from, trains the same model). The save
runs on a thread of its own over a gloo group of its own once each rank's state is copied to host memory (the
only part training waits for); rank 0 writes the manifest, atomically, only once every rank's shards and DCP's
metadata are on disk: the manifest is the commit, so a directory without one is never resumed from, and a reader
(a restart, or SageMaker syncing the directory to S3) never takes half a checkpoint for a whole one. A checkpoint
whose files are missing or short (a partial copy, a bad disk) has its manifest renamed to *.corrupt and the
previous one is used instead. It loads into any world size and sharding (FSDP, HSDP, DDP, one process).

Version 1 checkpoints (step-<step>.pt, the whole state in one file, written by earlier trainers) still load.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FORMAT = "lustrain-checkpoint"
VERSION = 2
#: the whole state in one file, as trainers before sharded checkpoints wrote it: still loaded
FULL_VERSION = 1
SHARDED = "sharded"
NAME = re.compile(r"step-(\d+)\.pt")
MANIFEST_NAME = re.compile(r"step-(\d+)\.json")
SHARDED_DIR = re.compile(r"step-(\d+)-(\w+)")
#: the run a checkpoint belongs to, and the one a run may continue: set by lustrain on the training job
RUN_ID_ENV = "LUSTRAIN_RUN_ID"
RESUME_FROM_ENV = "LUSTRAIN_RESUME_FROM"
# One process without a process group: DCP warns that it assumes a single process (on the save's own thread too),
# which is what is meant.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
REQUIRED = ("format", "version", "step", "model", "optimizer", "model_config")


class CheckpointMismatch(ValueError):
    """A readable checkpoint that this run cannot continue from (another model shape)."""


@dataclass(frozen=True)
class Loaded:
    """The checkpoint a run resumes from: a sharded one (path: its DCP directory, payload: its manifest, which holds
    no tensors: every rank loads its own part) or a version 1 file (payload: the whole state, read by rank 0)."""

    step: int
    path: Path
    payload: dict[str, Any]
    sharded: bool = False


def counting_reader(path: Path) -> Any:
    """torch.distributed.checkpoint's FileSystemReader of the checkpoint at `path`, which counts the bytes of its
    files this rank reads (`bytes_read`: the stored length of each item of its load plan): what a restart reads."""
    from torch.distributed.checkpoint import FileSystemReader

    class CountingReader(FileSystemReader):
        bytes_read = 0

        def read_data(self, plan: Any, planner: Any) -> Any:
            self.bytes_read += sum(int(self.storage_data[item.storage_index].length) for item in plan.items)
            return super().read_data(plan, planner)

    return CountingReader(str(path))


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step-{step:09d}.pt"


def manifest_path(directory: Path, step: int) -> Path:
    return directory / f"step-{step:09d}.json"


def save_manifest(path: Path, manifest: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomic(payload: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def make_payload(step: int, model: dict[str, Any], optimizer: dict[str, Any], model_config: dict[str, Any],
                 extra: dict[str, Any]) -> dict[str, Any]:
    """A version 1 checkpoint's contents (the tests write one, as earlier trainers did, to load it)."""
    return {"format": FORMAT, "version": FULL_VERSION, "step": step, "model": model, "optimizer": optimizer,
            "model_config": model_config, **extra}


def _parameter_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Names of the optimizer's parameters in its own order (the integer ids its state_dict uses)."""
    name_of = {id(p): name for name, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def optimizer_state_by_name(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state keyed by parameter name: the layout torch.distributed.checkpoint's full state
    dict uses, so a checkpoint taken with DDP resumes under FSDP and the other way round."""
    names = _parameter_names(model, optimizer)
    state = optimizer.state_dict()
    return {
        "state": {names[i]: value for i, value in state["state"].items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                         for group in state["param_groups"]],
    }


def optimizer_state_by_id(model: torch.nn.Module, optimizer: torch.optim.Optimizer, by_name: dict[str, Any]
                          ) -> dict[str, Any]:
    ids = {name: i for i, name in enumerate(_parameter_names(model, optimizer))}
    unknown = {n for group in by_name["param_groups"] for n in group["params"]} - set(ids)
    if unknown:
        raise CheckpointMismatch(f"optimizer state names parameters this model lacks: {sorted(unknown)[:5]}")
    return {
        "state": {ids[name]: value for name, value in by_name["state"].items()},
        "param_groups": [{**group, "params": [ids[n] for n in group["params"]]}
                         for group in by_name["param_groups"]],
    }


def load_step(directory: Path, step: int) -> dict[str, Any]:
    """The checkpoint of this exact step (the one rank 0 chose), as a rank on any host finds it locally."""
    path = checkpoint_path(directory, step)
    payload = torch.load(path, map_location="cpu", weights_only=True)
    problem = _problem(payload, step)
    if problem:
        raise CheckpointMismatch(f"{path}: {problem}")
    assert isinstance(payload, dict)
    return payload


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint file, newest first; temporary and set-aside files are not listed."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := NAME.fullmatch(p.name))]
    return sorted(found, reverse=True)


def _problem(payload: Any, step: int) -> str | None:
    if not isinstance(payload, dict):
        return "not a checkpoint dictionary"
    missing = [key for key in REQUIRED if key not in payload]
    if missing:
        return f"missing {missing}"
    if payload["format"] != FORMAT or payload["version"] != FULL_VERSION:
        return f"format {payload['format']!r} version {payload['version']!r}, expected {FORMAT!r} {FULL_VERSION}"
    if payload["step"] != step:
        return f"holds step {payload['step']} but is named for step {step}"
    return None


def read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _sharded_problem(directory: Path, manifest: dict[str, Any], step: int) -> str | None:
    """Why a committed sharded checkpoint cannot be loaded (a file missing or shorter than DCP's metadata says), or
    None. Reads the metadata only: no tensor."""
    from torch.distributed.checkpoint import FileSystemReader

    if manifest.get("format") != FORMAT or manifest.get("step") != step:
        return f"manifest of format {manifest.get('format')!r} step {manifest.get('step')!r}"
    missing = [key for key in ("directory", "model_config") if key not in manifest]
    if missing:
        return f"manifest lacks {missing}"
    path = directory / str(manifest["directory"])
    try:
        metadata = FileSystemReader(path).read_metadata()
    except Exception as exc:  # any failure to read the metadata means the checkpoint cannot be loaded
        return f"{path.name}: no readable metadata ({type(exc).__name__})"
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        file = path / name
        actual = file.stat().st_size if file.is_file() else None
        if actual is None or actual < size:
            return f"{path.name}/{name}: {'missing' if actual is None else f'{actual} bytes of {size}'}"
    return None


def _steps(directory: Path) -> list[int]:
    """Every step with a manifest or a version 1 file, newest first."""
    if not directory.is_dir():
        return []
    steps = {int(m.group(1)) for p in directory.iterdir() if (m := NAME.fullmatch(p.name) or MANIFEST_NAME.fullmatch(p.name))}
    return sorted(steps, reverse=True)


def _set_aside(path: Path, why: str, log: Callable[[str], None]) -> None:
    aside = path.with_name(path.name + ".corrupt")
    os.replace(path, aside)
    log(f"skipping checkpoint {path.name} ({why}); moved it to {aside.name}")


def load_latest(directory: Path, log: Callable[[str], None]) -> Loaded | None:
    """The newest checkpoint that can be loaded. A sharded one is checked against its metadata (no tensor is read);
    a version 1 file is read whole. One that cannot be loaded is set aside (*.corrupt) and the one before tried."""
    for step in _steps(directory):
        manifest_file = manifest_path(directory, step)
        manifest = read_manifest(manifest_file) if manifest_file.is_file() else None
        if manifest is not None and manifest.get("layout") == SHARDED:
            problem = _sharded_problem(directory, manifest, step)
            if problem is None:
                return Loaded(step=step, path=directory / str(manifest["directory"]), payload=manifest, sharded=True)
            _set_aside(manifest_file, problem, log)
            continue
        path = checkpoint_path(directory, step)
        if not path.is_file():
            continue  # a manifest without its checkpoint (a version 1 file pruned, or a copy cut short)
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
            problem = _problem(payload, step)
        except Exception as exc:  # any failure to read means the file cannot be resumed from
            problem = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if problem is None:
            return Loaded(step=step, path=path, payload=payload)
        _set_aside(path, problem, log)
    return None


def prune(directory: Path, keep: int, pending: str | None = None) -> list[Path]:
    """Keep the `keep` newest committed checkpoints; remove older ones, and every sharded directory no manifest
    commits (a save cut short), except `pending`, the one being written."""
    removed: list[Path] = []
    kept: set[str] = set()
    for n, step in enumerate(_steps(directory)):
        manifest = read_manifest(manifest_path(directory, step)) or {}
        if n < keep:
            kept.add(str(manifest.get("directory", "")))
            continue
        for path in (checkpoint_path(directory, step), manifest_path(directory, step)):
            if path.exists():
                path.unlink()
                removed.append(path)
        if manifest.get("directory"):
            shutil.rmtree(directory / str(manifest["directory"]), ignore_errors=True)
            removed.append(directory / str(manifest["directory"]))
    for path in directory.iterdir() if directory.is_dir() else []:
        if path.is_dir() and SHARDED_DIR.fullmatch(path.name) and path.name not in kept and path.name != pending:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class Checkpointer:
    """Sharded checkpoints in the background: save() returns once this rank's state is copied to host memory, the
    write goes on; the previous save is committed (its manifest written by rank 0) before the next one starts, at
    wait(), or at poll() once done. Every rank calls save(), wait() and poll() at the same steps."""

    def __init__(self, directory: Path, rank: int, world_size: int, keep: int, log: Callable[[str], None]) -> None:
        import torch.distributed as dist

        self.directory, self.rank, self.keep, self.log = directory, rank, keep, log
        # The save's own collectives (its plan and metadata) run on a thread while training's run on the main one:
        # they need a group of their own, and a CPU one (DCP's async save needs gloo even where training uses NCCL).
        self.group = dist.new_group(backend="gloo") if world_size > 1 and dist.is_initialized() else None
        self._pending: tuple[Any, int, dict[str, Any], float] | None = None
        # this rank's committed saves: where each host has a checkpoint directory of its own (SageMaker's local
        # /opt/ml/checkpoints), only rank 0's holds the manifests, so every other rank prunes its own shards
        self._committed: collections.deque[str] = collections.deque()
        self.last_blocking_s = 0.0
        self.committed_step = -1

    def save(self, step: int, state: dict[str, Any], manifest: dict[str, Any], save_id: str, reason: str,
             blocking: bool = False) -> float:
        """Start writing `state` (model and optimizer state dicts, sharded or whole) as step `step`; the seconds this
        rank was blocked. With blocking, returns once the checkpoint is committed."""
        import torch.distributed.checkpoint as dcp

        started = time.monotonic()
        self.wait()
        name = f"step-{step:09d}-{save_id}"
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
        future = dcp.async_save(state, checkpoint_id=str(self.directory / name), process_group=self.group)
        manifest = {**manifest, "format": FORMAT, "version": VERSION, "layout": SHARDED, "step": step,
                    "directory": name, "reason": reason}
        self._pending = (future, step, manifest, started)
        self.last_blocking_s = time.monotonic() - started
        if blocking:
            self.wait()
        return time.monotonic() - started if blocking else self.last_blocking_s

    def poll(self) -> None:
        if self._pending is not None and self._pending[0].done():
            self.wait()

    def wait(self) -> None:
        """Block until the save in flight is written, then commit it (rank 0 writes its manifest and prunes)."""
        if self._pending is None:
            return
        future, step, manifest, started = self._pending
        self._pending = None
        future.result()  # every rank's shards and DCP's metadata are written once any rank's future is done
        self._committed.append(str(manifest["directory"]))
        if self.rank == 0:
            save_manifest(manifest_path(self.directory, step), manifest)
            _fsync_dir(self.directory)
            prune(self.directory, self.keep)
            self.log(f"checkpoint saved {manifest['directory']} at step {step} ({manifest['reason']}, "
                     f"{time.monotonic() - started:.2f}s, training blocked {self.last_blocking_s:.2f}s)")
        while len(self._committed) > self.keep:
            old = self._committed.popleft()
            if self.rank:  # (rank 0's prune has removed it where the directory is shared)
                shutil.rmtree(self.directory / old, ignore_errors=True)
        self.committed_step = step


def foreign(payload: dict[str, Any], run: str | None, resume_from: str | None) -> str | None:
    """Why this run may not continue a checkpoint another run wrote, or None. A run lustrain started knows its id
    (LUSTRAIN_RUN_ID) and continues only its own checkpoints, or those of the run it was told to resume."""
    if run is None:
        return None
    owner = payload.get("run")
    if owner in (run, resume_from) and owner is not None:
        return None
    return (
        f"it belongs to run {owner or 'unknown (written without a run id)'}, not to this run {run}; continue it only "
        "by naming it in checkpoints.resume_from"
    )
