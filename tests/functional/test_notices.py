"""The run's notices in the team's chat, on moto: the notify function reads the webhook from Secrets Manager and
posts each moment of a run to a local receiver (127.0.0.1), formatted for Slack, Microsoft Teams or plain JSON."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import boto3
import pytest
from infra_support import REGION, invoke, register
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


def execution_change(status: str, name: str, **detail: Any) -> dict[str, Any]:
    return {
        "version": "0",
        "source": "aws.states",
        "detail-type": "Step Functions Execution Status Change",
        "detail": {
            "name": name,
            "status": status,
            "executionArn": f"arn:aws:states:{REGION}:1:execution:m:{name}",
            **detail,
        },
    }


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
        execution_change("RUNNING", "run-1", input=json.dumps({"spec_s3_uri": "s3://jobs/jobs/tiny.yaml"})),
        queue_change(job_id, "queued"),
        queue_change(job_id, "admitted"),
        training_change(
            f"{job_id}-1", "Failed", "CapacityError: Unable to provision requested ML compute capacity"
        ),
        training_change(f"{job_id}-2", "Completed"),
        execution_change(
            "ABORTED", "run-1", error="RunCancelled", cause=f"cancelled by {CALLER} with lustrain cancel"
        ),
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
    """What the chat shows of a posted notice."""
    if fmt == "slack":
        return "\n".join(
            [
                block["text"]["text"] if block["type"] == "section" else block["elements"][0]["text"]
                for block in body["blocks"]
            ]
        )
    if fmt == "teams":
        card = body["attachments"][0]["content"]
        return "\n".join(
            item["text"]
            if item["type"] == "TextBlock"
            else "\n".join(f"{f['title']}: {f['value']}" for f in item["facts"])
            for item in card["body"]
        )
    return str(body["text"])


@pytest.mark.parametrize("fmt", ["slack", "teams", "json"])
def test_every_notice_of_a_run_arrives_formatted_for_its_chat(aws, monkeypatch, caplog, fmt):
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


def test_a_webhook_that_fails_once_gets_the_notice_on_the_second_try(aws, monkeypatch):
    with receiver([500, 200]) as hook:
        use_webhook(monkeypatch, json.dumps({"url": hook.url, "format": "json"}))
        result = invoke("notify", execution_change("RUNNING", "run-9"))
    assert result["posted"] is True and result["chat"]["tries"] == 2
    assert [p["kind"] for p in hook.posts] == ["started", "started"]


def test_a_refusing_webhook_is_not_tried_again_and_an_unreachable_one_is_answered(aws, monkeypatch):
    with receiver([400]) as hook:
        use_webhook(monkeypatch, hook.url)
        refused = invoke("notify", execution_change("RUNNING", "run-9"))
    assert refused["chat"] == {"kind": "started", "delivered": False, "tries": 1, "status": 400}
    from lustrain_core.steps import notices

    notices.forget()
    # the receiver is gone: the connection is refused, three times, and nothing is raised
    gone = invoke("notify", execution_change("RUNNING", "run-9"))
    assert gone["chat"]["delivered"] is False and gone["chat"]["tries"] == 3
    assert gone["chat"]["error"] in ("URLError", "ConnectionRefusedError")


def test_a_secret_that_is_no_webhook_is_reported_by_its_field_and_the_run_goes_on(aws, monkeypatch):
    use_webhook(monkeypatch, json.dumps({"url": "https://hooks.example.com/x", "format": "discord"}))
    result = invoke("notify", json.loads((EVENTS / "notify.json").read_text()))
    assert result["outcome"] == "succeeded"
    assert result["chat"]["delivered"] is False and "the secret's format" in result["chat"]["error"]


def test_the_webhook_is_read_once_per_warm_container(aws, monkeypatch):
    from lustrain_core.steps import notices

    with receiver() as hook:
        use_webhook(monkeypatch, hook.url)
        invoke("notify", execution_change("RUNNING", "run-9"))
        # a changed secret is not read again while the webhook answers
        secrets = boto3.client("secretsmanager", region_name=REGION)
        secrets.put_secret_value(SecretId="team/hook", SecretString="https://hooks.example.com/elsewhere")
        invoke("notify", execution_change("RUNNING", "run-10"))
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
    aws, monkeypatch
):
    from lustrain_core.steps import records

    job_id = register()["job"]["job_id"]
    died = execution_change(
        "FAILED", "run-1", error="States.Runtime", cause="An error occurred while executing"
    )
    with receiver() as hook:
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
