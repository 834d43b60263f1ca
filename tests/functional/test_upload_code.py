"""upload_code on moto: the code under code.source becomes one sourcedir.tar.gz per content, uploaded once."""

from __future__ import annotations

import hashlib
import io
import tarfile

import boto3
import pytest
from infra_support import REGION, invoke, register, spec
from lustrain_core import clients
from lustrain_core.errors import SpecInvalid
from training_support import CODE_BUCKET, calls_of

CODE = {
    "train.py": b"from lustrain_trainer.trainer import main\nmain()\n",
    "lustrain_trainer/__init__.py": b"",
    "lustrain_trainer/trainer.py": b"def main():\n    print('train_loss=1.0')\n",
    "requirements.txt": b"numpy\n",
}


def put_code(prefix: str = "tiny/", files: dict[str, bytes] | None = None) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    if CODE_BUCKET not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=CODE_BUCKET)
    for name, body in (CODE if files is None else files).items():
        s3.put_object(Bucket=CODE_BUCKET, Key=prefix + name, Body=body)


def bundle_at(bucket: str, key: str) -> bytes:
    return boto3.client("s3", region_name=REGION).get_object(Bucket=bucket, Key=key)["Body"].read()


def test_the_code_is_stored_under_its_content_hash_as_sagemaker_unpacks_it(aws):
    doc = register()
    put_code()

    code = invoke("upload_code", doc)

    body = bundle_at(code["bucket"], code["key"])
    assert code["sha256"] == hashlib.sha256(body).hexdigest()
    # under the run's own id: a training job may read only its own run's code
    assert code["key"] == f"code/{doc['job']['job_id']}/{code['sha256']}/sourcedir.tar.gz"
    assert code["submit_directory"] == f"s3://{aws.artifacts_bucket}/{code['key']}"
    assert code["uploaded"] is True and code["metric_definitions"] == []
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        assert {m.name: tar.extractfile(m).read() for m in tar.getmembers()} == CODE


def test_an_existing_bundle_is_not_uploaded_again(aws):
    doc = register()
    put_code()
    first = invoke("upload_code", doc)

    with calls_of(clients.client("s3")) as calls:
        second = invoke("upload_code", doc)

    assert second["key"] == first["key"] and second["uploaded"] is False
    # the bundle is not written again (the run's stop request is written only if absent: If-None-Match)
    puts = [params for op, params in calls if op == "PutObject"]
    assert all(p["Key"].startswith("control/") and p.get("IfNoneMatch") == "*" for p in puts), puts


def test_a_bundle_planted_at_the_key_is_replaced_not_reused(aws):
    """Whoever could write the key cannot have a run take other bytes for its code: the object there is reused only
    when S3's own SHA-256 of it is the bundle's (the key's name and the object's metadata prove nothing)."""
    doc = register()
    put_code()
    honest = invoke("upload_code", doc)
    s3 = boto3.client("s3", region_name=REGION)
    planted = b"import os; os.system('exfiltrate')"
    s3.put_object(
        Bucket=honest["bucket"], Key=honest["key"], Body=planted, Metadata={"sha256": honest["sha256"]}
    )

    again = invoke("upload_code", doc)

    assert again["key"] == honest["key"] and again["uploaded"] is True
    body = bundle_at(again["bucket"], again["key"])
    assert body != planted and hashlib.sha256(body).hexdigest() == honest["sha256"]


def test_identical_code_uploaded_again_later_gives_identical_bytes(aws):
    """S3 gives the re-uploaded objects new LastModified times; the bundle must not depend on them."""
    doc = register()
    put_code("tiny/")
    first = invoke("upload_code", doc)
    put_code("tiny-copy/")
    doc["job"]["spec"]["code"]["source"] = f"s3://{CODE_BUCKET}/tiny-copy/"

    second = invoke("upload_code", doc)

    assert second["sha256"] == first["sha256"]
    assert bundle_at(second["bucket"], second["key"]) == bundle_at(first["bucket"], first["key"])


def test_changed_code_gets_a_new_key(aws):
    doc = register()
    put_code()
    first = invoke("upload_code", doc)
    put_code(files={"train.py": b"print('changed')\n"})

    second = invoke("upload_code", doc)

    assert second["key"] != first["key"] and second["uploaded"] is True


def test_a_missing_entry_point_is_refused_when_the_run_registers_before_anything_exists(aws):
    with pytest.raises(SpecInvalid) as info:
        register(spec(code={"source": f"s3://{CODE_BUCKET}/tiny/", "entry_point": "main.py"}))
    (error,) = info.value.errors
    assert error.path == "code.entry_point" and "not found under code.source" in error.message
    assert boto3.client("ec2", region_name=REGION).describe_vpcs(Filters=[{"Name": "tag-key", "Values": ["lustrain:job-id"]}])["Vpcs"] == []


def test_a_missing_entry_point_at_upload_names_the_python_files_there(aws):
    doc = register()
    put_code(files={k: v for k, v in CODE.items() if k != "train.py"})
    boto3.client("s3", region_name=REGION).delete_object(Bucket=CODE_BUCKET, Key="tiny/train.py")
    with pytest.raises(SpecInvalid) as info:
        invoke("upload_code", doc)
    (error,) = info.value.errors
    assert error.path == "code.entry_point"
    assert "lustrain_trainer/trainer.py" in error.message


def test_an_empty_code_prefix_is_refused_at_code_source_when_the_run_registers(aws):
    with pytest.raises(SpecInvalid) as info:
        register(spec(code={"source": f"s3://{CODE_BUCKET}/empty/"}))
    assert info.value.errors[0].path == "code.source" and "no objects" in info.value.errors[0].message


def test_the_trainers_own_metric_definitions_are_returned_for_start_training(aws):
    import json

    from lustrain_trainer.metrics import metric_definitions

    doc = register()
    put_code(files={**CODE, "metric_definitions.json": json.dumps(metric_definitions()).encode()})

    code = invoke("upload_code", doc)

    assert code["metric_definitions"] == metric_definitions()
    assert 0 < len(code["metric_definitions"]) <= 40
