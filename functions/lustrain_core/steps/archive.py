"""The archive of a completed training job: its results gathered under s3://<artifacts>/<ARCHIVE_PREFIX><job id>/.

    model.tar.gz                 copy of ModelArtifacts.S3ModelArtifacts
    output.tar.gz                copy of the output.tar.gz SageMaker writes next to it (when there is one)
    describe_training_job.json   the job's DescribeTrainingJob (datetimes as ISO 8601)
    final_metrics.json           its FinalMetricDataList
    manifest.json                every object above with its size and sha256, written last

manifest.json is written only once everything else is in place, so a manifest this archive wrote means the archive
is complete: a repeated event finds it and archives nothing again. A manifest is trusted only when it is one:
it names this job (job id, training job name, this archive's location) and every object it lists is there, under
the archive, with the size it gives (HeadObject: a repeated event never reads a model's bytes again). Anything else
found there (a manifest planted by whoever could write the prefix, or one of an archive cut short) is not taken for
the archive: the archive is written again, over it. Only the stack's on_training_event may write the archive
prefix (a training job's role writes only its run's output, and no spec may point into archive/), so its content
is not hashed a second time. The sha256 is of the archived bytes, read back after a server-side copy (boto3's managed
copy: multipart beyond 5 GB), as `sha256sum` would print it.
"""

from __future__ import annotations

import hashlib
import json
from datetime import date, datetime
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core.aws_errors import not_found
from lustrain_core.steps.job import split_s3_uri
from lustrain_core.steps.records import now_iso

MANIFEST = "manifest.json"
DESCRIPTION = "describe_training_job.json"
FINAL_METRICS = "final_metrics.json"
_CHUNK = 8 * 2**20


def _json_bytes(value: Any) -> bytes:
    def iso(obj: Any) -> str:
        if isinstance(obj, datetime | date):
            return obj.isoformat()
        raise TypeError(f"{type(obj).__name__} is not JSON serialisable")

    return json.dumps(value, indent=2, sort_keys=True, default=iso).encode()


def _read_manifest(s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if not_found(exc):
            return None
        raise
    try:
        manifest = json.loads(body)
    except ValueError:
        return None  # not a manifest this archive wrote
    return manifest if isinstance(manifest, dict) else None


def _is_ours(
    s3: Any, manifest: dict[str, Any], description: dict[str, Any], job_id: str, bucket: str, prefix: str
) -> bool:
    """Whether a manifest found at the archive is the one this job's archive wrote (see the module's text)."""
    location = f"s3://{bucket}/{prefix}"
    objects = manifest.get("objects")
    if (
        manifest.get("job_id") != job_id
        or manifest.get("training_job_name") != description.get("TrainingJobName")
        or manifest.get("archive_s3_uri") != location
        or not isinstance(objects, list)
    ):
        return False
    names = {str(obj.get("name")) for obj in objects if isinstance(obj, dict)}
    if not {DESCRIPTION, FINAL_METRICS} <= names:
        return False
    for obj in objects:
        uri = str(obj.get("s3_uri", ""))
        if not uri.startswith(location) or "/" in uri[len(location) :]:
            return False
        key = uri.removeprefix(f"s3://{bucket}/")
        try:
            if int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"]) != obj.get("size"):
                return False
        except ClientError as exc:
            if not_found(exc):
                return False
            raise
    return True


def _sha256_of(s3: Any, bucket: str, key: str) -> str:
    digest = hashlib.sha256()
    for chunk in s3.get_object(Bucket=bucket, Key=key)["Body"].iter_chunks(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _copy(s3: Any, source_uri: str, bucket: str, key: str) -> dict[str, Any] | None:
    """Copy one object into the archive; None when the source does not exist."""
    src_bucket, src_key = split_s3_uri(source_uri, "ModelArtifacts.S3ModelArtifacts")
    try:
        size = int(s3.head_object(Bucket=src_bucket, Key=src_key)["ContentLength"])
    except ClientError as exc:
        if not_found(exc):
            return None
        raise
    s3.copy({"Bucket": src_bucket, "Key": src_key}, bucket, key)
    return {
        "name": key.rsplit("/", 1)[-1],
        "s3_uri": f"s3://{bucket}/{key}",
        "size": size,
        "sha256": _sha256_of(s3, bucket, key),
        "source": source_uri,
    }


def _write(s3: Any, bucket: str, key: str, body: bytes) -> dict[str, Any]:
    s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
    return {
        "name": key.rsplit("/", 1)[-1],
        "s3_uri": f"s3://{bucket}/{key}",
        "size": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
    }


def archive_training_job(s3: Any, description: dict[str, Any], target: str, job_id: str) -> dict[str, Any]:
    """Archive a completed job under `target` (an s3:// prefix) once; returns the manifest."""
    bucket, prefix = split_s3_uri(target, "archive_target")
    prefix = prefix if prefix.endswith("/") or not prefix else prefix + "/"
    existing = _read_manifest(s3, bucket, prefix + MANIFEST)
    if existing is not None and _is_ours(s3, existing, description, job_id, bucket, prefix):
        return existing

    objects: list[dict[str, Any]] = []
    missing: list[str] = []
    model_uri = (description.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    if model_uri:
        sources = [model_uri, model_uri.rsplit("/", 1)[0] + "/output.tar.gz"]
        for source, name in zip(sources, ("model.tar.gz", "output.tar.gz"), strict=True):
            copied = _copy(s3, source, bucket, prefix + name)
            if copied is None:
                missing.append(source)
            else:
                objects.append(copied)
    objects.append(_write(s3, bucket, prefix + DESCRIPTION, _json_bytes(description)))
    objects.append(
        _write(s3, bucket, prefix + FINAL_METRICS, _json_bytes(description.get("FinalMetricDataList", [])))
    )

    manifest = {
        "job_id": job_id,
        "training_job_name": description.get("TrainingJobName"),
        "training_job_status": description.get("TrainingJobStatus"),
        "archive_s3_uri": f"s3://{bucket}/{prefix}",
        "archived_at": now_iso(),
        "objects": objects,
        "missing": missing,
    }
    s3.put_object(
        Bucket=bucket, Key=prefix + MANIFEST, Body=_json_bytes(manifest), ContentType="application/json"
    )
    return manifest
