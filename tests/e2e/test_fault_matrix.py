"""The fault matrix on the twin: every forward state x {throttling, service error, Lambda timeout}, every create
whose answer was lost, FSx failure, quota, capacity, training error and stop, a teardown cut off mid-delete and
two teardowns at once, the sweeper at a run's deadline, and forged and replayed events. Each case is a whole run of
the real state machine and handlers (bench/fault_matrix.py runs them, all at once in one twin); each must end as
the state machine says it should and leave nothing behind. The training job that never reports needs a twin of
its own: tests/e2e/test_fault_matrix_heartbeat.py.
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

#: the cases that share the stack's own settings, all at once in one twin; the one case that needs a twin of its
#: own (a heartbeat of seconds) runs in test_fault_matrix_heartbeat.py, which pytest-xdist can run beside this file
CASES = [case for case in fault_matrix.cases() if not case.parameters]


@pytest.fixture(scope="module")
def results() -> dict[str, fault_matrix.Result]:
    return {str(r.case): r for r in fault_matrix.run_matrix(CASES)}


def test_the_matrix_tries_every_forward_state_with_every_transient_fault():
    tried = {(c.step, c.fault) for c in fault_matrix.cases()}
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
