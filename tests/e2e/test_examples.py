"""The README's examples rehearse on the twin, under its IAM, network and errors, scaled to this machine.

Each keeps what decides how its run is built on AWS (the file system's deployment type and links, the network,
output on Lustre, the tags): what changes is what a 2-core machine cannot hold (50 instances, a 6.4B model, a
week, the team's own buckets), so the code is trainer/ with a tiny preset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lustrain.twin.rehearse import rehearse

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).parents[2] / "examples"


def scaled(example: Path, into: Path) -> Path:
    spec: dict[str, Any] = yaml.safe_load(example.read_text())
    spec["compute"].update(instance_count=min(spec["compute"]["instance_count"], 2), max_runtime_hours=1)
    spec["code"] = {
        "source": "trainer/",
        "hyperparameters": {"preset": "tiny", "max_steps": 6, "log_interval": 2},
    }
    spec["data"]["size_gib"] = min(float(spec["data"].get("size_gib", 1)), 1.0)
    spec["output"]["expected_size_gib"] = 0.1
    spec.pop("budget", None)
    path = into / example.name
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("name", ["p4d-2x-scratch.yaml", "p4d-50x-persistent.yaml"])
def test_each_example_rehearses_to_an_archived_model_and_leaves_nothing(name, tmp_path):
    run = rehearse(scaled(EXAMPLES / name, tmp_path))

    assert run.status == "SUCCEEDED", (run.error, run.cause)
    assert run.resources_left == 0, run.leftovers
    assert "model.tar.gz" in {o["key"] for o in run.archive_objects}
