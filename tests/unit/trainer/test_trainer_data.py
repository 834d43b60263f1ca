"""The training loader: memory-mapped shards, disjoint per rank, deterministic from the step, prefetched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from lustrain_trainer import prepare as prep
from lustrain_trainer.data import BatchPlan, Prefetcher, ShardReader
from lustrain_trainer.shards import DataError, read_index


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    # several shards, so batches come from more than one file
    assert prep.main(["stdlib", str(out), "--glob", "**/*.py", "--max-bytes", "600KiB",
                      "--shard-size", "128KiB"]) == 0
    return out


def plan_for(data: Path, rank: int, world_size: int, seed: int = 7, block: int | None = 4,
             window: int = 3) -> BatchPlan:
    # Blocks of 4 batches, windows of 3 blocks: many of each in the test data, as in a real data set.
    index = read_index(data)
    return BatchPlan([s.tokens for s in index.splits["train"]], 4, 32, rank, world_size, seed, block=block,
                     window=window)


def test_a_rank_stats_only_the_shards_it_opens_and_none_to_read_the_index(
        data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At 10^5 shards and 400 ranks a stat of every shard per rank is 4*10^7 metadata calls on Lustre: the index
    gives the sizes, and a shard's file is checked once, by the rank that opens it."""
    stats: list[str] = []
    real_stat = Path.stat

    def counted(self: Path, *args: object, **kwargs: object) -> object:
        if self.suffix == ".bin":
            stats.append(self.name)
        return real_stat(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "stat", counted)
    index = read_index(data)
    assert len(index.splits["train"]) > 3 and stats == []
    reader = ShardReader(index, "train")
    reader.read(2, 0, 8)
    reader.read(2, 8, 8)
    assert stats == [index.splits["train"][2].path.name]


def test_ranks_read_disjoint_batches_that_cover_the_epoch(data: Path) -> None:
    plans = [plan_for(data, rank, 3) for rank in range(3)]
    per_rank = plans[0].per_rank
    seen = [{p.location(k) for k in range(per_rank)} for p in plans]
    assert all(len(s) == per_rank for s in seen)  # no rank reads a batch twice in an epoch
    assert not (seen[0] & seen[1]) and not (seen[0] & seen[2]) and not (seen[1] & seen[2])
    assert len(seen[0] | seen[1] | seen[2]) == 3 * per_rank >= plans[0].total - 2


def test_each_epoch_is_a_new_order_and_the_order_is_the_same_in_every_process(data: Path) -> None:
    plan, again = plan_for(data, 0, 1), plan_for(data, 0, 1)
    n = plan.per_rank
    first = [plan.location(k) for k in range(n)]
    second = [plan.location(k) for k in range(n, 2 * n)]
    assert sorted(first) == sorted(second) and first != second
    assert [again.location(k) for k in range(2 * n)] == first + second
    shards, offsets = plan.locations(n - 3, 6)  # a range across the epoch boundary
    assert list(zip(shards.tolist(), offsets.tolist(), strict=True)) == (first + second)[n - 3 : n + 3]


