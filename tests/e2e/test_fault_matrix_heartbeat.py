"""The fault matrix's case that needs a twin of its own: a training job that never reports, on a stack whose
training heartbeat is a few seconds (bench/fault_matrix.py HEARTBEAT_PARAMETERS). A file of its own, so that
pytest-xdist runs it beside the rest of the matrix (tests/e2e/test_fault_matrix.py) rather than after it.
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

CASES = [case for case in fault_matrix.cases() if case.parameters]


@pytest.fixture(scope="module")
def results() -> dict[str, fault_matrix.Result]:
    return {str(r.case): r for r in fault_matrix.run_matrix(CASES)}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_each_fault_ends_the_run_as_the_state_machine_says_and_leaves_nothing(results, case):
    result = results[str(case)]
    assert result.correct, "; ".join(result.problems)


def test_a_training_job_that_never_reports_times_out_and_the_teardown_stops_it(results):
    result = results["start_training:silent"]

    assert result.fired
    assert "States.Timeout" in result.task_errors
    # a Fail state may not raise States.Timeout: the run ends under lustrain's name for it
    assert (result.status, result.error) == ("FAILED", "TrainingTimedOut")
    # the job was still InProgress when the heartbeat fired: only the teardown's StopTrainingJob ended it
    assert result.leftovers == []
