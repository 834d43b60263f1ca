"""What the end-to-end tests share: runs that train until they are stopped, trainers that stop quickly, and a
local MLflow tracking server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

QUICK = Path(__file__).with_name("quick.yaml")


@pytest.fixture
def long_spec(tmp_path: Path) -> Callable[[str], Path]:
    """quick.yaml named `name`, on one instance, with more steps than it will get to run: it is stopped first."""

    def write(name: str) -> Path:
        doc = yaml.safe_load(QUICK.read_text())
        doc["name"] = name
        doc["compute"]["instance_count"] = 1
        doc["code"]["distribution"] = "none"
        doc["code"]["hyperparameters"].update(max_steps=100_000, eval_interval=100_000)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    return write


@pytest.fixture
def quick_stops():
    """The stopped trainer gets 20 s to save (SageMaker gives 120), for this test only."""
    from lustrain.twin import simulator

    before = simulator.settings()
    simulator.configure(stop_grace_s=20.0)
    yield
    simulator.configure(**before.__dict__)


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
    root = Path(__file__).resolve().parents[2]
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
