"""Nothing bills after the end (issue 39, Build 6), on moto with the twin's SageMaker: a run that ends FAILED (a
failure, a budget, a cancel, an execution that timed out) leaves no warm pool Available, through each entry point
that tears it down (the state machine's teardown step, on_execution_end, the sweeper's later teardowns), unless a
queued run of its shape takes the pool over; the claim of an offer is idempotent under a lost answer; and the twin's
UpdateTrainingJob ends a pool as SageMaker's guide says.

The runs' training jobs are the twin's own (DescribeTrainingJob, ListTags, UpdateTrainingJob answer for them), made
already ended, as their run's cancel, budget or failure leaves them: no trainer runs."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from infra_support import (
    REGION,
    MinuteLeft,
    count_of_job,
    invoke,
    job_record,
    register,
    sfn,
    spec,
    state_machine,
)
from lustrain_core import clients
from lustrain_core.config import Settings
from lustrain_core.launch_plan import training_job_name
from lustrain_core.steps import records, warm_pool

from lustrain.twin import faults
from lustrain.twin.patches import fsx as twin_fsx
from lustrain.twin.patches import service_quotas
from lustrain.twin.simulator.job import SimulatedJob, now

ACCOUNT = "123456789012"
POOL = {"keep_alive_minutes": 10}
NETWORK = ("vpcs", "subnets", "security_groups", "route_tables", "endpoints")
SAMPLE = json.loads((Path(__file__).resolve().parents[2] / "events" / "on_execution_end.json").read_text())
#: how long ago the pooled jobs ended: their pool has billed about this long when the test ends it
ENDED_S_AGO = 90


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setenv("LUSTRAIN_TEARDOWN_POLL_SECONDS", "0.01")
    faults.clear()
    twin_fsx.configure(polls=1)


@pytest.fixture
def machine(aws, monkeypatch) -> str:
    """The stack's own state machine (LUSTRAIN_STATE_MACHINE_ARN, as template.yaml sets it)."""
    arn = state_machine("lustrain-test-runs")
    monkeypatch.setenv("LUSTRAIN_STATE_MACHINE_ARN", arn)
    return arn


def sagemaker() -> Any:
    return boto3.client("sagemaker", region_name=REGION)


def networked(execution: str, compute: dict[str, Any] | None = None) -> dict[str, Any]:
    """A registered run with its network (made, or a kept one claimed) as create_network left it."""
    document = register(spec(compute={**POOL, **(compute or {})}), execution=execution)
    document["network"] = invoke("create_network", document)
    return document


def pooled_job(
    settings: Settings, document: dict[str, Any], status: str = "Stopped", reason: str | None = None
) -> str:
    """The run's training job on the twin, ended `status` with its warm pool kept (SageMaker keeps one after a stop
    and an algorithm error as after a completion), and in the run's ledger as start_training records it."""
    from moto.sagemaker.models import sagemaker_backends

    from lustrain.twin.patches import sagemaker as twin_sagemaker

    job_id = document["job"]["job_id"]
    name = training_job_name(document["job"]["spec"]["name"], job_id, 1)
    network = document["network"]
    request: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": settings.sagemaker_role_arn,
        "AlgorithmSpecification": {"TrainingImage": "pytorch-training:2.8", "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://lustrain-test-artifacts/results/"},
        "ResourceConfig": {
            "InstanceType": "ml.p4d.24xlarge",
            "InstanceCount": 2,
            "VolumeSizeInGB": 100,
            "KeepAlivePeriodInSeconds": 600,
        },
        "VpcConfig": {"Subnets": [network["subnet_id"]], "SecurityGroupIds": network["security_group_ids"]},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "Tags": [
            {"Key": "lustrain:job-id", "Value": job_id},
            {"Key": "lustrain:created-by", "Value": settings.stack_name},
        ],
    }
    backend = sagemaker_backends[ACCOUNT][REGION]
    fake = backend.create_training_job(
        training_job_name=name,
        hyper_parameters={},
        algorithm_specification=request["AlgorithmSpecification"],
        role_arn=request["RoleArn"],
        input_data_config=[],
        output_data_config=request["OutputDataConfig"],
        resource_config=request["ResourceConfig"],
        vpc_config=request["VpcConfig"],
        stopping_condition=request["StoppingCondition"],
        tags=request["Tags"],
        enable_network_isolation=False,
        enable_inter_container_traffic_encryption=False,
        enable_managed_spot_training=False,
        checkpoint_config={},
        debug_hook_config={},
        debug_rule_configurations=[],
        tensor_board_output_config={},
        experiment_config={},
    )
    job = SimulatedJob(request=request, arn=fake.arn, account=ACCOUNT, region=REGION)
    job.pool_granted = True
    job.training_start_time = job.creation_time - timedelta(seconds=ENDED_S_AGO + 60)
    job._move(status, status, reason)
    job.training_end_time = now() - timedelta(seconds=ENDED_S_AGO)
    twin_sagemaker._state(backend).jobs[name] = job
    ddb = boto3.client("dynamodb", region_name=REGION)
    records.add_resources(ddb, settings.jobs_table, job_id, [{"type": "training_job", "id": name}])
    records.set_fields(ddb, settings.jobs_table, job_id, training_attempts=1)
    return name


