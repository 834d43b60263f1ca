"""register_job: read and check the job spec, plan the run, and record the job once (duplicates end cleanly).

Input: the S3 "Object Created" EventBridge event of a spec dropped into the jobs bucket, or {"spec": {...}} /
{"spec_s3_uri": "s3://..."}; the state machine adds "execution". Output: $.job.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.steps import job

logger = Logger(service="lustrain")


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    source = job.parse_start(event)
    result = job.register_job(
        source,
        s3=clients.client("s3"),
        ddb=clients.client("dynamodb"),
        ec2=clients.client("ec2"),
        fsx=clients.client("fsx"),
        sagemaker=clients.client("sagemaker"),
        settings=Settings.from_env(),
    )
    logger.info("job registered", extra={"job_id": result["job_id"], "duplicate": result["duplicate"]})
    return result
