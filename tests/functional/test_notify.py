"""notify on moto: the run's outcome reaches the SNS topic's subscribers."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
from infra_support import REGION, invoke

EVENTS = Path(__file__).resolve().parents[2] / "events"


def subscribed_queue(topic_arn: str) -> str:
    """An SQS queue subscribed to the topic (raw delivery off: it receives SNS's envelope, as email would the text)."""
    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.create_queue(QueueName="lustrain-test-outcomes")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    boto3.client("sns", region_name=REGION).subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=arn)
    return url


def received(url: str) -> list[dict]:
    messages = boto3.client("sqs", region_name=REGION).receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    return [json.loads(m["Body"]) for m in messages.get("Messages", [])]


def test_a_successful_run_is_published_with_its_archive_teardown_and_cost(aws):
    queue = subscribed_queue(aws.notify_topic_arn)
    document = json.loads((EVENTS / "notify.json").read_text())
    job_id = document["job"]["job_id"]

    result = invoke("notify", document)

    (envelope,) = received(queue)
    assert result == {"message_id": envelope["MessageId"], "outcome": "succeeded"}
    assert envelope["Subject"] == f"lustrain: {job_id} succeeded"
    assert envelope["MessageAttributes"]["outcome"]["Value"] == "succeeded"
    text = envelope["Message"]
    assert document["training"]["archive_s3_uri"] in text
    assert "Teardown deleted: file_system fs-0123456789abcdef0" in text
    assert "Estimated cost before launch: $1,858.45" in text
    # 80412 billable seconds x 2 instances x $37.688/h
    assert "Compute billed (list price x billable time): $1,683.65" in text
    facts = json.loads(text[text.index("\n\n") + 2 :])
    assert facts["job_id"] == job_id and facts["error"] is None


def test_a_failed_run_names_the_error_and_the_lambda_errors_message(aws):
    queue = subscribed_queue(aws.notify_topic_arn)
    document = json.loads((EVENTS / "notify.json").read_text())
    del document["training"]
    document["error"] = {
        "Error": "CapacityError",
        "Cause": json.dumps(
            {
                "errorType": "CapacityError",
                "errorMessage": "CapacityError: Unable to provision requested ML compute",
            }
        ),
    }

    result = invoke("notify", document)

    (envelope,) = received(queue)
    assert result["outcome"] == "failed"
    assert envelope["Subject"].endswith("failed") and len(envelope["Subject"]) < 100
    assert (
        "Error: CapacityError: CapacityError: Unable to provision requested ML compute" in envelope["Message"]
    )


def test_a_teardown_that_failed_is_reported_with_its_cause(aws):
    queue = subscribed_queue(aws.notify_topic_arn)
    document = json.loads((EVENTS / "notify.json").read_text())
    document["error"] = {"Error": "MountFailed", "Cause": "ClientError: Unable to mount file system"}
    document["teardown"] = {
        "Error": "TeardownIncomplete",
        "Cause": json.dumps(
            {"errorType": "TeardownIncomplete", "errorMessage": "still there: subnet subnet-0f1e"}
        ),
    }

    invoke("notify", document)

    (envelope,) = received(queue)
    assert (
        "Teardown did not finish: TeardownIncomplete: still there: subnet subnet-0f1e" in envelope["Message"]
    )
    assert "Teardown deleted: none" in envelope["Message"]


def test_without_a_topic_nothing_is_sent_and_the_run_carries_on(aws, monkeypatch):
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", "")
    document = json.loads((EVENTS / "notify.json").read_text())
    result = invoke("notify", document)
    assert result["message_id"] is None and result["outcome"] == "succeeded"


def test_a_retry_of_a_notify_whose_answer_was_lost_sends_nothing_more(aws):
    from infra_support import job_record, register, seed_data, spec

    queue = subscribed_queue(aws.notify_topic_arn)
    seed_data()
    document = {**json.loads((EVENTS / "notify.json").read_text()), "job": register(spec())["job"]}

    first = invoke("notify", document)
    again = invoke("notify", document)  # Step Functions' retry after Sandbox.Timedout

    assert len(received(queue)) == 1
    assert again == {**first, "already_sent": True}
    assert job_record(aws.jobs_table, document["job"]["job_id"])["notified"]["message_id"] == first["message_id"]


def test_what_the_runs_teardown_deleted_is_reported_even_when_its_retry_deleted_nothing(aws):
    queue = subscribed_queue(aws.notify_topic_arn)
    document = json.loads((EVENTS / "notify.json").read_text())
    deleted = [{"type": "vpc", "id": "vpc-0123456789abcdef0"}]
    document["teardown"] = {**document["teardown"], "deleted": [], "torn_down": {"deleted": deleted, "stopped": []}}

    invoke("notify", document)

    (envelope,) = received(queue)
    assert "Teardown deleted: vpc vpc-0123456789abcdef0" in envelope["Message"]


def test_a_refused_drop_names_the_file_and_the_field_not_an_unknown_job(aws):
    """register_job refused the spec: the document is still the execution's input (the S3 event), with the error
    beside it (the Catch's ResultPath $.error)."""
    queue = subscribed_queue(aws.notify_topic_arn)
    document = json.loads((EVENTS / "register_job.json").read_text())["input"]
    where = f"s3://{document['detail']['bucket']['name']}/{document['detail']['object']['key']}"
    problem = "invalid job spec, 1 problem:\n  - compute.instance_count: must be >= 1 (got 0)"
    document["error"] = {"Error": "SpecInvalid", "Cause": json.dumps({"errorType": "SpecInvalid", "errorMessage": problem})}

    result = invoke("notify", document)

    (envelope,) = received(queue)
    assert result["outcome"] == "refused"
    assert envelope["Subject"] == f"lustrain: the spec {where} refused"[:99]
    text = envelope["Message"]
    assert "unknown job" not in text
    assert f"Spec: {where}" in text and "compute.instance_count: must be >= 1 (got 0)" in text


def test_a_data_preparation_run_is_published_with_its_estimated_cost(aws):
    """A kind: prepare run's plan (prepare_plan.plan_of) prices it as cost_usd, not a training plan's cost."""
    queue = subscribed_queue(aws.notify_topic_arn)
    spec = {"kind": "prepare", "name": "corpus", "source": "s3://c/text/", "output": "s3://c/shards/"}
    plan = {"kind": "prepare", "stages": ["plan x1", "work x4", "merge x1"], "cost_usd": 12.34}
    document = {"job": {"job_id": "corpus-0badc0de", "kind": "prepare", "spec": spec, "plan": plan}}

    assert invoke("notify", document)["outcome"] == "succeeded"

    (envelope,) = received(queue)
    assert "Estimated cost before launch: $12.34" in envelope["Message"]
