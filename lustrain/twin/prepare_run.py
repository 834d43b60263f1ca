"""A data preparation run on the twin's SageMaker Processing, with what the stack would give it: a private subnet
that reaches S3 through a gateway endpoint, the trainer package's bundle as the code, a role SageMaker may assume
that reads the code and the source and writes the output only, and the stages driven by steps/prepare.advance.

Used by the test that holds a two-instance run to a local one (tests/functional/test_prepare_processing.py) and by
the twin's benchmark (bench/prepare_twin.py). The caller has moto's mock (or server) and the twin's patches in
place. The stack's own path (the state machine's, from `lustrain data prepare ... --stack`) is
tests/e2e/test_prepare_run.py's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
from lustrain_core import aws_requests, prepare_plan
from lustrain_core.config import Settings
from lustrain_core.images import prepare_image
from lustrain_core.steps import prepare, records
from lustrain_core.steps.code import build_bundle

from lustrain.twin.patches import processing
from lustrain.twin.patches.sagemaker import VPC_ACTIONS

ACCOUNT = "123456789012"
TRAINER = Path(__file__).resolve().parents[2] / "trainer"
ROLE_NAME = "lustrain-prepare"


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


def _role(iam: Any, run: prepare_plan.PrepareRun, code_bucket: str, code_prefix: str) -> str:
    src_bucket, src_prefix = _split(run.source)
    out_bucket, out_prefix = _split(run.output)
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "sagemaker.amazonaws.com"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    try:
        arn = str(
            iam.create_role(RoleName=ROLE_NAME, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
        )
    except iam.exceptions.EntityAlreadyExistsException:
        arn = str(iam.get_role(RoleName=ROLE_NAME)["Role"]["Arn"])
    buckets = sorted({src_bucket, out_bucket, code_bucket})
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": [f"arn:aws:s3:::{b}" for b in buckets],
            },
            {
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": [
                    f"arn:aws:s3:::{src_bucket}/{src_prefix}*",
                    f"arn:aws:s3:::{out_bucket}/{out_prefix}*",
                    f"arn:aws:s3:::{code_bucket}/{code_prefix}*",
                ],
            },
            {
                "Effect": "Allow",
                "Action": ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": f"arn:aws:s3:::{out_bucket}/{out_prefix}*",
            },
            {
                "Effect": "Allow",
                "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": "arn:aws:logs:*:*:log-group:/aws/sagemaker/ProcessingJobs*",
            },
            {"Effect": "Allow", "Action": [f"ec2:{a}" for a in VPC_ACTIONS], "Resource": "*"},
        ],
    }
    iam.put_role_policy(RoleName=ROLE_NAME, PolicyName="prepare", PolicyDocument=json.dumps(policy))
    return arn


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
    role = _role(boto3.client("iam", region_name=region), run, code_bucket, code_prefix)

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

    def request_of(stage: str) -> dict[str, Any]:
        return aws_requests.prepare_job(
            run,
            stage,
            role_arn=role,
            image_uri=prepare_image(region),
            code_s3_uri=f"s3://{code_bucket}/{code_key}",
            subnet_id=subnet,
            security_group_ids=[group],
            tags=[{"Key": "lustrain:job-id", "Value": run.job_id}],
            settings=settings,
        )

    finished = Finished()
    look = prepare.advance(run, [], sagemaker=sm, ddb=ddb, settings=settings, request_of=request_of)
    finished.looks.append(look)
    while look["stage"] is not None:
        stage = str(look["stage"])
        name = run.job_name(stage)
        if not processing.jobs(ACCOUNT, region)[name]._done.wait(timeout_s):
            raise TimeoutError(f"{name} did not end in {timeout_s} s")
        finished.jobs[stage] = dict(sm.describe_processing_job(ProcessingJobName=name))
        look = prepare.advance(
            run, look["done"], sagemaker=sm, ddb=ddb, settings=settings, request_of=request_of
        )
        finished.looks.append(look)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=out_bucket, Prefix=out_prefix):
        for item in page.get("Contents", []):
            body = s3.get_object(Bucket=out_bucket, Key=item["Key"])["Body"].read()
            finished.written[item["Key"][len(out_prefix) :]] = body
    return finished
