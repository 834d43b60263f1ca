"""Fixtures for the twin's patch tests: moto with the patches installed and state machines executed."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from moto import mock_aws

# The tiny handler modules (twinfakes/) and helpers live next to the tests; handlers are imported by name.
HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture
def moto_twin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """moto with every twin patch, executing ASL for real; faults, lifecycles and logs start clean."""
    from twinfakes import check_quota, handlers

    from lustrain.twin import faults, patches
    from lustrain.twin.patches import eventbridge, fsx

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    patches.install()
    faults.clear()
    fsx.configure()
    eventbridge.reset()
    handlers.reset()
    check_quota.calls.clear()
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        yield
        # Deliveries run in threads: let them finish while moto's mock is still in place.
        eventbridge.drain(timeout=30)
    faults.clear()
    fsx.configure()
