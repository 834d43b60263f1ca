"""Reading token shards for training: memory-mapped, disjoint per rank, prefetched in the background.

A batch is one contiguous span of batch_size * seq_len + 1 tokens; spans do not overlap. The order is
shuffled at two levels, so that the loader reads a few large pieces rather than many scattered batches:

- blocks of adjacent spans (about a megabyte, aligned within a shard) are put in an order shuffled per
  epoch with a seed every rank shares, and rank r takes the r-th of world_size equal runs of that order,
  so no two ranks read the same span in an epoch and each span is read at most once per epoch;
- within a window of a few blocks a rank's batches are shuffled again.

A background thread copies a window's whole blocks with one np.take per shard (a single call without the
GIL, near the speed of a sequential read; cut blocks at a shard's end or a rank's share are copied run by
run) into one buffer (pinned on a GPU). It works out the next window while the training loop waits and
hands a window over in one piece; the loop turns it into batches, views of the buffer, while the thread
copies the next one.
"""

from __future__ import annotations

import collections
import itertools
import math
import queue
import sys
import threading
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from .shards import DTYPE, TOKEN_BYTES, DataError, DataIndex

BLOCK_BYTES = 1 << 20
WINDOW_BLOCKS = 8
KEEP_BUFFERS = 8
PLANNED_WINDOWS = 16


class ShardReader:
    """Memory maps of one split's shards: pages are read on demand and shared by all ranks on a host.

    Tokens stay uint16 until they reach the device: a quarter of the bytes of int64 to copy and, on a GPU,
    to send over PCIe; the widening to int64 happens on the device.
    """

    def __init__(self, index: DataIndex, split: str) -> None:
        if sys.byteorder != "little":
            raise DataError(f"shards are little-endian {DTYPE}; this machine is {sys.byteorder}-endian")
        self.shards = index.splits.get(split, [])
        # shared=False maps the file copy-on-write; nothing here writes, so no page is ever copied. (A
        # torch mapping rather than np.memmap: that one keeps a file descriptor open per shard.)
        self._maps = [torch.from_file(str(shard.path), shared=False, size=shard.tokens, dtype=torch.uint16).numpy()
                      for shard in self.shards]
        self.buffers = _Buffers(keep=KEEP_BUFFERS)

    def read_into(self, out: np.ndarray, shard: int, offset: int) -> None:
        """Fill `out` with the tokens from `offset` of shard `shard`: one straight copy, without the GIL.

        Gathers of many small rows were tried first: the per-row work (and on a busy machine torch's
        OpenMP gathers) made the loader several times slower than a sequential read.
        """
        out[:] = self._maps[shard][offset : offset + len(out)]

    def blocks(self, shard: int, row_tokens: int) -> np.ndarray:
        """Shard `shard` as rows of `row_tokens` (its whole blocks), without copying."""
        whole = len(self._maps[shard]) // row_tokens
        return self._maps[shard][: whole * row_tokens].reshape(whole, row_tokens)

    def read(self, shard: int, offset: int, count: int) -> torch.Tensor:
        return torch.from_numpy(self._maps[shard][offset : offset + count].copy())


