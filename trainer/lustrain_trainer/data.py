"""Reading token shards for training: memory-mapped, disjoint per rank, prefetched in the background.

A batch is one contiguous span of batch_size * seq_len + 1 tokens; spans do not overlap. An epoch's order is the
same for every world size with the same global batch:

- the split's spans are cut into blocks of adjacent spans (about a megabyte); the blocks are put in an order
  shuffled per epoch by a keyed permutation computed index by index (a Feistel network, cycle-walked onto the
  number of blocks), so no array grows with the data: the plan holds a few numbers per shard;
- that order is cut into G equal streams, G = world_size * grad_accum (the micro-batches of one optimizer step):
  step s takes the s-th batch of every stream, so a global batch comes from G places far apart in the data, and
  rank r's micro-batch m reads stream r * grad_accum + m. Within windows of a few blocks a stream's batches are
  shuffled again. A run resumed on another world size with the same G (grad_accum absorbing the change) reads,
  from the saved step on, exactly what the first run would have read: within an epoch no span is seen twice or
  skipped.

A background thread copies a window's spans of this rank (a few whole blocks of each of its streams) with one
np.take per shard (a single call without the GIL) into one buffer (pinned on a GPU). It works out the next window
while the training loop waits and hands a window over in one piece; the loop turns it into batches, views of the
buffer, while the thread copies the next.
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

from .shards import TOKEN_BYTES, DataError, DataIndex, check_shard

BLOCK_BYTES = 1 << 20
WINDOW_BLOCKS = 8
KEEP_BUFFERS = 8
#: shards mapped at once by a reader: a 20 TB data set has tens of thousands, and the kernel allows a process
#: about 65,000 mappings (vm.max_map_count)
OPEN_MAPS = 512
#: how each shard dtype is held in memory: uint32 ids are read as int32 (the same bits for every id below 2**31,
#: far beyond any vocabulary), a type every torch kernel and device handles, where uint32 is barely supported
MEMORY_DTYPES = {"<u2": (np.uint16, torch.uint16), "<u4": (np.int32, torch.int32)}
#: windows of a stream whose order a plan works out at once, and the groups of them it keeps per stream (the
#: prefetch thread plans one window ahead of the loop; an evaluation or a resume may look elsewhere)
PLANNED_WINDOWS = 16
KEEP_WINDOWS = 2
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


@functools.lru_cache(maxsize=4)
def _tail_order(seed: int, epoch: int, length: int) -> np.ndarray:
    """The order of the spans no whole block holds (fewer than a block's)."""
    return np.random.default_rng([seed, epoch, 1 << 20, 3]).permutation(length)


class ShardReader:
    """Memory maps of one split's shards, opened on first use (at most OPEN_MAPS at once, the least recently used
    closed first): pages are read on demand and shared by all ranks on a host.

    Tokens stay uint16 (or 32 bits, when the vocabulary needs them: the index's dtype) until they reach the device:
    a quarter (a half) of the bytes of int64 to copy and, on a GPU, to send over PCIe; the widening to int64 happens
    on the device.
    """

    def __init__(self, index: DataIndex, split: str, open_maps: int = OPEN_MAPS) -> None:
        if sys.byteorder != "little":
            raise DataError(f"shards are little-endian {index.dtype}; this machine is {sys.byteorder}-endian")
        if index.dtype not in MEMORY_DTYPES:
            raise DataError(f"shard dtype {index.dtype!r} is not one of {' '.join(MEMORY_DTYPES)}")
        self.shards = index.splits.get(split, [])
        self._token_bytes = index.token_bytes
        self.np_dtype, self.torch_dtype = MEMORY_DTYPES[index.dtype]
        self._open_maps = open_maps
        self._maps: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.buffers = _Buffers(keep=KEEP_BUFFERS, np_dtype=self.np_dtype, torch_dtype=self.torch_dtype)

    def _map(self, shard: int) -> np.ndarray:
        with self._lock:
            tokens = self._maps.get(shard)
            if tokens is None:
                # shared=False maps the file copy-on-write; nothing here writes, so no page is ever copied. (A
                # torch mapping rather than np.memmap: that one keeps a file descriptor open per shard.)
                info = self.shards[shard]
                check_shard(info, self._token_bytes)  # the one metadata call of a shard, made as it is opened
                tokens = torch.from_file(str(info.path), shared=False, size=info.tokens,
                                        dtype=self.torch_dtype).numpy()
                self._maps[shard] = tokens
                while len(self._maps) > self._open_maps:
                    self._maps.popitem(last=False)  # unmapped once no batch refers to it any more
            else:
                self._maps.move_to_end(shard)
            return tokens

    def rows(self, shard: int, row_tokens: int) -> np.ndarray:
        """Shard `shard` as rows of `row_tokens` (its whole spans), without copying."""
        tokens = self._map(shard)
        whole = len(tokens) // row_tokens
        return tokens[: whole * row_tokens].reshape(whole, row_tokens)

    def read(self, shard: int, offset: int, count: int) -> torch.Tensor:
        return torch.from_numpy(self._map(shard)[offset : offset + count].copy())


class BatchPlan:
    """Where batch number k of this rank lies: a pure function of (seed, epoch, rank, world_size, grad_accum, k).

    Batch k of a rank is micro-batch m = k % grad_accum of optimizer step s = k // grad_accum, and reads the s-th
    batch of stream r * grad_accum + m of the G = world_size * grad_accum streams. Stream j is the j-th of G equal
    runs of the epoch's shuffled blocks, shuffled again within windows of `window` blocks: each step's global batch
    comes from G places far apart in the data, and a rank reads a few whole blocks per stream and window. The
    streams depend on G alone, so a run resumed on another world size with the same G reads the same batches.
    `block` (spans per block) and `window` default to about a megabyte and eight of them. Memory: a few numbers
    per shard and the windows being read, whatever the size of the data.
    """

    def __init__(self, shard_tokens: list[int], batch_size: int, seq_len: int, rank: int, world_size: int,
                 seed: int, shuffle: bool = True, split: str = "train", block: int | None = None,
                 window: int = WINDOW_BLOCKS, grad_accum: int = 1, token_bytes: int = TOKEN_BYTES) -> None:
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
        self.global_batches = world_size * grad_accum  # micro-batches of the whole world per optimizer step: streams
        self.steps_per_epoch = self.total // self.global_batches  # each stream's length
        if self.steps_per_epoch == 0:
            raise DataError(
                f"the {split} split holds {self.total} batches of batch_size {batch_size} x seq_len {seq_len}, "
                f"fewer than the {world_size} ranks x grad_accum {grad_accum} of one step: prepare more data or "
                "lower batch_size/seq_len"
            )
        self.per_rank = self.steps_per_epoch * grad_accum
        # about BLOCK_BYTES of the shards a block, whatever their token width (uint16 or uint32: the index's dtype)
        self.block = block or max(1, BLOCK_BYTES // (self.batch_tokens * token_bytes))
        self.window_blocks = window
        self._whole_blocks = self.total // self.block
        self._window_steps = self.block * window  # a stream's batches per shuffle window
        # this rank's batches per window (one window of each of its streams): its buffer's size
        self.window = self._window_steps * grad_accum
        self._windows: collections.OrderedDict[tuple[int, int, int], list[np.ndarray]] = collections.OrderedDict()
        self._keep = KEEP_WINDOWS * grad_accum
        self._lock = threading.Lock()

    @property
    def batch_tokens(self) -> int:
        return self.span + 1

    # -- the epoch's order -----------------------------------------------------------------------------

    def _sequence(self, epoch: int, q: np.ndarray) -> np.ndarray:
        """Span numbers at positions q of the epoch's block order: whole blocks in a keyed permuted order, then the
        spans no whole block holds, shuffled among themselves."""
        whole = self._whole_blocks * self.block
        spans = np.empty(len(q), dtype=np.int64)
        inside = q < whole
        blocks = _keyed_permutation(q[inside] // self.block, self._whole_blocks, (self.seed, epoch))
        spans[inside] = blocks * self.block + q[inside] % self.block
        if not inside.all():
            tail = _tail_order(self.seed, epoch, self.total - whole)
            spans[~inside] = whole + tail[q[~inside] - whole]
        return spans

    def _window_order(self, epoch: int, stream: int, window: int) -> np.ndarray:
        """The span numbers of one shuffle window of one stream, in their shuffled order. Windows are worked out
        PLANNED_WINDOWS at a time with one set of numpy calls: the prefetch thread plans a window while the training
        loop runs, and holds the GIL while it does, so what costs per call is paid once per group."""
        group, index = divmod(window, PLANNED_WINDOWS)
        key = (epoch, stream, group)
        with self._lock:
            orders = self._windows.get(key)
        if orders is None:
            first = group * PLANNED_WINDOWS * self._window_steps
            length = min(PLANNED_WINDOWS * self._window_steps, self.steps_per_epoch - first)
            order = self._sequence(epoch, stream * self.steps_per_epoch + first + np.arange(length))
            parts = [order[a : a + self._window_steps] for a in range(0, length, self._window_steps)]
            if self.shuffle:
                rng = np.random.default_rng([self.seed, epoch, stream, group, 3])
                parts = [part[rng.permutation(len(part))] for part in parts]
            orders = parts
            with self._lock:
                self._windows[key] = orders
                while len(self._windows) > self._keep:
                    self._windows.popitem(last=False)
        return orders[index]

    def spans(self, start: int, count: int) -> np.ndarray:
        """Span numbers (positions in the split, shard after shard) of this rank's batches start .. +count-1."""
        ks = np.arange(start, start + count, dtype=np.int64)
        steps, micro = np.divmod(ks, self.grad_accum)
        epochs, at = np.divmod(steps, self.steps_per_epoch)
        streams = self.rank * self.grad_accum + micro
        if not self.shuffle:  # the streams in plain order: stream j's i-th batch is span j * length + i
            return streams * self.steps_per_epoch + at
        windows, within = np.divmod(at, self._window_steps)
        first, last = int(steps[0]), int(steps[-1])
        if (self.grad_accum == 1 and first // self.steps_per_epoch == last // self.steps_per_epoch
                and int(windows[0]) == int(windows[-1])):  # the usual call: the rest of one window
            return self._window_order(int(epochs[0]), int(streams[0]), int(windows[0]))[within]
        spans = np.empty(count, dtype=np.int64)
        keys = (epochs * self.global_batches + streams) * (self.steps_per_epoch // self._window_steps + 1) + windows
        for key in np.unique(keys).tolist():
            here = keys == key
            at_first = int(np.argmax(here))
            order = self._window_order(int(epochs[at_first]), int(streams[at_first]), int(windows[at_first]))
            spans[here] = order[within[here]]
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
        """The first batch number after k in another shuffle window of this rank's streams (or another epoch)."""
        step = k // self.grad_accum
        epoch, at = divmod(step, self.steps_per_epoch)
        end = min(self.steps_per_epoch, (at // self._window_steps + 1) * self._window_steps)
        return (epoch * self.steps_per_epoch + end) * self.grad_accum

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
        # a window holds grad_accum streams' worth: fewer of them are kept for reuse
        reader.buffers.keep = max(2, KEEP_BUFFERS // plan.grad_accum)
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

    def __init__(self, keep: int, np_dtype: type[np.generic] = np.uint16,
                 torch_dtype: torch.dtype = torch.uint16) -> None:
        self.keep = keep
        self.np_dtype, self.torch_dtype = np_dtype, torch_dtype
        self._free: collections.deque[np.ndarray] = collections.deque()

    def take(self, tokens: int, capacity: int, pin: bool) -> torch.Tensor:
        """A buffer of `tokens`; a new one on the CPU holds `capacity`, so that it fits any window after."""
        if pin:
            return torch.empty(tokens, dtype=self.torch_dtype, pin_memory=True)
        memory = self._free.pop() if self._free else np.empty(0, dtype=self.np_dtype)
        if len(memory) < tokens:
            memory = np.empty(max(tokens, capacity), dtype=self.np_dtype)
        # The tensor (and every view of it) keeps `part` alive; when the last one goes, so does `part`.
        part = memory[:tokens]
        weakref.finalize(part, self._give_back, memory)
        return torch.from_numpy(part)

    def _give_back(self, memory: np.ndarray) -> None:
        if len(self._free) < self.keep:
            self._free.append(memory)
