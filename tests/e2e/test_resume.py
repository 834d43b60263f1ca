"""Checkpoints belong to their run: two runs of one spec each train every step, and a run continues another only
when its spec names it (checkpoints.resume_from), checked against the checkpoint's model before anything exists, and
only a run of its own team: another team's run is refused as if it did not exist, its model never told."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from lustrain import operate
from lustrain.twin import rehearse
from lustrain.twin.rehearse import REGION, STACK_NAME, drop, operator_session, twin, until

pytestmark = pytest.mark.slow

QUICK = Path(__file__).with_name("quick.yaml")


def spec_file(tmp_path: Path, label: str, team: str = "default", **hyperparameters: Any) -> Path:
    doc = yaml.safe_load(QUICK.read_text())
    doc["name"] = "ckpt"
    doc["output"]["s3_uri"] = doc["output"]["s3_uri"].replace("/default/", f"/{team}/")
    doc["compute"]["instance_count"] = 1
    doc["code"]["distribution"] = "none"
    resume = hyperparameters.pop("resume_from", None)
    doc["code"]["hyperparameters"].update(hyperparameters)
    if resume:
        doc["checkpoints"] = {"resume_from": resume}
    path = tmp_path / f"{label}.yaml"
    path.write_text(yaml.safe_dump(doc) + f"# {label}\n")  # another object: another run
    return path


def ended(sfn: Any, arn: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        described: dict[str, Any] = sfn.describe_execution(executionArn=arn)
        return None if described["status"] == "RUNNING" else described

    result: dict[str, Any] = until(done, "the end of the run", timeout=300)
    return result


def training_log(job_id: str) -> str:
    logs = boto3.client("logs", region_name=REGION)
    found = logs.filter_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix=f"{job_id}-")
    return "\n".join(e["message"] for e in found["events"])


def test_runs_of_one_spec_each_train_and_only_a_named_run_is_continued(tmp_path):
    from lustrain.twin import simulator
    from lustrain.twin.patches import fsx, service_quotas

    with twin({"Teams": "default,vision"}) as stack:
        service_quotas.set_quota("ml.p4d.24xlarge", 8, REGION)
        fsx.configure(polls=1)
        sfn = boto3.client("stepfunctions", region_name=REGION)
        runs = {}
        for label, extra in (("first", {}), ("second", {})):
            spec, arn = drop(stack, spec_file(tmp_path, label, **extra), key=f"jobs/default/{label}.yaml")
            assert ended(sfn, arn)["status"] == "SUCCEEDED", label
            runs[label] = rehearse.job_id_of(rehearse.execution_history(sfn, arn))
        simulator.wait_all(timeout=60)
        first, second = runs["first"], runs["second"]

        # the same spec twice: the second run trained every step itself, from its own checkpoint location
        assert "completed at step 6" in training_log(second)
        assert "resumed from" not in training_log(second)

        # told to, a run continues the first run's final checkpoint, to a later step
        _, arn = drop(stack, spec_file(tmp_path, "third", max_steps=10, resume_from=first), key="jobs/default/third.yaml")
        assert ended(sfn, arn)["status"] == "SUCCEEDED"
        third = rehearse.job_id_of(rehearse.execution_history(sfn, arn))
        simulator.wait_all(timeout=60)
        log = training_log(third)
        assert f"continuing run {first}" in log and re.search(r"resumed from step-000000006-\w+ at step 6", log)
        assert "completed at step 10" in log

        # a run whose model differs from the checkpoint's is refused at register_job: nothing is created
        spec, arn = drop(stack, spec_file(tmp_path, "fourth", n_layer=3, resume_from=first), key="jobs/default/fourth.yaml")
        described = ended(sfn, arn)
        assert described["status"] == "FAILED" and described["error"] == "SpecInvalid"
        assert "checkpoints.resume_from" in described["cause"] and "n_layer" in described["cause"]
        fourth = rehearse.job_id_of(rehearse.execution_history(sfn, arn))
        assert rehearse.resources_left(fourth, spec) == ([], [])
        # ... and it is a run all the same, named by its execution, its refusal in words (no Lambda error JSON)
        execution = arn.rsplit(":", 1)[-1]
        ours = operate.Stack.locate(STACK_NAME, operator_session())
        refused = {r.job_id: r for r in operate.runs(ours)}[execution]
        assert (refused.name, refused.state, refused.error) == ("fourth", "FAILED", "SpecInvalid")
        shown = operate.status(ours, execution)
        assert shown.cause and shown.cause.startswith("invalid job spec") and "n_layer" in shown.cause
        assert "stackTrace" not in shown.cause and shown.timeline[0].state == "Register the job"

        # a run of another team cannot continue the first run, by its id (refused as a run that does not exist is)
        # or by its checkpoints' location (outside the team's folders), even with a model that differs: the refusal
        # tells nothing of the first run's model
        first_checkpoints = f"s3://lustrain-example-results/default/{first}/checkpoints/"
        for label, named, error, said in (
            ("fifth", first, "SpecInvalid", "no run of team vision"),
            ("sixth", first_checkpoints, "SpecForbidden", "s3://lustrain-example-results/vision/"),
        ):
            spec, arn = drop(
                stack,
                spec_file(tmp_path, label, team="vision", n_layer=3, resume_from=named),
                key=f"jobs/vision/{label}.yaml",
            )
            described = ended(sfn, arn)
            assert (described["status"], described["error"]) == ("FAILED", error), label
            assert said in described["cause"] and "checkpoints.resume_from" in described["cause"], described["cause"]
            assert "n_layer" not in described["cause"] and "preset" not in described["cause"]
            assert rehearse.resources_left(rehearse.job_id_of(rehearse.execution_history(sfn, arn)), spec) == ([], [])
