"""Fault injection: validated specs, one-shot and persistent faults, throttling seen by the handler of a step."""

from __future__ import annotations

import json
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
        (
            "check_quota:slow",
            "unknown fault 'slow'; faults: capacity-error, capacity-error-once, fsx-failed, hardware-failure",
        ),
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
    faults.inject("start_training", "capacity-error-once")

    assert faults.active("start_training", "capacity-error-once")
    assert not faults.consume("start_training", "user-error")
    assert faults.consume("start_training", "capacity-error-once")
    assert not faults.consume("start_training", "capacity-error-once")
    assert faults.fired() == [faults.Fault("start_training", "capacity-error-once")]


def test_capacity_error_refuses_every_attempt_of_the_run() -> None:
    faults.inject("start_training", "capacity-error")

    assert [faults.consume("start_training", "capacity-error") for _ in range(3)] == [True, True, True]


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


def _document(spec_name: str) -> dict:
    return {"job": {"job_id": f"{spec_name}-0123abcd", "spec": {"name": spec_name}}}


def test_a_fault_armed_for_one_run_fires_in_that_run_only() -> None:
    faults.inject("create_network", "service-error", run="a")
    with faults.running_step("create_network", _document("b")):
        assert not faults.consume("create_network", "service-error")
    with faults.running_step("create_network", _document("a")):
        assert faults.consume("create_network", "service-error")
        assert not faults.consume("create_network", "service-error")  # one-shot
    assert [str(f) for f in faults.fired()] == ["create_network:service-error@a"]


def test_on_training_event_faults_wait_for_the_event_that_ends_the_job() -> None:
    faults.inject("on_training_event", "service-error")
    heartbeat = {"detail": {"TrainingJobName": "gpt-0123abcd-1", "TrainingJobStatus": "InProgress"}}
    completed = {"detail": {"TrainingJobName": "gpt-0123abcd-1", "TrainingJobStatus": "Completed"}}
    with faults.running_step("on_training_event", heartbeat):
        assert not faults.consume("on_training_event", "service-error")
    with faults.running_step("on_training_event", completed):
        assert faults.consume("on_training_event", "service-error")


@pytest.mark.parametrize(
    ("event", "run"),
    [
        (_document("gpt"), "gpt"),
        ({"job": {"job_id": "gpt-small-0123abcd"}}, "gpt-small"),
        ({"detail": {"TrainingJobName": "gpt-small-0123abcd-2"}}, "gpt-small"),
        ({"input": {"detail": {"object": {"key": "jobs/gpt-small.yaml"}}}}, "gpt-small"),
        ({"input": {"spec": {"name": "inline"}}}, "inline"),
        ({"input": {"spec_s3_uri": "s3://b/k.yaml"}}, None),
        ([1, 2], None),
    ],
)
def test_the_run_of_an_invocation_is_read_from_each_shape_of_event(event, run) -> None:
    assert faults.run_of(event) == run


@pytest.mark.usefixtures("moto_twin")
def test_each_lost_create_of_create_network_loses_the_answer_of_its_own_create() -> None:
    ec2 = client("ec2")
    faults.inject("create_network", "lost-create-subnet")

    with faults.running_step("create_network"):
        vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]  # not the subnet: answered
        with pytest.raises(ClientError) as raised:
            ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.0.0/24")
        ec2.create_route_table(VpcId=vpc)  # fired once: answered

    assert raised.value.response["Error"]["Code"] == "InternalError"
    # AWS did create it: only the answer was lost
    assert [
        s["CidrBlock"] for s in ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]
    ] == ["10.9.0.0/24"]
    assert [str(f) for f in faults.fired()] == ["create_network:lost-create-subnet"]


@pytest.mark.usefixtures("moto_twin")
def test_a_teardown_cut_off_mid_delete_answers_timed_out_and_goes_on_deleting() -> None:
    from twinfakes import teardown

    teardown.reset()
    s3 = client("s3")
    for name in ("first-to-delete", "second-to-delete"):
        s3.create_bucket(Bucket=name)
    make_function("teardown", "twinfakes.teardown.handler", timeout=30)
    faults.inject("teardown", "timeout-mid-delete")

    response = client("lambda").invoke(
        FunctionName="teardown", Payload=json.dumps({"buckets": ["first-to-delete", "second-to-delete"]})
    )

    assert response["FunctionError"] == "Unhandled"
    assert json.loads(response["Payload"].read())["errorType"] == "Sandbox.Timedout"
    # the answer came at the first delete, well before the function's Timeout; the handler goes on
    assert teardown.finished.wait(timeout=30)
    assert teardown.deleted == ["first-to-delete", "second-to-delete"]


@pytest.mark.usefixtures("moto_twin")
def test_twice_at_once_runs_the_teardown_twice_at_the_same_time() -> None:
    from twinfakes import teardown

    teardown.reset(parties=2)  # each run waits for the other: only two at once get past it
    client("s3").create_bucket(Bucket="deleted-by-one")
    make_function("teardown", "twinfakes.teardown.handler", timeout=30)
    faults.inject("teardown", "twice-at-once")

    response = client("lambda").invoke(
        FunctionName="teardown", Payload=json.dumps({"buckets": ["deleted-by-one"]})
    )

    # one of the two deleted the bucket; the other's delete of a bucket already gone failed, and that is the answer
    assert response["FunctionError"] == "Unhandled"
    assert json.loads(response["Payload"].read())["errorType"] == "NoSuchBucket"
    assert teardown.deleted == ["deleted-by-one"]
