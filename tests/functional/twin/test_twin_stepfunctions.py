"""Step Functions on the twin as on AWS: a callback failure keeps its cause, unnamed starts, stops, status events,
history pages, and each execution of a definition runs on its own."""

from __future__ import annotations

import json
import time

import pytest
from twinfakes import handlers
from twinhelpers import STALL_S, client, make_function, make_state_machine, wait_execution

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
    deadline = time.monotonic() + STALL_S
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


def waiting_machine(name: str) -> str:
    """A task that waits for its callback, with a Catch that would run a clean-up on any error."""
    function_arn = make_function(f"{name}-fn", "twinfakes.handlers.record")
    return make_state_machine(
        name,
        {
            "StartAt": "Wait",
            "States": {
                "Wait": {
                    "Type": "Task",
                    "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
                    "Parameters": {"FunctionName": function_arn, "Payload": {"task_token.$": "$$.Task.Token", "execution.$": "$$.Execution.Id"}},
                    "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "CleanUp"}],
                    "End": True,
                },
                "CleanUp": {"Type": "Pass", "End": True},
            },
        },
    )


def test_executions_started_without_a_name_each_get_their_own() -> None:
    machine = waiting_machine("unnamed")
    sfn = client("stepfunctions")
    arns = [sfn.start_execution(stateMachineArn=machine, input=json.dumps({"n": n}))["executionArn"] for n in range(3)]
    names = [arn.rsplit(":", 1)[1] for arn in arns]
    assert len(set(names)) == 3 and "None" not in names
    assert all(len(name) == 36 for name in names)  # a UUID, as AWS generates
    for arn in arns:
        sfn.stop_execution(executionArn=arn)


def test_a_stop_the_moment_an_execution_starts_still_aborts_it() -> None:
    """AWS stops an execution at any moment: one stopped before its first state (moto skipped the program's
    body, and no ExecutionAborted was written) or before its task has made its callback still ends ABORTED with
    ExecutionAborted in its history, and its task waits for no callback. Eight stops, to land in both moments."""
    machine = waiting_machine("stopped-early")
    sfn = client("stepfunctions")
    arns = [
        sfn.start_execution(stateMachineArn=machine, name=f"early-{n}", input="{}")["executionArn"] for n in range(8)
    ]
    for arn in arns:
        sfn.stop_execution(executionArn=arn, error="Cancelled", cause="at once")
    for arn in arns:
        deadline = time.monotonic() + STALL_S
        while True:
            events = sfn.get_execution_history(executionArn=arn)["events"]
            if events[-1]["type"] == "ExecutionAborted" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert events[-1]["type"] == "ExecutionAborted", [e["type"] for e in events]
        assert sfn.describe_execution(executionArn=arn)["status"] == "ABORTED"


def test_stop_execution_aborts_at_once_and_runs_no_catch() -> None:
    machine = waiting_machine("stopped")
    sfn = client("stepfunctions")
    arn = sfn.start_execution(stateMachineArn=machine, name="stop-me", input="{}")["executionArn"]
    deadline = time.monotonic() + STALL_S
    # this execution's own invocation (another test's stopped executions may still be delivering theirs)
    while not any(e.get("execution") == arn for e in handlers.received) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(e.get("execution") == arn for e in handlers.received), "the task never invoked its function"

    sfn.stop_execution(executionArn=arn, error="Cancelled", cause="lustrain cancel")

    described = sfn.describe_execution(executionArn=arn)
    assert described["status"] == "ABORTED" and "stopDate" in described
    deadline = time.monotonic() + STALL_S
    while True:  # the history's last event is written as the execution's worker stops
        events = sfn.get_execution_history(executionArn=arn)["events"]
        aborted = [e for e in events if e["type"] == "ExecutionAborted"]
        if aborted or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert aborted, [(e["type"], e.get("stateEnteredEventDetails", {}).get("name")) for e in events]
    assert aborted[0]["executionAbortedEventDetails"] == {"error": "Cancelled", "cause": "lustrain cancel"}
    entered = [e["stateEnteredEventDetails"]["name"] for e in events if e["type"].endswith("StateEntered")]
    assert "CleanUp" not in entered


