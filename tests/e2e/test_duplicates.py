"""At-least-once delivery on the twin: a spec or an event that arrives twice (or three times) makes one run.

Three runs share one twin, at once: a spec put into the jobs bucket twice; a spec whose S3 "Object Created" event
is put on the bus a second time; and a run whose training job's every SageMaker event is delivered three times.
Each is judged as a user would: the executions and how each ended, the job records, the training jobs, the
archive's objects (the artifacts bucket is versioned, so an object written twice has two versions), and what
on_training_event answered to each delivery.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import fault_matrix  # noqa: E402 - the bench lives beside the tests, not in a package

pytestmark = pytest.mark.slow

REGION = fault_matrix.REGION

PUT_TWICE = "dup-put"
EVENT_TWICE = "dup-event"
EVENTS_THRICE = "dup-events"
ARCHIVED = {
    "model.tar.gz",
    "output.tar.gz",
    "describe_training_job.json",
    "final_metrics.json",
    "manifest.json",
}


@dataclass
class Observed:
    """What a user can see of the three runs once everything has ended."""

    executions: dict[str, list[fault_matrix.Ended]]
    job_records: dict[str, list[str]]
    training_jobs: dict[str, list[str]]
    #: archived object's name (its key's last part) -> how many versions of it exist, per spec name
    archive_versions: dict[str, dict[str, int]]
    #: on_training_event's answers to the deliveries of EVENTS_THRICE's job
    event_answers: list[dict[str, Any]]
    task_succeeded: dict[str, int]
    token_status: dict[str, str]


def _same_event_again(sfn: Any, machine: str, name: str) -> None:
    """Put the S3 event that started `name`'s run on the bus once more, as EventBridge may deliver it twice."""
    from lustrain.twin.patches import eventbridge

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for execution in sfn.list_executions(stateMachineArn=machine)["executions"]:
            started_by = sfn.describe_execution(executionArn=execution["executionArn"])["input"]
            if fault_matrix.run_name(started_by) != name:
                continue
            delivered = json.loads(started_by)
            # as S3 puts it (PutEvents refuses an aws.* source to any caller)
            eventbridge.emit(
                delivered["source"],
                delivered["detail-type"],
                delivered["detail"],
                REGION,
                resources=delivered["resources"],
            )
            return
        time.sleep(0.1)
    raise AssertionError(f"no execution started for {name}")


@pytest.fixture(scope="module")
def observed() -> Observed:
    from lustrain.twin import faults
    from lustrain.twin.patches import eventbridge, fsx, service_quotas
    from lustrain.twin.rehearse import bucket_of, ensure_bucket, ensure_data, submittable, twin

    names = (PUT_TWICE, EVENT_TWICE, EVENTS_THRICE)
    specs = {name: fault_matrix.spec_for(name) for name in names}
    with twin() as stack:
        service_quotas.set_quota("ml.p4d.24xlarge", 8, REGION)
        fsx.configure(polls=1)
        eventbridge.reset()
        faults.inject("start_training", "repeat-events", run=EVENTS_THRICE)
        ensure_data(specs[PUT_TWICE], lambda _: None)
        ensure_bucket(bucket_of(specs[PUT_TWICE].output.s3_uri))
        docs = {n: submittable(s, fault_matrix.E2E, stack.outputs, lambda _: None) for n, s in specs.items()}
        machine = stack.outputs["StateMachineArn"]
        sfn = boto3.client("stepfunctions", region_name=REGION)

        jobs_bucket = stack.outputs["JobsBucketName"]
        fault_matrix.drop_specs(jobs_bucket, docs)
        fault_matrix.drop_specs(jobs_bucket, {PUT_TWICE: docs[PUT_TWICE]})
        _same_event_again(sfn, machine, EVENT_TWICE)
        ended = fault_matrix.watch(machine, specs)
        eventbridge.drain(30)

        ddb = boto3.client("dynamodb", region_name=REGION)
        s3 = boto3.client("s3", region_name=REGION)
        sagemaker = boto3.client("sagemaker", region_name=REGION)
        records = ddb.scan(TableName=stack.outputs["JobsTableName"])["Items"]
        training = [j["TrainingJobName"] for j in sagemaker.list_training_jobs()["TrainingJobSummaries"]]
        tokens = ddb.scan(TableName=stack.outputs["TaskTokensTableName"])["Items"]
        versions: dict[str, dict[str, int]] = {}
        for name in names:
            versions[name] = {}
            listed = s3.list_object_versions(
                Bucket=stack.outputs["ArtifactsBucketName"], Prefix=f"archive/{name}-"
            ).get("Versions", [])
            for version in listed:
                key = version["Key"].rsplit("/", 1)[-1]  # the model lies under jobs/<training job>/output/
                versions[name][key] = versions[name].get(key, 0) + 1
        answers = [
            json.loads(d.result)
            for d in eventbridge.deliveries()
            if d.detail_type == "SageMaker Training Job State Change" and d.result
        ]
        succeeded = {
            name: sum(
                1
                for e in ended
                if e.name == name and not e.duplicate
                for event in fault_matrix.execution_history(sfn, e.execution_arn)
                if event["type"] == "TaskSucceeded"
            )
            for name in names
        }
    return Observed(
        executions={n: [e for e in ended if e.name == n] for n in names},
        job_records={
            n: [r["job_id"]["S"] for r in records if r["job_id"]["S"].startswith(n + "-")] for n in names
        },
        training_jobs={n: [j for j in training if faults.spec_name_of(j) == n] for n in names},
        archive_versions=versions,
        event_answers=[
            a for a in answers if str(a.get("training_job_name", "")).startswith(EVENTS_THRICE + "-")
        ],
        task_succeeded=succeeded,
        token_status={
            t["training_job_name"]["S"]: t["status"]["S"]
            for t in tokens
            if t["training_job_name"]["S"].startswith(EVENTS_THRICE + "-")
        },
    )