class BatchPlan:
    """Where batch number k of this rank lies: a pure function of (seed, epoch, rank, world_size, k).

    `block` (spans per block) and `window` (blocks per shuffle window) default to about a megabyte and
    eight of them; smaller ones shuffle more finely at more copies per window.
    """

    def __init__(self, shard_tokens: list[int], batch_size: int, seq_len: int, rank: int, world_size: int,
                 seed: int, shuffle: bool = True, split: str = "train", block: int | None = None,
                 window: int = WINDOW_BLOCKS) -> None:
        if (block is not None and block < 1) or window < 1:
            raise DataError(f"block ({block}) and window ({window}) must be at least 1")
        self.batch_size, self.seq_len = batch_size, seq_len
        self.span = batch_size * seq_len
        self.rank, self.world_size, self.seed, self.shuffle = rank, world_size, seed, shuffle
        # Spans do not overlap (the last target of a batch is not the next batch's first input), so a
        # block of them is one straight row of a shard: 1 input-target pair in span is not trained on.
        counts = np.array([tokens // self.batch_tokens for tokens in shard_tokens], dtype=np.int64)
        self._shard_of = np.repeat(np.arange(len(counts)), counts)
        firsts = np.cumsum(counts) - counts  # span number of each shard's first span
        self._offset_of = (np.arange(int(counts.sum())) - np.repeat(firsts, counts)) * self.batch_tokens
        self.total = int(counts.sum())
        self.per_rank = self.total // world_size
        if self.per_rank == 0:
            raise DataError(
                f"the {split} split holds {self.total} batches of batch_size {batch_size} x seq_len {seq_len}, "
                f"fewer than the {world_size} ranks: prepare more data or lower batch_size/seq_len"
            )
        self.block = block or max(1, BLOCK_BYTES // (self.batch_tokens * TOKEN_BYTES))
        self.window = self.block * window  # batches
        # Blocks start at every block-th span of a shard; a shard's last block may be short.
        self._block_starts = np.concatenate(
            [first + np.arange(0, n, self.block) for first, n in zip(firsts.tolist(), counts.tolist(), strict=True)])
        self._block_lengths = np.diff(np.append(self._block_starts, self.total))
        self._orders: dict[int, np.ndarray] = {}
        self._planned: tuple[tuple[int, int], list[tuple[np.ndarray, Reads, np.ndarray]]] | None = None

    @property
    def batch_tokens(self) -> int:
        return self.span + 1

    def _order(self, epoch: int) -> np.ndarray:
        """The span numbers of this rank's batches in one epoch."""
        if epoch in self._orders:
            return self._orders[epoch]
        lo, hi = self.rank * self.per_rank, (self.rank + 1) * self.per_rank
        if not self.shuffle:
            return np.arange(lo, hi)
        blocks = np.random.default_rng([self.seed, epoch]).permutation(len(self._block_starts))
        starts, lengths = self._block_starts[blocks], self._block_lengths[blocks]
        ends = np.cumsum(lengths)
        # Only the blocks that overlap this rank's run of the shuffled order are spelled out span by span.
        first, last = int(np.searchsorted(ends, lo, "right")), int(np.searchsorted(ends, hi - 1, "right"))
        starts, lengths = starts[first : last + 1], lengths[first : last + 1]
        before = ends[first] - lengths[0]
        spans = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
        order = spans[lo - before : hi - before]
        # Within each window the batches are shuffled again, with a draw of this rank's own.
        keys = np.random.default_rng([self.seed, epoch, self.rank]).random(self.per_rank)
        # (A stable sort of each window's keys: the order of np.lexsort((keys, position // window)).)
        full = self.per_rank - self.per_rank % self.window
        within = keys[:full].reshape(-1, self.window).argsort(axis=1, kind="stable")
        within += np.arange(0, full, self.window)[:, None]
        order = order[np.concatenate((within.ravel(), full + keys[full:].argsort(kind="stable")))]
        self._orders = {e: o for e, o in self._orders.items() if e == epoch - 1}
        self._orders[epoch] = order
        return order

    def spans(self, start: int, count: int) -> np.ndarray:
        """Span numbers (positions in the split, shard after shard) of this rank's batches start .. +count-1."""
        epoch, position = divmod(start, self.per_rank)
        if position + count <= self.per_rank:
            return self._order(epoch)[position : position + count]
        epochs, positions = np.divmod(np.arange(start, start + count), self.per_rank)
        spans = np.empty(count, dtype=np.int64)
        for epoch in np.unique(epochs):
            here = epochs == epoch
            spans[here] = self._order(int(epoch))[positions[here]]
        return spans

    def locations(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard, offset) arrays of this rank's batches start .. start + count - 1."""
        return self.locations_of(self.spans(start, count))

    def locations_of(self, spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard, offset) arrays of the given span numbers."""
        return self._shard_of[spans], self._offset_of[spans]

    def location(self, k: int) -> tuple[int, int]:
        shards, offsets = self.locations(k, 1)
        return int(shards[0]), int(offsets[0])

    def window_end(self, k: int) -> int:
        """The first batch number after the shuffle window that holds batch k (windows end with the epoch)."""
        epoch, position = divmod(k, self.per_rank)
        return epoch * self.per_rank + min(self.per_rank, (position // self.window + 1) * self.window)

    def window_reads(self, start: int) -> tuple[int, np.ndarray, Reads, list[int]]:
        """(end, spans, reads, rows) of the batches from `start` to the end of its window: rows[i] is the row of
        the buffer that reads.layout puts the i-th batch in.

        Windows are planned PLANNED_WINDOWS at a time with one set of numpy calls, not one set per window: the
        prefetch thread works this out between two copies, and a window's numpy calls on a few hundred spans
        cost about a third of its copy, most of it per call. A start inside a window (a resumed run) plans
        the rest of that window alone.
        """
        end = self.window_end(start)
        epoch, position = divmod(start, self.per_rank)
        if position % self.window:
            spans = self.spans(start, end - start)
            (reads,), rows = self._grouped_reads(spans, np.zeros(len(spans), dtype=np.int64), 1)
            return end, spans, reads, rows.tolist()
        window = position // self.window
        key = (epoch, window // PLANNED_WINDOWS)
        planned = self._planned  # one read: another thread may plan the same windows meanwhile
        if planned is None or planned[0] != key:
            first = key[1] * PLANNED_WINDOWS * self.window
            spans = self._order(epoch)[first : first + PLANNED_WINDOWS * self.window]
            groups = np.arange(len(spans)) // self.window
            reads, rows = self._grouped_reads(spans, groups, int(groups[-1]) + 1)
            bounds = range(0, len(spans), self.window)
            planned = self._planned = (key, [(spans[b : b + self.window], r, rows[b : b + self.window])
                                             for b, r in zip(bounds, reads, strict=True)])
        spans, reads, rows = planned[1][window % PLANNED_WINDOWS]
        return end, spans, reads, rows.tolist()

    def reads(self, spans: np.ndarray) -> Reads:
        """How to read the given spans in few straight copies: their whole blocks, then runs of the rest."""
        (reads,), _ = self._grouped_reads(spans, np.zeros(len(spans), dtype=np.int64), 1)
        return reads

    def _grouped_reads(self, spans: np.ndarray, groups: np.ndarray, count: int) -> tuple[list[Reads], np.ndarray]:
        """reads() of each group of spans (groups: 0 .. count - 1, none empty), and the row of each span in its
        group's layout."""
        n = len(spans)
        by = np.argsort(groups * self.total + spans)  # by group, then by span
        ordered, group = spans[by], groups[by]
        shards = self._shard_of[ordered]
        local = self._offset_of[ordered] // self.batch_tokens  # span number within its shard
        # A block is whole when its first span is here along with the block - 1 spans after it, in its group.
        ahead, fit = np.full(n, -1), max(0, n - self.block + 1)
        ahead[:fit] = ordered[self.block - 1 :]
        whole = (local % self.block == 0) & (ahead == ordered + self.block - 1)
        whole &= self._shard_of[np.maximum(ahead, 0)] == shards
        whole[:fit] &= group[self.block - 1 :] == group[:fit]
        # A span is in a whole block when one starts at it or at one of the block - 1 spans before it.
        starts_here = np.cumsum(whole)
        starts_here[self.block :] -= starts_here[: -self.block].copy()
        in_whole = starts_here > 0
        # Each group's layout: the spans of its whole blocks, then the rest, both in order.
        sizes, whole_sizes = np.bincount(group, minlength=count), np.bincount(group[in_whole], minlength=count)
        starts, whole_starts = np.cumsum(sizes) - sizes, np.cumsum(whole_sizes) - whole_sizes
        whole_before = np.cumsum(in_whole) - in_whole  # spans in whole blocks before each, over all groups
        rest_before = np.arange(n) - whole_before
        row = np.where(in_whole, whole_before - whole_starts[group],
                       whole_sizes[group] + rest_before - (starts - whole_starts)[group])
        layout = np.empty_like(ordered)
        layout[starts[group] + row] = ordered
        rows = np.empty_like(row)
        rows[by] = row
        # Whole blocks, group by group and shard by shard.
        at = np.flatnonzero(whole)
        block_groups, block_shards, numbers = group[at], shards[at], local[at] // self.block
        cut = np.flatnonzero((block_groups[1:] != block_groups[:-1]) | (block_shards[1:] != block_shards[:-1])) + 1
        firsts = np.concatenate(([0], cut)) if len(at) else np.empty(0, dtype=np.int64)
        blocks: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(count)]
        for g, shard, a, length in zip(block_groups[firsts].tolist(), block_shards[firsts].tolist(), firsts.tolist(),
                                       np.diff(firsts, append=len(at)).tolist(), strict=True):
            blocks[g].append((shard, numbers[a : a + length]))
        # The other spans, run by run.
        rest, rest_shards, rest_groups = ordered[~in_whole], shards[~in_whole], group[~in_whole]
        apart = (rest[1:] - rest[:-1] != 1) | (rest_shards[1:] != rest_shards[:-1]) | (rest_groups[1:] != rest_groups[:-1])
        first = np.concatenate(([0], np.flatnonzero(apart) + 1)) if len(rest) else np.empty(0, dtype=np.int64)
        runs: list[list[tuple[int, int, int]]] = [[] for _ in range(count)]
        for g, shard, offset, length in zip(rest_groups[first].tolist(), rest_shards[first].tolist(),
                                            self._offset_of[rest[first]].tolist(),
                                            np.diff(first, append=len(rest)).tolist(), strict=True):
            runs[g].append((shard, offset, length))
        bounds = np.append(starts, n).tolist()
        return [Reads(blocks[g], runs[g], layout[bounds[g] : bounds[g + 1]]) for g in range(count)], rows


@dataclass(slots=True)
class Reads:
    blocks: list[tuple[int, np.ndarray]]  # (shard, its whole blocks to read), shard by shard
    runs: list[tuple[int, int, int]]  # (shard, offset, spans) of the other spans, run by run
    layout: np.ndarray  # the span read into each row of the buffer: the blocks' spans, then the runs'


@dataclass(slots=True)
class Batch:
    number: int
    shard: int
    offset: int
    tokens: torch.Tensor

    def inputs_targets(self, device: torch.device, batch_size: int, seq_len: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.tokens.to(device, non_blocking=True).long()
        return tokens[:-1].view(batch_size, seq_len), tokens[1:].view(batch_size, seq_len)


class Prefetcher:
    """Batches start, start+1, ... read ahead on a background thread, a shuffle window at a time.

    The thread does the reading: one straight copy per run of adjacent spans into one buffer per window
    (pinned on a GPU, so the copy to the device overlaps compute; the caching host allocator keeps it
    until those copies are done). The training loop turns a window into batches, views of that buffer,
    when it takes it: that Python work overlaps the thread's next copy instead of holding the GIL against
    it. At least `depth` batches are kept ready. A start inside a window (a resumed run) reads only the
    rest of that window.
    """

    def __init__(self, plan: BatchPlan, reader: ShardReader, start: int, depth: int, pin: bool) -> None:
        self.plan, self.reader = plan, reader
        windows = max(2, math.ceil(depth / plan.window))
        self._queue: queue.Queue[_Window | BaseException] = queue.Queue(maxsize=windows)
        self._pin, self._capacity = pin, plan.window * (plan.span + 1)
        self._ready: collections.deque[Batch] = collections.deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(start,), name="lustrain-prefetch", daemon=True)
        self._thread.start()

    def _prepare(self, start: int) -> _Window:
        """Everything but the copy, done while the training loop waits for the window before."""
        end, spans, reads, rows = self.plan.window_reads(start)
        buffer = self.reader.buffers.take(len(spans) * self.plan.batch_tokens, self._capacity, self._pin)
        return _Window(start, end, spans, buffer, reads, rows)

    def _fill(self, window: _Window) -> None:
        row_tokens = self.plan.block * self.plan.batch_tokens
        out, at = window.buffer.numpy(), 0
        for shard, blocks in window.reads.blocks:
            # One np.take per shard: a single call that copies every block without taking the GIL back, so
            # the training loop's Python work runs alongside it.
            rows = out[at : at + len(blocks) * row_tokens].reshape(len(blocks), row_tokens)
            np.take(self.reader.blocks(shard, row_tokens), blocks, axis=0, out=rows, mode="clip")
            at += len(blocks) * row_tokens
        for shard, offset, n in window.reads.runs:
            self.reader.read_into(out[at : at + n * self.plan.batch_tokens], shard, offset)
            at += n * self.plan.batch_tokens

    def _run(self, k: int) -> None:
        try:
            window = self._prepare(k)
            while not self._stop.is_set():
                self._fill(window)
                after = self._prepare(window.end)
                self._put(window)
                window = after
        except BaseException as exc:  # re-raised in the training loop, which owns the process
            self._put(exc)

    def _put(self, item: _Window | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def next(self) -> Batch:
        if not self._ready:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            self._ready.extend(self._batches(item))
        return self._ready.popleft()

    def _batches(self, window: _Window) -> list[Batch]:
        rows = window.buffer.view(len(window.rows), self.plan.batch_tokens).unbind(0)
        shards, offsets = self.plan.locations_of(window.spans)
        return [Batch(k, shard, offset, rows[row]) for k, shard, offset, row
                in zip(itertools.count(window.start), shards.tolist(), offsets.tolist(), window.rows)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass(slots=True)
class _Window:
    start: int
    end: int
    spans: np.ndarray  # span numbers of batches start .. end - 1
    buffer: torch.Tensor  # one row of batch_tokens per span, in the order of reads.layout
    reads: Reads
    rows: list[int]  # for each batch, its row


class _Buffers:
    """Buffers for windows; on the CPU each is reused once no tensor made from it is alive any more.

    A fresh buffer of megabytes costs a page fault every 4 KiB, about as long as the copy into it. Pinned
    buffers come from torch's caching host allocator, which already reuses them, and only once the
    copies to the GPU that read them are done. Up to `keep` free buffers are kept.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._free: collections.deque[np.ndarray] = collections.deque()

    def take(self, tokens: int, capacity: int, pin: bool) -> torch.Tensor:
        """A buffer of `tokens`; a new one on the CPU holds `capacity`, so that it fits any window after."""
        if pin:
            return torch.empty(tokens, dtype=torch.uint16, pin_memory=True)
        memory = self._free.pop() if self._free else np.empty(0, dtype=np.uint16)
        if len(memory) < tokens:
            memory = np.empty(max(tokens, capacity), dtype=np.uint16)
        # The tensor (and every view of it) keeps `part` alive; when the last one goes, so does `part`.
        part = memory[:tokens]
        weakref.finalize(part, self._give_back, memory)
        return torch.from_numpy(part)

    def _give_back(self, memory: np.ndarray) -> None:
        if len(self._free) < self.keep:
            self._free.append(memory)