def test_each_status_change_is_announced_on_eventbridge_as_aws_does() -> None:
    """RUNNING when the execution starts, ABORTED with StopExecution's error and cause when it is stopped: the
    "Step Functions Execution Status Change" events a rule on aws.states receives (here into an SQS queue)."""
    machine = waiting_machine("announced")
    sqs, events = client("sqs"), client("events")
    queue = sqs.create_queue(QueueName="status-changes")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    pattern = {"source": ["aws.states"], "detail-type": ["Step Functions Execution Status Change"],
               "detail": {"stateMachineArn": [machine]}}
    events.put_rule(Name="status-changes", EventPattern=json.dumps(pattern))
    events.put_targets(Rule="status-changes", Targets=[{"Id": "queue", "Arn": queue_arn}])
    sfn = client("stepfunctions")
    arn = sfn.start_execution(stateMachineArn=machine, name="announce-me", input=json.dumps({"n": 1}))["executionArn"]
    sfn.stop_execution(executionArn=arn, error="RunCancelled", cause="cancelled by alice")

    received: list[dict] = []
    deadline = time.monotonic() + STALL_S
    while len(received) < 2 and time.monotonic() < deadline:
        received += [json.loads(m["Body"]) for m in sqs.receive_message(QueueUrl=queue).get("Messages", [])]
        time.sleep(0.05)
    assert [e["detail"]["status"] for e in received] == ["RUNNING", "ABORTED"]
    started, aborted = received
    assert started["resources"] == [arn] and started["source"] == "aws.states"
    detail = aborted["detail"]
    assert (detail["executionArn"], detail["stateMachineArn"], detail["name"]) == (arn, machine, "announce-me")
    assert (detail["error"], detail["cause"]) == ("RunCancelled", "cancelled by alice")
    assert json.loads(detail["input"]) == {"n": 1} and detail["inputDetails"] == {"included": True}
    assert detail["stopDate"] >= detail["startDate"] > 1_000_000_000_000  # epoch milliseconds
    assert started["detail"]["stopDate"] is None


def test_execution_history_pages_as_aws_does_newest_first_when_asked() -> None:
    states = {f"P{i}": {"Type": "Pass", "Next": f"P{i + 1}"} for i in range(7)}
    states["P7"] = {"Type": "Pass", "End": True}
    machine = make_state_machine("paged", {"StartAt": "P0", "States": states})
    sfn = client("stepfunctions")
    arn = sfn.start_execution(stateMachineArn=machine, input="{}")["executionArn"]
    assert wait_execution(arn, sfn)["status"] == "SUCCEEDED"

    everything = [e for page in sfn.get_paginator("get_execution_history").paginate(executionArn=arn)
                  for e in page["events"]]
    ids = [e["id"] for e in everything]
    assert ids == list(range(1, len(ids) + 1)) and len(ids) > 10
    # at most maxResults a call, a token for the rest, the same events page by page
    first = sfn.get_execution_history(executionArn=arn, maxResults=4)
    assert [e["id"] for e in first["events"]] == [1, 2, 3, 4] and first["nextToken"]
    second = sfn.get_execution_history(executionArn=arn, maxResults=4, nextToken=first["nextToken"])
    assert [e["id"] for e in second["events"]] == [5, 6, 7, 8]
    # newest first, one event: what a watcher reads to learn whether anything happened
    newest = sfn.get_execution_history(executionArn=arn, reverseOrder=True, maxResults=1)
    assert [e["id"] for e in newest["events"]] == [ids[-1]] and newest["events"][0]["type"] == "ExecutionSucceeded"
    # the last page has no token; a token given with other arguments is refused
    last = sfn.get_execution_history(executionArn=arn, maxResults=len(ids))
    assert "nextToken" not in last
    with pytest.raises(sfn.exceptions.InvalidToken):
        sfn.get_execution_history(executionArn=arn, maxResults=4, reverseOrder=True, nextToken=first["nextToken"])


def test_executions_of_one_definition_each_retry_on_their_own_and_parse_it_once(monkeypatch) -> None:
    """The twin keeps a definition's parse tree, never an execution's state: each execution retries its failing
    state as many times as the definition says, as if it were the first."""
    from collections import OrderedDict

    from moto.stepfunctions.parser.asl.antlr.runtime.ASLParser import ASLParser

    from lustrain.twin.patches import asl_parse

    monkeypatch.setattr(asl_parse, "_trees", OrderedDict())  # none kept from an earlier test of this process
    parses = []
    parse_tree = ASLParser.state_machine
    monkeypatch.setattr(ASLParser, "state_machine", lambda self: parses.append(1) or parse_tree(self))
    machine = make_state_machine(
        "retries",
        {
            "StartAt": "Try",
            "States": {
                "Try": {
                    "Type": "Parallel",
                    "Branches": [{"StartAt": "Fail", "States": {"Fail": {"Type": "Fail", "Error": "Flaky"}}}],
                    "Retry": [{"ErrorEquals": ["Flaky"], "MaxAttempts": 2, "IntervalSeconds": 1, "BackoffRate": 1}],
                    "End": True,
                }
            },
        },
    )
    sfn = client("stepfunctions")
    for _ in range(2):
        arn = sfn.start_execution(stateMachineArn=machine)["executionArn"]
        assert wait_execution(arn)["status"] == "FAILED"
        events = sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
        assert sum(event["type"] == "ParallelStateStarted" for event in events) == 3
    assert len(parses) == 1
