"""Load on `lustrain local up`: six specs dropped at once against a quota of three instances (bench/load.py, small).

The server listens on a free port of 127.0.0.1 only, and the bench stops it when every run has ended (bounded by
its TIMEOUT_S). The runs wait in the capacity queue for the quota: each must end SUCCEEDED with its own model
archived, none refused; no more instances train at once than the quota, no file system exists while its run
waits, nothing is left behind, and no archive or resource belongs to another run.
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


def test_every_run_waits_its_turn_and_succeeds(report):
    assert len(report.ended) == RUNS
    assert report.wrong == []
    assert (report.succeeded, report.refused) == (RUNS, 0)
    # the jobs keep busy long enough that the crowd overlaps: some runs must have waited in the queue
    assert report.queued_s_max > 0


def test_no_more_instances_train_at_once_than_the_quota_and_no_file_system_waits(report):
    assert report.peak_instances == QUOTA
    assert report.fs_seconds_while_queued == 0


def test_nothing_is_left_and_nothing_crosses_between_runs(report):
    assert report.leaked == 0
    assert report.crossed == []
    assert all(run.leftovers == [] for run in report.ended)
