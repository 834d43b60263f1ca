"""The fault matrix on the twin: every forward state x {throttling, service error, Lambda timeout}, plus FSx
failure, quota, capacity, training error, stop and a training job that never reports. Each case is a whole run of
the real state machine and handlers (bench/fault_matrix.py runs them, several at once per twin); each must end
as the state machine says it should and leave nothing behind.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import fault_matrix  # noqa: E402 - the bench lives beside the tests, not in a package

pytestmark = pytest.mark.slow

CASES = fault_matrix.cases()


@pytest.fixture(scope="module")
def results() -> dict[str, fault_matrix.Result]:
    return {str(r.case): r for r in fault_matrix.run_matrix(CASES)}


def test_the_matrix_tries_every_forward_state_with_every_transient_fault():
    tried = {(c.step, c.fault) for c in CASES}
    for step in fault_matrix.faults.STEPS:
        assert {(step, "throttling"), (step, "service-error"), (step, "lambda-timeout")} <= tried
    # a create that AWS did but whose answer was lost, at every step that creates what a run pays for, and each
    # of create_network's creates (CreateVpc, CreateSubnet, CreateRouteTable, CreateSecurityGroup, the endpoint)
    for fault in fault_matrix.faults.LOST_CREATES:
        for step in fault_matrix.faults.FAULTS[fault]:
            assert (step, fault) in tried
    assert set(fault_matrix.faults.LOST_CREATES.values()) == {
        None,
        "CreateSubnet",
        "CreateRouteTable",
        "CreateSecurityGroup",
        "CreateVpcEndpoint",
    }
    # a teardown cut off mid-delete beside its retry, and two teardowns at once
    assert {("teardown", "timeout-mid-delete"), ("teardown", "twice-at-once")} <= tried
    # the sweeper at a run's deadline, while the run still trains
    assert ("sweep", "at-deadline") in tried
    # forged and replayed events of each kind the stack's rules deliver
    assert {
        ("on_execution_end", "forged-abort"),
        ("on_execution_end", "forged-abort-other"),
        ("on_training_event", "forged-failed"),
        ("on_training_event", "replayed-event"),
    } <= tried
    assert {
        ("create_filesystem", "fsx-failed"),
        ("check_quota", "quota"),
        ("start_training", "capacity-error"),
        ("start_training", "capacity-error-once"),
        ("start_training", "hardware-failure"),
        ("start_training", "user-error"),
        ("start_training", "stopped"),
        ("start_training", "silent"),
    } <= tried


@pytest.mark.parametrize("case", CASES, ids=str)
def test_each_fault_ends_the_run_as_the_state_machine_says_and_leaves_nothing(results, case):
    # the bench's own verdict (fault_matrix._judge), the one its table prints: the fault fired, the run ended as
    # expected with the step's task failing by the fault's error, nothing left, a success archived its model,
    # and no run started a second training job
    result = results[str(case)]
    assert result.correct, "; ".join(result.problems)


def test_a_start_whose_answer_was_lost_adopts_the_job_it_started(results):
    result = results["start_training:lambda-timeout"]

    assert "Sandbox.Timedout" in result.task_errors
    assert (result.status, result.training_jobs) == ("SUCCEEDED", 1)


def test_a_training_job_that_never_reports_times_out_and_the_teardown_stops_it(results):
    result = results["start_training:silent"]

    assert result.fired
    assert "States.Timeout" in result.task_errors
    # a Fail state may not raise States.Timeout: the run ends under lustrain's name for it
    assert (result.status, result.error) == ("FAILED", "TrainingTimedOut")
    # the job was still InProgress when the heartbeat fired: only the teardown's StopTrainingJob ended it
    assert result.leftovers == []