def pool_of(name: str) -> dict[str, Any]:
    return dict(sagemaker().describe_training_job(TrainingJobName=name)["WarmPoolStatus"])


def network_left(job_id: str) -> dict[str, int]:
    return {k: v for k, v in count_of_job(job_id).items() if k in NETWORK}


def offer_of(settings: Settings, job_id: str) -> dict[str, Any] | None:
    pool_shape = job_record(settings.jobs_table, job_id)["warm_pool_shape"]
    return warm_pool.current_offer(boto3.client("dynamodb", region_name=REGION), settings, pool_shape)


def assert_pool_ended(settings: Settings, document: dict[str, Any], job: str, result: dict[str, Any]) -> None:
    """What a user checks after the end: the pool Terminated with its billing stopped, the network gone, the
    teardown saying it ended the pool, nothing offered."""
    job_id = document["job"]["job_id"]
    pool = pool_of(job)
    assert pool["Status"] == "Terminated"
    assert ENDED_S_AGO <= pool["ResourceRetainedBillableTimeInSeconds"] < ENDED_S_AGO + 60
    assert result["warm_pools_ended"] == [job]
    assert network_left(job_id) == dict.fromkeys(NETWORK, 0)
    record = job_record(settings.jobs_table, job_id)
    assert record["resources"] == [] and record["torn_down"][warm_pool.ENDED] == [job]
    assert offer_of(settings, job_id) is None


# --------------------------------------------------------------------------- the state machine's teardown


@pytest.mark.parametrize(
    ("status", "reason", "error"),
    [
        ("Failed", "AlgorithmError: ExecuteUserScriptError: exit code 1", "TrainingFailed"),
        ("Stopped", None, "BudgetExceeded"),
    ],
    ids=["failure", "budget"],
)
def test_a_failed_run_and_one_ended_by_its_budget_leave_no_warm_pool_available(aws, status, reason, error):
    document = networked("run-1")
    job = pooled_job(aws, document, status, reason)
    # what SageMaker leaves after the stop or the algorithm error
    assert pool_of(job)["Status"] == "Available"

    result = invoke(
        "teardown", {**document, "error": {"Error": error, "Cause": "the run's end"}}, MinuteLeft()
    )

    assert_pool_ended(aws, document, job, result)
    later = pool_of(job)["ResourceRetainedBillableTimeInSeconds"]
    assert later == pool_of(job)["ResourceRetainedBillableTimeInSeconds"]  # billing stopped with the pool


def test_a_run_that_succeeded_keeps_offering_its_pool(aws):
    document = networked("run-1")
    job = pooled_job(aws, document, "Completed")
    result = invoke("teardown", document, MinuteLeft())
    assert pool_of(job)["Status"] == "Available" and result["warm_pools_ended"] == []
    assert offer_of(aws, document["job"]["job_id"])["training_job"] == job
    assert network_left(document["job"]["job_id"])["subnets"] == 1


