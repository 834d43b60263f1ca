"""A task failed by callback keeps the cause sent with SendTaskFailure, as on AWS."""

from __future__ import annotations

import json
import time

import pytest
from twinfakes import handlers
from twinhelpers import client, make_function, make_state_machine, wait_execution

pytestmark = pytest.mark.usefixtures("moto_twin")


def test_send_task_failure_keeps_error_and_cause() -> None:
    function_arn = make_function("start-training", "twinfakes.handlers.record")
    machine = make_state_machine(
        "callback",
        {
            "StartAt": "StartTraining",
            "States": {
                "StartTraining": {
                    "Type": "Task",
                    "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
                    "Parameters": {
                        "FunctionName": function_arn,
                        "Payload": {"task_token.$": "$$.Task.Token"},
                    },
                    "End": True,
                }
            },
        },
    )
    sfn = client("stepfunctions")
    execution_arn = sfn.start_execution(stateMachineArn=machine, input=json.dumps({}))["executionArn"]
    deadline = time.monotonic() + 20
    while not handlers.received and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handlers.received, "the task never invoked its function"

    sfn.send_task_failure(
        taskToken=handlers.received[0]["task_token"],
        error="TrainingFailed",
        cause="AlgorithmError: loss is NaN",
    )

    execution = wait_execution(execution_arn)
    assert execution["status"] == "FAILED"
    assert execution["error"] == "TrainingFailed"
    assert execution["cause"] == "AlgorithmError: loss is NaN"
