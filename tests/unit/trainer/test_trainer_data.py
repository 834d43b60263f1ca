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


def test_windows_shuffle_blocks_of_adjacent_batches_read_in_few_straight_copies(data: Path) -> None:
    plan = plan_for(data, 0, 2)
    blocks = plan.window // plan.block
    for start in range(0, plan.per_rank, plan.window):
        spans = plan.spans(start, plan.window_end(start) - start)
        reads = plan.reads(spans)
        # whole blocks, plus at most the pieces of blocks cut by a shard's end or this rank's share
        assert sum(len(b) for _, b in reads.blocks) <= blocks and len(reads.runs) <= 3
        assert sorted(reads.layout.tolist()) == sorted(spans.tolist())
        if len(spans) == plan.window:
            assert spans.tolist() != sorted(spans.tolist())  # shuffled within the window
    firsts = plan.spans(0, plan.per_rank)[:: plan.block]
    assert np.any(np.diff(firsts) != plan.block)  # blocks in a shuffled order


def test_prefetcher_yields_the_planned_batches_with_their_tokens_from_any_start(data: Path) -> None:
    index = read_index(data)
    shards = [np.fromfile(s.path, dtype="<u2") for s in index.splits["train"]]
    reader = ShardReader(index, "train")
    for block in (4, None):  # whole blocks copied by shard rows; everything in runs (one block per shard)
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
    reader.read_into = None  # type: ignore[assignment,method-assign]
    prefetch = Prefetcher(plan, reader, start=0, depth=2, pin=False)
    try:
        with pytest.raises(TypeError):
            prefetch.next()
    finally:
        prefetch.close()


def test_too_little_data_for_the_ranks_names_the_sizes(data: Path) -> None:
    with pytest.raises(DataError, match=r"holds \d+ batches of batch_size 512 x seq_len 1024, fewer than the 8"):
        BatchPlan([s.tokens for s in read_index(data).splits["train"]], 512, 1024, 0, 8, 1)


def test_a_directory_without_an_index_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"python -m lustrain_trainer\.prepare SRC OUT"):
        read_index(tmp_path)


def _one_window(plan: BatchPlan, start: int) -> tuple[int, np.ndarray, list, list, np.ndarray, list[int]]:
    """The window from `start` planned on its own, the plain way: reads() of its spans, rows by search."""
    end = plan.window_end(start)
    spans = plan.spans(start, end - start)
    reads = plan.reads(spans)
    where = np.argsort(reads.layout)
    rows = where[np.searchsorted(reads.layout[where], spans)]
    blocks = [(shard, numbers.tolist()) for shard, numbers in reads.blocks]
    return end, spans, blocks, reads.runs, reads.layout, rows.tolist()


@pytest.mark.parametrize("seed", range(40))
def test_windows_planned_in_groups_read_what_each_window_planned_alone_reads(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shards = rng.integers(1, 4000, size=int(rng.integers(1, 6))).tolist()
    world = int(rng.integers(1, 4))
    try:
        plan = BatchPlan(shards, int(rng.integers(1, 4)), int(rng.integers(1, 9)), int(rng.integers(world)), world,
                         seed, shuffle=bool(rng.random() < 0.8), block=[None, 1, 2, 3, 7][seed % 5],
                         window=int(rng.integers(1, 6)))
    except DataError:
        return
    # every window of three epochs, in order and backwards (the cache of planned groups moves both ways),
    # and starts inside windows (a resumed run)
    starts = [k for k in range(3 * plan.per_rank) if k % plan.per_rank % plan.window == 0]
    for start in [*starts, *rng.integers(3 * plan.per_rank, size=5).tolist(), *starts[::-1]]:
        end, spans, reads, rows = plan.window_reads(start)
        expected = _one_window(plan, start)
        assert (end, spans.tolist(), [(s, n.tolist()) for s, n in reads.blocks], reads.runs) == (
            expected[0], expected[1].tolist(), expected[2], expected[3])
        assert reads.layout.tolist() == expected[4].tolist() and rows == expected[5]

