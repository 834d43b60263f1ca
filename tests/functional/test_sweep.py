"""The sweeper on moto and the twin's FSx and SageMaker: what runs left behind goes, what is running or kept stays.

Each run here is left the way a broken run leaves it: an execution of a (moto, non-executing) state machine, the
job registered under that execution's name, the network and the Lustre file system created, sometimes a training
job held InProgress. The test then stops the execution, or removes the record, and invokes the sweeper.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from infra_support import REGION, count_of_job, invoke, job_record, register, spec
from lustrain_core.steps import records
from training_support import code_section, held_training_jobs

from lustrain.twin.patches import fsx as twin_fsx

NOTHING = {
    "vpcs": 0,
    "subnets": 0,
    "security_groups": 0,
    "route_tables": 0,
    "endpoints": 0,
    "file_systems": 0,
}
POLL = {"initial_seconds": 1, "max_seconds": 1, "max_polls": 20}
SCHEDULED_EVENT = Path(__file__).resolve().parents[2] / "events" / "sweep.json"


class Context:
    """A Lambda context with a minute left: the sweep may wait about 30 s."""

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


@pytest.fixture
def machine(aws, monkeypatch) -> str:
    """The runs' state machine: moto keeps its executions RUNNING until they are stopped."""
    from lustrain.twin import faults

    monkeypatch.setenv("LUSTRAIN_TEARDOWN_POLL_SECONDS", "0.01")
    faults.clear()
    twin_fsx.configure(polls=2)
    definition = {"StartAt": "Train", "States": {"Train": {"Type": "Wait", "Seconds": 3600, "End": True}}}
    arn = sfn().create_state_machine(
        name="lustrain-test-runs",
        definition=json.dumps(definition),
        roleArn="arn:aws:iam::123456789012:role/lustrain-test-states",
    )["stateMachineArn"]
    monkeypatch.setenv("LUSTRAIN_STATE_MACHINE_ARN", arn)
    return str(arn)


def sfn():
    return boto3.client("stepfunctions", region_name=REGION)


def sagemaker():
    return boto3.client("sagemaker", region_name=REGION)


def run(machine: str, spec_doc: dict[str, Any] | None = None, execution: str = "run-1") -> dict[str, Any]:
    """A run as far as its file system (AVAILABLE and linked), its execution still RUNNING."""
    arn = sfn().start_execution(stateMachineArn=machine, name=execution, input="{}")["executionArn"]
    document = register(spec_doc, execution=execution)
    document["execution_arn"] = arn
    document["network"] = invoke("create_network", document)
    document["poll"] = POLL
    document["filesystem"] = invoke("create_filesystem", document)
    while document["filesystem"]["lifecycle"] != "AVAILABLE":
        document["filesystem"] = invoke("check_filesystem", document)
    del document["poll"]
    return document


def sweep() -> dict[str, Any]:
    """The sweeper as its schedule invokes it."""
    return invoke("sweep", json.loads(SCHEDULED_EVENT.read_text()), Context())


def test_a_run_whose_execution_was_stopped_is_swept_and_its_training_job_stopped(machine, aws):
    from lustrain.twin.patches import service_quotas

    service_quotas.set_quota("ml.p4d.24xlarge", 4, REGION)
    with held_training_jobs():
        document = run(machine)
        job_id = document["job"]["job_id"]
        document.update(code=code_section(document["job"]), task_token="t" * 64)
        name = invoke("start_training", document)["training_job_name"]
        sfn().stop_execution(executionArn=document["execution_arn"])

        result = sweep()

        assert sagemaker().describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "Stopped"
    assert count_of_job(job_id) == NOTHING
    swept = {(s["type"], s["id"]): s for s in result["swept"]}
    network = document["network"]
    assert set(swept) == {
        ("training_job", name),
        ("file_system", document["filesystem"]["file_system_id"]),
        ("data_repository_association", document["filesystem"]["links"][0]["association_id"]),
        ("vpc", network["vpc_id"]),
        ("subnet", network["subnet_id"]),
        ("route_table", network["route_table_id"]),
        ("vpc_endpoint", network["endpoint_id"]),
        ("security_group", network["security_group_ids"][0]),
    }
    assert swept[("training_job", name)]["action"] == "stopped"
    assert all(
        s["job_id"] == job_id and "ended ABORTED without a teardown" in s["reason"] for s in swept.values()
    )
    assert (result["kept"], result["skipped"]) == ([], [])
    record = job_record(aws.jobs_table, job_id)
    assert (record["status"], record["resources"], record["error"]["Error"]) == ("FAILED", [], "RunAbandoned")


def test_a_run_whose_execution_still_runs_is_left_alone(machine):
    document = run(machine)
    job_id = document["job"]["job_id"]
    before = count_of_job(job_id)

    result = sweep()

    assert count_of_job(job_id) == before and before["vpcs"] == before["file_systems"] == 1
    (skipped,) = result["skipped"]
    assert skipped["job_id"] == job_id and "still running" in skipped["reason"]
    assert result["swept"] == []


