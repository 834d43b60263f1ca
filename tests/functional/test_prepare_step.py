"""The prepare handler (steps/prepare.look) on the twin: a registered kind: prepare run, in its network and with
the trainer package's bundle as its code, is looked at until every stage's processing job Completed, and writes
its shards and index under OUT; a document that is not a preparation's, or a stack without the processing role,
is refused before anything is created."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from infra_support import REGION, any_role, invoke
from lustrain_core.config import Settings
from lustrain_core.errors import SpecInvalid
from lustrain_core.steps.code import build_bundle

from lustrain.twin import simulator
from lustrain.twin.patches import processing
from lustrain.twin.prepare_run import trainer_files

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
}


@pytest.fixture
def twin(aws: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    previous = simulator.settings()
    simulator.configure(start_delay_s=0.05, work_root=tmp_path / "jobs")
    role = any_role(
        boto3.client("iam", region_name=REGION), "lustrain-test-prepare", "sagemaker.amazonaws.com"
    )
    monkeypatch.setenv("LUSTRAIN_PREPARE_ROLE_ARN", role)
    try:
        yield aws
    finally:
        simulator.reset()
        simulator.configure(**{f: getattr(previous, f) for f in previous.__dataclass_fields__})


def network() -> dict[str, Any]:
    """A private subnet that reaches S3 through a gateway endpoint, as create_network makes."""
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.82.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.82.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="prep", Description="prepare", VpcId=vpc)["GroupId"]
    table = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["RouteTables"][0]
    ec2.create_vpc_endpoint(
        VpcId=vpc,
        ServiceName=f"com.amazonaws.{REGION}.s3",
        VpcEndpointType="Gateway",
        RouteTableIds=[table["RouteTableId"]],
    )
    return {"vpc_id": vpc, "subnet_id": subnet, "security_group_ids": [group], "created": True}


def registered(settings: Settings) -> dict[str, Any]:
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    for key, body in CORPUS.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    job = invoke("register_job", {"execution": "prep-1", "input": {"spec": SPEC}})
    key = f"code/{job['job_id']}/0123/sourcedir.tar.gz"
    s3.put_object(Bucket=settings.artifacts_bucket, Key=key, Body=build_bundle(trainer_files()))
    code = {"submit_directory": f"s3://{settings.artifacts_bucket}/{key}"}
    return {"job": job, "network": network(), "code": code}


def test_a_registered_preparation_is_looked_at_until_every_stage_completed(twin):
    document = registered(twin)
    job_id = document["job"]["job_id"]
    sm = boto3.client("sagemaker", region_name=REGION)

    looks = [invoke("prepare", document)]
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
        "wait_seconds": 0,
    }
    work = sm.describe_processing_job(ProcessingJobName=f"{job_id}-prep-work")
    assert work["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 2
    assert work["NetworkConfig"]["VpcConfig"]["Subnets"] == [document["network"]["subnet_id"]]
    tags = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=work["ProcessingJobArn"])["Tags"]}
    assert tags == {"team": "data", "lustrain:job-id": job_id, "lustrain:created-by": twin.stack_name}
    s3 = boto3.client("s3", region_name=REGION)
    index = json.loads(s3.get_object(Bucket=BUCKET, Key="shards/index.json")["Body"].read())
    assert (index["tokenizer"]["kind"], index["source"]["bytes"]) == ("bytes", sum(map(len, CORPUS.values())))
    written = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="shards/")["Contents"]]
    assert any(key.endswith(".bin") for key in written)


def test_a_training_document_or_a_stack_without_the_processing_role_is_refused_before_anything_starts(
    twin, monkeypatch
):
    document = registered(twin)
    training = {**document, "job": {**document["job"], "spec": {"name": "corpus"}}}
    with pytest.raises(SpecInvalid) as exc:
        invoke("prepare", training)
    assert [e.path for e in exc.value.errors] == ["job.spec.kind"]
    with pytest.raises(SpecInvalid) as exc:
        invoke("prepare", {**document, "prepare": {"done": ["train"]}})
    assert [e.path for e in exc.value.errors] == ["prepare.done"]
    monkeypatch.delenv("LUSTRAIN_PREPARE_ROLE_ARN")
    with pytest.raises(ValueError, match="LUSTRAIN_PREPARE_ROLE_ARN"):
        invoke("prepare", document)
    assert (
        boto3.client("sagemaker", region_name=REGION).list_processing_jobs()["ProcessingJobSummaries"] == []
    )
