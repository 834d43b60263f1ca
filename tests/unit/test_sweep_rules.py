"""The sweeper's judgement of one job (steps/sweep.py), from its record and its execution's status: pure, no AWS."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from lustrain_core import recovery
from lustrain_core.config import Settings
from lustrain_core.steps import sweep
from lustrain_core.steps.records import JobRecord

STARTED = "2026-05-01T08:00:00Z"
T0 = datetime(2026, 5, 1, 8, tzinfo=UTC).timestamp()
HOUR = 3600.0
MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:lustrain-TrainingJobStateMachine-Ab12"


def record(status: str = "RUNNING", execution: str = "run-1", **compute: Any) -> dict[str, Any]:
    return {
        "job_id": "gpt-0badc0de",
        "execution": execution,
        "status": status,
        "created_at": STARTED,
        "spec": {"compute": {"max_runtime_hours": 24, "max_wait_hours": None, **compute}},
    }


def judge(stored: dict[str, Any] | None, *args: Any) -> sweep.Verdict:
    """The sweeper's verdict on a record stored as `stored`."""
    return sweep.judge(JobRecord.from_stored(stored) if stored is not None else None, *args)


def deadline(stored: dict[str, Any], grace_hours: float) -> float | None:
    return sweep.deadline(JobRecord.from_stored(stored), grace_hours)


def test_a_job_without_a_record_is_an_orphan_and_swept():
    verdict = judge(None, None, T0, 6)
    assert (verdict.sweep, verdict.stop_execution) == (True, False)
    assert "orphan" in verdict.reason


WAIT = recovery.longest_wait()


def test_a_running_execution_is_left_alone_until_its_deadline():
    within = judge(record(), "RUNNING", T0 + 29 * HOUR, 6)
    assert (within.sweep, within.reason) == (False, "its execution run-1 is still running")
    late = judge(record(), "RUNNING", T0 + 31 * HOUR, 6)
    assert (late.sweep, late.stop_execution) == (True, True)
    assert "past its deadline (2026-05-02T14:05:00Z" in late.reason


def test_the_deadline_counts_the_spot_wait_the_wait_before_another_attempt_and_the_grace():
    assert deadline(record(), 6) == T0 + 30 * HOUR + WAIT
    assert deadline(record(spot=True, max_wait_hours=48), 6) == T0 + 54 * HOUR + WAIT
    # the last attempt allowed: no wait for another
    last = {**record(max_attempts=2), "training_attempts": 2}
    assert deadline(last, 6) == T0 + 30 * HOUR
    assert deadline({"job_id": "gpt-0badc0de", "status": "RUNNING"}, 6) is None
    assert deadline({**record(), "created_at": "yesterday"}, 6) is None


def test_a_run_warming_its_data_up_gets_the_warm_ups_max_runtime_before_its_first_attempt():
    warming = {**record(), "launch": {"preload": {"max_runtime_seconds": 10 * HOUR}}}
    assert deadline(warming, 6) == T0 + 40 * HOUR + WAIT
    assert not judge(warming, "RUNNING", T0 + 39 * HOUR, 6).sweep
    # once an attempt started, the warm-up is behind it
    started = {**warming, "training_attempts": 1, "attempt_started_at": "2026-05-01T20:00:00Z"}
    assert deadline(started, 6) == T0 + 12 * HOUR + 30 * HOUR + WAIT


def test_a_legitimate_second_attempt_is_never_stopped_for_the_time_the_first_one_took():
    # the first attempt trained its whole 24 h and failed (an instance's GPU); the second started at once
    second = {**record(), "training_attempts": 2, "attempt_started_at": "2026-05-02T08:10:00Z"}
    now = T0 + 40 * HOUR  # past the first attempt's deadline, 16 h into the second
    assert deadline(record(), 6) < now
    verdict = judge(second, "RUNNING", now, 6)
    assert (verdict.sweep, verdict.reason) == (False, "its execution run-1 is still running")
    # and the second is held to its own deadline
    late = judge(second, "RUNNING", T0 + 24 * HOUR + 10 / 60 * HOUR + 30 * HOUR + WAIT + 1, 6)
    assert (late.sweep, late.stop_execution) == (True, True)


def test_a_run_waiting_in_the_capacity_queue_is_given_the_time_it_may_still_wait():
    # queued since its registration, allowed 20 h of queue: nothing is past due while it may still be admitted
    queued = {
        **record(max_queue_hours=20),
        "queue": {"state": "queued", "since": STARTED, "queued_s": 19 * 3600, "left_s": 20 * 3600},
    }
    assert deadline(queued, 6) == T0 + 20 * HOUR + 30 * HOUR + WAIT
    within = judge(queued, "RUNNING", T0 + 49 * HOUR, 6)
    assert (within.sweep, within.reason) == (False, "its execution run-1 is still running")


