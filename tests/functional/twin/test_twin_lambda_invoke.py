"""Lambda Invoke runs the handler in this process; Step Functions matches its errors by class name."""

from __future__ import annotations

import base64
import json
import os
import threading

import boto3
import pytest
from twinhelpers import REGION, client, history, lambda_task, make_function, make_state_machine, run_execution

pytestmark = pytest.mark.usefixtures("moto_twin")


def invoke(name: str, payload: object) -> dict[str, object]:
    response = client("lambda").invoke(FunctionName=name, Payload=json.dumps(payload), LogType="Tail")
    response["Payload"] = json.loads(response["Payload"].read())
    return response


def test_handler_runs_in_process_with_the_functions_environment_and_context() -> None:
    make_function("echo", "twinfakes.handlers.echo", env={"GREETING": "hello"}, timeout=7)

    response = invoke("echo", {"job": "gpt-small"})

    assert "FunctionError" not in response
    payload = response["Payload"]
    assert payload["event"] == {"job": "gpt-small"}
    assert payload["env"] == {"GREETING": "hello", "AWS_LAMBDA_FUNCTION_NAME": "echo", "AWS_REGION": REGION}
    assert payload["context"]["function_name"] == "echo"
    assert payload["context"]["memory_limit_in_mb"] == 256
    assert 0 < payload["context"]["remaining_ms"] <= 7000
    # The function's variables were applied for the call only.
    assert "GREETING" not in os.environ
    tail = base64.b64decode(response["LogResult"]).decode()
    assert f"START RequestId: {payload['context']['aws_request_id']}" in tail


def test_raised_error_is_reported_by_class_name_as_aws_runtime_does() -> None:
    make_function("fail", "twinfakes.handlers.fail")

    response = invoke("fail", {"count": 8})

    assert response["FunctionError"] == "Unhandled"
    payload = response["Payload"]
    assert payload["errorType"] == "QuotaExceeded"
    assert payload["errorMessage"] == "asked for 8 ml.p4d.24xlarge, 0 free"
    assert any("in fail" in line for line in payload["stackTrace"])


@pytest.mark.parametrize(
    ("handler", "error_type", "message_part"),
    [
        (
            "twinfakes.missing.handler",
            "Runtime.ImportModuleError",
            "Unable to import module 'twinfakes.missing'",
        ),
        ("twinfakes.handlers.nope", "Runtime.HandlerNotFound", "Handler 'nope' missing on module"),
        ("twinfakes.handlers.unmarshallable", "Runtime.MarshalError", "Unable to marshal response"),
    ],
)
def test_handler_that_cannot_run_or_answer_fails_like_the_lambda_runtime(
    handler: str, error_type: str, message_part: str
) -> None:
    make_function("broken", handler)

    payload = invoke("broken", {})["Payload"]

    assert payload["errorType"] == error_type
    assert message_part in payload["errorMessage"]


def test_a_handlers_default_boto3_session_is_its_own_as_in_a_lambda_process() -> None:
    iam = client("iam")
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}],
    }
    role = iam.create_role(RoleName="lists-buckets-only", AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    only_list = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:ListAllMyBuckets", "Resource": "*"}]}
    iam.put_role_policy(RoleName="lists-buckets-only", PolicyName="list", PolicyDocument=json.dumps(only_list))
    client("lambda").create_function(
        FunctionName="lister",
        Runtime="python3.12",
        Role=role,
        Handler="twinfakes.check_quota.handler",
        Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18},
    )

    # the handler calls boto3.client("s3"): boto3's default session, made under the function's role
    assert invoke("lister", {})["Payload"] == {"buckets": 0}

    # the caller's own boto3.client() still signs as the caller, not as the function's role
    boto3.client("s3", region_name=REGION).create_bucket(Bucket="made-by-the-caller")
    assert invoke("lister", {})["Payload"] == {"buckets": 1}


def test_handler_past_its_timeout_fails_with_sandbox_timedout() -> None:
    make_function("slow", "twinfakes.handlers.slow", timeout=1)

    response = invoke("slow", {"seconds": 3})

    assert response["FunctionError"] == "Unhandled"
    assert response["Payload"]["errorType"] == "Sandbox.Timedout"
    assert response["Payload"]["errorMessage"].endswith("Error: Task timed out after 1.00 seconds")


