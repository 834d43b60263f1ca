"""Reading token shards for training: memory-mapped, disjoint per rank, prefetched in the background.

A batch is one contiguous slice of batch_size * seq_len + 1 tokens, so every read is a single sequential
copy (what Lustre and the page cache serve fastest). The order of those slices is shuffled per epoch with
a seed every rank shares, and rank r takes every world_size-th slice of that order, so no two ranks read
the same batch in an epoch. A background thread reads batches a few megabytes at a time into one buffer
(pinned on a GPU), so the per-batch Python work is small next to the copy itself.
"""

from __future__ import annotations

import math
import queue
import sys
import threading
from dataclasses import dataclass

import numpy as np
import torch

from .shards import DTYPE, DataError, DataIndex

GROUP_BYTES = 4 << 20
MAX_GROUP = 256


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

    def read_rows(self, out: np.ndarray, shards: list[int], offsets: list[int]) -> None:
        """Fill row j of `out` with the tokens at offsets[j] of shard shards[j].

        One straight copy per row (numpy lets go of the GIL while it copies); for batches of tens of
        kilobytes the Python per row is small next to the copy. Gathers were tried: numpy fancy indexing
        copies twice, and torch.index_select spreads a memory-bound copy over every OpenMP thread, which
        on a busy machine made the loader several times slower.
        """
        maps, count = self._maps, out.shape[1]
        for row, shard, offset in zip(out, shards, offsets, strict=True):
            row[:] = maps[shard][offset : offset + count]

    def read(self, shard: int, offset: int, count: int) -> torch.Tensor:
        return torch.from_numpy(self._maps[shard][offset : offset + count].copy())


class BatchPlan:
    """Where batch number k of this rank lies: a pure function of (seed, epoch, rank, world_size, k)."""

    def __init__(self, shard_tokens: list[int], batch_size: int, seq_len: int, rank: int, world_size: int,
                 seed: int, shuffle: bool = True, split: str = "train") -> None:
        self.batch_size, self.seq_len = batch_size, seq_len
        self.span = batch_size * seq_len
        self.rank, self.world_size, self.seed, self.shuffle = rank, world_size, seed, shuffle
        # The +1 token is the last target; it may be the first token of the next batch's slice.
        counts = [max(0, (tokens - 1) // self.span) for tokens in shard_tokens]
        self._shard_of = np.repeat(np.arange(len(counts)), counts)
        self._offset_of = np.concatenate([np.arange(n, dtype=np.int64) * self.span for n in counts])
        self.total = int(sum(counts))
        self.per_rank = self.total // world_size
        if self.per_rank == 0:
            raise DataError(
                f"the {split} split holds {self.total} batches of batch_size {batch_size} x seq_len {seq_len}, "
                f"fewer than the {world_size} ranks: prepare more data or lower batch_size/seq_len"
            )
        self._orders: dict[int, np.ndarray] = {}

    @property
    def batch_tokens(self) -> int:
        return self.span + 1

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.total)
        if epoch not in self._orders:
            self._orders = {e: o for e, o in self._orders.items() if e == epoch - 1}
            self._orders[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.total)
        return self._orders[epoch]

    def locations(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard, offset) arrays of this rank's batches start .. start + count - 1."""
        ks = np.arange(start, start + count)
        epochs, positions = np.divmod(ks, self.per_rank)
        globals_ = np.empty(count, dtype=np.int64)
        for epoch in np.unique(epochs):
            here = epochs == epoch
            globals_[here] = self._order(int(epoch))[positions[here] * self.world_size + self.rank]
        return self._shard_of[globals_], self._offset_of[globals_]

    def location(self, k: int) -> tuple[int, int]:
        shards, offsets = self.locations(k, 1)
        return int(shards[0]), int(offsets[0])


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
    """Batches start, start+1, ... read ahead on a background thread, a group of batches at a time.

    A group is a few megabytes of batches in one buffer (pinned on a GPU, so the copy to the device
    overlaps compute), handed over in one piece: the per-batch Python work stays small next to the copy.
    At least `depth` batches are kept ready.
    """

    def __init__(self, plan: BatchPlan, reader: ShardReader, start: int, depth: int, pin: bool) -> None:
        self.plan, self.reader, self.pin = plan, reader, pin
        batch_bytes = plan.batch_tokens * np.dtype(DTYPE).itemsize
        self.group = max(1, min(MAX_GROUP, GROUP_BYTES // batch_bytes))
        self._queue: queue.Queue[_Group | BaseException] = queue.Queue(maxsize=max(2, math.ceil(depth / self.group)))
        self._current: _Group | None = None
        self._next = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(start,), name="lustrain-prefetch", daemon=True)
        self._thread.start()

    def _read_group(self, start: int) -> _Group:
        shards, offsets = self.plan.locations(start, self.group)
        buffer = torch.empty((self.group, self.plan.batch_tokens), dtype=torch.uint16, pin_memory=self.pin)
        group = _Group(start, shards.tolist(), offsets.tolist(), buffer.unbind(0))
        self.reader.read_rows(buffer.numpy(), group.shards, group.offsets)
        return group

    def _run(self, k: int) -> None:
        try:
            while not self._stop.is_set():
                self._put(self._read_group(k))
                k += self.group
        except BaseException as exc:  # re-raised in the training loop, which owns the process
            self._put(exc)

    def _put(self, item: _Group | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def next(self) -> Batch:
        if self._current is None or self._next == self.group:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            self._current, self._next = item, 0
        group, j = self._current, self._next
        self._next += 1
        return Batch(group.start + j, group.shards[j], group.offsets[j], group.rows[j])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass(slots=True)
class _Group:
    start: int
    shards: list[int]
    offsets: list[int]
    rows: tuple[torch.Tensor, ...]