def test_windows_shuffle_blocks_of_adjacent_batches_read_with_one_gather_per_shard(data: Path) -> None:
    plan = plan_for(data, 0, 1)
    start = 0
    while start < plan.per_rank:
        end = plan.window_end(start)
        spans = plan.spans(start, end - start)
        reads = plan.reads(spans)
        assert len(reads.takes) == len({shard for shard, _ in reads.takes})  # one gather per shard
        assert sorted(reads.layout.tolist()) == sorted(spans.tolist())
        if end - start == plan.block * plan.window_blocks:
            assert spans.tolist() != sorted(spans.tolist())  # shuffled within the window
            # a window is a few whole blocks of adjacent spans
            assert len({span // plan.block for span in spans.tolist()}) == plan.window_blocks
        start = end
    firsts = np.sort(plan.spans(0, plan.per_rank)[: plan.block * plan.window_blocks])[:: plan.block]
    assert np.any(np.diff(firsts) != plan.block)  # blocks in a shuffled order


@pytest.mark.parametrize("world, accum", [(2, 2), (4, 1), (1, 4)])
def test_any_world_size_with_the_same_global_batch_reads_the_same_order(data: Path, world: int, accum: int) -> None:
    """Resuming on another world size (grad_accum absorbing the change) continues the same order of the data."""
    index = read_index(data)
    tokens = [s.tokens for s in index.splits["train"]]
    one = BatchPlan(tokens, 4, 32, 0, 1, 7, block=4, window=3, grad_accum=4)
    order = one.spans(0, 2 * one.per_rank).tolist()
    plans = [BatchPlan(tokens, 4, 32, rank, world, 7, block=4, window=3, grad_accum=accum) for rank in range(world)]
    steps = 2 * one.steps_per_epoch
    seen = [span for step in range(steps) for p in plans for span in p.spans(step * accum, accum).tolist()]
    assert seen == order


def test_the_plan_holds_a_few_numbers_per_shard_whatever_the_size_of_the_data() -> None:
    import tracemalloc

    shards = [1 << 30] * 10_000  # 20 TB of uint16 tokens, in shards of 2 GiB
    tracemalloc.start()
    plan = BatchPlan(shards, 8, 4096, 3, 400, 1, grad_accum=2)
    k = 10**9
    end, spans, _, _ = plan.window_reads(k)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert end > k and len(set(spans.tolist())) == len(spans)
    assert peak < 8 << 20, peak


def test_prefetcher_yields_the_planned_batches_with_their_tokens_from_any_start(data: Path) -> None:
    index = read_index(data)
    shards = [np.fromfile(s.path, dtype="<u2") for s in index.splits["train"]]
    reader = ShardReader(index, "train")
    for block in (4, None):  # small blocks, and the default (about a megabyte: one block per shard here)
        plan = plan_for(data, 1, 2, block=block)
        for start in (0, 5, plan.per_rank - 2):  # a resumed run starts at step * grad_accum
            prefetch = Prefetcher(plan, reader, start=start, depth=3, pin=False)
            try:
                for k in range(start, start + 2 * plan.window + 10):  # across windows and the epoch's end
                    batch = prefetch.next()
                    assert (batch.number, (batch.shard, batch.offset)) == (k, plan.location(k))
                    expected = shards[batch.shard][batch.offset : batch.offset + plan.batch_tokens]
                    assert np.array_equal(batch.tokens.numpy(), expected)
            finally:
                prefetch.close()


def test_a_window_buffer_is_reused_only_once_its_batches_are_gone(data: Path) -> None:
    plan, reader = plan_for(data, 0, 1), ShardReader(read_index(data), "train")
    prefetch = Prefetcher(plan, reader, start=0, depth=1, pin=False)
    try:
        held = [prefetch.next() for _ in range(3 * plan.window)]  # kept across windows
        copies = [batch.tokens.clone() for batch in held]
        for _ in range(3 * plan.window):
            prefetch.next()
    finally:
        prefetch.close()
    assert all(torch.equal(batch.tokens, copy) for batch, copy in zip(held, copies, strict=True))


def test_targets_are_the_inputs_shifted_by_one_token(data: Path) -> None:
    plan, reader = plan_for(data, 0, 1), ShardReader(read_index(data), "train")
    prefetch = Prefetcher(plan, reader, start=0, depth=2, pin=False)
    try:
        x, y = prefetch.next().inputs_targets(torch.device("cpu"), 4, 32)
    finally:
        prefetch.close()
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(x[1:, 0], y[:-1, -1])  # rows are consecutive text


def test_a_reader_error_reaches_the_training_loop(data: Path) -> None:
    plan, reader = plan_for(data, 0, 1, block=None), ShardReader(read_index(data), "train")
    reader.rows = None  # type: ignore[assignment,method-assign]
    prefetch = Prefetcher(plan, reader, start=0, depth=2, pin=False)
    try:
        with pytest.raises(TypeError):
            prefetch.next()
    finally:
        prefetch.close()


def test_too_little_data_for_the_ranks_names_the_sizes(data: Path) -> None:
    with pytest.raises(DataError, match=r"holds \d+ batches of batch_size 512 x seq_len 1024, fewer than the 8 ranks"):
        BatchPlan([s.tokens for s in read_index(data).splits["train"]], 512, 1024, 0, 8, 1)


def test_a_directory_without_an_index_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"python -m lustrain_trainer\.prepare SRC OUT"):
        read_index(tmp_path)


def test_a_block_holds_about_a_megabyte_of_shards_whatever_the_token_width() -> None:
    from lustrain_trainer.data import BLOCK_BYTES, BatchPlan

    narrow = BatchPlan([1 << 24], 4, 64, 0, 1, 0)
    wide = BatchPlan([1 << 24], 4, 64, 0, 1, 0, token_bytes=4)  # uint32 shards: a vocabulary above 65,536
    assert narrow.block == BLOCK_BYTES // (narrow.batch_tokens * 2)
    assert wide.block == BLOCK_BYTES // (wide.batch_tokens * 4) < narrow.block


def test_the_start_check_stats_each_shard_once_over_the_ranks_and_tells_a_few(
        data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shard is statted once in all, by the rank its position names; a shard whose stat fails (a permission, an
    I/O error) is a bad shard like a cut one, never an exception on one rank; each rank sends only how many it found
    and the first few."""
    from lustrain_trainer import shards

    index = read_index(data)
    every = [s.path.name for split in sorted(index.splits) for s in index.splits[split]]
    stats: list[str] = []
    real_stat = Path.stat
    unreadable = index.splits["train"][1].path.name

    def counted(self: Path, *args: object, **kwargs: object) -> object:
        if self.suffix == ".bin":
            stats.append(self.name)
            if self.name == unreadable:
                raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "stat", counted)
    found = [shards.check_share(index, rank, 3) for rank in range(3)]
    assert sorted(stats) == sorted(every)  # once each, over the three ranks
    assert [len(f) for f in found].count(1) == 1 and "PermissionError" in "".join(line for lines in found for line in lines)

    many = [f"shard-{i}.bin: cut" for i in range(40)]
    report = shards.share_report(many)
    assert report == [(40, many[: shards.NAMED_BAD_SHARDS])]
    error = str(shards.bad_shards_error(report + shards.share_report(["other.bin: gone"]), 100))
    assert error.startswith("41 of the 100 shards") and error.endswith("(and 36 more)") and "other.bin" not in error
