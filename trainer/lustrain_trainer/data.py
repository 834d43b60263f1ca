"""Reading token shards for training: memory-mapped, disjoint per rank, prefetched in the background.

A batch is one contiguous span of batch_size * seq_len + 1 tokens; spans do not overlap. An epoch is one order
of every span of the split, the same for every world size:

- the split's spans are cut into blocks of adjacent spans (about a megabyte); the blocks are put in an order
  shuffled per epoch by a keyed permutation computed index by index (a Feistel network, cycle-walked onto the
  number of blocks), so no array grows with the data: the plan holds a few numbers per shard;
- windows of a few consecutive blocks of that order are shuffled again, span by span, with a draw of the
  window's own; the spans that do not fill a whole block come last, shuffled among themselves;
- optimizer step s takes positions s*G .. s*G + G - 1 of that order, G = world_size * grad_accum micro-batches
  (the global batch); rank r takes grad_accum consecutive ones of them. A run resumed on another world size with
  the same G (grad_accum absorbing the change) reads, from the saved step on, exactly what the first run would
  have read: within an epoch no span is seen twice or skipped.

A background thread copies a window's spans of this rank with one np.take per shard (a single call without the
GIL) into one buffer (pinned on a GPU). It works out the next window while the training loop waits and hands a
window over in one piece; the loop turns it into batches, views of the buffer, while the thread copies the next.
"""

from __future__ import annotations

import collections
import functools
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
#: shards mapped at once by a reader: a 20 TB data set has tens of thousands, and the kernel allows a process
#: about 65,000 mappings (vm.max_map_count)
OPEN_MAPS = 512
#: windows whose order a plan works out at once, and the groups of them it keeps (the prefetch thread plans one
#: window ahead of the loop; an evaluation or a resume may look elsewhere)
PLANNED_WINDOWS = 16
KEEP_GROUPS = 3
FEISTEL_ROUNDS = 4
_MIX = np.uint64(0x9E3779B97F4A7C15)
_MIX2 = np.uint64(0xBF58476D1CE4E5B9)


@functools.lru_cache(maxsize=8)
def _round_keys(key: tuple[int, ...]) -> tuple[np.uint64, ...]:
    return tuple(np.uint64(int(k)) for k in np.random.default_rng(list(key)).integers(0, 2**63, FEISTEL_ROUNDS))


