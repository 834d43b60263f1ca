"""`lustrain report RUN` on moto: the plots read at a glance, for a run that has logged nothing yet as much as for
one that has (titles whole, bars labelled with their values, an empty plot that says it is empty)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import boto3
import pytest
from infra_support import REGION
from lustrain_core.steps import records
from matplotlib.backends.backend_agg import FigureCanvasAgg

from lustrain import operate, report

MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:lustrain-TrainingJobStateMachine"
NOW = datetime(2026, 6, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def built(aws, tmp_path) -> report.Report:
    """The report of a run cancelled while queued: no training job, no losses, nothing spent."""
    ddb = boto3.client("dynamodb", region_name=REGION)
    iso = "%Y-%m-%dT%H:%M:%SZ"
    records.put_new(ddb, aws.jobs_table, {
        "job_id": "gpt-small-0a1b2c3d", "execution": "exec-1", "status": "FAILED",
        "created_at": (NOW - timedelta(minutes=10)).strftime(iso), "finished_at": NOW.strftime(iso),
        "spec": {"name": "gpt-small", "compute": {"instance_type": "ml.p4d.24xlarge", "instance_count": 2,
                                                 "max_runtime_hours": 3}},
        "plan": {"cost": {"total_usd": 412.5, "filesystem_usd": 4.0},
                 "filesystem": {"storage_gib": 1200, "throughput_mb_s": 240, "demand_mb_s": 96}},
        "resources": [], "error": {"Error": "RunCancelled", "Cause": "cancelled while queued"},
    })
    stack = operate.Stack("lustrain", MACHINE, aws.jobs_table, "jobs", "artifacts", boto3.Session(region_name=REGION))
    return report.build(stack, "gpt-small-0a1b2c3d", tmp_path, now=NOW.timestamp())


def texts(figure) -> list[str]:
    return [t.get_text() for ax in figure.axes for t in ax.texts]


def test_every_title_fits_in_its_figure(built):
    for name, figure in built.figures.items():
        renderer = FigureCanvasAgg(figure).get_renderer()
        drawn = figure.bbox
        for ax in figure.axes:
            box = ax.title.get_window_extent(renderer)
            assert (box.x0 >= drawn.x0 - 1 and box.x1 <= drawn.x1 + 1), (name, ax.title.get_text())
    # the long one is whole, on two lines
    title = built.figures["throughput"].axes[0].title.get_text()
    assert title.replace("\n", " ") == "file-system throughput: provisioned vs the GPUs' demand"


def test_the_bars_carry_their_values_a_zero_one_too(built):
    assert texts(built.figures["cost"]) == ["$412.50", "$0.00"]
    assert texts(built.figures["throughput"]) == ["240 MB/s", "96 MB/s"]


def test_a_run_without_losses_says_so_instead_of_empty_axes(built):
    assert "no losses logged yet" in texts(built.figures["loss"])
    assert "no validation logged yet" in texts(built.figures["val_bpb"])
    assert built.series["loss"] == {}


def test_the_report_says_where_the_runs_tensorboard_files_are(aws, built, tmp_path, monkeypatch):
    # a run cancelled while queued had no training job: nothing to point at
    assert built.tensorboard_logdir is None and "tensorboard" not in built.html_path.read_text()
    # one whose jobs uploaded theirs (TensorBoardOutputConfig, as DescribeTrainingJob gives it back)
    logdir = "s3://artifacts/archive/gpt-small-0a1b2c3d/jobs/"
    jobs = [{"TrainingJobName": "gpt-small-0a1b2c3d-1", "TrainingJobStatus": "Stopped", "SecondaryStatus": "Stopped",
             "BillableTimeInSeconds": 0, "TensorBoardOutputConfig": {"S3OutputPath": logdir}}]
    monkeypatch.setattr(operate, "training_jobs", lambda stack, record: jobs)
    stack = operate.Stack("lustrain", MACHINE, aws.jobs_table, "jobs", "artifacts", boto3.Session(region_name=REGION))
    made = report.build(stack, "gpt-small-0a1b2c3d", tmp_path / "again", now=NOW.timestamp())
    assert made.tensorboard_logdir == logdir and made.to_dict()["tensorboard_logdir"] == logdir
    assert f"tensorboard --logdir {logdir}" in made.html_path.read_text()