def test_a_run_still_running_past_its_deadline_is_stopped_and_swept(machine, aws):
    from lustrain_core import clients
    from lustrain_core.config import Settings
    from lustrain_core.steps import sweep as sweep_step
    from lustrain_core.steps import teardown

    document = run(machine)
    job_id = document["job"]["job_id"]
    record = records.JobRecord.from_stored(job_record(aws.jobs_table, job_id))
    # the spec's max_runtime_hours is 1 and the default grace 6 h: a day later the run is stuck
    a_day_later = sweep_step.deadline(record, sweep_step.DEFAULT_GRACE_HOURS) + 17 * 3600
    settings = Settings.from_env()

    result = sweep_step.sweep(
        ec2=clients.client("ec2"),
        fsx=clients.client("fsx"),
        sagemaker=clients.client("sagemaker"),
        sfn=clients.client("stepfunctions"),
        ddb=clients.client("dynamodb"),
        settings=settings,
        clock=teardown.clock_for(Context(), settings),
        now=lambda: a_day_later,
    )

    assert sfn().describe_execution(executionArn=document["execution_arn"])["status"] == "ABORTED"
    assert count_of_job(job_id) == NOTHING
    assert result["swept"] and all("past its deadline" in s["reason"] for s in result["swept"])


def test_an_orphan_whose_job_record_is_gone_is_swept(machine, aws):
    document = run(machine)
    job_id = document["job"]["job_id"]
    boto3.client("dynamodb", region_name=REGION).delete_item(
        TableName=aws.jobs_table, Key={"job_id": {"S": job_id}}
    )

    result = sweep()

    assert count_of_job(job_id) == NOTHING
    assert len(result["swept"]) == 7
    assert all(s["reason"] == "no job record: an orphan of this stack" for s in result["swept"])


def test_a_kept_file_system_and_its_network_stay_and_a_second_sweep_changes_nothing(machine, aws):
    document = run(machine, spec(filesystem={"keep": True}))
    job_id = document["job"]["job_id"]
    fs_id = document["filesystem"]["file_system_id"]
    sfn().stop_execution(executionArn=document["execution_arn"])

    first = sweep()
    recorded = job_record(aws.jobs_table, job_id)
    second = sweep()

    kept = {(k["type"], k["id"]): k["reason"] for k in first["kept"]}
    assert kept[("file_system", fs_id)] == "filesystem.keep is true"
    assert kept[("subnet", document["network"]["subnet_id"])] == f"the kept file system {fs_id} lives in it"
    assert first["swept"] == [] == second["swept"]
    assert second["kept"] == first["kept"]
    assert count_of_job(job_id) == dict.fromkeys(NOTHING, 1)
    assert job_record(aws.jobs_table, job_id)["finished_at"] == recorded["finished_at"]


def test_an_orphan_file_system_tagged_keep_stays_though_its_record_is_gone(machine, aws):
    document = run(machine, spec(filesystem={"keep": True}))
    job_id = document["job"]["job_id"]
    fs_id = document["filesystem"]["file_system_id"]
    boto3.client("dynamodb", region_name=REGION).delete_item(
        TableName=aws.jobs_table, Key={"job_id": {"S": job_id}}
    )

    result = sweep()

    fs = boto3.client("fsx", region_name=REGION).describe_file_systems(FileSystemIds=[fs_id])["FileSystems"][
        0
    ]
    assert fs["Lifecycle"] == "AVAILABLE"
    assert {"Key": "lustrain:keep", "Value": "true"} in fs["Tags"]
    assert ("file_system", fs_id) in {(k["type"], k["id"]) for k in result["kept"]}
    assert count_of_job(job_id)["subnets"] == 1


def test_a_finished_run_whose_teardown_gave_up_is_swept_and_keeps_its_status(machine, aws):
    document = run(machine)
    job_id = document["job"]["job_id"]
    ddb = boto3.client("dynamodb", region_name=REGION)
    records.set_fields(ddb, aws.jobs_table, job_id, {"status": "SUCCEEDED"})
    sfn().stop_execution(executionArn=document["execution_arn"])

    result = sweep()

    assert count_of_job(job_id) == NOTHING
    assert all("its teardown did not finish" in s["reason"] for s in result["swept"])
    record = job_record(aws.jobs_table, job_id)
    assert (record["status"], record["resources"], "error" in record) == ("SUCCEEDED", [], False)


