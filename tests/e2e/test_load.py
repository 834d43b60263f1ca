"""Load on `lustrain local up`: six specs dropped at once against a quota of three instances (bench/load.py, small).

The server listens on a free port of 127.0.0.1 only, and the bench stops it when every run has ended (bounded by
its TIMEOUT_S). The runs wait in the capacity queue for the quota: each must end SUCCEEDED with its own model
archived, none refused; no more instances train at once than the quota, no file system exists while its run
waits, nothing is left behind, and no archive or resource belongs to another run.

Meanwhile `lustrain dashboard` follows the runs in a headless Chromium: the page must show them waiting, training
and moving on, and a run's plots and log (tests/e2e/test_dashboard.py says how it is looked at).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from test_dashboard import Seen, watch_the_dashboard  # noqa: E402 - beside this file, on the path pytest gives

from bench import load  # noqa: E402 - the bench lives beside the tests, not in a package

pytestmark = pytest.mark.slow

RUNS, QUOTA = 6, 3


@pytest.fixture(scope="module")
def seen() -> Seen:
    return Seen()


@pytest.fixture(scope="module")
def report(seen: Seen) -> load.LoadReport:
    before = dict(os.environ)
    done = load.run_load(RUNS, QUOTA, while_running=lambda endpoint, ready: watch_the_dashboard(endpoint, ready, seen))
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


def test_the_dashboard_shows_the_runs_waiting_training_and_moving_on(report, seen):
    assert seen.failure is None, seen.failure
    assert seen.names == [f"load-{i:02d}" for i in range(1, RUNS + 1)]
    assert seen.waiting.startswith("waiting in ") and ": place " in seen.waiting
    assert seen.training.startswith("InProgress")
    job_id, before, after = seen.progress
    assert job_id.startswith("load-") and after.startswith("step ") and after != before
    # the run's own view, at its own address: the report's plots, drawn, and its log's last lines
    assert seen.run_url.endswith(f"/run/{job_id}") and seen.run_title.startswith(f"run {job_id} ")
    assert {"loss", "timeline", "cost"} <= set(seen.plots) and min(seen.plots.values()) > 0
    assert "step=1 train_loss=1.0" in seen.log
    # a name with markup is shown as the text it is
    assert seen.hostile_name == "<img src=x onerror=\"document.title='owned'\">"
    assert seen.hostile_elements == 0
    assert seen.exit_code == 0  # Ctrl-C stops it cleanly
