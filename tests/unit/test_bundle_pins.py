"""The Lambda bundle runs the library versions the tests ran: functions/requirements.txt pins what pyproject.toml
pins, boto3 and botocore included (lustrain_core.limits checks requests against botocore's service models; the
python3.12 runtime's own boto3 is of another date), and the versions installed here are those pins."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _name(requirement: Requirement) -> str:
    return re.sub(r"[-_.]+", "-", requirement.name).lower()


def bundle_requirements() -> dict[str, Requirement]:
    lines = (ROOT / "functions" / "requirements.txt").read_text().splitlines()
    found = [Requirement(line.split("#", 1)[0]) for line in lines if line.split("#", 1)[0].strip()]
    return {_name(r): r for r in found}


def project_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = [Requirement(text) for text in project["dependencies"]]
    return {_name(r): r for r in found}


def _pin(requirement: Requirement) -> str | None:
    specs = list(requirement.specifier)
    return specs[0].version if len(specs) == 1 and specs[0].operator == "==" else None


def test_the_bundle_pins_boto3_and_botocore():
    bundle = bundle_requirements()
    for name in ("boto3", "botocore"):
        assert name in bundle, f"functions/requirements.txt does not bundle {name}"


def test_every_bundle_requirement_is_pinned_exactly_as_pyproject_pins_it():
    bundle, project = bundle_requirements(), project_requirements()
    for name, requirement in bundle.items():
        assert _pin(requirement), f"functions/requirements.txt: {requirement} is not pinned with =="
        assert name in project, (
            f"functions/requirements.txt bundles {name}, which pyproject.toml does not list"
        )
        assert _pin(project[name]) == _pin(requirement), (
            f"{name}: the bundle pins {_pin(requirement)}, pyproject.toml {project[name].specifier or 'nothing'}"
        )


def test_the_tests_run_the_pinned_versions():
    for name, requirement in bundle_requirements().items():
        assert metadata.version(name) == _pin(requirement), (
            f"{name} {metadata.version(name)} is installed, the bundle pins {_pin(requirement)}"
        )
