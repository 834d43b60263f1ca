"""`lustrain export MODEL -o DIR`: a trained model, wherever it lies, as a Hugging Face directory.

MODEL is one of
- a model directory (model.pt and config.json, what train.py writes to SM_MODEL_DIR);
- a model.tar.gz (SageMaker's upload with CompressionType GZIP), local or s3://;
- an s3:// prefix holding the model directory's files (CompressionType NONE: .../output/model/);
- a run of the stack (its job id, execution name or unique spec name, as `lustrain status` takes it): the model
  of its newest completed training attempt, where SageMaker uploaded it (DescribeTrainingJob's
  ModelArtifacts.S3ModelArtifacts, the location the run's archive manifest records too).

Whatever is downloaded goes to a temporary directory beside DIR and is removed afterwards; the writing itself is
lustrain_trainer.export's.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path, PureWindowsPath
from typing import Any

from lustrain_core.errors import FieldError, UsageInvalid

MODEL_ARCHIVE = "model.tar.gz"


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise UsageInvalid.one("MODEL", uri, "is not an s3:// location (s3://BUCKET/KEY)")
    return bucket, key


def _escape(root: Path, name: str, *, directory: bool = False) -> str | None:
    """Why writing `name` (an S3 key's part after the prefix, a tar member's name) beneath `root` would not stay
    inside `root`, or None when it would. A file must lie strictly beneath root; a directory may be root itself."""
    why = _unsafe(name)
    if why is not None:
        return f"{why}, which could take it outside the folder the model is written to"
    base = root.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(base):
        return f"it resolves to {str(path)!r}, outside the folder the model is written to ({str(base)!r})"
    if path == base and not directory:
        return "it resolves to the folder the model is written to itself, not a file in it"
    return None


def _unsafe(name: str) -> str | None:
    """What in a relative name could make a path of it leave the folder it is joined to."""
    if not name:
        return "its name is empty"
    if "\x00" in name:
        return "its name holds a NUL character"
    if "\\" in name:
        return "its name holds a backslash (a path separator on Windows)"
    if name.startswith("/"):
        return "its name is an absolute path"
    if PureWindowsPath(name).drive:
        return "its name starts with a drive"
    parts = name.split("/")
    if "" in parts:
        return "its name holds an empty path segment (//)"
    if ".." in parts:
        return "its name holds a .. segment"
    return None


def _refused(source: str, what: str, refused: list[tuple[str, str]]) -> UsageInvalid:
    """The error refusing a model: each refused entry by name, with why; nothing of the model was written."""
    return UsageInvalid(
        [
            FieldError(
                "MODEL",
                source,
                f"{what} {name!r} is refused, {why}; nothing of the model was written",
            )
            for name, why in refused
        ]
    )


def _member_escape(root: Path, member: tarfile.TarInfo) -> str | None:
    """Why extracting a tar member into root would not stay a plain file or directory inside root."""
    if member.issym():
        return f"it is a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"it is a hard link (to {member.linkname!r})"
    if not (member.isfile() or member.isdir()):
        return "it is a device, FIFO or other special file, not a plain file or directory"
    name = member.name.rstrip("/") if member.isdir() else member.name
    if member.isdir() and name in ("", "."):
        return None  # the archive's root: `tar -C DIR .` writes it
    return _escape(root, name, directory=member.isdir())


def _extract(archive: Path, into: Path) -> Path:
    """A model.tar.gz's files in `into`. Every member is checked before any is written: one that is not a plain
    file or directory (a link, a device), or whose name would land outside `into`, refuses the whole archive;
    tarfile's "data" filter then guards the extraction itself."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            refused = [(m.name, why) for m in members if (why := _member_escape(into, m)) is not None]
            if refused:
                raise _refused(str(archive), "archive member", refused)
            into.mkdir(parents=True, exist_ok=True)
            tar.extractall(into, members=members, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise UsageInvalid.one("MODEL", str(archive), f"is not a readable model.tar.gz: {exc}") from exc
    return into


def download(s3: Any, uri: str, into: Path) -> Path:
    """The model at an s3:// URI (a .tar.gz object, or a prefix of the model's files) as a local directory.
    Every key of a prefix is checked before any object is downloaded: one whose part after the prefix would land
    outside the model's directory (an absolute path, a .. segment, a backslash, a NUL, a drive, an empty segment)
    refuses the whole prefix."""
    bucket, key = _split(uri)
    if key.endswith(".tar.gz"):
        archive = into / MODEL_ARCHIVE
        s3.download_file(bucket, key, str(archive))
        return _extract(archive, into / "model")
    prefix = key if key.endswith("/") or not key else key + "/"
    target = into / "model"
    keys = [
        item["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for item in page.get("Contents", [])
        if item["Key"] != prefix and not item["Key"].endswith("/")  # the prefix's "folder" markers
    ]
    relatives = {k: k[len(prefix) :] for k in keys}
    refused = [(k, why) for k, rel in relatives.items() if (why := _escape(target, rel)) is not None]
    # a key that is also another's folder (a, a/b) cannot be both a file and a directory
    folders = {
        "/".join(rel.split("/")[:n]) for rel in relatives.values() for n in range(1, rel.count("/") + 1)
    }
    refused += [(k, "another key lies beneath it") for k, rel in relatives.items() if rel in folders]
    if refused:
        raise _refused(uri, "key", refused)
    if not keys:
        raise UsageInvalid.one(
            "MODEL", uri, "holds no object (a model.tar.gz, or a prefix of a model's files)"
        )
    for k, rel in relatives.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, k, str(path))
    return target


def model_uri_of_run(stack: Any, run: str) -> str:
    """Where SageMaker uploaded the model of the run's newest completed training attempt."""
    from lustrain import operate

    record = operate.find_run(stack, run)
    jobs = operate.training_jobs(stack, record)
    done = [
        job
        for job in jobs
        if job.get("TrainingJobStatus") == "Completed"
        and (job.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    ]
    if not done:
        attempts = (
            ", ".join(f"{j.get('TrainingJobName')} {j.get('TrainingJobStatus')}" for j in jobs) or "none"
        )
        raise UsageInvalid.one(
            "MODEL",
            run,
            f"run {record.job_id} has no completed training job with a model (its attempts: {attempts})",
        )
    return str(done[-1]["ModelArtifacts"]["S3ModelArtifacts"])


def _ordinary(out: Path, files: list[str]) -> list[str]:
    """The files written in out, given the mode a new file gets (0644 under the usual umask): safetensors writes
    its files 0600."""
    umask = os.umask(0o022)
    os.umask(umask)
    for name in files:
        (out / name).chmod(0o666 & ~umask)
    return files


def export(
    source: str,
    out: Path,
    *,
    dtype: str = "float32",
    max_shard_bytes: int | None = None,
    s3: Callable[[], Any],
    stack: Callable[[], Any],
) -> list[str]:
    """Export MODEL `source` to the Hugging Face directory `out`; the files written. s3 and stack make the S3
    client and the operate.Stack when the source needs them (an s3:// URI, a run)."""
    from lustrain_trainer import export as writer

    limit = max_shard_bytes or writer.DEFAULT_MAX_SHARD_BYTES
    local = Path(source)
    if "://" not in source and local.is_dir():
        written: list[str] = writer.export(local, out, dtype, limit)
        return _ordinary(out, written)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".lustrain-export-", dir=out.parent) as work:
        if "://" not in source and local.is_file():
            model_dir = _extract(local, Path(work) / "model")
        elif source.startswith("s3://"):
            model_dir = download(s3(), source, Path(work))
        elif "://" in source or "/" in source or source.endswith(".tar.gz"):
            raise UsageInvalid.one(
                "MODEL", source, "is not a model directory, model.tar.gz, s3:// location or run"
            )
        else:
            model_dir = download(s3(), model_uri_of_run(stack(), source), Path(work))
        files: list[str] = writer.export(model_dir, out, dtype, limit)
        return _ordinary(out, files)
