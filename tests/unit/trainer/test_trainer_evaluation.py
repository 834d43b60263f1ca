"""The evaluation's figures for a known loss: perplexity, bits per byte from the index's val split, the metric line
SageMaker reads them from, and the final summary."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from lustrain_trainer.metrics import (
    bits_per_byte,
    evaluation,
    final_summary,
    format_line,
    metric_definitions,
    perplexity,
    split_bytes,
)
from lustrain_trainer.shards import DataIndex, Shard


def read(line: str) -> dict[str, float]:
    """What SageMaker's MetricDefinitions read from a log line."""
    return {d["Name"]: float(m.group(1)) for d in metric_definitions() if (m := re.search(d["Regex"], line))}


def test_perplexity_and_bits_per_byte_of_a_known_loss() -> None:
    # a uniform guess over 256 byte values: perplexity 256, 8 bits a byte when every token is one byte
    assert perplexity(math.log(256)) == pytest.approx(256.0)
    assert bits_per_byte(math.log(256), 1000, 1000) == pytest.approx(8.0)
    # a BPE token carrying 4 bytes on average: the same loss per token is a quarter of the bits per byte
    assert bits_per_byte(math.log(256), 1000, 4000) == pytest.approx(2.0)
    assert perplexity(1000.0) == math.inf  # a diverged run, not an OverflowError
    with pytest.raises(ValueError, match="bytes above 0"):
        bits_per_byte(1.0, 10, 0)


def index_of(raw: dict) -> DataIndex:
    splits = {name: [Shard(Path(f"{name}-00000.bin"), entry["tokens"])] for name, entry in raw["splits"].items()}
    return DataIndex(root=Path("."), splits=splits, raw=raw)


def test_the_val_split_bytes_come_from_either_index_version() -> None:
    version2 = index_of({"version": 2, "splits": {"val": {"tokens": 1200, "documents": 3, "bytes": 4800}}})
    assert split_bytes(version2, "val") == (1200, 4800)
    # version 1: the byte tokenizer, each document its bytes and one end-of-document token
    version1 = index_of({"version": 1, "splits": {"val": {"tokens": 1003, "documents": 3}}})
    assert split_bytes(version1, "val") == (1003, 1000)
    # a version 2 index without the split's bytes cannot say; no val split at all neither
    assert split_bytes(index_of({"version": 2, "splits": {"val": {"tokens": 5, "documents": 1}}}), "val") is None
    assert split_bytes(version2, "test") is None


def test_an_evaluation_is_logged_and_read_back_by_the_metric_definitions() -> None:
    figures = evaluation(2.0, (1003, 1000))
    assert figures == pytest.approx(
        {"val_loss": 2.0, "val_ppl": math.exp(2.0), "val_bpb": 2.0 * 1003 / 1000 / math.log(2)}
    )
    line = format_line(6, {"train_loss": 2.1, **figures, "tokens_seen": 768})
    assert line == "step=6 train_loss=2.1000 val_loss=2.0000 val_ppl=7.389 val_bpb=2.8940 tokens_seen=768"
    assert read(line) == {
        "step": 6,
        "train_loss": 2.1,
        "val_loss": 2.0,
        "val_ppl": 7.389,
        "val_bpb": 2.8940,
        "tokens_seen": 768,
    }
    # without the split's bytes no bits per byte; an infinite perplexity is printed but read as no value
    diverged = format_line(7, evaluation(900.0, None))
    assert diverged == "step=7 val_loss=900.0000 val_ppl=inf" and "val_ppl" not in read(diverged)


def test_the_final_summary_holds_every_figure_and_nulls_what_was_not_measured() -> None:
    metrics = {"train_loss": 2.1, **evaluation(2.0, (1003, 1000)), "tokens_seen": 768.0}
    final = final_summary(metrics, 6, 768, 12.5, 6)
    assert final == pytest.approx(
        {
            "step": 6,
            "tokens_seen": 768,
            "elapsed_s": 12.5,
            "train_loss": 2.1,
            "val_step": 6,
            "val_loss": 2.0,
            "val_ppl": math.exp(2.0),
            "val_bpb": 2.0 * 1003 / 1000 / math.log(2),
        }
    )
    bare = final_summary({"train_loss": 3.0, "val_loss": 900.0, "val_ppl": math.inf}, 2, 64, 1.0, 2)
    assert (bare["val_ppl"], bare["val_bpb"]) == (None, None)
    json.dumps(bare, allow_nan=False)  # strict JSON: no Infinity, no NaN
