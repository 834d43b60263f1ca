"""The prepare handler (steps/prepare.look) on the twin: a registered kind: prepare run, in the network
create_network built for it and with the trainer package's bundle upload_code made of its spec's `code`, is looked at
until every stage's processing job Completed, and writes its shards and index under OUT; a document that is not a
preparation's, a spec without the trainer package, or a stack without the preparation roles' boundary, is refused before
anything is created."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from infra_support import REGION, invoke
from lustrain_core.config import Settings
from lustrain_core.errors import SpecInvalid
from lustrain_core.steps.code import build_bundle

from lustrain.twin import simulator
from lustrain.twin.patches import processing
from lustrain.twin.prepare_run import boundary_policy, trainer_files

ACCOUNT = "123456789012"
BUCKET = "lustrain-test-corpus"
CORPUS = {
    f"text/f{i:02d}.txt": (f"document {i}: the quick brown fox jumps over the lazy dog.\n" * 20).encode()
    for i in range(6)
}
SPEC = {
    "kind": "prepare",
    "name": "corpus",
    "source": f"s3://{BUCKET}/text/",
    "output": f"s3://{BUCKET}/shards/",
    "instances": 2,
    "tags": {"team": "data"},
    "code": f"s3://{BUCKET}/trainer/",
}


@pytest.fixture
def twin(aws: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    previous = simulator.settings()
    simulator.configure(start_delay_s=0.05, work_root=tmp_path / "jobs")
    monkeypatch.setenv("LUSTRAIN_PREPARE_BOUNDARY_ARN", boundary_policy(boto3.client("iam", region_name=REGION)))
    try:
        yield aws
    finally:
        simulator.reset()
        simulator.configure(**{f: getattr(previous, f) for f in previous.__dataclass_fields__})


def registered(spec: dict[str, Any] = SPEC) -> dict[str, Any]:
    """A registered run, as the state machine's prepare path has it when it first looks: its network
    (create_network) and the trainer package's bundle (upload_code) made by their own handlers."""
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    for key, body in CORPUS.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    for name, body in trainer_files():
        s3.put_object(Bucket=BUCKET, Key=f"trainer/{name}", Body=body)
    document = {"job": invoke("register_job", {"execution": "prep-1", "input": {"spec": spec}})}
    document["network"] = invoke("create_network", document)
    return {**document, "code": invoke("upload_code", document)}


def test_a_preparation_gets_its_own_network_and_the_trainer_package_as_its_code(twin):
    document = registered()
    job_id = document["job"]["job_id"]
    ec2 = boto3.client("ec2", region_name=REGION)
    subnet = ec2.describe_subnets(SubnetIds=[document["network"]["subnet_id"]])["Subnets"][0]
    # two instances and five addresses of headroom: a /28 (11 usable) of the run's own VPC
    assert subnet["CidrBlock"] == "10.80.0.0/28"
    tags = {t["Key"]: t["Value"] for t in subnet["Tags"]}
    assert tags["lustrain:job-id"] == job_id and tags["team"] == "data"
    kinds = sorted(r["type"] for r in document["network"]["resources"])
    assert kinds == ["route_table", "security_group", "subnet", "vpc", "vpc_endpoint"]
    s3 = boto3.client("s3", region_name=REGION)
    code = document["code"]
    assert code["key"].startswith(f"code/{job_id}/") and code["files"] == len(trainer_files())
    bundle = s3.get_object(Bucket=code["bucket"], Key=code["key"])["Body"].read()
    assert bundle == build_bundle(trainer_files())


def test_a_preparation_without_the_trainer_package_is_refused_by_upload_code(twin):
    with pytest.raises(SpecInvalid) as exc:
        registered({**SPEC, "code": f"s3://{BUCKET}/text/"})
    assert [e.path for e in exc.value.errors] == ["code"]
    assert "lustrain_trainer/prepare.py" in str(exc.value)


def test_a_registered_preparation_is_looked_at_until_every_stage_completed(twin):
    document = registered()
    job_id = document["job"]["job_id"]
    sm = boto3.client("sagemaker", region_name=REGION)

    # the first look makes the run's own role and starts nothing: IAM may not have spread it yet
    made = invoke("prepare", document)
    assert (made["stage"], made["status"], made["wait_seconds"] > 0) == ("plan", "Pending", True)
    assert sm.list_processing_jobs()["ProcessingJobSummaries"] == []
    looks = [invoke("prepare", {**document, "prepare": made})]
    while looks[-1]["stage"] is not None:
        look = looks[-1]
        assert look["wait_seconds"] > 0 and look["status"] == "InProgress"
        name = f"{job_id}-prep-{look['stage']}"
        assert processing.jobs(ACCOUNT, REGION)[name]._done.wait(300), f"{name} did not end"
        looks.append(invoke("prepare", {**document, "prepare": look}))

    assert [look["stage"] for look in looks] == ["plan", "work", "merge", None]
    assert looks[-1] == {
        "done": ["plan", "work", "merge"],
        "stage": None,
        "status": "Completed",
        "looks": len(looks) + 1,
        "stage_looks": 1,
        "wait_seconds": 0,
    }
    # each look counts the looks at its stage: the waits grow after a stage's first quarter hour
    assert [look["looks"] for look in looks] == list(range(2, len(looks) + 2))
    assert looks[0]["stage_looks"] == 2  # the look that made the role was the plan stage's first
    work = sm.describe_processing_job(ProcessingJobName=f"{job_id}-prep-work")
    assert work["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 2
    assert work["NetworkConfig"]["VpcConfig"]["Subnets"] == [document["network"]["subnet_id"]]
    tags = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=work["ProcessingJobArn"])["Tags"]}
    assert tags == {
        "team": "data",
        "lustrain:job-id": job_id,
        "lustrain:created-by": twin.stack_name,
        "lustrain:team": "default",
    }
    s3 = boto3.client("s3", region_name=REGION)
    index = json.loads(s3.get_object(Bucket=BUCKET, Key="shards/index.json")["Body"].read())
    assert (index["tokenizer"]["kind"], index["source"]["bytes"]) == ("bytes", sum(map(len, CORPUS.values())))
    written = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="shards/")["Contents"]]
    assert any(key.endswith(".bin") for key in written)


def test_a_training_document_or_a_stack_without_the_roles_boundary_is_refused_before_anything_starts(
    twin, monkeypatch
):
    document = registered()
    training = {**document, "job": {**document["job"], "spec": {"name": "corpus"}}}
    with pytest.raises(SpecInvalid) as exc:
        invoke("prepare", training)
    assert [e.path for e in exc.value.errors] == ["job.spec.kind"]
    with pytest.raises(SpecInvalid) as exc:
        invoke("prepare", {**document, "prepare": {"done": ["train"]}})
    assert [e.path for e in exc.value.errors] == ["prepare.done"]
    monkeypatch.delenv("LUSTRAIN_PREPARE_BOUNDARY_ARN")
    with pytest.raises(ValueError, match="LUSTRAIN_PREPARE_BOUNDARY_ARN"):
        invoke("prepare", document)
    assert (
        boto3.client("sagemaker", region_name=REGION).list_processing_jobs()["ProcessingJobSummaries"] == []
    )
    assert boto3.client("iam", region_name=REGION).list_roles(PathPrefix="/lustrain/")["Roles"] == []
