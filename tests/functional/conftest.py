"""Functional tests: the handlers against moto, with the twin's patches filling moto's gaps."""

from __future__ import annotations

import dataclasses

import boto3
import pytest
from lustrain_core.config import Settings
from moto import mock_aws

REGION = "us-east-1"
ACCOUNT = "123456789012"


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    s = Settings(
        region=REGION,
        jobs_table="lustrain-test-jobs",
        tokens_table="lustrain-test-tokens",
        artifacts_bucket="lustrain-test-artifacts",
        sagemaker_role_arn=f"arn:aws:iam::{ACCOUNT}:role/lustrain-test-sagemaker",
        notify_topic_arn="",
        stack_name="lustrain-test",
    )
    env = {
        "JOBS_TABLE": s.jobs_table,
        "TOKENS_TABLE": s.tokens_table,
        "ARTIFACTS_BUCKET": s.artifacts_bucket,
        "SAGEMAKER_ROLE_ARN": s.sagemaker_role_arn,
        "STACK_NAME": s.stack_name,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return s


@pytest.fixture
def aws(settings: Settings, monkeypatch: pytest.MonkeyPatch):
    """moto with the twin's patches and the stack's stateful resources (tables, buckets, topic)."""
    from lustrain.twin import patches

    patches.install()
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        ddb.create_table(
            TableName=settings.jobs_table,
            KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        ddb.create_table(
            TableName=settings.tokens_table,
            KeySchema=[{"AttributeName": "training_job_name", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "training_job_name", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=settings.artifacts_bucket)
        topic = boto3.client("sns", region_name=REGION).create_topic(Name="lustrain-test-notify")["TopicArn"]
        monkeypatch.setenv("NOTIFY_TOPIC_ARN", topic)
        yield dataclasses.replace(settings, notify_topic_arn=topic)
