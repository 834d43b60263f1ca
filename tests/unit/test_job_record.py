"""The job record's model (steps/records.py): each answer a caller asks of a run, from stored attributes as
DynamoDB gives them back, and a record written before a field existed reading with its default."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from lustrain_core.launch_plan import training_job_name
from lustrain_core.steps import records
from lustrain_core.steps.budget import cost_so_far_usd
from lustrain_core.steps.records import JobRecord

MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:lustrain-training"


def stored(**fields: object) -> dict:
    """A record's attributes as register_job writes them, with `fields` over them."""
    base = {
        "job_id": "gpt-small-1a2b3c4d",
        "source": {"bucket": "jobs", "key": "jobs/gpt-small.yaml", "uri": "s3://jobs/jobs/gpt-small.yaml"},
        "spec": {
            "name": "gpt-small",
            "compute": {"instance_type": "ml.p4d.24xlarge", "instance_count": 2, "max_runtime_hours": 3},
            "code": {"hyperparameters": {"max_steps": 300}},
            "budget": {"max_usd": 500},
            "filesystem": {},
        },
        "plan": {"cost": {"filesystem_usd": 4.0}, "quota": {"instances": 2}},
        "launch": {"checkpoint_s3_uri": "s3://out/ckpt/", "training_plan": None},
        "status": "RUNNING",
        "created_at": "2026-12-01T10:00:00Z",
        "resources": [],
        "execution": "drop-1",
    }
    return {**base, **fields}


def at(iso: str) -> float:
    return datetime.strptime(iso, records.ISO_FORMAT).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(("status", "finished"), [("RUNNING", False), ("SUCCEEDED", True), ("FAILED", True)])
def test_a_run_is_finished_once_its_teardown_wrote_succeeded_or_failed(status: str, finished: bool) -> None:
    assert JobRecord.from_stored(stored(status=status)).finished is finished


def test_the_current_attempt_and_its_training_job_follow_the_counted_attempts() -> None:
    before = JobRecord.from_stored(stored())
    assert (before.attempt, before.current_training_job, before.training_job_names()) == (0, None, [])
    assert before.attempt_judged  # nothing to judge yet
    third = JobRecord.from_stored(stored(training_attempts=3, judged_attempt=2))
    assert third.attempt == 3
    assert third.current_training_job == training_job_name("gpt-small", "gpt-small-1a2b3c4d", 3)
    assert third.training_job_names() == [
        training_job_name("gpt-small", "gpt-small-1a2b3c4d", n) for n in (1, 2, 3)
    ]
    assert not third.attempt_judged
    assert JobRecord.from_stored(stored(training_attempts=3, judged_attempt=3)).attempt_judged


def test_the_latest_training_job_is_the_ledgers_newest() -> None:
    ledger = [
        {"type": "training_job", "id": "a-1"},
        {"type": "file_system", "id": "fs-1"},
        {"type": "training_job", "id": "a-2"},
    ]
    record = JobRecord.from_stored(stored(resources=ledger))
    assert record.latest_training_job == "a-2"
    assert record.resources_of("file_system") == ["fs-1"]
    assert JobRecord.from_stored(stored()).latest_training_job is None


def test_the_execution_arn_comes_from_the_state_machines_and_a_direct_invoke_has_none() -> None:
    record = JobRecord.from_stored(stored())
    assert record.execution_arn(MACHINE) == MACHINE.replace(":stateMachine:", ":execution:") + ":drop-1"
    direct = {k: v for k, v in stored().items() if k != "execution"}
    assert JobRecord.from_stored(direct).execution_arn(MACHINE) is None


def test_the_error_reads_as_its_name_and_cause() -> None:
    failed = JobRecord.from_stored(
        stored(status="FAILED", error={"Error": "QuotaRefused", "Cause": "no p4d left"})
    )
    assert (failed.error_name, failed.cause) == ("QuotaRefused", "no p4d left")
    assert (JobRecord.from_stored(stored()).error_name, JobRecord.from_stored(stored()).cause) == (None, None)


