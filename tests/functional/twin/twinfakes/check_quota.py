"""A handler whose module is named after a step of the run, so step faults (throttling) reach it."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.exceptions import ClientError


class AwsThrottled(Exception):
    """Named like lustrain's own error: the state machine retries it."""


calls: list[str] = []


def handler(event: Any, context: Any) -> dict[str, Any]:
    s3 = boto3.client("s3")
    try:
        buckets = s3.list_buckets()["Buckets"]
    except ClientError as exc:
        calls.append(exc.response["Error"]["Code"])
        if exc.response["Error"]["Code"] == "ThrottlingException":
            raise AwsThrottled(str(exc)) from exc
        raise
    calls.append("ok")
    return {"buckets": len(buckets)}