def _one_run(observed: Observed, name: str) -> None:
    executions = observed.executions[name]
    ran = [e for e in executions if not e.duplicate]
    assert len(ran) == 1, [(e.status, e.duplicate) for e in executions]
    assert ran[0].status == "SUCCEEDED" and ran[0].leftovers == []
    assert observed.job_records[name] == [ran[0].job_id]
    assert len(observed.training_jobs[name]) == 1
    assert set(observed.archive_versions[name]) == ARCHIVED


def test_the_same_spec_put_twice_is_one_run(observed):
    """Bug: the jobs bucket is versioned, so each put of the same spec had a version id of its own, and the job
    identity (bucket/key#version) made two whole runs of one spec (two fleets of p4d instances). The identity is
    now the content's (bucket/key#ETag)."""
    _one_run(observed, PUT_TWICE)
    second = [e for e in observed.executions[PUT_TWICE] if e.duplicate]
    assert len(second) == 1 and second[0].status == "SUCCEEDED"
    assert second[0].task_errors == []


def test_the_same_s3_event_delivered_twice_is_one_run(observed):
    _one_run(observed, EVENT_TWICE)
    duplicates = [e for e in observed.executions[EVENT_TWICE] if e.duplicate]
    assert len(duplicates) == 1 and duplicates[0].status == "SUCCEEDED"


def test_each_training_event_delivered_three_times_archives_once_and_calls_back_once(observed):
    _one_run(observed, EVENTS_THRICE)
    # every archived object was written once: a second archive would be a second version
    assert observed.archive_versions[EVENTS_THRICE] == dict.fromkeys(ARCHIVED, 1)
    # one callback in all: the first delivery that finds the job Completed in SageMaker's DescribeTrainingJob makes
    # it, whichever event that delivery carries (a late InProgress one included); every later one is a duplicate
    assert sum(a.get("callback") == "send_task_success" for a in observed.event_answers) == 1
    completed = [a for a in observed.event_answers if a["status"] == "Completed"]
    assert len(completed) == 3
    assert all(a.get("callback") == "send_task_success" or a.get("duplicate") for a in completed), completed
    assert observed.task_succeeded[EVENTS_THRICE] == 1
    assert list(observed.token_status.values()) == ["callback_sent"]
    # the heartbeats came three times each too, and none of them failed
    assert len(observed.event_answers) % 3 == 0 and all("error" not in a for a in observed.event_answers)