def test_a_run_admitted_late_is_held_to_a_deadline_from_its_admission():
    # queued 20 h, admitted, its network and file system made: its training may take its whole 24 h from there
    admitted = {
        **record(max_queue_hours=24),
        "queue": {"state": "admitted", "queued_s": 20 * 3600, "admitted_at": "2026-05-02T04:00:00Z"},
    }
    assert deadline(admitted, 6) == T0 + 20 * HOUR + 30 * HOUR + WAIT
    assert judge(admitted, "RUNNING", T0 + 45 * HOUR, 6).sweep is False
    assert judge(admitted, "RUNNING", T0 + 51 * HOUR, 6).stop_execution is True


@pytest.mark.parametrize("status", ["ABORTED", "FAILED", "TIMED_OUT", "SUCCEEDED", "PENDING_REDRIVE"])
def test_an_execution_that_ended_without_a_teardown_is_swept_at_once(status):
    verdict = judge(record(), status, T0 + HOUR, 6)
    assert (verdict.sweep, verdict.stop_execution) == (True, False)
    assert verdict.reason == f"its execution run-1 ended {status} without a teardown"


def test_a_finished_record_whose_execution_ended_is_a_teardown_that_gave_up():
    verdict = judge(record(status="SUCCEEDED"), "FAILED", T0 + HOUR, 6)
    assert verdict.sweep and verdict.reason.startswith("its teardown did not finish")


def test_a_finished_record_whose_execution_still_runs_is_a_teardown_still_retrying():
    assert not judge(record(status="FAILED"), "RUNNING", T0 + HOUR, 6).sweep


def test_an_execution_that_no_longer_exists_is_swept():
    verdict = judge(record(), None, T0 + HOUR, 6)
    assert (verdict.sweep, verdict.reason) == (True, "its execution run-1 no longer exists")


def test_without_an_execution_the_record_and_the_deadline_decide():
    assert not judge(record(execution=""), None, T0 + HOUR, 6).sweep
    assert judge(record(execution=""), None, T0 + 31 * HOUR, 6).sweep
    assert judge(record(status="FAILED", execution=""), None, T0 + HOUR, 6).sweep


def test_without_a_start_time_a_running_execution_is_never_late():
    stuck = {**record(), "created_at": None}
    assert not judge(stuck, "RUNNING", T0 + 1000 * HOUR, 6).sweep


def test_the_execution_arn_is_built_from_the_state_machine_and_the_recorded_name():
    config = sweep.SweepSettings(MACHINE, 6)
    assert config.execution_arn("run-1") == (
        "arn:aws:states:us-east-1:123456789012:execution:lustrain-TrainingJobStateMachine-Ab12:run-1"
    )
    arn = "arn:aws:states:us-east-1:123456789012:execution:other:x"
    assert config.execution_arn(arn) == arn
    assert config.execution_arn("") is None
    assert sweep.SweepSettings("", 6).execution_arn("run-1") is None


def test_the_settings_come_from_the_stack_and_a_broken_grace_is_named():
    settings = Settings(extra={"LUSTRAIN_STATE_MACHINE_ARN": MACHINE, "LUSTRAIN_SWEEP_GRACE_HOURS": "12"})
    assert sweep.SweepSettings.from_settings(settings) == sweep.SweepSettings(MACHINE, 12.0)
    assert sweep.SweepSettings.from_settings(Settings()).grace_hours == sweep.DEFAULT_GRACE_HOURS
    for raw in ("soon", "0"):
        with pytest.raises(ValueError, match=f"LUSTRAIN_SWEEP_GRACE_HOURS='{raw}'"):
            sweep.SweepSettings.from_settings(Settings(extra={"LUSTRAIN_SWEEP_GRACE_HOURS": raw}))


def test_a_data_preparation_run_is_stuck_after_its_three_stages_longest_time_and_the_grace():
    """A kind: prepare record has no compute section: its stages run one after the other, each for at most a day
    (prepare_plan.MAX_RUNTIME_SECONDS) plus its start."""
    prep = {
        "job_id": "corpus-0badc0de",
        "execution": "run-1",
        "status": "RUNNING",
        "created_at": STARTED,
        "kind": "prepare",
        "spec": {"kind": "prepare", "name": "corpus", "source": "s3://a/text/", "output": "s3://a/shards/"},
    }
    due = T0 + 3 * (24 * HOUR + 300) + 6 * HOUR
    assert deadline(prep, 6) == due
    assert not judge(prep, "RUNNING", due - 60, 6).sweep
    late = judge(prep, "RUNNING", due + 60, 6)
    assert (late.sweep, late.stop_execution) == (True, True)
