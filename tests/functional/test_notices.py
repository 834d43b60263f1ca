"""The run's notices in the team's chat, on moto: the notify function reads the webhook from Secrets Manager and
posts each moment of a run to a local receiver (127.0.0.1), formatted for Slack, Microsoft Teams or plain JSON.

An execution's end (cancelled, timed out, died) is told only as Step Functions bears it out: its executions are
those of a (moto, non-executing) state machine, the stack's own (`machine`), which stay RUNNING until a test stops
them; an end moto cannot reach (TIMED_OUT, FAILED, SUCCEEDED) is DescribeExecution's answer served by botocore's
Stubber, which checks it against the API model."""

from __future__ import annotations

import copy
import html
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from infra_support import REGION, invoke, register, sfn, state_machine
from lustrain_core import clients
from lustrain_core.steps import records

from lustrain.twin.notice_receiver import receiver

EVENTS = Path(__file__).resolve().parents[2] / "events"
CALLER = "arn:aws:sts::123456789012:assumed-role/ml-team/ana"


@pytest.fixture(autouse=True)
def _fresh_webhooks(monkeypatch: pytest.MonkeyPatch):
    from lustrain_core.steps import notices

    notices.forget()
    monkeypatch.setattr(notices, "PAUSES_S", (0.0, 0.0))  # the pauses between tries, not what is tested here
    yield
    notices.forget()


def use_webhook(monkeypatch: pytest.MonkeyPatch, value: str) -> str:
    arn = boto3.client("secretsmanager", region_name=REGION).create_secret(
        Name="team/hook", SecretString=value
    )["ARN"]
    monkeypatch.setenv("LUSTRAIN_NOTICE_WEBHOOK_SECRET", arn)
    return arn


#: the stack's state machine: the notify function's LUSTRAIN_STATE_MACHINE_ARN (template.yaml), made by `machine`
MACHINE = f"arn:aws:states:{REGION}:123456789012:stateMachine:lustrain-test-runs"
#: the moment the executions DescribeExecution is stubbed for ended (`described_as`)
STOPPED = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)




@pytest.fixture
def machine(aws, monkeypatch: pytest.MonkeyPatch) -> str:
    """The stack's own state machine, named to the notify function as template.yaml names it."""
    arn = state_machine(MACHINE.rsplit(":", 1)[-1])
    assert arn == MACHINE
    monkeypatch.setenv("LUSTRAIN_STATE_MACHINE_ARN", arn)
    return arn


def execution_arn(machine: str, name: str) -> str:
    return machine.replace(":stateMachine:", ":execution:") + ":" + name


def execution_change(status: str, name: str, machine: str = MACHINE, **detail: Any) -> dict[str, Any]:
    arn = execution_arn(machine, name)
    return {
        "version": "0",
        "source": "aws.states",
        "detail-type": "Step Functions Execution Status Change",
        "resources": [arn],
        "detail": {
            "name": name,
            "status": status,
            "executionArn": arn,
            "stateMachineArn": machine,
            **detail,
        },
    }


def started(name: str, machine: str = MACHINE, given: str = "{}") -> dict[str, Any]:
    """Start the execution with the input `given`: the RUNNING event Step Functions puts on the bus for it, its start
    time DescribeExecution's."""
    sfn().start_execution(stateMachineArn=machine, name=name, input=given)
    began = sfn().describe_execution(executionArn=execution_arn(machine, name))["startDate"]
    return execution_change("RUNNING", name, machine, startDate=millis(began), input=given)


def stopped(name: str, machine: str = MACHINE, **reason: str) -> dict[str, Any]:
    """Start the execution (unless it runs) and stop it (StopExecution with `reason`): the ABORTED event Step
    Functions puts on the bus for it, its stop time DescribeExecution's."""
    running = {e["name"] for e in sfn().list_executions(stateMachineArn=machine)["executions"]}
    if name not in running:
        sfn().start_execution(stateMachineArn=machine, name=name, input="{}")
    sfn().stop_execution(executionArn=execution_arn(machine, name), **reason)
    ended = sfn().describe_execution(executionArn=execution_arn(machine, name))
    return execution_change("ABORTED", name, machine, stopDate=millis(ended["stopDate"]), **reason)


