"""EventBridge delivers to Lambda and Step Functions targets; S3 emits AWS's "Object Created" events."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from twinfakes import handlers
from twinhelpers import (
    ACCOUNT,
    REGION,
    STALL_S,
    client,
    make_function,
    make_state_machine,
    role_arn,
    wait_execution,
)

from lustrain.twin.patches import eventbridge

pytestmark = pytest.mark.usefixtures("moto_twin")

TRAINING_EVENT = "SageMaker Training Job State Change"


def rule_to(target_arn: str, pattern: dict[str, Any], name: str = "to-target", **target: Any) -> None:
    events = client("events")
    events.put_rule(Name=name, EventPattern=json.dumps(pattern))
    events.put_targets(Rule=name, Targets=[{"Id": "target", "Arn": target_arn, **target}])


def put_training_event(status: str) -> None:
    """SageMaker's event on the bus, put as SageMaker puts it (PutEvents refuses an aws.* source to anyone else)."""
    eventbridge.emit(
        "aws.sagemaker", TRAINING_EVENT, {"TrainingJobName": "gpt-small-1", "TrainingJobStatus": status}, REGION
    )


def test_put_events_refuses_an_aws_source_entry_by_entry_and_delivers_the_rest() -> None:
    function_arn = make_function("on-any-event", "twinfakes.handlers.record")
    rule_to(function_arn, {"source": ["aws.sagemaker", "aws.states", "lustrain"]})

    def entry(source: str) -> dict[str, str]:
        return {"Source": source, "DetailType": TRAINING_EVENT, "Detail": json.dumps({"TrainingJobName": source})}

    answer = client("events").put_events(Entries=[entry("aws.sagemaker"), entry("lustrain"), entry("aws.states")])
    log = eventbridge.drain(timeout=STALL_S)

    assert answer["FailedEntryCount"] == 2
    refused, put, forged = answer["Entries"]
    assert refused["ErrorCode"] == forged["ErrorCode"] == "NotAuthorizedForSourceException"
    assert "EventId" in put and "ErrorCode" not in put
    # only the entry of a source the caller may use reached the rule
    assert [e["source"] for e in handlers.received] == ["lustrain"] and len(log) == 1


def test_put_events_invokes_a_lambda_target_asynchronously_with_the_aws_event() -> None:
    function_arn = make_function("on-training-event", "twinfakes.handlers.record")
    rule_to(function_arn, {"source": ["aws.sagemaker"], "detail-type": [TRAINING_EVENT]})

    put_training_event("Completed")
    log = eventbridge.drain(timeout=STALL_S)

    assert len(handlers.received) == 1
    event = handlers.received[0]
    assert event["source"] == "aws.sagemaker"
    assert event["detail-type"] == TRAINING_EVENT
    assert event["detail"] == {"TrainingJobName": "gpt-small-1", "TrainingJobStatus": "Completed"}
    assert event["account"] == ACCOUNT
    assert event["region"] == REGION
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", event["time"])
    assert [(d.rule, d.target_arn, d.status) for d in log] == [("to-target", function_arn, "delivered")]


def test_only_events_matching_the_pattern_are_delivered() -> None:
    function_arn = make_function("on-training-event", "twinfakes.handlers.record")
    rule_to(
        function_arn,
        {"source": ["aws.sagemaker"], "detail": {"TrainingJobStatus": ["Completed", "Failed", "Stopped"]}},
    )

    put_training_event("InProgress")
    put_training_event("Failed")
    eventbridge.drain(timeout=STALL_S)

    assert [e["detail"]["TrainingJobStatus"] for e in handlers.received] == ["Failed"]


def test_a_disabled_rule_delivers_nothing() -> None:
    function_arn = make_function("on-training-event", "twinfakes.handlers.record")
    rule_to(function_arn, {"source": ["aws.sagemaker"]})
    client("events").disable_rule(Name="to-target")

    put_training_event("Completed")

    assert eventbridge.drain(timeout=STALL_S) == []
    assert handlers.received == []


def test_emit_delivers_like_an_aws_service_and_input_path_selects_the_payload() -> None:
    function_arn = make_function("on-training-event", "twinfakes.handlers.record")
    rule_to(function_arn, {"source": ["aws.sagemaker"]}, InputPath="$.detail")

    event_id = eventbridge.emit(
        "aws.sagemaker",
        TRAINING_EVENT,
        {"TrainingJobName": "gpt-small-1", "TrainingJobStatus": "Stopped"},
        region=REGION,
        account=ACCOUNT,
        resources=["arn:aws:sagemaker:us-east-1:123456789012:training-job/gpt-small-1"],
    )
    log = eventbridge.drain(timeout=STALL_S)

    assert handlers.received == [{"TrainingJobName": "gpt-small-1", "TrainingJobStatus": "Stopped"}]
    assert log[0].event_id == event_id


