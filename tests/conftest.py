"""Shared test set-up: no test may reach AWS; every client is pointed at fake credentials."""

from __future__ import annotations

import os

import pytest

os.environ.update(
    AWS_ACCESS_KEY_ID="testing",
    AWS_SECRET_ACCESS_KEY="testing",
    AWS_SESSION_TOKEN="testing",
    AWS_DEFAULT_REGION="us-east-1",
    AWS_REGION="us-east-1",
)
os.environ.pop("AWS_PROFILE", None)
os.environ.pop("AWS_ENDPOINT_URL", None)


@pytest.fixture(autouse=True)
def _fresh_clients():
    """boto3 clients are cached per process; each test starts with none."""
    from lustrain_core import clients

    clients.reset()
    yield
    clients.reset()
