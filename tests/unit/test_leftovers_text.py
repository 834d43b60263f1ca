"""What `lustrain leftovers` and `lustrain cancel --wait` print: each resource by run with what it bills, the total,
and a teardown's stopped, deleted and kept (the commands themselves run on the twin in tests/e2e)."""

from __future__ import annotations

from lustrain_core.leftovers import Leftover, Report

from lustrain.cleanup import leftovers_text, teardown_text


def test_the_table_names_each_run_and_says_what_bills_together():
    shown = Report(
        "lustrain",
        "2026-11-01",
        [
            Leftover("late-1", "late", "RUNNING", "vpc", "vpc-1", None, 0.0, kept=False, note=""),
            Leftover("late-1", "late", "RUNNING", "training_job", "late-1-1", "InProgress", 37.688, kept=False, note=""),
            Leftover("pool-2", "pool", "SUCCEEDED", "warm_pool", "pool-2-1", "Available", 37.688, kept=True,
                     note="compute.keep_alive_minutes", billed_s=120),
            Leftover("gone-3", "", None, "iam_role", "gone-3-prep", None, 0.0, kept=False, note=""),
        ],
    ).to_dict()
    text = leftovers_text(shown)
    assert "late (late-1)" in text and "gone-3 (no record)" in text
    assert "37.6880" in text and "billed 120 s so far" in text
    assert text.splitlines()[-1] == (
        "4 resources of stack lustrain; 2 bill, $75.38 an hour together (list prices of 2026-11-01)"
    )


def test_nothing_left_says_so_and_an_unpriced_resource_makes_the_total_unknown():
    assert leftovers_text(Report("s", "2026-11-01", []).to_dict()) == "stack s: its runs hold nothing; nothing bills"
    odd = Report("s", "2026-11-01", [Leftover("j", "r", "RUNNING", "training_job", "j-1", "InProgress", None,
                                              kept=False, note="")]).to_dict()
    text = leftovers_text(odd)
    assert "unknown" in text.splitlines()[1] and "unknown (a resource has no price here)" in text


def test_cancel_wait_says_what_the_teardown_did_or_what_is_still_there():
    ended = {"ended": True, "status": "FAILED", "error": "RunCancelled",
             "stopped": [{"type": "training_job", "id": "a-1"}], "deleted": [{"type": "vpc", "id": "vpc-1"}],
             "left": [{"kind": "file_system", "id": "fs-1", "note": "kept: filesystem.keep", "hourly_usd": 0.99}]}
    text = teardown_text(ended, "a", "lustrain")
    assert text.splitlines() == [
        "teardown ended: run a FAILED, RunCancelled",
        "  stopped: training_job a-1",
        "  deleted: vpc vpc-1",
        "  kept: file_system fs-1 (kept: filesystem.keep; $0.99/h)",
    ]
    waiting = {**ended, "ended": False, "left": [{"kind": "subnet", "id": "subnet-1", "note": "", "hourly_usd": 0}]}
    assert teardown_text(waiting, "a", "lustrain").splitlines() == [
        "its teardown has not ended; still there: subnet subnet-1",
        "see: lustrain leftovers a --stack lustrain",
    ]
