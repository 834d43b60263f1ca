"""Helpers for the infra handlers' functional tests: a job spec, its data in S3, and a registered job."""

from __future__ import annotations

import copy
import importlib
import json
import os
from pathlib import Path
from typing import Any

import boto3
import pytest

from lustrain.twin.cfn import load_template

REGION = "us-east-1"
TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"

SPEC: dict[str, Any] = {
    "name": "tiny",
    "compute": {"instance_type": "ml.p4d.24xlarge", "instance_count": 2, "max_runtime_hours": 1},
    "code": {"source": "s3://lustrain-test-code/tiny/", "entry_point": "train.py"},
    "data": {"s3_uri": "s3://lustrain-test-data/tokens/"},
    "output": {"s3_uri": "s3://lustrain-test-results/tiny/", "expected_size_gib": 1},
    "tags": {"team": "rehearsal"},
}

#: A role for tests whose subject is not IAM: it may do anything (the twin enforces IAM on every call a role makes).
ANYTHING = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def any_role(iam: Any, name: str, *services: str) -> str:
    """The ARN of a role `services` may assume, allowed everything; created once per moto account."""
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": list(services)}, "Action": "sts:AssumeRole"}
        ],
    }
    try:
        arn = str(iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"])
    except iam.exceptions.EntityAlreadyExistsException:
        return str(iam.get_role(RoleName=name)["Role"]["Arn"])
    iam.put_role_policy(RoleName=name, PolicyName="anything", PolicyDocument=json.dumps(ANYTHING))
    return arn


DATA = {"shard-000.bin": b"\x01" * 4096, "shard-001.bin": b"\x02" * 4096, "meta/vocab.json": b'{"a": 1}'}


def stack_resources(
    jobs_table: str,
    tokens_table: str,
    artifacts_bucket: str,
    env: pytest.MonkeyPatch,
    queue_table: str = "lustrain-test-queue",
) -> str:
    """On moto, the stack's stateful resources the handlers use: the jobs, task-token and capacity-queue tables
    (QUEUE_TABLE is set to the last), the artifacts
    bucket, the notification topic (NOTIFY_TOPIC_ARN is set to it) and the training jobs' execution role
    (SAGEMAKER_ROLE_ARN's); returns the topic's ARN."""
    ddb = boto3.client("dynamodb", region_name=REGION)
    resources = load_template(TEMPLATE)["Resources"]
    env.setenv("QUEUE_TABLE", queue_table)
    tables = ((jobs_table, "JobsTable"), (tokens_table, "TaskTokensTable"), (queue_table, "CapacityQueueTable"))
    for table, logical_id in tables:
        # as the template defines them: keys and indexes (the handlers query the jobs table's by-execution)
        props = resources[logical_id]["Properties"]
        ddb.create_table(
            TableName=table,
            **{k: props[k] for k in ("KeySchema", "AttributeDefinitions", "GlobalSecondaryIndexes") if k in props},
            BillingMode="PAY_PER_REQUEST",
        )
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=artifacts_bucket)
    topic: str = boto3.client("sns", region_name=REGION).create_topic(Name=f"{jobs_table}-notify")["TopicArn"]
    env.setenv("NOTIFY_TOPIC_ARN", topic)
    role = os.environ.get("SAGEMAKER_ROLE_ARN")
    if role:  # the training jobs' execution role, which SageMaker must be able to assume (the twin checks it)
        any_role(boto3.client("iam", region_name=REGION), role.rsplit("/", 1)[-1], "sagemaker.amazonaws.com")
    return topic


def spec(**sections: Any) -> dict[str, Any]:
    """The test spec with some sections replaced or merged (a dict value merges into that section)."""
    doc = copy.deepcopy(SPEC)
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return doc


def seed_data(uri: str = SPEC["data"]["s3_uri"], files: dict[str, bytes] | None = None) -> None:
    """The data under `uri`, and what register_job checks besides: the test spec's code (its entry point) and the
    bucket its output goes to."""
    s3 = boto3.client("s3", region_name=REGION)
    existing = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    code = SPEC["code"]["source"] + SPEC["code"]["entry_point"]
    output = SPEC["output"]["s3_uri"]
    for where, content in ((uri, DATA if files is None else files), (code, {"": b"print('train')\n"}), (output, {})):
        bucket, _, prefix = where.removeprefix("s3://").partition("/")
        if bucket not in existing:
            s3.create_bucket(Bucket=bucket)
            existing.add(bucket)
        for key, body in content.items():
            s3.put_object(Bucket=bucket, Key=prefix + key, Body=body)


