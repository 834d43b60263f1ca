"""prepare_estimate: a data preparation's time from its text, tokenizer and instances, at bench/prepare.py's rates."""

from __future__ import annotations

import pytest
from lustrain_trainer import prepare_estimate as est

TB = 10**12


def test_the_work_divides_among_the_instances_by_whole_parts() -> None:
    one = est.estimate_prepare(TB, "bpe:32000", instances=1)
    four = est.estimate_prepare(TB, "bpe:32000", instances=4)
    assert one.parts == four.parts == -(-TB // est.PART_BYTES)
    assert four.work_seconds == pytest.approx(one.work_seconds / 4, rel=1e-3)
    assert one.work_seconds == pytest.approx(TB / est.BPE_RATE)
    # ten parts on four instances: the slowest does three
    ten = est.estimate_prepare(10 * est.PART_BYTES, "bytes", instances=4)
    assert ten.work_seconds == pytest.approx(3 * est.PART_BYTES / est.BYTES_RATE)
    assert ten.seconds == ten.plan_seconds + ten.work_seconds + ten.merge_seconds


def test_a_bpe_is_trained_on_a_bounded_sample_and_encodes_faster_on_more_cores() -> None:
    small, large = est.estimate_prepare(10 << 20, "bpe:4096"), est.estimate_prepare(TB, "bpe:4096")
    assert small.plan_seconds == pytest.approx(est.FIXED_SECONDS + (10 << 20) / est.BPE_TRAIN_RATE)
    assert large.plan_seconds == pytest.approx(est.FIXED_SECONDS + est.BPE_SAMPLE / est.BPE_TRAIN_RATE)
    assert est.estimate_prepare(TB, "tokenizer.json").plan_seconds == est.FIXED_SECONDS
    assert est.estimate_prepare(TB, "bpe:4096", vcpus=16).work_seconds == pytest.approx(large.work_seconds / 8)
    assert est.estimate_prepare(TB, "bytes", vcpus=16).work_seconds == est.estimate_prepare(TB).work_seconds


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"instances": 0}, "instances 0 is not allowed: use 1 or more"),
    ({"text_bytes": -1}, "text_bytes -1 is not allowed"),
    ({"tokenizer": " "}, "tokenizer is empty; allowed: bytes | bpe:VOCAB"),
])
def test_bad_input_is_refused_naming_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        est.estimate_prepare(**{"text_bytes": TB, **kwargs})  # type: ignore[arg-type]