def test_the_spec_answers_name_shape_budget_and_max_steps() -> None:
    record = JobRecord.from_stored(stored())
    assert (record.name, record.instance_type, record.instance_count) == ("gpt-small", "ml.p4d.24xlarge", 2)
    assert (record.budget_usd, record.max_steps, record.checkpoint_s3_uri) == (500.0, 300, "s3://out/ckpt/")
    assert record.quota == {"instances": 2}
    assert record.training_plan is None
    assert record.spec_uri == "s3://jobs/jobs/gpt-small.yaml"


def test_a_run_cancelled_while_queued_costs_nothing() -> None:
    """Nothing was created before its admission: no training job, no file system in its ledger."""
    record = JobRecord.from_stored(
        stored(
            status="FAILED",
            finished_at="2026-12-01T11:00:00Z",
            queue={"state": "queued", "since": "2026-12-01T10:00:00Z"},
        )
    )
    assert cost_so_far_usd(record, [], now=at("2026-12-01T12:00:00Z")) == 0.0


def test_the_file_system_costs_from_admission_to_the_records_end() -> None:
    """$4 for 3 + 1 hours: $1 an hour, billed from admission (10:30) to the teardown's end (12:30)."""
    record = JobRecord.from_stored(
        stored(
            status="SUCCEEDED",
            finished_at="2026-12-01T12:30:00Z",
            queue={"state": "admitted", "admitted_at": "2026-12-01T10:30:00Z"},
            torn_down={"deleted": [{"type": "file_system", "id": "fs-1"}]},
        )
    )
    assert record.created_file_system
    assert cost_so_far_usd(record, [], now=at("2026-12-02T00:00:00Z")) == 2.0
    given = JobRecord.from_stored(
        {**record.stored(), "spec": {**record.spec, "filesystem": {"file_system_id": "fs-9"}}}
    )
    assert not given.created_file_system
    assert cost_so_far_usd(given, [], now=at("2026-12-02T00:00:00Z")) == 0.0


def test_a_training_attempt_costs_its_billable_time_or_its_time_so_far() -> None:
    from lustrain_core.prices import PriceTable

    record = JobRecord.from_stored(stored(training_attempts=2))
    hour = PriceTable().billed_compute_usd("ml.p4d.24xlarge", 2.0, 3600.0) or 0.0
    assert hour > 0
    started = datetime(2026, 12, 1, 11, 0, tzinfo=UTC)
    jobs = [{"BillableTimeInSeconds": 3600}, {"TrainingStartTime": started}]
    assert cost_so_far_usd(record, jobs, now=started.timestamp() + 1800) == round(hour * 1.5, 2)


def test_the_moments_read_in_epoch_seconds() -> None:
    record = JobRecord.from_stored(
        stored(finished_at="2026-12-01T10:05:00Z", queue={"admitted_at": "2026-12-01T10:01:00Z"})
    )
    assert record.ended_at is not None and record.started_at is not None
    assert record.ended_at - record.started_at == 300
    assert record.admitted_at == at("2026-12-01T10:01:00Z")
    assert JobRecord.from_stored(stored()).ended_at is None


def test_an_old_record_reads_with_each_newer_fields_default_and_keeps_what_the_model_does_not_know() -> None:
    """A record written before the model (no kind, attempts, queue or warm pool fields; an attribute of a newer
    writer) reads; what it stores is written back unchanged."""
    old = {
        "job_id": "old-1",
        "spec": {"name": "old"},
        "status": "SUCCEEDED",
        "created_at": "2026-01-01T00:00:00Z",
        "later": 7,
    }
    record = JobRecord.from_stored(old)
    assert (record.kind, record.attempt, record.queue, record.warm_pool_offered, record.resources) == (
        "train",
        0,
        {},
        False,
        (),
    )
    assert record.execution is None and record.error is None
    assert record.stored() == old