def prepare_spec() -> dict[str, Any]:
    """A kind: prepare spec over a one-file corpus put in the twin's S3 (its bucket holds the source, the code's
    prefix with the module register_job looks for, and the output)."""
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="lustrain-test-corpus")
    s3.put_object(Bucket="lustrain-test-corpus", Key="text/a.txt", Body=b"some text\n")
    s3.put_object(Bucket="lustrain-test-corpus", Key="trainer/lustrain_trainer/prepare.py", Body=b"# entry\n")
    return {
        "kind": "prepare",
        "name": "corpus",
        "source": "s3://lustrain-test-corpus/text/",
        "output": "s3://lustrain-test-corpus/out/",
        "code": "s3://lustrain-test-corpus/trainer/",
    }


def invoke(step: str, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """Call a handler as Lambda would (the module is imported fresh from functions/handlers)."""
    module = importlib.import_module(f"handlers.{step}")
    result: dict[str, Any] = module.handler(event, context)
    return result


class MinuteLeft:
    """A Lambda context with a minute left: teardown (and what tears down with it) may wait about 30 s."""

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def torn_down(settings: Any, job_id: str, sagemaker: Any = None) -> dict[str, Any]:
    """A run's teardown as its step (or the sweeper, for a finished run whose resources are left) runs it, with a
    minute left."""
    from lustrain_core.steps import teardown

    return teardown.teardown_job(
        job_id,
        status="SUCCEEDED",
        error=None,
        ec2=boto3.client("ec2", region_name=REGION),
        fsx=boto3.client("fsx", region_name=REGION),
        ddb=boto3.client("dynamodb", region_name=REGION),
        sagemaker=sagemaker,
        settings=settings,
        clock=teardown.clock_for(MinuteLeft(), settings),
    )


def register(spec_doc: dict[str, Any] | None = None, execution: str = "run-1") -> dict[str, Any]:
    """A registered job as the state document carries it after register_job: {"job": {...}}."""
    seed_data()
    return {"job": invoke("register_job", {"execution": execution, "input": {"spec": spec_doc or spec()}})}


def job_record(table: str, job_id: str) -> dict[str, Any]:
    """The job record's attributes as the jobs table holds them (JobRecord.stored)."""
    from lustrain_core.steps import records

    found = records.get(boto3.client("dynamodb", region_name=REGION), table, job_id)
    assert found is not None, f"no job record for {job_id}"
    return found.stored()


def ours(job_id: str) -> list[dict[str, Any]]:
    return [{"Name": "tag:lustrain:job-id", "Values": [job_id]}]


def count_of_job(job_id: str) -> dict[str, int]:
    """How many of each kind of resource carry the job's tag (the VPC's own main route table excepted): the
    registry's kinds (lustrain_core.resources), as teardown and the sweeper find them."""
    from lustrain_core import resources as registry

    ec2 = boto3.client("ec2", region_name=REGION)
    fsx = boto3.client("fsx", region_name=REGION)
    counts = {
        kind.name: sum(1 for _ in registry.tagged(ec2, kind, {"lustrain:job-id": job_id}))
        for kind in registry.KINDS
        if kind.tag_filter
    }
    file_systems = [
        fs
        for fs in fsx.describe_file_systems()["FileSystems"]
        if {"Key": "lustrain:job-id", "Value": job_id} in fs.get("Tags", []) and registry.present(registry.FILE_SYSTEM, fs)
    ]
    return {
        "vpcs": counts["vpc"],
        "subnets": counts["subnet"],
        "security_groups": counts["security_group"],
        "route_tables": counts["route_table"],
        "endpoints": counts["vpc_endpoint"],
        "file_systems": len(file_systems),
    }


def sfn() -> Any:
    return boto3.client("stepfunctions", region_name=REGION)


def state_machine(name: str) -> str:
    """A state machine of `name` on moto whose executions wait an hour: an execution to stop, or to claim ended."""
    definition = {"StartAt": "Train", "States": {"Train": {"Type": "Wait", "Seconds": 3600, "End": True}}}
    return str(
        sfn().create_state_machine(
            name=name,
            definition=json.dumps(definition),
            roleArn="arn:aws:iam::123456789012:role/lustrain-test-states",
        )["stateMachineArn"]
    )