def test_a_step_functions_target_starts_an_execution_with_the_event() -> None:
    machine = make_state_machine(
        "on-event", {"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}}
    )
    rule_to(machine, {"source": ["aws.sagemaker"]}, RoleArn=role_arn("twin-test-events", service="events.amazonaws.com"))

    put_training_event("Completed")
    log = eventbridge.drain(timeout=STALL_S)

    assert [d.status for d in log] == ["delivered"]
    execution = wait_execution(log[0].result)
    assert execution["status"] == "SUCCEEDED"
    assert json.loads(execution["input"])["detail"]["TrainingJobStatus"] == "Completed"


def test_a_step_functions_target_is_started_as_its_role_and_fails_without_one_that_may() -> None:
    machine = make_state_machine("guarded", {"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}})
    rule_to(machine, {"source": ["aws.sagemaker"]}, RoleArn=role_arn("twin-test-lambda-only"))  # trusts lambda

    put_training_event("Completed")
    (delivery,) = eventbridge.drain(timeout=STALL_S)

    assert delivery.status == "failed"
    assert "events.amazonaws.com cannot assume" in delivery.error


def test_a_failing_lambda_target_is_logged_as_failed() -> None:
    function_arn = make_function("fails", "twinfakes.handlers.fail")
    rule_to(function_arn, {"source": ["aws.sagemaker"]})

    put_training_event("Completed")
    log = eventbridge.drain(timeout=STALL_S)

    assert [d.status for d in log] == ["failed"]
    assert "QuotaExceeded" in log[0].error


def test_drain_raises_naming_what_is_still_in_flight() -> None:
    function_arn = make_function("slow", "twinfakes.handlers.slow", timeout=5)
    rule_to(function_arn, {"source": ["aws.sagemaker"]}, Input=json.dumps({"seconds": 1}))

    put_training_event("Completed")

    with pytest.raises(TimeoutError, match=f"{TRAINING_EVENT} -> {function_arn}"):
        eventbridge.drain(timeout=0.05)
    assert [d.status for d in eventbridge.drain(timeout=STALL_S)] == ["delivered"]


def make_bucket(name: str, versioned: bool = False) -> None:
    s3 = client("s3")
    s3.create_bucket(Bucket=name)
    if versioned:
        s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    s3.put_bucket_notification_configuration(
        Bucket=name, NotificationConfiguration={"EventBridgeConfiguration": {}}
    )


def test_s3_put_object_emits_aws_object_created_event() -> None:
    function_arn = make_function("register-job", "twinfakes.handlers.record")
    rule_to(
        function_arn,
        {
            "source": ["aws.s3"],
            "detail-type": ["Object Created"],
            "detail": {"bucket": {"name": ["jobs"]}, "object": {"key": [{"prefix": "specs/"}]}},
        },
    )
    make_bucket("jobs")

    put = client("s3").put_object(Bucket="jobs", Key="specs/gpt-small.yaml", Body=b"name: gpt-small\n")
    client("s3").put_object(Bucket="jobs", Key="elsewhere/readme.txt", Body=b"not a spec")
    eventbridge.drain(timeout=STALL_S)

    assert len(handlers.received) == 1
    event = handlers.received[0]
    assert event["source"] == "aws.s3"
    assert event["detail-type"] == "Object Created"
    assert event["resources"] == ["arn:aws:s3:::jobs"]
    detail = event["detail"]
    assert detail["bucket"] == {"name": "jobs"}
    assert detail["object"]["key"] == "specs/gpt-small.yaml"
    assert detail["object"]["size"] == len(b"name: gpt-small\n")
    assert detail["object"]["etag"] == put["ETag"].strip('"')
    assert re.fullmatch(r"[0-9A-F]+", detail["object"]["sequencer"])
    assert "version-id" not in detail["object"]
    assert detail["reason"] == "PutObject"
    assert detail["requester"] == ACCOUNT


def test_s3_event_of_a_versioned_bucket_names_the_version() -> None:
    function_arn = make_function("register-job", "twinfakes.handlers.record")
    rule_to(function_arn, {"source": ["aws.s3"], "detail-type": ["Object Created"]})
    make_bucket("versioned-jobs", versioned=True)

    put = client("s3").put_object(Bucket="versioned-jobs", Key="specs/a.yaml", Body=b"x")
    eventbridge.drain(timeout=STALL_S)

    assert handlers.received[0]["detail"]["object"]["version-id"] == put["VersionId"]


def test_a_bucket_without_eventbridge_emits_nothing() -> None:
    function_arn = make_function("register-job", "twinfakes.handlers.record")
    rule_to(function_arn, {"source": ["aws.s3"]})
    client("s3").create_bucket(Bucket="quiet")

    client("s3").put_object(Bucket="quiet", Key="specs/a.yaml", Body=b"x")

    assert eventbridge.drain(timeout=STALL_S) == []


def test_a_rate_schedule_fires_its_targets_at_its_rate_and_a_disabled_one_never() -> None:
    import threading

    function_arn = make_function("on-schedule", "twinfakes.handlers.record")
    events = client("events")
    for name, state in (("every-minute", "ENABLED"), ("switched-off", "DISABLED")):
        events.put_rule(Name=name, ScheduleExpression="rate(1 minute)", State=state)
        events.put_targets(Rule=name, Targets=[{"Id": "fn", "Arn": function_arn}])
    stop = threading.Event()
    eventbridge.run_schedules(stop, speedup=60, poll_s=0.05)  # a minute in a second
    try:
        deadline = time.monotonic() + STALL_S
        while len(eventbridge.deliveries()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
    log = eventbridge.drain(timeout=STALL_S)
    assert len(log) >= 2 and {d.rule for d in log} == {"every-minute"}
    assert {d.detail_type for d in log} == {"Scheduled Event"} and {d.status for d in log} == {"delivered"}


@pytest.mark.parametrize("expression", ["rate(1 minutes)", "rate(5 minute)", "rate(0 minutes)", "cron(0 * * * ? *)"])
def test_a_schedule_the_twin_cannot_fire_is_named(expression: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        eventbridge.schedule_period_s(expression)


def test_rate_periods() -> None:
    assert eventbridge.schedule_period_s("rate(15 minutes)") == 900
    assert eventbridge.schedule_period_s("rate(1 hour)") == 3600
