"""The archive of a completed training job: its results gathered under s3://<artifacts>/<ARCHIVE_PREFIX><job id>/.

    jobs/<training job>/output/  what SageMaker uploaded there itself (OutputDataConfig.S3OutputPath is
                                 launch_plan.model_output_path): model.tar.gz and output.tar.gz (CompressionType
                                 GZIP), or the files of /opt/ml/model under model/ and of /opt/ml/output/data
                                 under data/ (NONE)
    describe_training_job.json   the job's DescribeTrainingJob (datetimes as ISO 8601)
    final_metrics.json           its FinalMetricDataList
    manifest.json                every object above with its size and S3's checksum of it, written last

No byte of the model passes through the archive: SageMaker writes the model straight under the archive, so nothing
is copied (a CopyObject source may not exceed 5 GB, and a server-side copy of hundreds of GB would not end within
a Lambda's 900 s either), and nothing is read back to be hashed. Each object's integrity is the checksum S3 keeps
with it (HeadObject with ChecksumMode ENABLED): S3 validates a checksum the uploader sends and stores it, and
computes a full-object CRC64NVME itself for an object uploaded without one (S3 User Guide, "Checking object
integrity"). The manifest records that checksum (its algorithm, value and type: FULL_OBJECT, or COMPOSITE for a
multipart upload's checksum of part checksums), the ETag, the version and the size. The archive's time is one
ListObjectsV2 page per thousand objects and one HeadObject per object, whatever their size. A model a job of an
older run uploaded outside the archive (its results location) is listed where it is, with its checksum, and not
copied.

manifest.json is written only once everything else is in place, so a manifest this archive wrote means the archive
is complete: a repeated event finds it and archives nothing again. A manifest is trusted only when it is one:
it names this job (job id, training job name, this archive's location) and every object it lists is there, under
the archive (or the job's own output location), with the size and checksum it gives (HeadObject: a repeated event
never reads a model's bytes). Anything else found there (a manifest planted by whoever could write the prefix, or
one of an archive cut short) is not taken for the archive: the archive is written again, over it. Only the stack's
on_training_event writes the archive's own files; a training job's role writes only under its own run's jobs/
(the session tag lustrain-run), where the manifest is not.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core.aws_errors import not_found
from lustrain_core.steps.job import split_s3_uri
from lustrain_core.steps.records import now_iso

MANIFEST = "manifest.json"
DESCRIPTION = "describe_training_job.json"
FINAL_METRICS = "final_metrics.json"
#: S3's checksum algorithms, in the order the manifest prefers one when an object has several
CHECKSUMS = ("CRC64NVME", "SHA256", "SHA1", "CRC32C", "CRC32")
#: HeadObject calls made at once for a model of many files (an uncompressed model)
HEAD_CONCURRENCY = 16


def _json_bytes(value: Any) -> bytes:
    def iso(obj: Any) -> str:
        if isinstance(obj, datetime | date):
            return obj.isoformat()
        raise TypeError(f"{type(obj).__name__} is not JSON serialisable")

    return json.dumps(value, indent=2, sort_keys=True, default=iso).encode()


def checksum_of(response: dict[str, Any]) -> dict[str, str] | None:
    """The checksum S3 gives for an object (HeadObject with ChecksumMode ENABLED, PutObject's answer): algorithm,
    base64 value and type; None when S3 has none for it (an object stored before S3 added default checksums)."""
    for algorithm in CHECKSUMS:
        value = response.get(f"Checksum{algorithm}")
        if value:
            return {
                "algorithm": algorithm,
                "value": str(value),
                "type": str(response.get("ChecksumType") or ""),
            }
    return None


def _same_checksum(found: dict[str, str] | None, listed: Any) -> bool:
    """Whether S3's checksum of an object is the one a manifest lists (algorithm and value; a listed None: S3
    had none when the archive was written)."""
    if listed is None:
        return True
    if found is None or not isinstance(listed, dict):
        return False
    return (found["algorithm"], found["value"]) == (listed.get("algorithm"), listed.get("value"))


def _head(s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    try:
        return dict(s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED"))
    except ClientError as exc:
        if not_found(exc):
            return None
        raise


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


def job_output_dir(model_uri: str) -> str:
    """The training job's output location (…/<training job>/output/) from its S3ModelArtifacts: the object
    …/output/model.tar.gz (GZIP) or the prefix …/output/model/ (NONE)."""
    return model_uri.rstrip("/").rsplit("/", 1)[0] + "/"


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
    model_uri = (description.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    homes = [location] + ([job_output_dir(str(model_uri))] if model_uri else [])
    names = {str(obj.get("name")) for obj in objects if isinstance(obj, dict)}
    if not {DESCRIPTION, FINAL_METRICS} <= names:
        return False
    for obj in objects:
        uri = str(obj.get("s3_uri", "")) if isinstance(obj, dict) else ""
        if not any(uri.startswith(home) for home in homes):
            return False
        obj_bucket, key = split_s3_uri(uri, "manifest.objects.s3_uri")
        head = _head(s3, obj_bucket, key)
        if head is None or int(head["ContentLength"]) != obj.get("size"):
            return False
        if not _same_checksum(checksum_of(head), obj.get("checksum")):
            return False
    return True


def _entry(bucket: str, key: str, head: dict[str, Any], location: str, role: str) -> dict[str, Any]:
    uri = f"s3://{bucket}/{key}"
    return {
        "name": uri[len(location) :] if uri.startswith(location) else uri,
        "role": role,
        "s3_uri": uri,
        "size": int(head["ContentLength"]),
        "etag": str(head.get("ETag", "")).strip('"'),
        "checksum": checksum_of(head),
        # the artifacts bucket is versioned: the version archived stays readable if the key is written again
        "version_id": head.get("VersionId"),
    }


def _listed(s3: Any, uri: str, location: str, role: str) -> list[dict[str, Any]]:
    """Every object under the prefix `uri`, each with its HeadObject (no byte read)."""
    bucket, prefix = split_s3_uri(uri, "ModelArtifacts.S3ModelArtifacts")
    keys = [
        obj["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for obj in page.get("Contents", [])
    ]
    with ThreadPoolExecutor(max_workers=HEAD_CONCURRENCY) as pool:
        heads = list(pool.map(lambda key: _head(s3, bucket, key), keys))
    return [_entry(bucket, key, head, location, role) for key, head in zip(keys, heads, strict=True) if head]


def _one(s3: Any, uri: str, location: str, role: str) -> list[dict[str, Any]]:
    bucket, key = split_s3_uri(uri, "ModelArtifacts.S3ModelArtifacts")
    head = _head(s3, bucket, key)
    return [] if head is None else [_entry(bucket, key, head, location, role)]


def job_outputs(s3: Any, model_uri: str, location: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The objects SageMaker uploaded for a job whose S3ModelArtifacts is `model_uri`, and the locations expected
    but absent: model.tar.gz and output.tar.gz beside it (GZIP: SageMaker tars even an empty /opt/ml/output/data),
    or the model/ and data/ prefixes (NONE: an empty /opt/ml/output/data leaves no object, and is not missing)."""
    found: list[dict[str, Any]] = []
    missing: list[str] = []
    if model_uri.endswith("/"):
        wanted = [(model_uri, "model", True), (job_output_dir(model_uri) + "data/", "output", False)]
        look = _listed
    else:
        wanted = [(model_uri, "model", True), (job_output_dir(model_uri) + "output.tar.gz", "output", True)]
        look = _one
    for uri, role, expected in wanted:
        objects = look(s3, uri, location, role)
        found.extend(objects)
        if not objects and expected:
            missing.append(uri)
    return found, missing


