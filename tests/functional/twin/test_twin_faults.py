"""Fault injection: validated specs, one-shot and persistent faults, throttling seen by the handler of a step."""

from __future__ import annotations

import re

import pytest
from botocore.exceptions import ClientError
from twinfakes import check_quota
from twinhelpers import client, history, lambda_task, make_function, make_state_machine, run_execution

from lustrain.twin import faults


@pytest.fixture(autouse=True)
def clean_faults() -> None:
    faults.clear()


def test_parse_reads_step_and_fault() -> None:
    assert faults.parse("check_quota:quota") == faults.Fault("check_quota", "quota")
    assert str(faults.parse("teardown:throttling-always")) == "teardown:throttling-always"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("check_quota", "expected STEP:FAULT"),
        ("check_quota:slow", "unknown fault 'slow'; faults: capacity-error, fsx-failed, lost-create, quota"),
        ("make_coffee:throttling", "unknown step 'make_coffee'; steps: register_job, check_quota"),
        (
            "teardown:fsx-failed",
            "fault 'fsx-failed' cannot happen at step 'teardown'; it happens at: create_filesystem",
        ),
    ],
)
def test_bad_inject_spec_says_what_is_allowed(spec: str, message: str) -> None:
    with pytest.raises(faults.FaultSpecInvalid, match=re.escape(message)):
        faults.parse(spec)


def test_a_fault_fires_once_and_is_recorded() -> None:
    faults.inject("start_training", "capacity-error")

    assert faults.active("start_training", "capacity-error")
    assert not faults.consume("start_training", "training-error")
    assert faults.consume("start_training", "capacity-error")
    assert not faults.consume("start_training", "capacity-error")
    assert faults.fired() == [faults.Fault("start_training", "capacity-error")]


def test_throttling_always_stays_armed_until_cleared() -> None:
    faults.inject("teardown", "throttling-always")

    assert [faults.consume_throttling("teardown") for _ in range(3)] == [True, True, True]
    faults.clear()
    assert not faults.consume_throttling("teardown")
    assert faults.fired() == []


@pytest.mark.usefixtures("moto_twin")
def test_throttling_makes_the_steps_next_aws_call_raise_once_with_no_side_effect() -> None:
    s3 = client("s3")
    faults.inject("create_network", "throttling")

    s3.create_bucket(Bucket="outside-any-handler")
    with faults.running_step("create_network"):
        with pytest.raises(ClientError) as raised:
            s3.create_bucket(Bucket="throttled")
        s3.create_bucket(Bucket="after-the-retry")

    assert raised.value.response["Error"]["Code"] == "ThrottlingException"
    assert raised.value.operation_name == "CreateBucket"
    names = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    assert names == {"outside-any-handler", "after-the-retry"}


@pytest.mark.slow
@pytest.mark.usefixtures("moto_twin")
def test_throttled_handler_is_retried_by_the_state_machine() -> None:
    function_arn = make_function("check-quota", "twinfakes.check_quota.handler")
    machine = make_state_machine(
        "throttled",
        {
            "StartAt": "CheckQuota",
            "States": {
                "CheckQuota": lambda_task(
                    function_arn,
                    Retry=[{"ErrorEquals": ["AwsThrottled"], "IntervalSeconds": 1, "MaxAttempts": 2}],
                    End=True,
                )
            },
        },
    )
    faults.inject("check_quota", "throttling")

    execution = run_execution(machine, {})

    assert execution["status"] == "SUCCEEDED"
    assert check_quota.calls == ["ThrottlingException", "ok"]
    failed = [
        e["taskFailedEventDetails"]["error"]
        for e in history(execution["executionArn"])
        if e["type"] == "TaskFailed"
    ]
    assert failed == ["AwsThrottled"]


def test_lost_create_happens_only_where_a_run_creates_what_it_pays_for() -> None:
    assert faults.parse("start_training:lost-create").fault == "lost-create"
    with pytest.raises(faults.FaultSpecInvalid, match="it happens at: create_network, create_filesystem"):
        faults.parse("notify:lost-create")
