"""Checkpoints: written atomically, found newest-first on start, corrupt ones skipped and set aside.

A checkpoint is step-<step>.pt, with its manifest step-<step>.json beside it: the run that wrote it and its model's
shape, readable without torch (lustrain's register_job reads it to check that a run told to continue this one,
checkpoints.resume_from, trains the same model). It is written to a hidden temporary name in the same directory, flushed to
disk and renamed into place, so a reader (a restart, or SageMaker syncing the directory to S3) never sees
half a file under the real name. A file that still fails to load (a partial copy, a bad disk) is renamed
to *.corrupt and the previous one is used instead.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FORMAT = "lustrain-checkpoint"
VERSION = 1
NAME = re.compile(r"step-(\d+)\.pt")
#: the run a checkpoint belongs to, and the one a run may continue: set by lustrain on the training job
RUN_ID_ENV = "LUSTRAIN_RUN_ID"
RESUME_FROM_ENV = "LUSTRAIN_RESUME_FROM"
REQUIRED = ("format", "version", "step", "model", "optimizer", "model_config")


class CheckpointMismatch(ValueError):
    """A readable checkpoint that this run cannot continue from (another model shape)."""


@dataclass(frozen=True)
class Loaded:
    step: int
    path: Path
    payload: dict[str, Any]


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
    return {"format": FORMAT, "version": VERSION, "step": step, "model": model, "optimizer": optimizer,
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
    if payload["format"] != FORMAT or payload["version"] != VERSION:
        return f"format {payload['format']!r} version {payload['version']!r}, expected {FORMAT!r} {VERSION}"
    if payload["step"] != step:
        return f"holds step {payload['step']} but is named for step {step}"
    return None


def load_latest(directory: Path, log: Callable[[str], None]) -> Loaded | None:
    for step, path in list_checkpoints(directory):
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
            problem = _problem(payload, step)
        except Exception as exc:  # any failure to read means the file cannot be resumed from
            problem = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if problem is None:
            return Loaded(step=step, path=path, payload=payload)
        aside = path.with_name(path.name + ".corrupt")
        os.replace(path, aside)
        log(f"skipping checkpoint {path.name} ({problem}); moved it to {aside.name}")
    return None


def prune(directory: Path, keep: int) -> list[Path]:
    removed = []
    for step, path in list_checkpoints(directory)[keep:]:
        path.unlink(missing_ok=True)
        manifest_path(directory, step).unlink(missing_ok=True)
        removed.append(path)
    return removed


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