def _keyed_permutation(indices: np.ndarray, n: int, key: tuple[int, ...]) -> np.ndarray:
    """A bijection of [0, n) keyed by `key`, evaluated at `indices` alone: a balanced Feistel network on the smallest
    even number of bits that holds n, cycle-walked (applied again while a value falls at or beyond n, which ends
    within a few rounds since the domain is under 4n). Memory: the indices' own. (Unsigned integer arithmetic
    wraps around silently: the multiplications are meant to.)"""
    if n <= 1:
        return np.zeros(len(indices), dtype=np.int64)
    bits = max(2, (n - 1).bit_length())
    bits += bits % 2
    half = np.uint64(bits // 2)
    mask = np.uint64((1 << (bits // 2)) - 1)
    keys = _round_keys(key)
    x = indices.astype(np.uint64)
    todo = np.ones(len(x), dtype=bool)
    while todo.any():
        v = x[todo]
        left, right = v >> half, v & mask
        for k in keys:
            mixed = (right + k) * _MIX
            mixed ^= mixed >> np.uint64(31)
            mixed *= _MIX2
            left, right = right, left ^ ((mixed >> np.uint64(29)) & mask)
        x[todo] = (left << half) | right
        todo[todo] = x[todo] >= np.uint64(n)
    return x.astype(np.int64)


class ShardReader:
    """Memory maps of one split's shards, opened on first use (at most OPEN_MAPS at once, the least recently used
    closed first): pages are read on demand and shared by all ranks on a host.

    Tokens stay uint16 until they reach the device: a quarter of the bytes of int64 to copy and, on a GPU,
    to send over PCIe; the widening to int64 happens on the device.
    """

    def __init__(self, index: DataIndex, split: str, open_maps: int = OPEN_MAPS) -> None:
        if sys.byteorder != "little":
            raise DataError(f"shards are little-endian {DTYPE}; this machine is {sys.byteorder}-endian")
        self.shards = index.splits.get(split, [])
        self._open_maps = open_maps
        self._maps: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.buffers = _Buffers(keep=KEEP_BUFFERS)

    def _map(self, shard: int) -> np.ndarray:
        with self._lock:
            tokens = self._maps.get(shard)
            if tokens is None:
                # shared=False maps the file copy-on-write; nothing here writes, so no page is ever copied. (A
                # torch mapping rather than np.memmap: that one keeps a file descriptor open per shard.)
                info = self.shards[shard]
                tokens = torch.from_file(str(info.path), shared=False, size=info.tokens, dtype=torch.uint16).numpy()
                self._maps[shard] = tokens
                while len(self._maps) > self._open_maps:
                    self._maps.popitem(last=False)  # unmapped once no batch refers to it any more
            else:
                self._maps.move_to_end(shard)
            return tokens

    def read_into(self, out: np.ndarray, shard: int, offset: int) -> None:
        """Fill `out` with the tokens from `offset` of shard `shard`: one straight copy, without the GIL."""
        out[:] = self._map(shard)[offset : offset + len(out)]

    def rows(self, shard: int, row_tokens: int) -> np.ndarray:
        """Shard `shard` as rows of `row_tokens` (its whole spans), without copying."""
        tokens = self._map(shard)
        whole = len(tokens) // row_tokens
        return tokens[: whole * row_tokens].reshape(whole, row_tokens)

    def read(self, shard: int, offset: int, count: int) -> torch.Tensor:
        return torch.from_numpy(self._map(shard)[offset : offset + count].copy())


class BatchPlan:
    """Where batch number k of this rank lies: a pure function of (seed, epoch, rank, world_size, grad_accum, k).

    Batch k of a rank is micro-batch k % grad_accum of optimizer step k // grad_accum. `block` (spans per block)
    and `window` (blocks per shuffle window) default to about a megabyte and eight of them. Memory: a few numbers
    per shard and one window's shuffle, whatever the size of the data.
    """

    def __init__(self, shard_tokens: list[int], batch_size: int, seq_len: int, rank: int, world_size: int,
                 seed: int, shuffle: bool = True, split: str = "train", block: int | None = None,
                 window: int = WINDOW_BLOCKS, grad_accum: int = 1) -> None:
        if (block is not None and block < 1) or window < 1 or grad_accum < 1:
            raise DataError(f"block ({block}), window ({window}) and grad_accum ({grad_accum}) must be at least 1")
        self.batch_size, self.seq_len = batch_size, seq_len
        self.span = batch_size * seq_len
        self.rank, self.world_size, self.seed, self.shuffle = rank, world_size, seed, shuffle
        self.grad_accum = grad_accum
        # Spans do not overlap (the last target of a batch is not the next batch's first input): 1 input-target
        # pair in span is not trained on.
        counts = np.array([tokens // self.batch_tokens for tokens in shard_tokens], dtype=np.int64)
        self._firsts = np.cumsum(counts) - counts  # span number of each shard's first span
        self.total = int(counts.sum())
        self.global_batches = world_size * grad_accum  # micro-batches of the whole world per optimizer step
        self.steps_per_epoch = self.total // self.global_batches
        if self.steps_per_epoch == 0:
            raise DataError(
                f"the {split} split holds {self.total} batches of batch_size {batch_size} x seq_len {seq_len}, "
                f"fewer than the {world_size} ranks x grad_accum {grad_accum} of one step: prepare more data or "
                "lower batch_size/seq_len"
            )
        self.per_rank = self.steps_per_epoch * grad_accum
        self.block = block or max(1, BLOCK_BYTES // (self.batch_tokens * TOKEN_BYTES))
        self.window_blocks = window
        self._whole_blocks = self.total // self.block
        self._window_spans = self.block * window
        # batches of this rank per window, at most: its buffer's size
        self.window = (self._window_spans // self.global_batches + 2) * grad_accum
        self._windows: collections.OrderedDict[tuple[int, int], np.ndarray] = collections.OrderedDict()
        self._lock = threading.Lock()

    @property
    def batch_tokens(self) -> int:
        return self.span + 1

    # -- the epoch's order -----------------------------------------------------------------------------

    def _positions(self, ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(epoch, position in the epoch's order) of this rank's batches ks."""
        steps, micro = np.divmod(ks, self.grad_accum)
        epochs, step_in_epoch = np.divmod(steps, self.steps_per_epoch)
        return epochs, step_in_epoch * self.global_batches + self.rank * self.grad_accum + micro

    def _window_order(self, epoch: int, window: int) -> np.ndarray:
        """The span numbers of one window of an epoch's order, in that order (window -1: the spans no whole block
        holds, shuffled among themselves). Windows are worked out PLANNED_WINDOWS at a time, with one set of numpy
        calls: the prefetch thread plans a window while the training loop runs, and holds the GIL while it does,
        so what costs per call is paid once per group."""
        group = window // PLANNED_WINDOWS if window >= 0 else -1
        with self._lock:
            orders = self._windows.get((epoch, group))
        if orders is None:
            orders = self._plan_group(epoch, group)
            with self._lock:
                self._windows[(epoch, group)] = orders
                while len(self._windows) > KEEP_GROUPS:
                    self._windows.popitem(last=False)
        return orders[window - group * PLANNED_WINDOWS if window >= 0 else 0]

    def _plan_group(self, epoch: int, group: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch, group + 1, 2])
        whole = self._whole_blocks * self.block
        if group < 0:
            return [whole + rng.permutation(self.total - whole)]
        first = group * PLANNED_WINDOWS * self.window_blocks
        numbers = np.arange(first, min(first + PLANNED_WINDOWS * self.window_blocks, self._whole_blocks))
        blocks = _keyed_permutation(numbers, self._whole_blocks, (self.seed, epoch))
        spans = (blocks[:, None] * self.block + np.arange(self.block)).ravel()
        size = self._window_spans
        return [part[rng.permutation(len(part))] for part in (spans[a : a + size] for a in range(0, len(spans), size))]

    def _window_of(self, position: int) -> int:
        whole = self._whole_blocks * self.block
        return position // self._window_spans if position < whole else -1

    def _spans_at(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Span numbers at these positions (ascending) of one epoch's order."""
        if not self.shuffle:
            return positions.copy()
        whole = self._whole_blocks * self.block
        first, last = self._window_of(int(positions[0])), self._window_of(int(positions[-1]))
        if first == last:  # the usual call: the rest of one window
            return self._window_order(epoch, first)[positions - (first * self._window_spans if first >= 0 else whole)]
        windows = np.where(positions < whole, positions // self._window_spans, -1)
        spans = np.empty(len(positions), dtype=np.int64)
        for window in np.unique(windows).tolist():
            here = windows == window
            start = window * self._window_spans if window >= 0 else whole
            spans[here] = self._window_order(epoch, window)[positions[here] - start]
        return spans

    def spans(self, start: int, count: int) -> np.ndarray:
        """Span numbers (positions in the split, shard after shard) of this rank's batches start .. +count-1."""
        epochs, positions = self._positions(np.arange(start, start + count, dtype=np.int64))
        if count and epochs[0] == epochs[-1]:
            return self._spans_at(int(epochs[0]), positions)
        spans = np.empty(count, dtype=np.int64)
        for epoch in np.unique(epochs).tolist():
            here = epochs == epoch
            spans[here] = self._spans_at(epoch, positions[here])
        return spans

    def locations(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard, offset) arrays of this rank's batches start .. start + count - 1."""
        return self.locations_of(self.spans(start, count))

    def locations_of(self, spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard, offset) arrays of the given span numbers."""
        shards = np.searchsorted(self._firsts, spans, side="right") - 1
        return shards, (spans - self._firsts[shards]) * self.batch_tokens

    def location(self, k: int) -> tuple[int, int]:
        shards, offsets = self.locations(k, 1)
        return int(shards[0]), int(offsets[0])

    def window_end(self, k: int) -> int:
        """The first batch number after k that lies in another shuffle window of the order (or another epoch)."""
        epoch_end = (k // self.per_rank + 1) * self.per_rank
        if not self.shuffle:
            return min(epoch_end, k + self.window)
        step, micro = divmod(k, self.grad_accum)
        position = step % self.steps_per_epoch * self.global_batches + self.rank * self.grad_accum + micro
        next_window = (position // self._window_spans + 1) * self._window_spans
        step, at = divmod(next_window, self.global_batches)
        mine = self.rank * self.grad_accum
        if at >= mine + self.grad_accum:
            step, at = step + 1, mine
        micro = max(0, at - mine)
        epoch_start = epoch_end - self.per_rank
        return min(epoch_end, epoch_start + step * self.grad_accum + micro)

    def window_reads(self, start: int) -> tuple[int, np.ndarray, Reads, list[int]]:
        """(end, spans, reads, rows) of the batches from `start` to the end of its window: rows[i] is the row of
        the buffer that reads.layout puts the i-th batch in."""
        end = self.window_end(start)
        spans = self.spans(start, end - start)
        reads = self.reads(spans)
        return end, spans, reads, np.searchsorted(reads.layout, spans).tolist()

    def reads(self, spans: np.ndarray) -> Reads:
        """How to read the given spans: one gather per shard of its spans, in file order (the layout). One call per
        shard, not one per run of adjacent spans: each copy lets go of the GIL, and each time the prefetch thread
        takes it back it may wait for the training loop's switch interval."""
        layout = np.sort(spans)
        shards, _ = self.locations_of(layout)
        cuts = np.flatnonzero(shards[1:] != shards[:-1]) + 1
        takes = [(int(shards[a]), layout[a:b] - self._firsts[shards[a]])
                 for a, b in zip(np.concatenate(([0], cuts)).tolist(), np.append(cuts, len(layout)).tolist(),
                                 strict=True) if b > a]
        return Reads(takes, layout)


@dataclass(slots=True)
class Reads:
    takes: list[tuple[int, np.ndarray]]  # (shard, its spans' numbers within it, in file order), shard by shard
    layout: np.ndarray  # the span read into each row of the buffer


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
        bt = self.plan.batch_tokens
        out, at = window.buffer.numpy(), 0
        for shard, spans in window.reads.takes:
            # One np.take per shard: a single call that copies every span without taking the GIL back, so the
            # training loop's Python work runs alongside it.
            rows = out[at : at + len(spans) * bt].reshape(len(spans), bt)
            np.take(self.reader.rows(shard, bt), spans, axis=0, out=rows, mode="clip")
            at += len(spans) * bt

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
