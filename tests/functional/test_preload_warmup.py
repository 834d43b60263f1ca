"""data.preload on moto with the twin's FSx and SageMaker: once the file system and its links are AVAILABLE,
check_filesystem's poll loop starts the warm-up job (one CPU instance in the run's subnet and security group, the
data mounted read-only, a command that reads every file), reports PRELOADING while it runs and AVAILABLE once it has
Completed; a warm-up that fails fails the file system; teardown stops one still running; a reused file system is
warmed up too."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from infra_support import DATA, REGION, MinuteLeft, invoke, job_record, register, seed_data, spec
from lustrain_core import aws_requests
from lustrain_core.errors import FileSystemFailed
from training_support import calls_of, held_training_jobs, move_job

from lustrain.twin import faults
from lustrain.twin.patches import fsx as twin_fsx
from lustrain.twin.simulator.events import LOG_GROUP

POLL = {"initial_seconds": 20, "max_seconds": 5, "max_polls": 12}
PRELOADING = spec(data={"preload": True})


@pytest.fixture(autouse=True)
def _clean_twin():
    faults.clear()
    twin_fsx.configure(polls=1)
    yield
    faults.clear()


def sagemaker():
    return boto3.client("sagemaker", region_name=REGION)


def prepared(spec_doc: dict[str, Any]) -> dict[str, Any]:
    document = register(spec_doc)
    document["network"] = invoke("create_network", document)
    document["poll"] = POLL
    document["filesystem"] = invoke("create_filesystem", document)
    return document


def until(document: dict[str, Any], lifecycle: str) -> list[dict[str, Any]]:
    """Run the poll loop as the state machine does until `lifecycle`; every check's result."""
    checks = []
    while document["filesystem"]["lifecycle"] != lifecycle:
        assert len(checks) < POLL["max_polls"], checks
        document["filesystem"] = invoke("check_filesystem", document)
        checks.append(document["filesystem"])
    return checks


def test_the_warm_up_starts_once_the_file_system_is_ready_and_the_loop_waits_for_it(aws):
    with held_training_jobs():
        document = prepared(PRELOADING)
        job_id = document["job"]["job_id"]
        until(document, "PRELOADING")
        name = document["job"]["launch"]["preload"]["name"]
        assert name == f"tiny-{job_id.rsplit('-', 1)[1]}-warmup"
        assert document["filesystem"]["ready"] is False

        described = sagemaker().describe_training_job(TrainingJobName=name)
        assert described["ResourceConfig"]["InstanceType"] == "ml.m5.xlarge"
        assert described["ResourceConfig"]["InstanceCount"] == 1
        assert described["AlgorithmSpecification"]["TrainingImage"].endswith(
            "/pytorch-training:2.8-cpu-py312"
        )
        assert described["AlgorithmSpecification"]["ContainerEntrypoint"] == aws_requests.PRELOAD_ENTRYPOINT
        (channel,) = described["InputDataConfig"]
        source = channel["DataSource"]["FileSystemDataSource"]
        assert source["FileSystemId"] == document["filesystem"]["file_system_id"]
        assert source["FileSystemAccessMode"] == "ro"
        assert source["DirectoryPath"] == document["filesystem"]["directory_path"]
        assert described["VpcConfig"] == {
            "Subnets": [document["network"]["subnet_id"]],
            "SecurityGroupIds": document["network"]["security_group_ids"],
        }
        tags = {
            t["Key"]: t["Value"]
            for t in sagemaker().list_tags(ResourceArn=described["TrainingJobArn"])["Tags"]
        }
        assert tags["lustrain:job-id"] == job_id and tags["Name"] == name
        # in the ledger, where teardown and the sweeper look for the run's training jobs
        assert {"type": "training_job", "id": name} in job_record(aws.jobs_table, job_id)["resources"]

        # another look while it runs starts nothing more, and paces the looks to outlast its MaxRuntimeInSeconds
        with calls_of(sagemaker()) as calls:
            document["filesystem"] = invoke("check_filesystem", document)
        assert document["filesystem"]["lifecycle"] == "PRELOADING"
        assert "CreateTrainingJob" not in [op for op, _ in calls]
        polls = document["filesystem"]["polls"]
        runtime = described["StoppingCondition"]["MaxRuntimeInSeconds"]
        assert document["filesystem"]["wait_seconds"] * (POLL["max_polls"] - polls - 1) >= runtime

        move_job(name, "Completed", "Completed")
        document["filesystem"] = invoke("check_filesystem", document)
        assert (document["filesystem"]["lifecycle"], document["filesystem"]["ready"]) == ("AVAILABLE", True)


