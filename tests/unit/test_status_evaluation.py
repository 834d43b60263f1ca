"""The evaluation `lustrain status` and `report` show, from the training jobs' FinalMetricDataList: each figure the
newest attempt's that reports it, final once the newest attempt Completed."""

from __future__ import annotations

from datetime import UTC, datetime

from lustrain import operate

AT = datetime(2026, 6, 2, 12, 0, tzinfo=UTC)


def job(status: str, **metrics: float) -> dict:
    return {
        "TrainingJobStatus": status,
        "FinalMetricDataList": [{"MetricName": k, "Value": v, "Timestamp": AT} for k, v in metrics.items()],
    }


def test_a_resumed_attempt_that_has_not_evaluated_yet_keeps_the_previous_evaluation():
    first = job(
        "Failed",
        step=300,
        tokens_seen=3e5,
        train_loss=2.5,
        val_loss=2.6,
        val_ppl=13.464,
        val_bpb=1.2,
        tokens_per_s=1e4,
    )
    second = job("InProgress", step=350, tokens_seen=3.5e5, train_loss=2.4, resumed_from=300)

    shown = operate.evaluation([first, second])

    assert shown == {
        "final": False,
        "step": 350,
        "tokens_seen": 350_000,
        "train_loss": 2.4,
        "val_loss": 2.6,
        "val_ppl": 13.464,
        "val_bpb": 1.2,
    }
    assert operate.evaluation_text(shown) == (
        "latest at step 350: val_loss 2.6000, perplexity 13.46, 1.2000 bits/byte; train_loss 2.4000; "
        "350,000 tokens seen"
    )


def test_the_figures_are_final_once_the_newest_attempt_completed():
    shown = operate.evaluation(
        [job("Completed", step=6, tokens_seen=6144, train_loss=2.0, val_loss=2.1, val_ppl=8.166, val_bpb=2.9)]
    )
    assert shown is not None and shown["final"] is True
    assert operate.evaluation_text(shown).startswith(
        "final at step 6: val_loss 2.1000, perplexity 8.17, 2.9000 bits/byte"
    )


def test_no_figure_yet_is_no_evaluation_and_a_run_without_validation_says_so():
    assert operate.evaluation([]) is None
    assert operate.evaluation([job("InProgress", step=0, resumed_from=0)]) is None
    shown = operate.evaluation([job("InProgress", step=10, tokens_seen=640, train_loss=5.1)])
    assert shown is not None
    assert (
        operate.evaluation_text(shown)
        == "latest at step 10: no validation yet; train_loss 5.1000; 640 tokens seen"
    )
