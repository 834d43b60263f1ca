"""Shared test set-up: no test may reach AWS; every client is pointed at fake credentials."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class MlflowServer:
    url: str

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """MLflow's REST API, as any client reads it (the tests' own reader: not lustrain's)."""
        request = urllib.request.Request(
            f"{self.url}/api/2.0/{path}",
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return dict(json.loads(answer.read() or b"{}"))

    def artifact(self, path: str) -> bytes:
        with urllib.request.urlopen(f"{self.url}/api/2.0/mlflow-artifacts/artifacts/{path}", timeout=30) as answer:
            return bytes(answer.read())


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """A real MLflow tracking server on 127.0.0.1 (`mlflow server`, from the virtualenv `make test` makes for it),
    serving its artifacts as a team's server does; answering once its /health does."""
    root = Path(__file__).resolve().parents[1]
    executable = (root / os.environ.get("LUSTRAIN_MLFLOW", ".venv-mlflow/bin/mlflow")).absolute()
    assert executable.exists(), f"no MLflow server at {executable}: `make test` installs it (.venv-mlflow)"
    home = tmp_path_factory.mktemp("mlflow")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [str(executable), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}", "--artifacts-destination", str(home / "artifacts")],
        cwd=home,
        stdout=(home / "server.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # the server's periodic jobs (LLM judges, trace roll-ups) have nothing to do here
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, "mlflow server ended:\n" + (home / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "mlflow server did not answer:\n" + (home / "server.log").read_text()[-3000:]
                time.sleep(0.2)
        yield MlflowServer(url)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