def described_as(name: str, status: str, times: int = 1, **ended: Any) -> Stubber:
    """DescribeExecution answers (`times` times) that the execution is `status` (an end moto's never reach),
    stopped at STOPPED."""
    arn = execution_arn(MACHINE, name)
    answer = {
        "executionArn": arn,
        "stateMachineArn": MACHINE,
        "name": name,
        "status": status,
        "startDate": datetime(2026, 12, 1, 8, 0, tzinfo=UTC),
        **({"stopDate": STOPPED} if status != "RUNNING" else {}),
        **ended,
    }
    stubber = Stubber(clients.client("stepfunctions"))
    for _ in range(times):
        stubber.add_response("describe_execution", answer, {"executionArn": arn})
    return stubber


def training_change(name: str, status: str, reason: str | None = None) -> dict[str, Any]:
    event = json.loads((EVENTS / "on_training_event_failed.json").read_text())
    event["detail"].update(TrainingJobName=name, TrainingJobStatus=status, FailureReason=reason)
    return event


#: DescribeTrainingJob's answers, by job name, for the jobs a test's events tell of (sagemaker_knows)
KNOWN_JOBS: dict[str, dict[str, Any]] = {}


@pytest.fixture(autouse=True)
def sagemaker_knows(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """What SageMaker says of a training job, which the notice tells rather than the event's words: the jobs of
    these tests are never created, so DescribeTrainingJob is answered from KNOWN_JOBS (None: no such job)."""
    from lustrain_core.steps import notify, training

    KNOWN_JOBS.clear()
    # the attempt's check (training.ended_attempt) and the cost of the run (notify) both ask
    for module in (notify, training):
        monkeypatch.setattr(module, "describe_training_job", lambda sagemaker, name: KNOWN_JOBS.get(name))
    return KNOWN_JOBS


def sagemaker_ended(name: str, status: str, reason: str | None = None, model: str | None = None) -> None:
    KNOWN_JOBS[name] = {
        "TrainingJobName": name,
        "TrainingJobStatus": status,
        "SecondaryStatus": status,
        **({"FailureReason": reason} if reason else {}),
        **({"ModelArtifacts": {"S3ModelArtifacts": model}} if model else {}),
    }


PLACE = {"pool": "ml.p4d.24xlarge#on-demand", "position": 2, "queued_s": 90}


def queue_change(job_id: str, state: str, **detail: Any) -> dict[str, Any]:
    detail = {"job_id": job_id, "state": state, **PLACE, **detail}
    return {
        "version": "0",
        "source": "lustrain",
        "detail-type": "lustrain Run Queue Change",
        "detail": detail,
    }


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The handlers' records from INFO up, whatever level an earlier test's environment gave their logger
    (Powertools keeps the level the service's first Logger in the process was made with)."""
    caplog.set_level(logging.INFO, logger="lustrain")
    return caplog


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every log record the handlers wrote, with its fields (Powertools' extra keys)."""
    return "\n".join(json.dumps(record.__dict__, default=str) for record in caplog.records)


def every_moment(job_id: str) -> list[dict[str, Any]]:
    """A run's events, from its start to its end, as the notify function receives them."""
    end = json.loads((EVENTS / "notify.json").read_text())
    end["job"]["job_id"] = job_id
    sagemaker_ended(f"{job_id}-1", "Failed", "CapacityError: Unable to provision requested ML compute capacity")
    sagemaker_ended(f"{job_id}-2", "Completed")
    return [
        started("run-1", given=json.dumps({"spec_s3_uri": "s3://jobs/jobs/tiny.yaml"})),
        queue_change(job_id, "queued"),
        queue_change(job_id, "admitted"),
        training_change(
            f"{job_id}-1", "Failed", "CapacityError: Unable to provision requested ML compute capacity"
        ),
        training_change(f"{job_id}-2", "Completed"),
        stopped("run-1", error="RunCancelled", cause=f"cancelled by {CALLER} with lustrain cancel"),
        end,
    ]


def deliver(aws: Any, event: dict[str, Any]) -> dict[str, Any]:
    """Invoke notify with the event; a queue change comes after check_quota wrote the run's place in its record,
    as on the stack."""
    if event.get("source") == "lustrain":
        place = {"state": event["detail"]["state"], **PLACE}
        records.set_fields(
            boto3.client("dynamodb", region_name=REGION), aws.jobs_table, event["detail"]["job_id"], queue=place
        )
    return invoke("notify", event)


def text_of(fmt: str, body: dict[str, Any]) -> str:
    """What the chat shows of a posted notice: Slack's mrkdwn without its code spans' backticks and its escapes,
    Teams' card as its TextRuns read."""
    if fmt == "slack":
        return html.unescape(
            "\n".join(
                [
                    block["text"]["text"] if block["type"] == "section" else block["elements"][0]["text"]
                    for block in body["blocks"]
                ]
            ).replace("`", "")
        )
    if fmt == "teams":
        card = body["attachments"][0]["content"]
        return "\n".join("".join(run["text"] for run in item["inlines"]) for item in card["body"]).replace(
            "\u200b", ""
        )
    return str(body["text"])


@pytest.mark.parametrize("fmt", ["slack", "teams", "json"])
def test_every_notice_of_a_run_arrives_formatted_for_its_chat(aws, machine, monkeypatch, caplog, fmt):
    job_id = register()["job"]["job_id"]
    with receiver() as hook:
        use_webhook(monkeypatch, json.dumps({"url": hook.url, "format": fmt}))
        results = [deliver(aws, event) for event in every_moment(job_id)]

    kinds = ["started", "queued", "admitted", "attempt-ended", "attempt-ended", "cancelled", "succeeded"]
    assert [r.get("kind") or r["chat"]["kind"] for r in results] == kinds
    assert all((r.get("chat") or {}).get("delivered") for r in results), results
    assert len(hook.posts) == len(kinds)
    if fmt == "slack":
        assert all(p["blocks"][0]["text"]["type"] == "mrkdwn" and p["text"] for p in hook.posts)
    elif fmt == "teams":
        assert all(p["type"] == "message" for p in hook.posts)
        assert {a["contentType"] for p in hook.posts for a in p["attachments"]} == {
            "application/vnd.microsoft.card.adaptive"
        }
        assert {p["attachments"][0]["content"]["type"] for p in hook.posts} == {"AdaptiveCard"}
    else:
        assert [p["kind"] for p in hook.posts] == kinds and {p["source"] for p in hook.posts} == {"lustrain"}
    shown = [text_of(fmt, p) for p in hook.posts]
    # each says the cost so far, where the model is, and the command that shows the run
    assert all("Cost so far" in s and "Model" in s for s in shown)
    assert "lustrain status run-1 --stack lustrain-test" in shown[0]
    assert all(f"lustrain status {job_id} --stack lustrain-test" in s for s in shown[1:])
    assert "waits in the capacity queue" in shown[1] and "place 2" in shown[1]
    # where the model will be archived, from the queue on
    assert all(f"s3://lustrain-test-artifacts/archive/{job_id}/" in s for s in shown[1:3])
    assert "admitted" in shown[2] and "after 90 s" in shown[2]
    assert "attempt 1 failed" in shown[3] and "CapacityError: Unable to provision" in shown[3]
    assert "attempt 2 completed" in shown[4]
    assert f"cancelled by {CALLER} with lustrain cancel" in shown[5]
    assert f"s3://lustrain-test-artifacts/archive/{job_id}/" in shown[5]
    assert f"lustrain run {job_id} succeeded" in shown[6] and "s3://" in shown[6]
    assert "$0.00" in shown[0]
    # the URL is a credential: in no log line, no result
    assert "outcome published" in logged(caplog) and hook.url not in logged(caplog) + json.dumps(results)


def test_a_bare_url_is_posted_as_its_host_expects_and_a_slack_url_as_slack():
    from lustrain_core.steps import notices

    assert notices.parse_webhook("https://hooks.slack.com/services/T/B/x").format == "slack"
    assert notices.parse_webhook("https://acme.webhook.office.com/webhookb2/x").format == "teams"
    assert notices.parse_webhook("https://prod-01.westus.logic.azure.com/workflows/x").format == "teams"
    assert notices.parse_webhook("https://ops.example.com/lustrain").format == "json"
    assert "hooks.slack.com" not in repr(notices.parse_webhook("https://hooks.slack.com/services/T/B/x"))
    for bad, named in (
        ("http://ops.example.com/x", "https://"),
        ('{"url": "https://ops.example.com/x", "format": "discord"}', "format"),
        ('{"format": "slack"}', "url"),
        ("not a url", "url"),
    ):
        with pytest.raises(notices.WebhookInvalid, match=named) as refused:
            notices.parse_webhook(bad)
        assert "ops.example.com" not in str(refused.value)


def test_a_webhook_that_keeps_failing_is_tried_three_times_and_the_run_goes_on(aws, monkeypatch, caplog):
    document = json.loads((EVENTS / "notify.json").read_text())
    with receiver([503]) as hook:
        use_webhook(monkeypatch, hook.url)
        result = invoke("notify", document)
    # the outcome is published all the same; the chat's failure is answered, not raised
    assert result["message_id"] and result["outcome"] == "succeeded"
    assert result["chat"] == {"kind": "succeeded", "delivered": False, "tries": 3, "status": 503}
    assert len(hook.posts) == 3
    lines = logged(caplog)
    assert '"notice_not_delivered": 1' in lines and hook.url not in lines and "127.0.0.1" not in lines


def test_a_webhook_that_fails_once_gets_the_notice_on_the_second_try(aws, machine, monkeypatch):
    with receiver([500, 200]) as hook:
        use_webhook(monkeypatch, json.dumps({"url": hook.url, "format": "json"}))
        result = invoke("notify", started("run-9"))
    assert result["posted"] is True and result["chat"]["tries"] == 2
    assert [p["kind"] for p in hook.posts] == ["started", "started"]


def test_a_refusing_webhook_is_not_tried_again_and_an_unreachable_one_is_answered(aws, machine, monkeypatch):
    with receiver([400]) as hook:
        use_webhook(monkeypatch, hook.url)
        run = started("run-9")
        refused = invoke("notify", run)
    assert refused["chat"] == {"kind": "started", "delivered": False, "tries": 1, "status": 400}
    from lustrain_core.steps import notices

    notices.forget()
    # the receiver is gone: the connection is refused, three times, and nothing is raised
    gone = invoke("notify", run)
    assert gone["chat"]["delivered"] is False and gone["chat"]["tries"] == 3
    assert gone["chat"]["error"] in ("URLError", "ConnectionRefusedError")


def test_a_secret_that_is_no_webhook_is_reported_by_its_field_and_the_run_goes_on(aws, monkeypatch):
    use_webhook(monkeypatch, json.dumps({"url": "https://hooks.example.com/x", "format": "discord"}))
    result = invoke("notify", json.loads((EVENTS / "notify.json").read_text()))
    assert result["outcome"] == "succeeded"
    assert result["chat"]["delivered"] is False and "the secret's format" in result["chat"]["error"]


def test_the_webhook_is_read_once_per_warm_container(aws, machine, monkeypatch):
    from lustrain_core.steps import notices

    with receiver() as hook:
        use_webhook(monkeypatch, hook.url)
        invoke("notify", started("run-9"))
        # a changed secret is not read again while the webhook answers
        secrets = boto3.client("secretsmanager", region_name=REGION)
        secrets.put_secret_value(SecretId="team/hook", SecretString="https://hooks.example.com/elsewhere")
        invoke("notify", started("run-10"))
    assert len(hook.posts) == 2 and len(notices._cache) == 1


def test_no_webhook_no_post_and_events_of_others_are_ignored(aws, monkeypatch):
    from lustrain_core.steps import notify

    assert invoke("notify", execution_change("RUNNING", "run-9"))["chat"]["skipped"]
    with receiver() as hook:
        use_webhook(monkeypatch, hook.url)
        other = invoke("notify", training_change("someone-elses-job-1", "Failed", "oops"))
        running = invoke("notify", training_change("tiny-0123abcd-1", "InProgress"))
    assert other == {"posted": False, "reason": "the training job is no run's of this stack"}
    assert running["posted"] is False and hook.posts == []
    assert notify.QUEUE_CHANGE == "lustrain Run Queue Change"


def test_the_queue_announces_the_first_look_of_a_wait_and_the_admission_after_one_only():
    from lustrain_core.document import Admission
    from lustrain_core.steps.queue import change_of

    waiting, admitted = Admission(admitted=False, position=1), Admission(admitted=True)
    assert change_of(None, waiting) == "queued"
    assert change_of({"admitted": False}, waiting) is None  # still waiting: said already
    assert change_of({"admitted": False}, admitted) == "admitted"
    assert change_of(None, admitted) is None  # admitted at once: no queue to tell of
    # back in line before a later attempt (the last answer was an admission)
    assert change_of({"admitted": True}, waiting) == "queued"


def test_an_execution_that_died_without_its_catch_is_told_and_a_failure_notify_announced_is_not_told_twice(
    aws, machine, monkeypatch
):
    from lustrain_core.steps import records

    job_id = register()["job"]["job_id"]
    # the notice tells DescribeExecution's error and cause, not the event's
    died = execution_change(
        "FAILED", "run-1", error="States.Runtime", cause="forged words", stopDate=millis(STOPPED)
    )
    described = described_as(
        "run-1", "FAILED", times=2, error="States.Runtime", cause="An error occurred while executing"
    )
    with receiver() as hook, described:
        use_webhook(monkeypatch, json.dumps({"url": hook.url, "format": "json"}))
        told = invoke("notify", died)
        # the state machine's notify announced this one (its record notes the message) before the execution ended
        ddb = boto3.client("dynamodb", region_name=REGION)
        records.set_fields(ddb, aws.jobs_table, job_id, {"notified": {"message_id": "m-1"}})
        again = invoke("notify", died)
    assert told["posted"] is True and again == {
        "posted": False,
        "reason": "the state machine's notify announced the failure",
    }
    (post,) = hook.posts
    assert (post["kind"], post["job_id"]) == ("failed", job_id)
    assert "Error: States.Runtime: An error occurred while executing" in post["text"]
    assert "forged" not in json.dumps(post)


def test_a_queue_change_the_runs_record_does_not_say_is_not_announced(aws, monkeypatch):
    """Anyone allowed PutEvents on the default bus can put the lustrain source: the notice says the record's place,
    and an event that disagrees with it (forged, or stale) posts nothing."""
    job_id = register()["job"]["job_id"]
    with receiver() as hook:
        use_webhook(monkeypatch, hook.url)
        unplaced = invoke("notify", queue_change(job_id, "admitted"))
        deliver(aws, queue_change(job_id, "queued"))
        forged = invoke("notify", queue_change(job_id, "admitted", pool="http://phish.example"))
        told = invoke("notify", queue_change(job_id, "queued", pool="http://phish.example", position=1))
    assert unplaced["posted"] is False and forged["posted"] is False
    assert "the run's record" in forged["reason"]
    assert len(hook.posts) == 2 and "phish" not in json.dumps(hook.posts)
    assert "place 2" in json.dumps(hook.posts[1]) and told["chat"]["delivered"]


def test_a_refused_start_shaped_like_an_event_is_told_as_the_refusal_it_is(aws, monkeypatch):
    """A refused start's document is its caller's input plus $.error: an input shaped like a queue or execution
    event must not pass for one."""
    job_id = register()["job"]["job_id"]
    document = {
        **queue_change(job_id, "admitted"),
        "error": {"Error": "SpecInvalid", "Cause": "spec: field required"},
    }
    with receiver() as hook:
        use_webhook(monkeypatch, hook.url)
        result = invoke("notify", document)
    assert "admitted" not in json.dumps(hook.posts)
    assert result.get("kind") != "admitted" and (result.get("chat") or {}).get("kind") != "admitted"


def test_a_training_notice_tells_what_sagemaker_says_not_what_the_event_says(aws, monkeypatch):
    """notify can be invoked with any payload: an attempt's end is told from DescribeTrainingJob, and an event that
    SageMaker does not bear out (another status, a job it does not know) posts nothing."""
    job_id = register()["job"]["job_id"]
    sagemaker_ended(f"{job_id}-1", "Failed", "AlgorithmError: the script raised", "s3://b/never-written/")
    with receiver() as hook:
        use_webhook(monkeypatch, hook.url)
        told = invoke("notify", training_change(f"{job_id}-1", "Failed", "CapacityError: forged words"))
        forged = invoke("notify", training_change(f"{job_id}-1", "Completed"))
        unknown = invoke("notify", training_change(f"{job_id}-2", "Failed", "CapacityError: forged"))
    assert told["posted"] is True and len(hook.posts) == 1
    assert "AlgorithmError: the script raised" in hook.posts[0]["text"]
    assert "forged" not in json.dumps(hook.posts)
    assert forged == {"posted": False, "reason": "the event says Completed, SageMaker says Failed: not announced"}
    assert unknown == {"posted": False, "reason": "SageMaker knows no such training job: not announced"}


# ------------------------------------------------------------------ an execution's end, as Step Functions tells it

#: the ends of an execution the notices tell of
ENDS = ["ABORTED", "TIMED_OUT", "FAILED"]
FORGED = {"error": "RunCancelled", "cause": "forged words: see http://phish.example"}


def told(hook: Any, monkeypatch: pytest.MonkeyPatch, *events: dict[str, Any]) -> list[dict[str, Any]]:
    """notify's answers to the events, with the team's chat at `hook`."""
    use_webhook(monkeypatch, json.dumps({"url": hook.url, "format": "json"}))
    return [invoke("notify", event) for event in events]


def refused(result: dict[str, Any], why: str) -> None:
    assert result["posted"] is False, result
    assert result["reason"].startswith("not verified: ") and why in result["reason"], result["reason"]


def test_a_forged_start_posts_nothing_and_a_real_one_is_told_from_step_functions_own_input(aws, machine, monkeypatch):
    """A started notice speaks for a run: an execution Step Functions does not know, or one whose start time is not
    the event's, is not told; a real one is told with the input Step Functions holds, not the event's copy."""
    real = started("run-real", given=json.dumps({"spec_s3_uri": "s3://jobs/jobs/tiny.yaml"}))
    forged_input = json.dumps({"spec_s3_uri": "s3://jobs/jobs/phishing.yaml"})
    with receiver() as hook:
        ghost, moved, result = told(
            hook,
            monkeypatch,
            execution_change("RUNNING", "run-ghost", startDate=millis(STOPPED)),
            {**real, "detail": {**real["detail"], "startDate": 1}},
            {**real, "detail": {**real["detail"], "input": forged_input}},
        )
    refused(ghost, "DescribeExecution knows no execution")
    refused(moved, "not the execution's start")
    assert result["posted"] is True and len(hook.posts) == 1
    assert "tiny.yaml" in json.dumps(hook.posts[0]) and "phishing" not in json.dumps(hook.posts[0])


@pytest.mark.parametrize("status", ENDS)
def test_a_forged_end_of_an_execution_step_functions_does_not_know_posts_nothing(aws, machine, monkeypatch, status):
    """notify can be invoked with any event: the end of an execution that never existed, named by a run's record
    (or only by the event), is not told."""
    register(execution="run-ghost")
    with receiver() as hook:
        (result,) = told(hook, monkeypatch, execution_change(status, "run-ghost", stopDate=millis(STOPPED), **FORGED))
    assert hook.posts == []
    refused(result, "DescribeExecution knows no execution")
    assert "ExecutionDoesNotExist" in result["reason"]


@pytest.mark.parametrize("status", ENDS)
def test_a_forged_end_of_an_execution_that_still_runs_posts_nothing(aws, machine, monkeypatch, status):
    sfn().start_execution(stateMachineArn=MACHINE, name="run-live", input="{}")
    register(execution="run-live")
    with receiver() as hook:
        (result,) = told(hook, monkeypatch, execution_change(status, "run-live", stopDate=millis(STOPPED), **FORGED))
    assert hook.posts == []
    refused(result, f"the event says {status} but DescribeExecution says RUNNING")
    assert sfn().describe_execution(executionArn=execution_arn(MACHINE, "run-live"))["status"] == "RUNNING"


@pytest.mark.parametrize("status", ENDS)
def test_a_forged_end_of_an_execution_that_succeeded_posts_nothing(aws, machine, monkeypatch, status):
    register(execution="run-done")
    with receiver() as hook, described_as("run-done", "SUCCEEDED"):
        (result,) = told(hook, monkeypatch, execution_change(status, "run-done", stopDate=millis(STOPPED), **FORGED))
    assert hook.posts == []
    refused(result, "DescribeExecution says SUCCEEDED")


def test_a_stopped_execution_of_another_state_machine_posts_nothing_for_the_run_of_its_name(
    aws, machine, monkeypatch
):
    """Another state machine's execution, stopped, carrying the name of a live run of ours: nothing is told."""
    sfn().start_execution(stateMachineArn=MACHINE, name="run-live", input="{}")
    register(execution="run-live")
    other = state_machine("someone-elses-machine")
    with receiver() as hook:
        (result,) = told(hook, monkeypatch, stopped("run-live", other, **FORGED))
    assert hook.posts == []
    refused(result, f"the event names state machine {other}, not this stack's ({MACHINE})")


def test_an_execution_end_whose_stop_time_is_not_the_executions_posts_nothing(aws, machine, monkeypatch):
    """A stop time DescribeExecution does not give (made up, or an earlier end of an execution redriven since), or
    none, is not the execution's end."""
    register(execution="run-stopped")
    event = stopped("run-stopped", error="RunCancelled", cause=f"cancelled by {CALLER} with lustrain cancel")
    earlier = copy.deepcopy(event)
    earlier["detail"]["stopDate"] -= 3_600_000
    bare = copy.deepcopy(event)
    del bare["detail"]["stopDate"]
    with receiver() as hook:
        off, without = told(hook, monkeypatch, earlier, bare)
    assert hook.posts == []
    refused(off, "stopped at ")
    refused(without, "stopped at no time but DescribeExecution says")


def test_without_the_stacks_state_machine_no_execution_end_is_told_and_the_warning_says_why(
    aws, machine, monkeypatch, caplog
):
    register(execution="run-stopped")
    event = stopped("run-stopped", error="RunCancelled", cause="by alice")
    monkeypatch.delenv("LUSTRAIN_STATE_MACHINE_ARN")
    with receiver() as hook:
        (result,) = told(hook, monkeypatch, event)
    assert hook.posts == []
    refused(result, "LUSTRAIN_STATE_MACHINE_ARN")
    assert "execution end not verified" in logged(caplog) and '"execution_end_not_verified": 1' in logged(caplog)


def test_a_real_stop_and_a_real_time_out_are_told(aws, machine, monkeypatch):
    job_id = register(execution="run-stopped")["job"]["job_id"]
    late_id = register(execution="run-late")["job"]["job_id"]
    cancelled = stopped("run-stopped", error="RunCancelled", cause=f"cancelled by {CALLER} with lustrain cancel")
    timed_out = execution_change("TIMED_OUT", "run-late", stopDate=millis(STOPPED))
    with receiver() as hook:
        results = told(hook, monkeypatch, cancelled)
        with described_as("run-late", "TIMED_OUT"):
            results += [invoke("notify", timed_out)]
    assert [(r["posted"], r["kind"], r["job_id"]) for r in results] == [
        (True, "cancelled", job_id),
        (True, "timed-out", late_id),
    ]
    assert [(p["kind"], p["job_id"]) for p in hook.posts] == [("cancelled", job_id), ("timed-out", late_id)]
    assert f"cancelled by {CALLER} with lustrain cancel" in json.dumps(hook.posts[0])


#: a FailureReason the job's own code wrote: a link in Slack's and in Markdown's syntax, mentions, HTML
PHISH = (
    "AlgorithmError: see <https://evil.example/a|click> or [click](https://evil.example/b) <!channel> <@U123> <b>x</b>"
)


@pytest.mark.parametrize("fmt", ["slack", "teams", "json"])
def test_a_failure_reason_reaches_the_chat_as_quoted_text_and_the_console_link_as_a_link(aws, monkeypatch, fmt):
    """What a training job wrote (its FailureReason, as DescribeTrainingJob says it) posts no link and no mention
    under the bot's name; the stack's own link to the job's console page is one."""
    job_id = register()["job"]["job_id"]
    sagemaker_ended(f"{job_id}-1", "Failed", PHISH)
    with receiver() as hook:
        use_webhook(monkeypatch, json.dumps({"url": hook.url, "format": fmt}))
        told = invoke("notify", training_change(f"{job_id}-1", "Failed", PHISH))
    assert told["posted"] is True
    (post,) = hook.posts
    console = f"https://{REGION}.console.aws.amazon.com/sagemaker/home?region={REGION}#/jobs/{job_id}-1"
    if fmt == "slack":
        section = post["blocks"][0]["text"]["text"]
        for text in (post["text"], section):
            assert "<https://evil" not in text and "<!channel>" not in text and "<@U123>" not in text
            # the reason escaped, and quoted: all of it in the code span that follows "Why: "
            quoted_why = text.split("Why: `", 1)[1].split("`", 1)[0]
            assert "AlgorithmError: see &lt;https://evil.example/a|click&gt;" in quoted_why
            assert "&lt;!channel&gt; &lt;@U123&gt; &lt;b&gt;x&lt;/b&gt;" in quoted_why
        assert f"<{console}|The training job in the SageMaker console>" in section
    elif fmt == "teams":
        card = post["attachments"][0]["content"]
        assert all(item["type"] == "RichTextBlock" for item in card["body"])
        (why,) = [run for item in card["body"] for run in item["inlines"] if "evil" in run["text"]]
        assert why["fontType"] == "Monospace" and "[click](" not in why["text"] and "<https://" not in why["text"]
        assert card["actions"] == [
            {"type": "Action.OpenUrl", "title": "The training job in the SageMaker console", "url": console}
        ]
    else:
        assert PHISH in post["text"] and post["links"][0]["url"] == console
    assert PHISH in text_of(fmt, post).replace("\u02cb", "`")
