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

import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lustrain_core.errors import UsageInvalid

MODEL_ARCHIVE = "model.tar.gz"


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise UsageInvalid.one("MODEL", uri, "is not an s3:// location (s3://BUCKET/KEY)")
    return bucket, key


def _extract(archive: Path, into: Path) -> Path:
    """A model.tar.gz's files in `into` (members that would land outside it are refused: the "data" filter)."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise UsageInvalid.one("MODEL", str(archive), f"is not a readable model.tar.gz: {exc}") from exc
    return into


def download(s3: Any, uri: str, into: Path) -> Path:
    """The model at an s3:// URI (a .tar.gz object, or a prefix of the model's files) as a local directory."""
    bucket, key = _split(uri)
    if key.endswith(".tar.gz"):
        archive = into / MODEL_ARCHIVE
        s3.download_file(bucket, key, str(archive))
        return _extract(archive, into / "model")
    prefix = key if key.endswith("/") or not key else key + "/"
    target = into / "model"
    found = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            relative = item["Key"][len(prefix) :]
            if not relative or relative.endswith("/") or ".." in Path(relative).parts:
                continue
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, item["Key"], str(target / relative))
            found += 1
    if not found:
        raise UsageInvalid.one(
            "MODEL", uri, "holds no object (a model.tar.gz, or a prefix of a model's files)"
        )
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
        return written
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
        return files
