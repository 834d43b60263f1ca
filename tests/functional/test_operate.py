"""The operator API (lustrain.operate, behind `lustrain runs / status / logs / cancel`) on moto: a run is named by
its job id, execution name or ARN, or its spec name when that is unique; the cost so far counts what has billed."""

from __future__ import annotations

import json
import types
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from botocore.exceptions import ClientError
from infra_support import REGION
from lustrain_core.errors import UsageInvalid
from lustrain_core.steps import records

from lustrain import operate

MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:lustrain-TrainingJobStateMachine"
NOW = datetime(2026, 6, 2, 12, 0, tzinfo=UTC)


def record(job_id: str, name: str, execution: str, created: datetime, **extra) -> dict:
    return {
        "job_id": job_id,
        "execution": execution,
        "status": "RUNNING",
        "created_at": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "spec": {"name": name, "compute": {"instance_type": "ml.p4d.24xlarge", "instance_count": 2,
                                           "max_runtime_hours": 3}},
        "plan": {"cost": {"filesystem_usd": 4.0}, "filesystem": {"storage_gib": 1200}},
        "queue": {"state": "admitted", "admitted_at": created.strftime("%Y-%m-%dT%H:%M:%SZ")},
        "resources": [{"type": "file_system", "id": f"fs-{job_id}"}],
        **extra,
    }


@pytest.fixture
def stack(aws):
    ddb = boto3.client("dynamodb", region_name=REGION)
    records.put_new(ddb, aws.jobs_table, record("gpt-aaaaaaaa", "gpt", "exec-1", NOW - timedelta(hours=2)))
    records.put_new(ddb, aws.jobs_table, record("gpt-bbbbbbbb", "gpt", "exec-2", NOW - timedelta(hours=1)))
    records.put_new(ddb, aws.jobs_table, record("bert-cccccccc", "bert", "exec-3", NOW - timedelta(hours=1)))
    return operate.Stack("lustrain", MACHINE, aws.jobs_table, "jobs", "artifacts", boto3.Session(region_name=REGION))


@pytest.mark.parametrize("name", ["bert-cccccccc", "exec-3", MACHINE.replace("stateMachine", "execution") + ":exec-3",
                                  "bert"])
def test_a_run_is_found_by_job_id_execution_name_or_arn_or_a_unique_spec_name(stack, name):
    assert operate.find_run(stack, name).job_id == "bert-cccccccc"


def test_a_spec_name_two_runs_share_is_refused_with_the_candidates(stack):
    with pytest.raises(UsageInvalid) as info:
        operate.find_run(stack, "gpt")
    message = str(info.value)
    assert "RUN" in message and "gpt-aaaaaaaa" in message and "gpt-bbbbbbbb" in message


def test_an_unknown_run_names_the_stack(stack):
    with pytest.raises(UsageInvalid, match="invalid usage, 1 problem:\n  - RUN: no run of stack lustrain"):
        operate.find_run(stack, "nothing-like-it")


def test_runs_lists_each_run_oldest_first_with_the_file_system_hours_so_far(stack):
    listed = operate.runs(stack, now=NOW.timestamp())
    assert len(listed) == 3
    first = listed[0]
    assert first.job_id == "gpt-aaaaaaaa"
    assert (first.instances, first.attempt, first.elapsed_s) == (2, 0, 7200.0)
    # no training job yet: 2 hours of a file system priced $4 for its 4 hours (3 h runtime + 1)
    assert first.cost_so_far_usd == 2.0