def test_step_functions_catch_matches_the_handlers_exception_class() -> None:
    failing = make_function("check", "twinfakes.handlers.fail")
    machine = make_state_machine(
        "catching",
        {
            "StartAt": "CheckQuota",
            "States": {
                "CheckQuota": lambda_task(
                    failing,
                    Catch=[{"ErrorEquals": ["QuotaExceeded"], "ResultPath": "$.error", "Next": "Caught"}],
                    End=True,
                ),
                "Caught": {"Type": "Pass", "End": True},
            },
        },
    )

    execution = run_execution(machine, {"count": 3})

    assert execution["status"] == "SUCCEEDED"
    error = json.loads(execution["output"])["error"]
    assert error["Error"] == "QuotaExceeded"
    assert json.loads(error["Cause"])["errorMessage"] == "asked for 3 ml.p4d.24xlarge, 0 free"


def test_uncaught_error_fails_the_execution_with_the_class_name() -> None:
    failing = make_function("check", "twinfakes.handlers.fail")
    machine = make_state_machine(
        "not-catching",
        {
            "StartAt": "CheckQuota",
            "States": {
                "CheckQuota": lambda_task(
                    failing, Catch=[{"ErrorEquals": ["CapacityError"], "Next": "Caught"}], End=True
                ),
                "Caught": {"Type": "Pass", "End": True},
            },
        },
    )

    execution = run_execution(machine, {})

    assert execution["status"] == "FAILED"
    assert execution["error"] == "QuotaExceeded"


@pytest.mark.slow
def test_step_functions_retry_names_the_error_and_the_retry_succeeds() -> None:
    flaky = make_function("flaky", "twinfakes.handlers.flaky")
    machine = make_state_machine(
        "retrying",
        {
            "StartAt": "Upload",
            "States": {
                "Upload": lambda_task(
                    flaky,
                    Retry=[{"ErrorEquals": ["FlakyError"], "IntervalSeconds": 1, "MaxAttempts": 1}],
                    End=True,
                )
            },
        },
    )

    execution = run_execution(machine, {"key": "retrying"})

    assert execution["status"] == "SUCCEEDED"
    assert json.loads(execution["output"]) == {"attempts": 2}
    failures = [
        e["taskFailedEventDetails"]["error"]
        for e in history(execution["executionArn"])
        if e["type"] == "TaskFailed"
    ]
    assert failures == ["FlakyError"]


@pytest.mark.slow
def test_lambda_timeout_reaches_step_functions_as_sandbox_timedout() -> None:
    slow = make_function("slow", "twinfakes.handlers.slow", timeout=1)
    machine = make_state_machine(
        "timing-out",
        {
            "StartAt": "Slow",
            "States": {
                "Slow": lambda_task(
                    slow,
                    Catch=[{"ErrorEquals": ["Sandbox.Timedout"], "ResultPath": "$.error", "Next": "Caught"}],
                    End=True,
                ),
                "Caught": {"Type": "Pass", "End": True},
            },
        },
    )

    execution = run_execution(machine, {"seconds": 3})

    assert execution["status"] == "SUCCEEDED"
    assert json.loads(execution["output"])["error"]["Error"] == "Sandbox.Timedout"


@pytest.mark.parametrize(("retries", "attempts"), [(None, 2), (0, 1)])
def test_a_failed_asynchronous_invocation_is_retried_as_the_function_allows(monkeypatch, retries, attempts) -> None:
    from twinfakes import handlers

    from lustrain.twin.patches import lambda_invoke

    monkeypatch.setattr(lambda_invoke, "ASYNC_RETRY_DELAYS_S", (0.0, 0.0))
    handlers.reset()
    make_function("flaky", "twinfakes.handlers.flaky")
    if retries is not None:
        client("lambda").put_function_event_invoke_config(FunctionName="flaky", MaximumRetryAttempts=retries)

    client("lambda").invoke(FunctionName="flaky", InvocationType="Event", Payload=json.dumps({"key": "k"}))

    # flaky fails its first attempt only: Lambda's default retries carry it, MaximumRetryAttempts 0 does not
    assert handlers._attempts["k"] == attempts


def test_a_session_made_outside_while_a_handler_runs_signs_as_the_caller_not_the_functions_role() -> None:
    from twinfakes import handlers

    make_function("holder", "twinfakes.handlers.hold", timeout=30)
    caller = boto3.Session().get_credentials().access_key
    lambda_client = client("lambda")
    invoking = threading.Thread(target=lambda: lambda_client.invoke(FunctionName="holder", Payload=b"{}"))
    invoking.start()
    assert handlers.holding.wait(timeout=30)
    try:
        # the role's credentials are in the process environment now; a session made here still finds the caller's
        assert os.environ["AWS_ACCESS_KEY_ID"] != caller
        assert boto3.Session().get_credentials().access_key == caller
    finally:
        handlers.release.set()
        invoking.join()