# --------------------------------------------------------------------------- an execution that ended without it


def status_change(machine: str, execution: str, status: str, **detail: Any) -> dict[str, Any]:
    event = copy.deepcopy(SAMPLE)
    arn = machine.replace(":stateMachine:", ":execution:") + ":" + execution
    event["detail"].update(executionArn=arn, stateMachineArn=machine, name=execution, status=status, **detail)
    event["resources"] = [arn]
    return event


def test_a_cancelled_run_leaves_no_warm_pool_available(aws, machine):
    sfn().start_execution(stateMachineArn=machine, name="run-cancelled", input="{}")
    document = networked("run-cancelled")
    job = pooled_job(aws, document, "Stopped")  # the cancel's StopTrainingJob: SageMaker kept the pool
    arn = machine.replace(":stateMachine:", ":execution:") + ":run-cancelled"
    sfn().stop_execution(executionArn=arn, error="RunCancelled", cause="by alice")

    result = invoke(
        "on_execution_end",
        status_change(machine, "run-cancelled", "ABORTED", error="RunCancelled", cause="by alice"),
        MinuteLeft(),
    )

    assert result["action"] == "torn down" and result["error"]["Error"] == "RunCancelled"
    assert_pool_ended(aws, document, job, result["teardown"])


def test_a_timed_out_execution_leaves_no_warm_pool_available(aws, machine):
    sfn().start_execution(stateMachineArn=machine, name="run-late", input="{}")
    document = networked("run-late")
    job = pooled_job(aws, document, "Stopped")
    arn = machine.replace(":stateMachine:", ":execution:") + ":run-late"
    # moto's executions never time out: DescribeExecution answers as Step Functions would (checked by the model)
    stubber = Stubber(clients.client("stepfunctions"))
    stubber.add_response(
        "describe_execution",
        {
            "executionArn": arn,
            "stateMachineArn": machine,
            "name": "run-late",
            "status": "TIMED_OUT",
            "startDate": datetime(2026, 12, 1, 8, 0, tzinfo=UTC),
            "stopDate": datetime(2026, 12, 1, 9, 0, tzinfo=UTC),
        },
        {"executionArn": arn},
    )
    with stubber:
        result = invoke(
            "on_execution_end", status_change(machine, "run-late", "TIMED_OUT", error=None), MinuteLeft()
        )

    assert result["error"]["Error"] == "RunTimedOut"
    assert_pool_ended(aws, document, job, result["teardown"])


# --------------------------------------------------------------------------- a queued run of the same shape


