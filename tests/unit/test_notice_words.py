"""The words of a run's notices: a run named by its spec's file before it is registered, and its final metrics as
the trainer logs them (a step is a whole number, not 150.0)."""

from __future__ import annotations

from lustrain_core.config import Settings
from lustrain_core.steps import notices


def test_the_started_notice_names_the_spec_file_beside_its_execution():
    execution = "4f1d2c3b-9a8e-4b7c-8d6e-5f4a3b2c1d0e"
    told = notices.started(execution, "s3://lustrain-jobs/jobs/tiny.yaml", Settings()).text().splitlines()[0]
    assert told == f"lustrain run started: tiny.yaml, execution {execution}"
    assert notices.started("by-hand", None, Settings()).text().splitlines()[0] == (
        "lustrain run started: execution by-hand"
    )


def test_final_metrics_are_told_as_the_trainer_logs_them():
    facts = {"job_id": "tiny-1a2b3c4d", "outcome": "succeeded", "spec_name": "tiny",
             "metrics": {"step": 150.0, "tokens_seen": 491520.0, "train_loss": 2.345678912, "lr": 3e-05}}
    text = notices.ended(facts, 1.5, Settings()).text()
    assert "Final metrics: lr=3e-05, step=150, tokens_seen=491520, train_loss=2.34568" in text
    assert notices.figure(150.0) == "150" and notices.figure(7) == "7" and notices.figure(0.5) == "0.5"
