"""The sample events (events/*.json) of the training handlers parse with the models the handlers use."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aws_lambda_powertools.utilities.parser import ValidationError, parse
from lustrain_core.document import Job
from lustrain_core.steps.events import TrainingJobStateChangeEvent, classify_failure
from lustrain_core.steps.notify import summary

EVENTS = Path(__file__).resolve().parents[2] / "events"


def load(name: str) -> dict:
    return json.loads((EVENTS / name).read_text())


@pytest.mark.parametrize("name", ["upload_code.json", "start_training.json", "notify.json"])
def test_state_documents_carry_a_registered_job(name):
    job = Job.from_document(load(name))
    assert job.job_id.startswith(job.spec.name + "-")


def test_start_training_gets_everything_it_needs():
    doc = load("start_training.json")
    assert doc["task_token"]
    assert doc["filesystem"]["mount_name"] and doc["filesystem"]["file_system_id"]
    assert doc["network"]["subnet_id"] and doc["network"]["security_group_ids"]
    assert doc["code"]["submit_directory"].endswith("/sourcedir.tar.gz")
    assert f"/{doc['code']['sha256']}/" in doc["code"]["key"]


def test_the_completed_event_parses_with_times_from_epoch_millisecond_strings():
    event = parse(event=load("on_training_event.json"), model=TrainingJobStateChangeEvent)
    detail = event.detail
    assert event.detail_type == "SageMaker Training Job State Change"
    assert detail.TrainingJobStatus == "Completed"
    assert detail.ModelArtifacts.S3ModelArtifacts.endswith("/output/model.tar.gz")
    assert detail.CreationTime == datetime.fromtimestamp(1795259789, tz=UTC)
    assert detail.TrainingEndTime > detail.TrainingStartTime
    assert detail.BillableTimeInSeconds == 80412


def test_the_failed_event_parses_with_times_as_numbers_and_classifies_as_capacity():
    event = parse(event=load("on_training_event_failed.json"), model=TrainingJobStateChangeEvent)
    detail = event.detail
    assert detail.TrainingJobStatus == "Failed"
    assert detail.CreationTime == datetime.fromtimestamp(1795259789, tz=UTC)
    assert detail.ModelArtifacts is None
    assert classify_failure(detail.FailureReason) == "CapacityError"


def test_both_training_events_name_the_job_start_training_would_start():
    doc = load("start_training.json")
    job = Job.from_document(doc)
    expected = f"{job.spec.name}-{job.job_id.rsplit('-', 1)[1]}-1"
    for name in ("on_training_event.json", "on_training_event_failed.json"):
        assert load(name)["detail"]["TrainingJobName"] == expected


def test_another_kind_of_event_is_refused():
    other = load("on_training_event.json")
    other["detail-type"] = "SageMaker Endpoint State Change"
    with pytest.raises(ValidationError):
        parse(event=other, model=TrainingJobStateChangeEvent)


def test_an_unknown_status_is_refused():
    event = load("on_training_event.json")
    event["detail"]["TrainingJobStatus"] = "Exploded"
    with pytest.raises(ValidationError):
        parse(event=event, model=TrainingJobStateChangeEvent)


def test_the_notify_sample_summarises_a_successful_run():
    facts = summary(load("notify.json"))
    assert facts["outcome"] == "succeeded"
    assert facts["archive_s3_uri"].endswith(f"/archive/{facts['job_id']}/")
    assert len(facts["deleted"]) == 7
    assert facts["estimated_cost_usd"] == 1858.45
