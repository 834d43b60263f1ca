"""An archive in bounded time, whatever the model's size: a model declared as 200 GB (the twin's S3 reports the
size without holding the bytes) is archived by on_training_event without a byte of it read or copied, in both of
SageMaker's forms (one model.tar.gz, or the model's files under output/model/), and S3 refuses what it refuses."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.exceptions import ClientError
from infra_support import REGION, invoke
from lustrain_core import clients
from lustrain_core.steps.job import split_s3_uri
from test_on_training_event import completed_description, started, state_change, stub_describe, uploader
from training_support import calls_of

from lustrain.twin.patches.s3 import COPY_SOURCE_TOO_LARGE, crc64nvme_base64, declare_size

__all__ = ["started"]  # the fixture, shared with test_on_training_event

GB = 10**9
#: what the archive may read: its own manifest (to find an archive already written), nothing of the model
READS = {"GetObject", "GetObjectAttributes", "SelectObjectContent", "RestoreObject"}
COPIES = {"CopyObject", "UploadPartCopy", "CreateMultipartUpload"}


def _job_output(name: str) -> tuple[str, str]:
    described = boto3.client("sagemaker", region_name=REGION).describe_training_job(TrainingJobName=name)
    bucket, base = split_s3_uri(described["OutputDataConfig"]["S3OutputPath"], "S3OutputPath")
    return bucket, f"{base}{name}/output/"


def _archive_recording(name: str, description: dict) -> tuple[dict, list[tuple[str, dict]]]:
    with stub_describe(description), calls_of(clients.client("s3")) as s3_calls:
        answered = invoke("on_training_event", state_change(name, "Completed"))
    assert answered["callback"] == "send_task_success"
    return answered, s3_calls


def _manifest(settings, job_id: str) -> dict:
    body = boto3.client("s3", region_name=REGION).get_object(
        Bucket=settings.artifacts_bucket, Key=f"archive/{job_id}/manifest.json"
    )["Body"]
    return json.loads(body.read())


def _no_model_byte_read(s3_calls, job_id: str) -> None:
    reads = [params.get("Key") for op, params in s3_calls if op in READS]
    # the run's stop request (was it asked to stop?) and the archive's own manifest: no byte of the model
    assert reads == [f"control/{job_id}/stop-request.json", f"archive/{job_id}/manifest.json"], reads
    assert not [op for op, _ in s3_calls if op in COPIES]


def test_a_200_gb_model_tar_gz_is_archived_without_a_byte_read_or_copied(started):
    settings, name, job_id = started["settings"], started["name"], started["job_id"]
    description = completed_description(name)
    bucket, prefix = _job_output(name)
    declare_size(bucket, prefix + "model.tar.gz", 200 * GB)

    answered, s3_calls = _archive_recording(name, description)

    _no_model_byte_read(s3_calls, job_id)
    manifest = _manifest(settings, job_id)
    model = next(o for o in manifest["objects"] if o["role"] == "model")
    assert model["s3_uri"] == f"s3://{bucket}/{prefix}model.tar.gz"
    assert model["s3_uri"].startswith(answered["output"]["archive_s3_uri"])
    assert model["size"] == 200 * GB
    assert model["checksum"]["algorithm"] == "CRC64NVME" and model["checksum"]["type"] == "FULL_OBJECT"


def test_an_uncompressed_200_gb_model_is_archived_file_by_file_without_a_byte_read(started):
    """CompressionType NONE: S3ModelArtifacts is the prefix output/model/, /opt/ml/output/data's files are under
    output/data/; the manifest lists every object with its size and S3's checksum."""
    settings, name, job_id = started["settings"], started["name"], started["job_id"]
    description = completed_description(name)
    bucket, prefix = _job_output(name)
    s3 = uploader()
    shards = {f"model-{i:05d}-of-00004.safetensors": f"shard {i}".encode() for i in range(1, 5)}
    files = {
        **{f"model/{k}": v for k, v in shards.items()},
        "model/config.json": b"{}",
        "data/seen.json": b"[]",
    }
    for key, body in files.items():
        s3.put_object(Bucket=bucket, Key=prefix + key, Body=body)
    for shard in shards:
        declare_size(bucket, f"{prefix}model/{shard}", 50 * GB)
    description["ModelArtifacts"] = {"S3ModelArtifacts": f"s3://{bucket}/{prefix}model/"}

    _, s3_calls = _archive_recording(name, description)

    _no_model_byte_read(s3_calls, job_id)
    manifest = _manifest(settings, job_id)
    listed = {o["s3_uri"].removeprefix(f"s3://{bucket}/{prefix}"): o for o in manifest["objects"]}
    assert set(files) <= set(listed)
    assert sum(listed[f"model/{shard}"]["size"] for shard in shards) == 200 * GB
    for key, body in files.items():
        assert listed[key]["checksum"] == {
            "algorithm": "CRC64NVME",
            "value": crc64nvme_base64(body),
            "type": "FULL_OBJECT",
        }
        assert listed[key]["role"] == ("output" if key.startswith("data/") else "model")
    assert manifest["model_s3_uri"] == f"s3://{bucket}/{prefix}model/" and manifest["missing"] == []


def test_a_model_changed_after_it_was_archived_is_not_taken_for_the_archive(started):
    """Same size, other bytes: S3's checksum differs from the manifest's, so a repeated event archives again."""
    settings, name, job_id = started["settings"], started["name"], started["job_id"]
    description = completed_description(name)
    from lustrain_core.steps.archive import archive_training_job

    target = f"s3://{settings.artifacts_bucket}/archive/{job_id}/"
    s3 = clients.client("s3")
    first = archive_training_job(s3, dict(description), target, job_id)
    bucket, prefix = _job_output(name)
    size = next(o["size"] for o in first["objects"] if o["role"] == "model")
    uploader().put_object(Bucket=bucket, Key=prefix + "model.tar.gz", Body=b"X" * size)

    again = archive_training_job(s3, dict(description), target, job_id)

    assert again != first
    model = next(o for o in again["objects"] if o["role"] == "model")
    assert model["checksum"]["value"] == crc64nvme_base64(b"X" * size)


def test_an_older_runs_model_outside_the_archive_is_listed_where_it_is_not_copied(started):
    from training_support import RESULTS_BUCKET

    settings, name, job_id = started["settings"], started["name"], started["job_id"]
    description = completed_description(name, bucket=RESULTS_BUCKET)

    _, s3_calls = _archive_recording(name, description)

    _no_model_byte_read(s3_calls, job_id)
    model = next(o for o in _manifest(settings, job_id)["objects"] if o["role"] == "model")
    assert model["s3_uri"] == f"s3://{RESULTS_BUCKET}/tiny/{name}/output/model.tar.gz"


def test_s3_refuses_to_copy_a_source_over_5_gb_in_one_copy_object(started):
    name = started["name"]
    completed_description(name)
    bucket, prefix = _job_output(name)
    s3 = boto3.client("s3", region_name=REGION)
    s3.copy_object(
        Bucket=bucket, Key="elsewhere/small", CopySource={"Bucket": bucket, "Key": prefix + "model.tar.gz"}
    )
    declare_size(bucket, prefix + "model.tar.gz", 5 * 2**30 + 1)

    with pytest.raises(ClientError) as refused:
        s3.copy_object(
            Bucket=bucket,
            Key="elsewhere/large",
            CopySource={"Bucket": bucket, "Key": prefix + "model.tar.gz"},
        )

    error = refused.value.response
    assert error["Error"]["Code"] == "InvalidRequest"
    assert error["Error"]["Message"] == COPY_SOURCE_TOO_LARGE
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="elsewhere/large")
