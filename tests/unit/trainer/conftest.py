"""The trainer's runs share a prepared data set (the stdlib's *.py) and the trainer as SageMaker extracts it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from lustrain_trainer import prepare as prep

TRAINER = Path(__file__).resolve().parents[3] / "trainer"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    assert prep.main(["stdlib", str(out), "--glob", "**/*.py", "--max-bytes", "2MiB"]) == 0
    return out


def extracted(target: Path) -> Path:
    """trainer/ as SageMaker extracts sourcedir.tar.gz: its contents at the root of the working directory."""
    shutil.copytree(TRAINER, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


@pytest.fixture
def sourcedir(tmp_path: Path) -> Path:
    return extracted(tmp_path / "code")


@pytest.fixture(scope="module")
def module_sourcedir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same, for a module's shared runs."""
    return extracted(tmp_path_factory.mktemp("code") / "code")
