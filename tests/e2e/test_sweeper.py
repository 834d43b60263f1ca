"""The sweeper on the twin: runs whose executions are killed mid-run leave everything behind (no teardown runs),
and one invocation of the sweep function, through the twin's Lambda, leaves nothing of them.

Two runs share one twin: one killed right after its network exists (its file system still being created), one
killed while its model trains. Everything the real state machine and handlers created for them is then counted
by tag: VPC, subnet, security group, route table, S3 endpoint, file system, and training jobs InProgress; and a
data preparation's own IAM role whose record is gone.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from lustrain_core.prices import PriceTable
from lustrain_core.spec import JobSpec
from lustrain_core.steps import prepare_role

from lustrain import cli
from lustrain.twin import rehearse
from lustrain.twin.iam import usage
from lustrain.twin.rehearse import REGION, drop, twin, until

pytestmark = pytest.mark.slow

SCHEDULED_EVENT = Path(__file__).resolve().parents[2] / "events" / "sweep.json"
TEARDOWN_STATES = ("Tear down the run", "Tear down after failure")


def entered(sfn: Any, execution_arn: str) -> list[str]:
    return [
        e["stateEnteredEventDetails"]["name"]
        for e in rehearse.execution_history(sfn, execution_arn)
        if "stateEnteredEventDetails" in e
    ]


def training_job_of(sagemaker: Any, spec: JobSpec) -> dict[str, Any] | None:
    for summary in sagemaker.list_training_jobs(StatusEquals="InProgress")["TrainingJobSummaries"]:
        if summary["TrainingJobName"].startswith(spec.name + "-"):
            job = sagemaker.describe_training_job(TrainingJobName=summary["TrainingJobName"])
            return dict(job) if job["SecondaryStatus"] == "Training" else None
    return None


def stopped(sfn: Any, execution_arn: str) -> str:
    """The status a stopped execution ends with; it must have ended without running a teardown."""

    def ended() -> str | None:
        status = str(sfn.describe_execution(executionArn=execution_arn)["status"])
        return None if status == "RUNNING" else status

    status: str = until(ended, "end of the stopped execution", timeout=30)
    assert not set(entered(sfn, execution_arn)) & set(TEARDOWN_STATES), "a teardown ran: nothing to sweep"
    return status


def test_runs_killed_mid_run_are_swept_to_nothing(long_spec, monkeypatch, capsys, quick_stops):
    from lustrain.twin.patches import fsx, service_quotas

    monkeypatch.setenv("LUSTRAIN_TEARDOWN_POLL_SECONDS", "0.2")
    with twin() as stack:
        # the rule that tears a stopped run down at once (tests/e2e/test_cancel.py) is off: its delivery failed, or
        # the function did, and what the run left waits for the sweeper
        events = boto3.client("events", region_name=REGION)
        events.disable_rule(Name=stack.ref("OnExecutionEndFunctionExecutionEnded"))
        sfn = boto3.client("stepfunctions", region_name=REGION)
        sagemaker = boto3.client("sagemaker", region_name=REGION)
        service_quotas.set_quota("ml.p4d.24xlarge", 8, REGION)

        # killed right after create_network: its file system never becomes AVAILABLE
        fsx.configure(polls=10_000)
        early, early_arn = drop(stack, long_spec("early"))
        until(lambda: "Wait for the file system" in entered(sfn, early_arn) or None, "file system wait")
        sfn.stop_execution(executionArn=early_arn, error="Killed", cause="killed after create_network")
        assert stopped(sfn, early_arn) == "ABORTED"

        # killed while its model trains
        fsx.configure(polls=1)
        late, late_arn = drop(stack, long_spec("late"))
        training = until(lambda: training_job_of(sagemaker, late), "training job in Training")
        sfn.stop_execution(executionArn=late_arn, error="Killed", cause="killed while training")
        # moto 5.2.5 may notice a StopExecution of a task waiting for its token only at the task's next heartbeat,
        # and then ends the execution FAILED (States.Timeout) where AWS aborts it at once: a heartbeat is sent
        # here so as not to wait for it (InvalidToken: moto noticed already). The sweeper treats every status but
        # RUNNING alike.
        token = boto3.client("dynamodb", region_name=REGION).get_item(
            TableName=stack.ref("TaskTokensTable"),
            Key={"training_job_name": {"S": training["TrainingJobName"]}},
        )["Item"]["token"]["S"]
        with contextlib.suppress(sfn.exceptions.InvalidToken):
            sfn.send_task_heartbeat(taskToken=token)
        late_status = stopped(sfn, late_arn)
        assert late_status in {"ABORTED", "FAILED"}

        # a data preparation's own role, left by a preparation whose record is gone: made as its first look makes it
        iam = boto3.client("iam", region_name=REGION)
        orphan_role = "corpus-0badc0de-prep"
        iam.create_role(
            RoleName=orphan_role,
            Path=f"/lustrain/{REGION}/{rehearse.STACK_NAME}/",
            AssumeRolePolicyDocument=json.dumps(prepare_role.trust_policy("123456789012")),
            PermissionsBoundary=stack.ref("PrepareProcessingBoundary"),
            Tags=[
                {"Key": "lustrain:job-id", "Value": "corpus-0badc0de"},
                {"Key": "lustrain:created-by", "Value": rehearse.STACK_NAME},
            ],
        )
        iam.put_role_policy(RoleName=orphan_role, PolicyName="this-run", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "*"}]}
        ))  # fmt: skip

        runs = ((early, early_arn), (late, late_arn))
        jobs = {spec.name: rehearse.job_id_of(rehearse.execution_history(sfn, arn)) for spec, arn in runs}
        for spec in (early, late):
            left, _ = rehearse.resources_left(jobs[spec.name], spec)
            assert len(left) >= 6, left  # VPC, subnet, group, route table, endpoint, file system (+ the job)

        # `lustrain leftovers` answers "what still bills?": every resource of the stack, by run, from the same
        # registry the sweeper finds them with; exit 1 while anything bills
        capsys.readouterr()
        assert cli.main(["leftovers", "--stack", rehearse.STACK_NAME, "--json"]) == 1
        shown = json.loads(capsys.readouterr().out)
        by_run: dict[str, dict[str, Any]] = {}
        for left in shown["leftovers"]:
            by_run.setdefault(left["job_id"], {})[(left["kind"], left["id"])] = left
        for spec in (early, late):
            mine = by_run[jobs[spec.name]]
            assert {kind for kind, _ in mine} >= {"vpc", "subnet", "security_group", "route_table", "vpc_endpoint",
                                                  "file_system"}, spec.name
            assert {left["run"] for left in mine.values()} == {spec.name}
            assert all(left["hourly_usd"] == 0 for (kind, _), left in mine.items() if kind in {"vpc", "subnet"})
            assert next(left for (kind, _), left in mine.items() if kind == "file_system")["hourly_usd"] > 0
        p4d = PriceTable().instance_types[late.compute.instance_type].hourly_usd
        job = by_run[jobs["late"]][("training_job", training["TrainingJobName"])]
        assert (job["state"], job["hourly_usd"], job["bills"]) == ("InProgress", p4d * late.compute.instance_count, True)
        orphan = by_run["corpus-0badc0de"][("iam_role", orphan_role)]
        assert (orphan["run"], orphan["hourly_usd"], orphan["bills"]) == ("", 0, False)
        assert shown["hourly_usd"] == pytest.approx(sum(left["hourly_usd"] for left in shown["leftovers"]), abs=1e-3)
        assert cli.main(["leftovers", "late", "--stack", rehearse.STACK_NAME]) == 1
        table = capsys.readouterr().out
        assert f"late ({jobs['late']})" in table and training["TrainingJobName"] in table
        assert jobs["early"] not in table

        answer = boto3.client("lambda", region_name=REGION).invoke(
            FunctionName=stack.function_names()["sweep"], Payload=SCHEDULED_EVENT.read_bytes()
        )
        payload = answer["Payload"].read()
        assert "FunctionError" not in answer, payload
        result = json.loads(payload)

        for spec in (early, late):
            assert rehearse.resources_left(jobs[spec.name], spec) == ([], []), spec.name
        name = training["TrainingJobName"]
        # asked through its stop request (no SIGTERM reaches it in SageMaker's PyTorch image), the trainer saved and
        # exited: the job ended by itself
        assert sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "Completed"
        swept = {(s["job_id"], s["type"], s["id"]): s for s in result["swept"]}
        assert (jobs["late"], "training_job", name) in swept
        for spec, status in ((early, "ABORTED"), (late, late_status)):
            mine = [s for (job_id, *_), s in swept.items() if job_id == jobs[spec.name]]
            assert {s["type"] for s in mine} >= {
                "vpc",
                "subnet",
                "security_group",
                "route_table",
                "vpc_endpoint",
            }
            assert "file_system" in {s["type"] for s in mine}, spec.name
            assert all(s["reason"].endswith(f"ended {status} without a teardown") for s in mine), spec.name
        assert ("corpus-0badc0de", "iam_role", orphan_role) in swept
        assert orphan_role not in {r["RoleName"] for r in iam.list_roles()["Roles"]}
        assert (result["kept"], result["skipped"]) == ([], [])
        # and then nothing of the stack is left, so nothing bills
        assert cli.main(["leftovers", "--stack", rehearse.STACK_NAME]) == 0
        assert "its runs hold nothing; nothing bills" in capsys.readouterr().out
        ddb = boto3.client("dynamodb", region_name=REGION)
        for job_id in jobs.values():
            record = ddb.get_item(TableName=stack.ref("JobsTable"), Key={"job_id": {"S": job_id}})["Item"]
            assert (record["status"]["S"], record["error"]["M"]["Error"]["S"]) == ("FAILED", "RunAbandoned")

        # each statement the sweep alone was allowed by, removed from its role, refuses that request naming the
        # action (as tests/e2e/test_least_privilege.py proves for the functions of a run)
        sweep = usage.collect(stack)["SweepFunctionRole"]
        assert len(usage.needed(sweep)) >= 3, usage.needed(sweep)
        assert usage.still_allowed_without(sweep) == {}