def test_what_another_stack_or_nobody_tagged_is_never_touched(machine, aws):
    ec2 = boto3.client("ec2", region_name=REGION)
    other_stack = ec2.create_vpc(
        CidrBlock="10.60.0.0/16",
        TagSpecifications=[
            {
                "ResourceType": "vpc",
                "Tags": [
                    {"Key": "lustrain:job-id", "Value": "gpt-0badc0de"},
                    {"Key": "lustrain:created-by", "Value": "lustrain-prod"},
                ],
            }
        ],
    )["Vpc"]["VpcId"]
    untagged = ec2.create_vpc(CidrBlock="10.61.0.0/16")["Vpc"]["VpcId"]

    result = sweep()

    assert {other_stack, untagged} <= {v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"]}
    assert result == {"swept": [], "kept": [], "skipped": [], "released": [], "ended": []}


class ShortContext:
    """A Lambda context with only its reserve left: nothing may be waited for."""

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def test_a_sweep_out_of_time_reports_what_it_did_and_the_next_one_finishes(machine, aws):
    document = run(machine)
    job_id = document["job"]["job_id"]
    fs_id = document["filesystem"]["file_system_id"]
    sfn().stop_execution(executionArn=document["execution_arn"])

    first = invoke("sweep", {}, ShortContext())

    (skipped,) = first["skipped"]
    assert skipped["job_id"] == job_id and skipped["reason"].startswith("not finished: ")
    assert f"file system {fs_id} is still DELETING" in skipped["reason"]
    assert ("file_system", fs_id) in {(s["type"], s["id"]) for s in first["swept"]}
    assert count_of_job(job_id)["vpcs"] == 1
    # a teardown cut short: `lustrain leftovers` lists what it left, by run, from the same registry
    left = stack_leftovers()
    assert {(x.kind, x.job_id) for x in left.leftovers} >= {("vpc", job_id), ("subnet", job_id)}
    name = document["job"]["spec"]["name"]
    assert all(x.run == name and x.run_status == "FAILED" and not x.kept for x in left.leftovers)

    second = sweep()

    assert count_of_job(job_id) == NOTHING and second["skipped"] == []
    assert {s["type"] for s in second["swept"]} >= {"vpc", "subnet", "security_group"}
    assert stack_leftovers().leftovers == []


def stack_leftovers() -> Any:
    """What `lustrain leftovers` reports of the stack the tests' runs are tagged with."""
    from lustrain_core import leftovers
    from lustrain_core.config import Settings

    settings = Settings.from_env()
    return leftovers.report(
        **{name: boto3.client(name, region_name=REGION) for name in ("ec2", "fsx", "sagemaker", "iam")},
        ddb=boto3.client("dynamodb", region_name=REGION),
        jobs_table=settings.jobs_table,
        stack_name=settings.stack_name,
        region=REGION,
    )


def test_a_job_that_cannot_be_judged_is_reported_and_the_others_are_still_swept(machine, aws):
    broken = run(machine, spec(name="broken"), execution="run-broken")
    fine = run(machine, execution="run-fine")
    ddb = boto3.client("dynamodb", region_name=REGION)
    records.set_fields(ddb, aws.jobs_table, broken["job"]["job_id"], {"execution": "arn:aws:states:nowhere"})
    sfn().stop_execution(executionArn=fine["execution_arn"])

    result = sweep()

    (skipped,) = result["skipped"]
    assert skipped["job_id"] == broken["job"]["job_id"] and skipped["reason"].startswith("could not be swept")
    assert count_of_job(broken["job"]["job_id"])["vpcs"] == 1
    assert count_of_job(fine["job"]["job_id"]) == NOTHING


def test_a_record_no_execution_carries_is_ended_and_a_live_runs_is_not(machine, aws):
    """`lustrain local invoke RegisterJobFunction -e events/register_job_inline.json` (or `sam local invoke`) registers
    a run under an execution that never existed: nothing of it is left to sweep, but its record said RUNNING for
    ever. The sweep ends it; a run whose execution still runs (queued: it holds nothing yet) stays RUNNING."""
    ghost = register(execution="gpt-small-console-2026-11-20")["job"]["job_id"]
    sfn().start_execution(stateMachineArn=machine, name="queued-1", input="{}")
    queued = register(execution="queued-1")["job"]["job_id"]

    first = sweep()

    (ended,) = first["ended"]
    assert ended["job_id"] == ghost and "gpt-small-console-2026-11-20 no longer exists" in ended["reason"]
    record = job_record(aws.jobs_table, ghost)
    assert (record["status"], record["error"]["Error"]) == ("FAILED", "RunAbandoned")
    assert record["error"]["Cause"].startswith("swept: its execution") and record["finished_at"]
    assert job_record(aws.jobs_table, queued)["status"] == "RUNNING"
    # a second sweep changes nothing: the record ended once
    assert sweep()["ended"] == []
    assert job_record(aws.jobs_table, ghost)["finished_at"] == record["finished_at"]


def test_the_end_of_a_record_left_running_never_overwrites_a_teardowns(aws):
    """The sweep's write is conditional on RUNNING: a teardown (on_execution_end) that wrote its own end first keeps it."""
    ddb = boto3.client("dynamodb", region_name=REGION)
    job_id = register(execution="gone-1")["job"]["job_id"]
    records.set_fields(ddb, aws.jobs_table, job_id, status="FAILED", error={"Error": "RunCancelled", "Cause": "by x"})
    assert not records.end_if_running(ddb, aws.jobs_table, job_id, {"Error": "RunAbandoned", "Cause": "swept"})
    assert job_record(aws.jobs_table, job_id)["error"]["Error"] == "RunCancelled"