def _write(s3: Any, bucket: str, key: str, body: bytes, location: str, role: str) -> dict[str, Any]:
    answer = s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
    head = {**answer, "ContentLength": len(body)}
    return _entry(bucket, key, head, location, role)


def archive_training_job(s3: Any, description: dict[str, Any], target: str, job_id: str) -> dict[str, Any]:
    """Archive a completed job under `target` (an s3:// prefix) once; returns the manifest."""
    bucket, prefix = split_s3_uri(target, "archive_target")
    prefix = prefix if prefix.endswith("/") or not prefix else prefix + "/"
    location = f"s3://{bucket}/{prefix}"
    existing = _read_manifest(s3, bucket, prefix + MANIFEST)
    if existing is not None and _is_ours(s3, existing, description, job_id, bucket, prefix):
        return existing

    objects: list[dict[str, Any]] = []
    missing: list[str] = []
    model_uri = (description.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    if model_uri:
        objects, missing = job_outputs(s3, str(model_uri), location)
    objects.append(
        _write(s3, bucket, prefix + DESCRIPTION, _json_bytes(description), location, "description")
    )
    metrics = _json_bytes(description.get("FinalMetricDataList", []))
    objects.append(_write(s3, bucket, prefix + FINAL_METRICS, metrics, location, "final_metrics"))

    manifest = {
        "job_id": job_id,
        "training_job_name": description.get("TrainingJobName"),
        "training_job_status": description.get("TrainingJobStatus"),
        "archive_s3_uri": location,
        "archived_at": now_iso(),
        "model_s3_uri": model_uri,
        "objects": objects,
        "missing": missing,
    }
    s3.put_object(
        Bucket=bucket, Key=prefix + MANIFEST, Body=_json_bytes(manifest), ContentType="application/json"
    )
    return manifest
