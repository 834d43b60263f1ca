"""S3 as a training job's own code reaches it on the twin (lustrain/twin/simulator/objects.py): the job's SDK, pointed
at its stand-in by AWS_ENDPOINT_URL_S3, gets, puts, deletes and lists objects, each call authorized as the job's role
and refused with S3's own AccessDenied where the role may not (tests/e2e/test_secrets.py runs a job whose code does
this with the real template's role)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from lustrain.twin.simulator.objects import ObjectEndpoint
from lustrain.twin.simulator.storage import JobStorage

BUCKET = "team-results"
MINE = "default/mine-0000aaaa/"


def authorize(service: str, operation: str, params: dict[str, Any]) -> None:
    """A role that may reach only its own run's folder, as the training role's grant does."""
    where = params.get("Key", params.get("Prefix", ""))
    if not str(where).startswith(MINE):
        raise ClientError(
            {"Error": {"Code": "AccessDenied", "Message": f"not allowed: {operation} {where}"},
             "ResponseMetadata": {"HTTPStatusCode": 403}},
            operation,
        )  # fmt: skip


@pytest.fixture
def job_s3() -> Iterator[Any]:
    with mock_aws():
        operator = boto3.client("s3", region_name="us-east-1")
        operator.create_bucket(Bucket=BUCKET)
        operator.put_object(Bucket=BUCKET, Key="default/other-0000bbbb/checkpoints/step-1.pt", Body=b"theirs")
        stand_in = ObjectEndpoint(JobStorage("123456789012", authorize), reachable=True)
        stand_in.start()
        try:
            url = stand_in.environment()["AWS_ENDPOINT_URL_S3"]
            yield boto3.client("s3", region_name="us-east-1", endpoint_url=url), operator
        finally:
            stand_in.close()


def refused(call: Any, **params: Any) -> str:
    with pytest.raises(ClientError) as exc:
        call(**params)
    return str(exc.value.response["Error"]["Code"])


def test_a_job_puts_lists_gets_and_deletes_in_its_own_folder(job_s3):
    job, operator = job_s3
    job.put_object(Bucket=BUCKET, Key=MINE + "notes/a.txt", Body=b"hello")
    assert operator.get_object(Bucket=BUCKET, Key=MINE + "notes/a.txt")["Body"].read() == b"hello"
    listed = job.list_objects_v2(Bucket=BUCKET, Prefix=MINE)
    assert [(o["Key"], o["Size"]) for o in listed["Contents"]] == [(MINE + "notes/a.txt", 5)]
    assert job.get_object(Bucket=BUCKET, Key=MINE + "notes/a.txt")["Body"].read() == b"hello"
    job.delete_object(Bucket=BUCKET, Key=MINE + "notes/a.txt")
    assert operator.list_objects_v2(Bucket=BUCKET, Prefix=MINE)["KeyCount"] == 0
    assert refused(job.get_object, Bucket=BUCKET, Key=MINE + "notes/a.txt") == "NoSuchKey"


def test_another_runs_folder_is_refused_for_every_call_and_left_as_it_was(job_s3):
    job, operator = job_s3
    theirs = "default/other-0000bbbb/checkpoints/step-1.pt"
    assert refused(job.get_object, Bucket=BUCKET, Key=theirs) == "AccessDenied"
    assert refused(job.put_object, Bucket=BUCKET, Key=theirs, Body=b"planted") == "AccessDenied"
    assert refused(job.delete_object, Bucket=BUCKET, Key=theirs) == "AccessDenied"
    assert refused(job.list_objects_v2, Bucket=BUCKET, Prefix="default/other-0000bbbb/") == "AccessDenied"
    assert operator.get_object(Bucket=BUCKET, Key=theirs)["Body"].read() == b"theirs"


def test_what_the_stand_in_does_not_serve_is_refused_not_taken_for_a_plain_call(job_s3):
    """A tagging PUT, a CopyObject, a multipart upload or a listing with a delimiter is not served: refused as not
    implemented, never a plain PutObject of the request's body (or a plain listing)."""
    job, operator = job_s3
    mine = MINE + "notes/a.txt"
    job.put_object(Bucket=BUCKET, Key=mine, Body=b"hello")
    assert refused(job.put_object_tagging, Bucket=BUCKET, Key=mine,
                   Tagging={"TagSet": [{"Key": "k", "Value": "v"}]}) == "NotImplemented"  # fmt: skip
    assert refused(job.copy_object, Bucket=BUCKET, Key=MINE + "copy",
                   CopySource={"Bucket": BUCKET, "Key": "default/other-0000bbbb/checkpoints/step-1.pt"}) == (
        "NotImplemented")  # fmt: skip
    assert refused(job.create_multipart_upload, Bucket=BUCKET, Key=MINE + "big") == "NotImplemented"
    assert refused(job.list_objects_v2, Bucket=BUCKET, Prefix=MINE, Delimiter="/") == "NotImplemented"
    assert operator.get_object(Bucket=BUCKET, Key=mine)["Body"].read() == b"hello"
    assert operator.list_objects_v2(Bucket=BUCKET, Prefix=MINE + "copy")["KeyCount"] == 0
