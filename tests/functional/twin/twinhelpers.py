"""Small boto3 helpers shared by the twin's tests."""

from __future__ import annotations

import io
import json
import time
import zipfile
from functools import cache
from typing import Any

import boto3
from infra_support import any_role

REGION = "us-east-1"
ACCOUNT = "123456789012"

# One session for every test: boto3 loads a service's model once per session, which is most of a
# client's cost; moto intercepts the clients of any session, whichever mock_aws is active.
_SESSION = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION)


@cache
def client(service: str) -> Any:
    return _SESSION.client(service)  # type: ignore[call-overload]


def key_table(name: str, key: str) -> Any:
    """A DynamoDB table of the twin keyed by the string attribute `key`, paid per request; its client."""
    ddb = client("dynamodb")
    ddb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return ddb


def role_arn(name: str = "twin-test-role", iam: Any = None, service: str = "lambda.amazonaws.com") -> str:
    """A role `service` may assume, allowed everything: the patches are under test, not IAM."""
    return any_role(iam or client("iam"), name, service)


def make_function(
    name: str,
    handler: str,
    *,
    env: dict[str, str] | None = None,
    timeout: int = 3,
    lambda_client: Any = None,
    iam: Any = None,
) -> str:
    """A Lambda function whose Handler names a module in twinfakes/ (its code zip is never read)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("unused.py", "")
    created = (lambda_client or client("lambda")).create_function(
        FunctionName=name,
        Runtime="python3.12",
        Role=role_arn(iam=iam),
        Handler=handler,
        Code={"ZipFile": buffer.getvalue()},
        Timeout=timeout,
        MemorySize=256,
        Environment={"Variables": env or {}},
    )
    return str(created["FunctionArn"])


def make_state_machine(name: str, definition: dict[str, Any], sfn: Any = None, iam: Any = None) -> str:
    created = (sfn or client("stepfunctions")).create_state_machine(
        name=name,
        definition=json.dumps(definition),
        roleArn=role_arn("twin-test-sfn", iam=iam, service="states.amazonaws.com"),
    )
    return str(created["stateMachineArn"])


def lambda_task(function_arn: str, **extra: Any) -> dict[str, Any]:
    return {
        "Type": "Task",
        "Resource": "arn:aws:states:::lambda:invoke",
        "Parameters": {"FunctionName": function_arn, "Payload.$": "$"},
        "OutputPath": "$.Payload",
        **extra,
    }


def run_execution(
    state_machine_arn: str, payload: Any, sfn: Any = None, timeout: float = 30
) -> dict[str, Any]:
    """Start an execution and wait for its end; returns DescribeExecution's answer."""
    sfn = sfn or client("stepfunctions")
    execution_arn = sfn.start_execution(stateMachineArn=state_machine_arn, input=json.dumps(payload))[
        "executionArn"
    ]
    return wait_execution(execution_arn, sfn, timeout)


#: how long a wait of these tests goes on without the event it waits for before it fails: a guard against a stall,
#: far beyond what the twin takes on a busy machine (each wait ends as soon as its event comes)
STALL_S = 300.0


def wait_execution(execution_arn: str, sfn: Any = None, timeout: float = STALL_S) -> dict[str, Any]:
    sfn = sfn or client("stepfunctions")
    deadline = time.monotonic() + timeout
    while True:
        described: dict[str, Any] = sfn.describe_execution(executionArn=execution_arn)
        if described["status"] != "RUNNING":
            return described
        if time.monotonic() > deadline:
            raise AssertionError(f"execution {execution_arn} still RUNNING after {timeout} s")
        time.sleep(0.05)


def history(execution_arn: str) -> list[dict[str, Any]]:
    pages = client("stepfunctions").get_paginator("get_execution_history").paginate(executionArn=execution_arn)
    return [event for page in pages for event in page["events"]]