def test_writing_an_attribute_the_model_does_not_name_is_refused() -> None:
    with pytest.raises(ValueError, match="judged_atempt"):
        records.set_fields(None, "jobs", "old-1", {"judged_atempt": 2})


def test_a_record_shows_a_notebook_its_stored_attributes_and_whether_it_was_recorded() -> None:
    assert JobRecord.from_stored(stored()).to_dict() == stored()
    refused = JobRecord(job_id="exec-1", execution="exec-1", status="FAILED", unrecorded=True)
    assert refused.to_dict() == {
        "job_id": "exec-1",
        "execution": "exec-1",
        "status": "FAILED",
        "unrecorded": True,
    }


def test_the_plan_answers_the_estimate_and_the_file_systems_throughput() -> None:
    planned = stored(
        plan={"cost": {"total_usd": 81.5}, "filesystem": {"throughput_mb_s": 1200, "demand_mb_s": 300.5}}
    )
    record = JobRecord.from_stored(planned)
    assert (record.estimated_usd, record.planned_throughput_mb_s) == (81.5, (1200.0, 300.5))
    assert (JobRecord(job_id="bare").estimated_usd, JobRecord(job_id="bare").planned_throughput_mb_s) == (
        0.0,
        (0.0, 0.0),
    )


def test_a_queued_runs_wait_ends_when_the_time_it_may_still_wait_runs_out() -> None:
    queued = JobRecord.from_stored(
        stored(queue={"state": "queued", "since": "2026-12-01T10:00:00Z", "left_s": 1800})
    )
    assert queued.queue_wait_ends_at == at("2026-12-01T10:30:00Z")
    admitted = JobRecord.from_stored(
        stored(queue={"state": "admitted", "admitted_at": "2026-12-01T10:10:00Z"})
    )
    assert admitted.queue_wait_ends_at is None


def test_the_warm_ups_runtime_is_the_launch_plans() -> None:
    warming = JobRecord.from_stored(stored(launch={"preload": {"max_runtime_seconds": 36000}}))
    assert warming.preload_max_runtime_s == 36000.0
    assert JobRecord.from_stored(stored()).preload_max_runtime_s == 0.0


def test_a_data_preparation_run_is_told_by_its_kind_or_for_a_record_without_one_its_specs() -> None:
    assert not JobRecord.from_stored(stored()).preparation  # no kind stored: a training run
    assert not JobRecord.from_stored(stored(kind="train")).preparation
    prep_spec = {"kind": "prepare", "name": "corpus", "source": "s3://a/text/", "output": "s3://a/shards/"}
    assert JobRecord.from_stored(stored(kind="prepare", spec=prep_spec)).preparation
    assert JobRecord.from_stored(stored(spec=prep_spec)).preparation


def test_the_notice_sent_is_the_noted_messages_id() -> None:
    assert JobRecord.from_stored(stored()).notice_sent is None
    assert JobRecord.from_stored(stored(notified={"outcome": "failed"})).notice_sent is None
    sent = {"message_id": "m-1", "outcome": "succeeded", "at": "2026-12-01T12:00:00Z"}
    assert JobRecord.from_stored(stored(notified=sent)).notice_sent == "m-1"


def test_a_runs_first_record_writes_its_kind_status_and_empty_ledger() -> None:
    """The kind is written even when it is a training run's (the default): the state machine and a reader of the
    table see it stored, as register_job always wrote it."""
    first = JobRecord.new(job_id="gpt-small-1a2b3c4d", kind=records.TRAIN, created_at="2026-12-01T10:00:00Z")
    assert first.stored() == {
        "job_id": "gpt-small-1a2b3c4d",
        "kind": "train",
        "status": "RUNNING",
        "resources": [],
        "created_at": "2026-12-01T10:00:00Z",
    }