def test_the_file_system_costs_from_its_creation_and_a_run_cancelled_while_queued_costs_nothing(aws):
    """The file system is created after the run's admission out of the queue: it bills from then, and a run
    cancelled while it queued created none (its ledger and its teardown name none) and has cost $0.00."""
    stack = operate.Stack("lustrain", MACHINE, aws.jobs_table, "jobs", "artifacts", boto3.Session(region_name=REGION))
    ddb = boto3.client("dynamodb", region_name=REGION)
    iso = "%Y-%m-%dT%H:%M:%SZ"
    queued = NOW - timedelta(hours=3)
    records.put_new(ddb, aws.jobs_table, record(
        "queued-dddddddd", "queued", "exec-4", queued, status="FAILED", resources=[],
        queue={"state": "queued", "pool": "ml.p4d.24xlarge/on-demand"},
        finished_at=(NOW - timedelta(hours=1)).strftime(iso), error={"Error": "RunCancelled", "Cause": "cancelled"},
        torn_down={"deleted": [], "stopped": []},
    ))
    # queued 2 hours, admitted an hour ago, its file system since deleted by its teardown
    records.put_new(ddb, aws.jobs_table, record(
        "waited-eeeeeeee", "waited", "exec-5", queued, status="FAILED", resources=[],
        queue={"state": "admitted", "admitted_at": (NOW - timedelta(hours=1)).strftime(iso)},
        finished_at=(NOW - timedelta(minutes=30)).strftime(iso), error={"Error": "RunCancelled", "Cause": "cancelled"},
        torn_down={"deleted": [{"type": "file_system", "id": "fs-0123"}], "stopped": []},
    ))
    costs = {r.job_id: r.cost_so_far_usd for r in operate.runs(stack, now=NOW.timestamp())}
    assert costs == {"queued-dddddddd": 0.0, "waited-eeeeeeee": 0.5}  # $1 an hour for half an hour


def test_the_timeline_spans_each_state_entered():
    at = NOW
    history = [
        {"timestamp": at, "stateEnteredEventDetails": {"name": "Register the job"}},
        {"timestamp": at + timedelta(seconds=2), "stateExitedEventDetails": {"name": "Register the job"}},
        {"timestamp": at + timedelta(seconds=2), "stateEnteredEventDetails": {"name": "Start the training job"}},
    ]
    spans = operate.timeline(history)
    assert [(s.state, s.seconds) for s in spans] == [("Register the job", 2.0), ("Start the training job", None)]


def test_a_state_still_open_when_the_execution_stopped_ends_with_it():
    """A run cancelled while it trains: StopExecution runs no Catch, so the training state never exits; it ends
    when the execution stopped (ExecutionAborted), not at `now` in status and the report's time line."""
    at = NOW
    history = [
        {"timestamp": at, "type": "TaskStateEntered", "stateEnteredEventDetails": {"name": "Register the job"}},
        {"timestamp": at + timedelta(seconds=2), "type": "TaskStateExited",
         "stateExitedEventDetails": {"name": "Register the job"}},
        {"timestamp": at + timedelta(seconds=2), "type": "TaskStateEntered",
         "stateEnteredEventDetails": {"name": "Start the training job"}},
        {"timestamp": at + timedelta(seconds=18), "type": "ExecutionAborted",
         "executionAbortedEventDetails": {"error": "RunCancelled"}},
    ]
    spans = operate.timeline(history)
    assert [(s.state, s.seconds) for s in spans] == [("Register the job", 2.0), ("Start the training job", 16.0)]
    assert spans[-1].exited_at == "2026-06-02T12:00:18Z"


def test_the_notebook_api_is_the_cli_s_own_calls():
    import lustrain

    assert (lustrain.runs, lustrain.status, lustrain.watch, lustrain.logs, lustrain.cancel) == (
        operate.runs, operate.status, operate.watch, operate.logs, operate.cancel,
    )
    assert lustrain.report.build.__module__ == "lustrain.report" and callable(lustrain.submit.submit)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        lustrain.nothing  # noqa: B018


# --------------------------------------------------------------------------- executions without a record

REFUSED = "0f1e2d3c-refused-drop"
REFUSAL = "invalid job spec, 1 problem:\n  - compute.instance_count: 0 is not allowed: at least 1"


def lambda_error(error_type: str, message: str) -> str:
    """A Catch's Cause for a Lambda function that raised: Python's runtime answer, stack trace included."""
    return json.dumps(
        {
            "errorMessage": message,
            "errorType": error_type,
            "requestId": "5e8a",
            "stackTrace": ['  File "/var/task/handlers/register_job.py", line 40, in handler\n'],
        }
    )


