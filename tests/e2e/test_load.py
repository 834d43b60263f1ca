"""Load on `lustrain local up`: six specs dropped at once against a quota of three instances (bench/load.py, small).

The server listens on a free port of 127.0.0.1 only, and the bench stops it when every run has ended (bounded by
its TIMEOUT_S). Each run must end as SUCCEEDED with its own model archived, or be refused with QuotaExceeded;
none may leave anything behind, and no archive or resource may belong to another run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import load  # noqa: E402 - the bench lives beside the tests, not in a package

pytestmark = pytest.mark.slow

RUNS, QUOTA = 6, 3


@pytest.fixture(scope="module")
def report() -> load.LoadReport:
    before = dict(os.environ)
    done = load.run_load(RUNS, QUOTA)
    assert dict(os.environ) == before, "the bench must leave the process environment as it found it"
    return done


def test_every_run_ends_succeeded_or_refused_for_quota(report):
    assert len(report.ended) == RUNS
    assert report.wrong == []
    assert report.succeeded + report.refused == RUNS
    assert report.succeeded >= 1
    # the jobs keep busy long enough that the crowd overlaps: some runs must find the quota taken
    assert report.refused >= 1


def test_no_more_instances_train_at_once_than_the_quota(report):
    assert 1 <= report.peak_instances <= QUOTA


def test_nothing_is_left_and_nothing_crosses_between_runs(report):
    assert report.leaked == 0
    assert report.crossed == []
    assert all(run.leftovers == [] for run in report.ended)
