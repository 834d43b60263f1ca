"""The README's examples rehearse on the twin, under its IAM, network and errors, scaled to this machine.

Each keeps what decides how its run is built on AWS (the file system's deployment type and links, the network,
output on Lustre, the tags): what changes is what a 2-core machine cannot hold (50 instances, a 6.4B model, a
week, the team's own buckets), so the code is trainer/ with a tiny preset.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lustrain.twin.rehearse import rehearse, scaled_to_this_machine

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.mark.parametrize("name", ["p4d-2x-scratch.yaml", "p4d-50x-persistent.yaml"])
def test_each_example_rehearses_to_an_archived_model_and_leaves_nothing(name, tmp_path):
    run = rehearse(scaled_to_this_machine(EXAMPLES / name, tmp_path))

    assert run.status == "SUCCEEDED", (run.error, run.cause)
    assert run.resources_left == 0, run.leftovers
    assert "model.tar.gz" in {o["key"].rsplit("/", 1)[-1] for o in run.archive_objects}
