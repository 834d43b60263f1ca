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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of slow tests first, each file's tests together and in their order: `make test` hands whole files
    to its workers in this order (`--dist loadfile --no-loadscope-reorder`), so the minutes-long files (the fault
    matrix, the budget run, the trainer's multi-process runs) start at once instead of last, when no other file is
    left to run beside them."""
    slow_files = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_files)
