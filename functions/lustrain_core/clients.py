"""The one place that builds boto3 clients. Steps take clients as arguments; handlers get them here."""

from __future__ import annotations

import os
from functools import cache
from typing import Any

import boto3
from botocore.config import Config

# Standard retry mode retries throttling and 5xx inside each call before Step Functions ever sees them.
_BOTO_CONFIG = Config(retries={"max_attempts": 5, "mode": "standard"}, user_agent_extra="lustrain")


def client(service: str, region: str | None = None) -> Any:
    """A cached boto3 client; honours AWS_ENDPOINT_URL so the local twin's server is reached.

    A client signs with the credentials it was built with, so clients are cached per access key too: in the local
    twin every function runs in one process, each with its own execution role's credentials."""
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return _client(service, region, os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_ENDPOINT_URL"))


@cache
def _client(service: str, region: str, access_key: str | None, endpoint: str | None) -> Any:
    # a session of its own: boto3's default session keeps the credentials it found first
    return boto3.session.Session().client(service, region_name=region, config=_BOTO_CONFIG)


def reset() -> None:
    """Forget cached clients (tests and the twin switch endpoints and credentials)."""
    _client.cache_clear()
