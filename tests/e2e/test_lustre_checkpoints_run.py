"""checkpoints.to_filesystem, carried through the real state machine with the real trainer: the checkpoints are
written to the run's Lustre file system, a second attempt after a hardware failure resumes from them there, and
the run's exports put them in its checkpoint prefix in S3 before the file system is deleted. The same run uploads
its model uncompressed (output.compression: none), as a giant run would: both land in S3 with 0 resources left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lustrain.twin.rehearse import operator_session, rehearse

pytestmark = pytest.mark.slow

QUICK = Path(__file__).with_name("quick.yaml")


def test_checkpoints_on_lustre_resume_there_and_reach_s3_before_the_file_system_goes(tmp_path):
    doc = yaml.safe_load(QUICK.read_text())
    doc["name"] = "ckpt-lustre"
    doc["code"]["hyperparameters"].update({"checkpoint_interval": 2})
    doc["checkpoints"] = {"to_filesystem": True}
    # checkpoints on Lustre need a file system that survives a file server's failure
    doc.setdefault("filesystem", {})["deployment_type"] = "persistent"
    doc["output"]["compression"] = "none"
    spec = tmp_path / "ckpt-lustre.yaml"
    spec.write_text(yaml.safe_dump(doc))
    jobs: list[dict[str, Any]] = []
    tasks: list[dict[str, Any]] = []
    keys: list[str] = []

    def inspect(stack: Any, result: Any) -> None:
        session = operator_session()
        sagemaker = session.client("sagemaker")
        jobs.extend(
            sagemaker.describe_training_job(TrainingJobName=a["training_job_name"]) for a in result.attempts
        )
        tasks.extend(session.client("fsx").describe_data_repository_tasks()["DataRepositoryTasks"])
        prefix = f"default/{result.job_id}/checkpoints/"
        listed = session.client("s3").list_objects_v2(Bucket="lustrain-example-results", Prefix=prefix)
        keys.extend(o["Key"][len(prefix) :] for o in listed.get("Contents", []))

    run = rehearse(spec, inject=["start_training:hardware-failure"], inspect=inspect)

    assert (run.status, run.resources_left) == ("SUCCEEDED", 0), (run.error, run.cause, run.leftovers)
    first, second = run.attempts
    assert (first["outcome"], second["outcome"]) == ("Failed", "Completed")
    # the second attempt found the first's checkpoint on Lustre: SageMaker synced nothing (no CheckpointConfig)
    assert 2 <= second["resumed_from"] <= first["step_reached"] and second["step_reached"] == 6
    for job in jobs:
        assert "CheckpointConfig" not in job
        channels = {c["ChannelName"]: c["DataSource"] for c in job["InputDataConfig"]}
        lustre = channels["checkpoints"]["FileSystemDataSource"]
        assert lustre["FileSystemAccessMode"] == "rw"
        assert lustre["DirectoryPath"].endswith(f"/lustrain-checkpoints/{run.job_id}")
    assert jobs[0]["InputDataConfig"] == jobs[1]["InputDataConfig"]
    # one export when the first attempt ended, one before the file system was deleted; both succeeded
    labels = sorted(next(t["Value"] for t in task["Tags"] if t["Key"] == "lustrain:export") for task in tasks)
    assert labels == ["attempt-1", "teardown"]
    assert all(task["Lifecycle"] == "SUCCEEDED" and task["Status"]["SucceededCount"] > 0 for task in tasks)
    # the file system is gone and the final checkpoint (manifest and shards) is in the run's checkpoint prefix
    assert "step-000000006.json" in keys, keys
    assert any(k.startswith("step-000000006-") and k.endswith(".distcp") for k in keys), keys
    # the model's files, uncompressed, under the run's archive
    archived = {o["key"] for o in run.archive_objects}
    model_files = {k.split("/output/model/", 1)[1] for k in archived if "/output/model/" in k}
    assert {"model.pt", "config.json"} <= model_files, archived
