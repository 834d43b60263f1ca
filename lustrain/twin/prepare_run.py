"""A data preparation run on the twin's SageMaker Processing, with what the stack would give it: a private subnet
that reaches S3 through a gateway endpoint, the trainer package's bundle as the code, the run's own role
(steps/prepare_role: it reads the code and the source and writes the output only), and the stages driven by
steps/prepare.advance.

Used by the test that holds a two-instance run to a local one (tests/functional/test_prepare_processing.py) and by
the twin's benchmark (bench/prepare_twin.py). The caller has moto's mock (or server) and the twin's patches in
place. The stack's own path (the state machine's, from `lustrain data prepare ... --stack`) is
tests/e2e/test_prepare_run.py's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
from lustrain_core import aws_requests, prepare_plan
from lustrain_core.config import Settings
from lustrain_core.images import prepare_image
from lustrain_core.launch_plan import TAG_CREATED_BY, TAG_JOB_ID
from lustrain_core.steps import prepare, prepare_role, records
from lustrain_core.steps.code import build_bundle

from lustrain.twin.patches import processing

ACCOUNT = "123456789012"
TRAINER = Path(__file__).resolve().parents[2] / "trainer"
BOUNDARY_NAME = "lustrain-twin-prepare-boundary"


@dataclass
class Finished:
    """A run's stages as SageMaker described them at their end, and what it wrote under OUT."""

    looks: list[dict[str, Any]] = field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    written: dict[str, bytes] = field(default_factory=dict)

    def seconds(self, stage: str) -> float:
        job = self.jobs[stage]
        start, end = job["ProcessingStartTime"], job["ProcessingEndTime"]
        assert isinstance(start, datetime) and isinstance(end, datetime)
        return (end - start).total_seconds()


def trainer_files(root: Path = TRAINER) -> list[tuple[str, bytes]]:
    """The trainer package as upload_code bundles it (what `lustrain submit` uploads of trainer/)."""
    return [
        (path.relative_to(root).as_posix(), path.read_bytes())
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    ]


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def boundary_policy(iam: Any) -> str:
    """A permissions boundary for the run's role as wide as the stack's PrepareProcessingBoundary is at most: the
    role's own policy (steps/prepare_role) is what scopes it."""
    document = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["s3:*", "logs:*", "ec2:*", "ecr:*", "kms:*"], "Resource": "*"}],
    }
    try:
        found = iam.create_policy(PolicyName=BOUNDARY_NAME, PolicyDocument=json.dumps(document))
    except iam.exceptions.EntityAlreadyExistsException:
        return f"arn:aws:iam::{ACCOUNT}:policy/{BOUNDARY_NAME}"
    return str(found["Policy"]["Arn"])


def run_on_twin(
    run: prepare_plan.PrepareRun,
    corpus: Iterable[tuple[str, bytes]],
    settings: Settings,
    *,
    region: str = "us-east-1",
    code_bucket: str = "lustrain-twin-prepare-code",
    timeout_s: float = 900.0,
) -> Finished:
    """Put `corpus` (keys relative to run.source) in S3, build the network and the role, and run every stage of
    `run` to its end (PrepareFailed for one that fails); what the run wrote under run.output."""
    s3 = boto3.client("s3", region_name=region)
    src_bucket, src_prefix = _split(run.source)
    out_bucket, out_prefix = _split(run.output)
    for bucket in sorted({src_bucket, out_bucket, code_bucket}):
        s3.create_bucket(Bucket=bucket)
    for key, body in corpus:
        s3.put_object(Bucket=src_bucket, Key=src_prefix + key, Body=body)
    code_prefix = f"code/{run.job_id}/"
    code_key = f"{code_prefix}bundle/sourcedir.tar.gz"
    s3.put_object(Bucket=code_bucket, Key=code_key, Body=build_bundle(trainer_files()))

    ec2 = boto3.client("ec2", region_name=region)
    vpc = ec2.create_vpc(CidrBlock="10.82.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.82.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName=f"{run.job_id}-prep", Description="prepare", VpcId=vpc)[
        "GroupId"
    ]
    table = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["RouteTables"][0]
    ec2.create_vpc_endpoint(
        VpcId=vpc,
        ServiceName=f"com.amazonaws.{region}.s3",
        VpcEndpointType="Gateway",
        RouteTableIds=[table["RouteTableId"]],
    )
    iam = boto3.client("iam", region_name=region)
    settings = replace(settings, extra={**settings.extra, prepare_role.BOUNDARY_SETTING: boundary_policy(iam)})
    code_uri = f"s3://{code_bucket}/{code_key}"
    tags = [{"Key": TAG_JOB_ID, "Value": run.job_id}, {"Key": TAG_CREATED_BY, "Value": settings.stack_name}]

    ddb = boto3.client("dynamodb", region_name=region)
    if settings.jobs_table not in ddb.list_tables()["TableNames"]:
        ddb.create_table(
            TableName=settings.jobs_table,
            KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
    records.put_new(ddb, settings.jobs_table, records.JobRecord(job_id=run.job_id))
    sm = boto3.client("sagemaker", region_name=region)

    def role_of() -> str:
        # the run's own role, as the stack's looks make it; the twin's IAM has no delay to wait out, so the second
        # call finds it ready
        for _ in range(2):
            arn = prepare_role.ensure(
                iam, ddb, run, code_s3_uri=code_uri, image_uri=prepare_image(region), tags=tags, settings=settings
            )
            if arn is not None:
                return arn
        raise RuntimeError(f"the role of {run.job_id} is not ready after it was made")

    def request_of(stage: str, role: str) -> dict[str, Any]:
        return aws_requests.prepare_job(
            run,
            stage,
            role_arn=role,
            image_uri=prepare_image(region),
            code_s3_uri=code_uri,
            subnet_id=subnet,
            security_group_ids=[group],
            tags=tags,
            settings=settings,
        )

    def advance(done: list[str]) -> dict[str, Any]:
        return prepare.advance(
            run, done, sagemaker=sm, ddb=ddb, settings=settings, request_of=request_of, role_of=role_of
        )

    finished = Finished()
    look = advance([])
    finished.looks.append(look)
    while look["stage"] is not None:
        stage = str(look["stage"])
        name = run.job_name(stage)
        if not processing.jobs(ACCOUNT, region)[name]._done.wait(timeout_s):
            raise TimeoutError(f"{name} did not end in {timeout_s} s")
        finished.jobs[stage] = dict(sm.describe_processing_job(ProcessingJobName=name))
        look = advance(look["done"])
        finished.looks.append(look)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=out_bucket, Prefix=out_prefix):
        for item in page.get("Contents", []):
            body = s3.get_object(Bucket=out_bucket, Key=item["Key"])["Body"].read()
            finished.written[item["Key"][len(out_prefix) :]] = body
    return finished