def test_a_run_without_preload_starts_no_warm_up(aws):
    with held_training_jobs():
        document = prepared(spec())
        until(document, "AVAILABLE")
        assert document["job"]["launch"]["preload"] is None
        assert sagemaker().list_training_jobs()["TrainingJobSummaries"] == []


@pytest.mark.parametrize("status", ["Failed", "Stopped"])
def test_a_warm_up_that_does_not_complete_fails_the_file_system_with_its_reason(aws, status):
    with held_training_jobs():
        document = prepared(PRELOADING)
        until(document, "PRELOADING")
        name = document["job"]["launch"]["preload"]["name"]
        move_job(
            name, status, status, "ClientError: the data could not be read" if status == "Failed" else None
        )
        with pytest.raises(FileSystemFailed) as failed:
            invoke("check_filesystem", document)
    assert name in str(failed.value) and status in str(failed.value) and "data.preload" in str(failed.value)
    if status == "Failed":
        assert "the data could not be read" in str(failed.value)


def test_teardown_stops_a_warm_up_still_running_and_leaves_nothing(aws):
    with held_training_jobs():
        document = prepared(PRELOADING)
        until(document, "PRELOADING")
        name = document["job"]["launch"]["preload"]["name"]
        assert sagemaker().describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "InProgress"
        del document["poll"]
        document["error"] = {"Error": "FileSystemFailed", "Cause": "the run was stopped"}

        result = invoke("teardown", document, MinuteLeft())

        assert sagemaker().describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "Stopped"
        assert {"type": "training_job", "id": name} in result["stopped"]
        assert result["remaining"] == []
        assert job_record(aws.jobs_table, document["job"]["job_id"])["resources"] == []


def test_the_sweeper_finds_a_running_warm_up_by_its_tags(aws):
    from lustrain_core.steps.sweep import find_tagged

    with held_training_jobs():
        document = prepared(PRELOADING)
        until(document, "PRELOADING")
        name = document["job"]["launch"]["preload"]["name"]
        found = find_tagged(
            boto3.client("ec2", region_name=REGION),
            boto3.client("fsx", region_name=REGION),
            sagemaker(),
            aws.stack_name,
        )
    assert {"type": "training_job", "id": name} in found[document["job"]["job_id"]]


def test_a_reused_file_system_is_warmed_up_too(aws):
    # allowed, not refused: files already loaded are read from Lustre at its pace, and what FSx released
    # (AUTO_RELEASE_DATA) is loaded again
    from test_filesystem import team_file_system

    with held_training_jobs():
        base = register(spec())
        base["network"] = invoke("create_network", base)
        fs_id = team_file_system(base)
        again = register(
            spec(data={"preload": True}, filesystem={"file_system_id": fs_id}), execution="reuse"
        )
        document = {**again, "network": base["network"], "poll": POLL}
        document["filesystem"] = invoke("create_filesystem", document)
        assert document["filesystem"]["lifecycle"] != "AVAILABLE"
        until(document, "PRELOADING")
        name = document["job"]["launch"]["preload"]["name"]
        source = sagemaker().describe_training_job(TrainingJobName=name)["InputDataConfig"][0]["DataSource"]
        assert source["FileSystemDataSource"]["FileSystemId"] == fs_id


def test_the_twin_runs_the_warm_up_which_reads_every_file_and_completes(aws):
    from lustrain.twin import simulator

    seed_data()
    document = prepared(PRELOADING)
    until(document, "PRELOADING")
    name = document["job"]["launch"]["preload"]["name"]
    assert name in [v.name for v in simulator.wait_all(timeout=120)]
    described = sagemaker().describe_training_job(TrainingJobName=name)
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    logs = boto3.client("logs", region_name=REGION)
    (stream,) = logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{name}/")[
        "logStreams"
    ]
    lines = [
        e["message"]
        for e in logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=stream["logStreamName"])["events"]
    ]
    # the rehearsal's data: three files under the linked prefix, each read through the read-only mount
    assert f"warm-up: {len(DATA)} files read" in lines, lines
    document["filesystem"] = invoke("check_filesystem", document)
    assert document["filesystem"]["lifecycle"] == "AVAILABLE"
