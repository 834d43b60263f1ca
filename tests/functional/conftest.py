"""Functional tests: the handlers against moto, with the twin's patches filling moto's gaps."""

from __future__ import annotations

import dataclasses

import boto3
import pytest
from infra_support import any_role, stack_resources
from lustrain_core import stop_request
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
        queue_table="lustrain-test-queue",
        artifacts_bucket="lustrain-test-artifacts",
        sagemaker_role_arn=f"arn:aws:iam::{ACCOUNT}:role/lustrain-test-sagemaker",
        notify_topic_arn="",
        stack_name="lustrain-test",
    )
    env = {
        "JOBS_TABLE": s.jobs_table,
        "TOKENS_TABLE": s.tokens_table,
        "QUEUE_TABLE": s.queue_table,
        "ARTIFACTS_BUCKET": s.artifacts_bucket,
        "SAGEMAKER_ROLE_ARN": s.sagemaker_role_arn,
        "STACK_NAME": s.stack_name,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # a training job here (held, or a stand-in) reads no stop request: teardown waits a second for it, not a poll
    # and a save's 30 s, before StopTrainingJob (lustrain_core.stop_request)
    monkeypatch.setenv(stop_request.POLL_SETTING, "1")
    monkeypatch.setattr(stop_request, "UNKNOWN_SAVE_SECONDS", 0)
    return s


@pytest.fixture
def aws(settings: Settings, monkeypatch: pytest.MonkeyPatch):
    """moto with the twin's patches and the stack's stateful resources (tables, buckets, topic)."""
    from lustrain.twin import patches

    patches.install()
    with mock_aws():
        topic = stack_resources(
            settings.jobs_table, settings.tokens_table, settings.artifacts_bucket, monkeypatch, settings.queue_table
        )
        # the training jobs' execution role, which SageMaker must be able to assume (the twin checks it)
        any_role(
            boto3.client("iam", region_name=REGION), "lustrain-test-sagemaker", "sagemaker.amazonaws.com"
        )
        yield dataclasses.replace(settings, notify_topic_arn=topic)