class FakeStepFunctions:
    """Step Functions as the operator's calls see it: one execution refused at registration (no record), one that
    recorded the run exec-3, one duplicate drop that SUCCEEDED without a record of its own."""

    def __init__(self) -> None:
        started = NOW - timedelta(minutes=30)
        drop = {"detail": {"bucket": {"name": "jobs"}, "object": {"key": "jobs/bad.yaml"}}}
        self.executions = {
            f"{MACHINE.replace('stateMachine', 'execution')}:{name}": {
                "executionArn": f"{MACHINE.replace('stateMachine', 'execution')}:{name}",
                "stateMachineArn": MACHINE,
                "name": name,
                "status": status,
                "startDate": started,
                "stopDate": started + timedelta(seconds=3),
                "input": json.dumps(drop),
                **extra,
            }
            for name, status, extra in (
                (REFUSED, "FAILED", {"error": "SpecInvalid", "cause": lambda_error("SpecInvalid", REFUSAL)}),
                ("exec-3", "RUNNING", {}),
                ("duplicate-drop", "SUCCEEDED", {}),
            )
        }

    def get_paginator(self, operation: str):
        pages = {
            "list_executions": lambda **_: [{"executions": list(self.executions.values())}],
            "get_execution_history": lambda executionArn, **_: [{"events": []}],
        }
        return types.SimpleNamespace(paginate=pages[operation])

    def describe_execution(self, executionArn: str) -> dict:
        if executionArn not in self.executions:
            raise ClientError({"Error": {"Code": "ExecutionDoesNotExist"}}, "DescribeExecution")
        return self.executions[executionArn]


@pytest.fixture
def with_executions(stack, monkeypatch):
    fake = FakeStepFunctions()
    real = stack.client
    monkeypatch.setattr(
        operate.Stack, "client", lambda self, service: fake if service == "stepfunctions" else real(service)
    )
    return stack


def test_a_spec_refused_at_registration_is_a_run_with_its_error_in_words(
    with_executions, monkeypatch, capsys
):
    listed = {r.job_id: r for r in operate.runs(with_executions, now=NOW.timestamp())}
    # the refused drop is a run, named by its execution; the duplicate drop is the first drop's run, not another
    assert set(listed) == {"gpt-aaaaaaaa", "gpt-bbbbbbbb", "bert-cccccccc", REFUSED}
    refused = listed[REFUSED]
    assert (refused.name, refused.state, refused.error, refused.cost_so_far_usd) == (
        "bad",
        "FAILED",
        "SpecInvalid",
        0,
    )
    assert refused.elapsed_s == 3.0
    shown = operate.status(with_executions, REFUSED)
    assert shown.cause == REFUSAL and shown.resources_left == []
    # the CLI: listed by `runs`, shown by `status` by its execution name, the refusal in words, no stack trace
    from lustrain import cli

    monkeypatch.setattr(cli, "_stack", lambda args: with_executions)
    assert cli.main(["runs"]) == 0
    assert any(
        line.startswith(REFUSED) and "FAILED (SpecInvalid)" in line
        for line in capsys.readouterr().out.splitlines()
    )
    assert cli.main(["status", REFUSED]) == 0
    out = capsys.readouterr().out
    assert f"run {REFUSED} (bad): FAILED, SpecInvalid" in out
    assert (
        "compute.instance_count: 0 is not allowed" in out
        and "stackTrace" not in out
        and "errorMessage" not in out
    )
    # `watch` ends at once on it, saying why
    assert cli.main(["watch", REFUSED, "--interval", "0"]) == 1
    assert "FAILED (SpecInvalid: invalid job spec" in capsys.readouterr().out


QUOTA_REFUSAL = (
    "5 x ml.p4d.24xlarge do not fit the quota 'ml.p4d.24xlarge for training job usage' (4 in us-east-1); an "
    "increase to 5 was requested"
)


