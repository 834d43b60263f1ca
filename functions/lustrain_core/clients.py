"""The one place that builds boto3 clients. Steps take clients as arguments; handlers get them here."""

from __future__ import annotations

import os
from functools import cache
from typing import Any

import boto3
from botocore.config import Config

# Standard retry mode retries throttling and 5xx inside each call before Step Functions ever sees them.
_BOTO_CONFIG = Config(retries={"max_attempts": 5, "mode": "standard"}, user_agent_extra="lustrain")


@cache
def client(service: str, region: str | None = None) -> Any:
    """A cached boto3 client; honours AWS_ENDPOINT_URL so the local twin's server is reached."""
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return boto3.client(service, region_name=region, config=_BOTO_CONFIG)


def reset() -> None:
    """Forget cached clients (tests and the twin switch endpoints and credentials)."""
    client.cache_clear()
