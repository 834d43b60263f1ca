"""Carried to a trained model: a hardware failure mid-training starts a second attempt, with the real trainer, on the
same network and file system, from the newest checkpoint (the run policy, lustrain_core.recovery).

The stand-in trainer's runs of the other faults (capacity once, capacity always, the user's own error) are in the
fault matrix (tests/e2e/test_fault_matrix.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lustrain.twin.rehearse import operator_session, rehearse

pytestmark = pytest.mark.slow

QUICK = Path(__file__).with_name("quick.yaml")


def test_a_hardware_failure_after_a_checkpoint_resumes_on_the_same_network_and_file_system(tmp_path):
    doc = yaml.safe_load(QUICK.read_text())
    doc["name"] = "recover"
    doc["code"]["hyperparameters"].update({"checkpoint_interval": 2})
    doc["compute"]["instance_count"] = 2  # a multi-instance job of a type with health checks (asserted below)
    spec = tmp_path / "recover.yaml"
    spec.write_text(yaml.safe_dump(doc))
    jobs: list[dict[str, Any]] = []

    def inspect(stack: Any, result: Any) -> None:
        sagemaker = operator_session().client("sagemaker")
        jobs.extend(
            sagemaker.describe_training_job(TrainingJobName=a["training_job_name"]) for a in result.attempts
        )

    run = rehearse(spec, inject=["start_training:hardware-failure"], inspect=inspect)

    assert (run.status, run.resources_left) == ("SUCCEEDED", 0)
    first, second = run.attempts
    assert (first["outcome"], first["failure_class"], first["error"]) == ("Failed", "infrastructure", "InfrastructureError")
    assert second["outcome"] == "Completed" and second["training_job_name"].endswith("-2")
    # the second attempt started from the checkpoint the first had committed (written in the background, so the
    # first may have trained a step past it before its instance went), and trained to the end
    assert first["resumed_from"] == 0 and 2 <= second["resumed_from"] <= first["step_reached"]
    assert second["step_reached"] == 6
    assert run.goodput is not None and run.goodput >= 6 / (6 + 2)
    # one network and one file system for both attempts, torn down once at the end
    vpc = [j["VpcConfig"] for j in jobs]
    fs = [{c["DataSource"]["FileSystemDataSource"]["FileSystemId"] for c in j["InputDataConfig"]} for j in jobs]
    assert vpc[0] == vpc[1] and fs[0] == fs[1]
    assert jobs[0]["FailureReason"].startswith("InternalServerError")
    assert jobs[0]["CheckpointConfig"] == jobs[1]["CheckpointConfig"]
    # two instances of a type that has them: SageMaker's health checks are on
    assert jobs[1]["InfraCheckConfig"] == {"EnableInfraCheck": True}
