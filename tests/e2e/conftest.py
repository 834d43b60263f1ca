"""What the end-to-end tests share: runs that train until they are stopped, and trainers that stop quickly (the local
MLflow tracking server, `mlflow_server`, is tests/conftest.py's: functional tests of `local up` use it too)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

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