def queued_pair(settings: Settings) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two runs of one shape: the first admitted and built, the second waiting behind it in the capacity queue."""
    service_quotas.set_quota("ml.p4d.24xlarge", 2)
    service_quotas.set_quota("ml.p4d.24xlarge", 2, warm_pool=True)
    first = register(spec(compute=POOL), execution="run-1")
    assert invoke("check_quota", first)["admitted"] is True
    first["network"] = invoke("create_network", first)
    second = register(spec(compute=POOL), execution="run-2")
    assert invoke("check_quota", second)["admitted"] is False
    return first, second


def test_a_queued_run_of_the_same_shape_takes_over_a_failed_runs_pool_and_its_claim_survives_a_lost_answer(
    aws,
):
    first, second = queued_pair(aws)
    first_id, second_id = first["job"]["job_id"], second["job"]["job_id"]
    job = pooled_job(aws, first, "Stopped")

    result = invoke(
        "teardown", {**first, "error": {"Error": "RunCancelled", "Cause": "by alice"}}, MinuteLeft()
    )

    assert result["warm_pools_ended"] == [] and pool_of(job)["Status"] == "Available"
    assert network_left(first_id)["subnets"] == 1
    assert offer_of(aws, first_id)["training_job"] == job
    # the queued run is admitted (the pool's instances are the ones it takes over) and claims the kept network
    assert invoke("check_quota", second)["admitted"] is True
    second["network"] = invoke("create_network", second)
    assert (
        second["network"]["subnet_id"] == first["network"]["subnet_id"]
        and second["network"]["created"] is False
    )

    ddb = boto3.client("dynamodb", region_name=REGION)
    pool_shape = job_record(aws.jobs_table, second_id)["warm_pool_shape"]
    # the claim's answer was lost: claimed again by the same run, it returns the same pool; any other run gets none
    again = warm_pool.claim(ddb, aws, pool_shape, second_id)
    assert again is not None and again["training_job"] == job
    assert again["network"]["subnet_id"] == first["network"]["subnet_id"]
    assert warm_pool.claim(ddb, aws, pool_shape, "someone-else") is None
    # the sweeper's next look at the failed run: the pool is claimed, so it stays for the claimer's job
    later = invoke(
        "teardown", {**first, "error": {"Error": "RunCancelled", "Cause": "by alice"}}, MinuteLeft()
    )
    assert later["warm_pools_ended"] == [] and pool_of(job)["Status"] == "Available"


def test_an_offered_pool_ends_once_no_queued_run_of_its_shape_waits_for_it(aws):
    from lustrain_core.steps import teardown

    first, second = queued_pair(aws)
    first_id = first["job"]["job_id"]
    job = pooled_job(aws, first, "Failed", "AlgorithmError: exit code 1")
    invoke("teardown", {**first, "error": {"Error": "TrainingFailed", "Cause": "exit code 1"}}, MinuteLeft())
    assert pool_of(job)["Status"] == "Available"

    # the queued run is cancelled before it was admitted: nobody will take the pool now
    invoke("teardown", {**second, "error": {"Error": "RunCancelled", "Cause": "by bob"}}, MinuteLeft())
    result = teardown.teardown_job(  # the sweeper's later teardown of the failed run
        first_id,
        status="FAILED",
        error=None,
        ec2=boto3.client("ec2", region_name=REGION),
        fsx=boto3.client("fsx", region_name=REGION),
        ddb=boto3.client("dynamodb", region_name=REGION),
        sagemaker=sagemaker(),
        settings=aws,
        clock=teardown.clock_for(MinuteLeft(), aws),
    )
    assert_pool_ended(aws, first, job, result)


def test_a_failed_run_gives_back_the_claim_on_a_pool_its_job_never_took(aws):
    """A run that claimed another run's kept network, then failed before its training job existed: the pool stays
    offered to the next run of the shape (its owner succeeded), not claimed by a run that will never use it."""
    owner = networked("run-1")
    owner_job = pooled_job(aws, owner, "Completed")
    invoke("teardown", owner, MinuteLeft())
    claimer = networked("run-2")
    assert claimer["network"]["created"] is False
    assert offer_of(aws, owner["job"]["job_id"])["claimed_by"] == claimer["job"]["job_id"]

    invoke("teardown", {**claimer, "error": {"Error": "FileSystemFailed", "Cause": "FAILED"}}, MinuteLeft())

    assert pool_of(owner_job)["Status"] == "Available"
    offered = offer_of(aws, owner["job"]["job_id"])
    assert offered is not None and offered["training_job"] == owner_job and "claimed_by" not in offered
    assert networked("run-3")["network"]["subnet_id"] == owner["network"]["subnet_id"]


# --------------------------------------------------------------------------- the twin's UpdateTrainingJob


def test_update_training_job_with_a_keep_alive_of_0_terminates_an_available_pool_and_its_billing(aws):
    document = networked("run-1")
    job = pooled_job(aws, document, "Completed")
    before = pool_of(job)
    assert before["Status"] == "Available" and before["ResourceRetainedBillableTimeInSeconds"] >= ENDED_S_AGO

    answer = sagemaker().update_training_job(
        TrainingJobName=job, ResourceConfig={"KeepAlivePeriodInSeconds": 0}
    )

    assert answer["TrainingJobArn"].endswith(f":training-job/{job}")
    after = pool_of(job)
    assert after["Status"] == "Terminated"
    assert ENDED_S_AGO <= after["ResourceRetainedBillableTimeInSeconds"] < ENDED_S_AGO + 60
    assert pool_of(job) == after  # no second more is billed
    listed = sagemaker().list_training_jobs(WarmPoolStatusEquals="Available")["TrainingJobSummaries"]
    assert job not in [s["TrainingJobName"] for s in listed]


def test_update_training_job_is_refused_for_a_pool_that_is_not_available_a_job_without_one_or_a_bad_value(
    aws,
):
    document = networked("run-1")
    job = pooled_job(aws, document, "Completed")
    with pytest.raises(ClientError) as exc:
        sagemaker().update_training_job(
            TrainingJobName=job, ResourceConfig={"KeepAlivePeriodInSeconds": 21601}
        )
    assert exc.value.response["Error"]["Code"] == "ValidationException"
    assert "keepAlivePeriodInSeconds" in exc.value.response["Error"]["Message"]
    assert "21600" in exc.value.response["Error"]["Message"]

    sagemaker().update_training_job(TrainingJobName=job, ResourceConfig={"KeepAlivePeriodInSeconds": 0})
    with pytest.raises(ClientError) as exc:
        sagemaker().update_training_job(TrainingJobName=job, ResourceConfig={"KeepAlivePeriodInSeconds": 0})
    assert exc.value.response["Error"]["Code"] == "ValidationException"
    assert "its warm pool is Terminated" in exc.value.response["Error"]["Message"]

    with pytest.raises(ClientError) as exc:
        sagemaker().update_training_job(
            TrainingJobName="no-such-job", ResourceConfig={"KeepAlivePeriodInSeconds": 0}
        )
    assert exc.value.response["Error"]["Message"] == "Requested resource not found."
    # ending a pool that is gone is no error for the teardown: there is nothing to end
    assert warm_pool.end_pool(sagemaker(), job) is False


def test_a_longer_keep_alive_keeps_an_available_pool_longer(aws):
    document = networked("run-1")
    job = pooled_job(aws, document, "Completed")
    sagemaker().update_training_job(TrainingJobName=job, ResourceConfig={"KeepAlivePeriodInSeconds": 1200})
    assert pool_of(job)["Status"] == "Available"
    sagemaker().update_training_job(TrainingJobName=job, ResourceConfig={"KeepAlivePeriodInSeconds": 30})
    # 30 s after a job that ended 90 s ago: the pool ends now, billed to now
    pool = pool_of(job)
    assert pool["Status"] == "Terminated" and pool["ResourceRetainedBillableTimeInSeconds"] >= ENDED_S_AGO


# --------------------------------------------------------------------------- what status and report show


def test_status_and_report_show_the_pools_billed_seconds(aws, tmp_path):
    from lustrain import operate, report

    document = networked("run-1")
    job_id = document["job"]["job_id"]
    job = pooled_job(aws, document, "Stopped")
    stack = operate.Stack(
        "lustrain",
        "arn:aws:states:us-east-1:123456789012:stateMachine:lustrain-test-runs",
        aws.jobs_table,
        "jobs",
        aws.artifacts_bucket,
        boto3.Session(region_name=REGION),
    )
    while_billing = operate.status(stack, job_id).warm_pool
    assert while_billing is not None and while_billing["available"] == [job]
    invoke("teardown", {**document, "error": {"Error": "RunCancelled", "Cause": "by alice"}}, MinuteLeft())

    shown = operate.status(stack, job_id)
    assert shown.warm_pool is not None and shown.warm_pool["available"] == []
    (pool,) = shown.warm_pool["pools"]
    assert (pool["training_job"], pool["status"], pool["instances"]) == (job, "Terminated", 2)
    assert ENDED_S_AGO <= pool["billed_s"] < ENDED_S_AGO + 60
    assert pool["billed_instance_s"] == 2 * pool["billed_s"] == shown.warm_pool["billed_instance_s"]
    assert shown.to_dict()["warm_pool"] == shown.warm_pool  # `lustrain status --json`
    line = operate.warm_pool_text(shown.warm_pool)
    assert (
        line
        == f"{job} Terminated, {pool['billed_s']:,} s billed x 2 instances = {2 * pool['billed_s']:,} instance-seconds"
    )
    page = report.build(stack, job_id, tmp_path).html_path.read_text()
    assert f"warm pool: {line}" in page
