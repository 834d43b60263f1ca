"""The operator API (lustrain.operate, behind `lustrain runs / status / logs / cancel`) on moto: a run is named by
its job id, execution name or ARN, or its spec name when that is unique; the cost so far counts what has billed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import boto3
import pytest
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
        "resources": [],
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
    assert operate.find_run(stack, name)["job_id"] == "bert-cccccccc"


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


def test_the_timeline_spans_each_state_entered():
    at = NOW
    history = [
        {"timestamp": at, "stateEnteredEventDetails": {"name": "Register the job"}},
        {"timestamp": at + timedelta(seconds=2), "stateExitedEventDetails": {"name": "Register the job"}},
        {"timestamp": at + timedelta(seconds=2), "stateEnteredEventDetails": {"name": "Start the training job"}},
    ]
    spans = operate.timeline(history)
    assert [(s.state, s.seconds) for s in spans] == [("Register the job", 2.0), ("Start the training job", None)]


def test_the_notebook_api_is_the_cli_s_own_calls():
    import lustrain

    assert (lustrain.runs, lustrain.status, lustrain.watch, lustrain.logs, lustrain.cancel) == (
        operate.runs, operate.status, operate.watch, operate.logs, operate.cancel,
    )
    assert lustrain.report.build.__module__ == "lustrain.report" and callable(lustrain.submit.submit)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        lustrain.nothing  # noqa: B018