def test_a_quota_refusal_is_the_run_s_cause_in_words_never_the_lambda_error_json(stack, monkeypatch, capsys, tmp_path):
    """A run's error kept by its Catch is a Lambda error as JSON (stack trace included): status, watch and the
    report show its message; an execution that failed with a Fail state's {Error, Cause} shows both in words."""
    ddb = boto3.client("dynamodb", region_name=REGION)
    records.put_new(ddb, stack.jobs_table, record(
        "quota-ffffffff", "quota", "exec-6", NOW, status="FAILED", resources=[],
        finished_at=(NOW + timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        error={"Error": "QuotaExceeded", "Cause": lambda_error("QuotaExceeded", QUOTA_REFUSAL)},
    ))
    assert operate.status(stack, "quota-ffffffff").cause == QUOTA_REFUSAL
    from lustrain import cli, report

    monkeypatch.setattr(cli, "_stack", lambda args: stack)
    assert cli.main(["status", "quota-ffffffff"]) == 0
    out = capsys.readouterr().out
    assert f"  cause:       {QUOTA_REFUSAL}" in out and "stackTrace" not in out
    page = report.build(stack, "quota-ffffffff", tmp_path, now=NOW.timestamp()).html_path.read_text()
    assert "stackTrace" not in page and "errorMessage" not in page and "an increase to 5 was requested" in page

    # an execution that ended in a Fail state whose Cause is the caught error as JSON (a States.* error)
    fake = FakeStepFunctions()
    fake.executions[next(iter(fake.executions))].update(
        error="StepFunctionsError",
        cause=json.dumps({"Error": "States.TaskFailed", "Cause": lambda_error("QuotaExceeded", QUOTA_REFUSAL)}),
    )
    real = stack.client
    monkeypatch.setattr(operate.Stack, "client", lambda self, service: fake if service == "stepfunctions" else real(service))
    assert operate.status(stack, REFUSED).cause == f"States.TaskFailed: {QUOTA_REFUSAL}"



def test_submit_says_a_dropped_spec_was_refused_and_why(with_executions, monkeypatch, capsys):
    """`lustrain submit --stack` waits for the run its drop started: a drop register_job refused is that run."""
    from lustrain import submit

    monkeypatch.setattr(submit, "stack_buckets", lambda stack, session: ("jobs", "artifacts"))
    monkeypatch.setattr(submit, "submit", lambda *a, **k: submit.Submission("s3://jobs/jobs/bad.yaml", None, 1.0))
    monkeypatch.setattr(operate.Stack, "locate", classmethod(lambda cls, name, session=None: with_executions))
    from lustrain import cli

    assert cli.main(["submit", "bad.yaml", "--stack", "lustrain", "--wait", "0"]) == 2
    out = capsys.readouterr().out
    assert f"run {REFUSED} was refused: SpecInvalid: {REFUSAL}" in out and "started" not in out


def test_a_runs_log_readers_read_its_own_jobs_streams_never_those_of_a_job_whose_name_extends_its_own(aws):
    """The readers (`logs`, the live tail, the MLflow logging) take a job's streams by `<job>/`, with the delimiter:
    attempt 1's job `<run>-1` never reads the streams of `<run>-10`, which IAM lets only that job write."""
    from lustrain_core.steps.tracking import attempt_lines
    from lustrain_core.steps.training import training_job_name

    ddb = boto3.client("dynamodb", region_name=REGION)
    records.put_new(
        ddb, aws.jobs_table, record("gpt-aaaaaaaa", "gpt", "exec-1", NOW, training_attempts=1)
    )
    stack = operate.Stack("lustrain", MACHINE, aws.jobs_table, "jobs", "artifacts", boto3.Session(region_name=REGION))
    own = training_job_name("gpt", "gpt-aaaaaaaa", 1)
    extended = training_job_name("gpt", "gpt-aaaaaaaa", 10)
    assert extended.startswith(own)
    logs = boto3.client("logs", region_name=REGION)
    logs.create_log_group(logGroupName=operate.TRAINING_LOG_GROUP)
    at = int(datetime.now(UTC).timestamp() * 1000)  # CloudWatch takes no event older than 14 days
    for job, text in ((own, "own line"), (extended, "planted line")):
        stream = f"{job}/algo-1-1780000000"
        logs.create_log_stream(logGroupName=operate.TRAINING_LOG_GROUP, logStreamName=stream)
        logs.put_log_events(
            logGroupName=operate.TRAINING_LOG_GROUP, logStreamName=stream, logEvents=[{"timestamp": at, "message": text}]
        )

    assert [line.message for line in operate.logs(stack, "gpt-aaaaaaaa")] == ["own line"]
    assert [line.message for line in operate.log_tail(stack, "gpt-aaaaaaaa")] == ["own line"]
    assert [message for _, message in attempt_lines(logs, own)] == ["own line"]


def test_a_wait_for_a_teardown_that_has_not_ended_returns_at_its_timeout_saying_so(stack):
    """`lustrain cancel --wait` of a run whose record still says RUNNING: at the timeout it returns not ended (the
    CLI then exits 1 and names what is still there); a finished record with nothing left ends the wait at once."""
    from lustrain.cleanup import wait_for_teardown

    waited = wait_for_teardown(stack, "gpt-aaaaaaaa", timeout_s=0)
    assert not waited.ended and waited.record.status == "RUNNING"
    ddb = boto3.client("dynamodb", region_name=REGION)
    records.set_fields(ddb, stack.jobs_table, "bert-cccccccc", status="FAILED", resources=[])
    done = wait_for_teardown(stack, "bert-cccccccc", timeout_s=60)
    assert done.ended and done.to_dict()["left"] == []
