"""Benchmark of the trainer's data path, measured side by side in one run on the same shards and model.

(a) loader throughput: the training loader (memory-mapped shards, shuffled windows of a few blocks of adjacent
    batches, each window's batches gathered by a prefetch thread with one copy per shard) against a raw sequential read of
    the same shard files with numpy.fromfile, both from the page cache, in alternating rounds of a few
    epochs each (median of the per-round ratios). The loader's rate runs from its first batch on; the
    time to that first batch (the pipeline's start, once per training process) is printed apart;
(b) data stall: 1 - (step rate with the real loader / step rate with batches already in memory), for the
    same model and optimizer, loader and in-memory steps alternating one by one (median of the pairs).

    python bench/trainer_data.py [--data DIR] [--rounds 9] [--steps 300] [--loader-batch 16x1024]

It ends with two lines: loader_vs_raw=<ratio> and data_stall=<fraction>. Targets: >= 0.8 and <= 0.02.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from lustrain_trainer.data import Batch, BatchPlan, Prefetcher, ShardReader
from lustrain_trainer.distributed import Dist
from lustrain_trainer.hparams import Hosts, RunPaths, parse
from lustrain_trainer.prepare import prepare, stdlib_source_dir
from lustrain_trainer.shards import TOKEN_BYTES, DataIndex, read_index
from lustrain_trainer.trainer import Trainer, lr_at


def raw_read_rate(index: DataIndex) -> float:
    """Bytes per second of numpy.fromfile over every train shard, in order."""
    started, total = time.perf_counter(), 0
    for shard in index.splits["train"]:
        total += np.fromfile(shard.path, dtype=np.uint16).nbytes
    return total / (time.perf_counter() - started)


def loader_rate(plan: BatchPlan, reader: ShardReader, depth: int, epochs: int) -> tuple[float, float]:
    """Shard bytes per second the training loop receives from the loader (uint16 batches) once it runs, over
    `epochs` epochs (their boundaries included), and the seconds until the first batch.

    The loader is a pipeline started once per training process: its start (a thread, the first window read
    while nothing overlaps it) is a one-off of about a millisecond, reported apart, and left out of the rate,
    which is what the GPUs see for the hours of a run. The widening to int64 is not counted: the trainer does
    it on the device, after the copy to the GPU.
    """
    started = time.perf_counter()
    prefetch = Prefetcher(plan, reader, start=0, depth=depth, pin=False)
    try:
        prefetch.next()
        first = time.perf_counter()
        for _ in range(plan.per_rank * epochs - 1):
            prefetch.next()
        ended = time.perf_counter()
    finally:
        prefetch.close()
    return (plan.per_rank * epochs - 1) * plan.batch_tokens * TOKEN_BYTES / (ended - first), first - started


def timed_step(trainer: Trainer, step: int, next_batch: Callable[[], Batch]) -> tuple[float, float]:
    """Seconds of one training step, and of that the seconds spent waiting for its batches."""
    waited = 0.0

    def fetch() -> Batch:
        nonlocal waited
        started = time.perf_counter()
        batch = next_batch()
        waited += time.perf_counter() - started
        return batch

    started = time.perf_counter()
    trainer.train_step(step, lr_at(step, trainer.hp), fetch)
    return time.perf_counter() - started, waited


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="prepared shards (default: prepare the stdlib's *.py now)")
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds of (a)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs of the shards per round of (a)")
    parser.add_argument("--steps", type=int, default=300, help="pairs of training steps for (b)")
    parser.add_argument("--loader-batch", default="16x1024",
                        help="batch_size x seq_len for (a): the 85m preset's, the smallest p4d shape")
    args = parser.parse_args(argv)
    batch_size, seq_len = (int(v) for v in args.loader_batch.lower().split("x"))

    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            data = Path(tmp) / "data"
            started = time.perf_counter()
            # 16 MiB shards so the reads cross shard files as they do on a real data set.
            prepare(stdlib_source_dir(), data, "**/*.py", shard_tokens=8 << 20, source_label="stdlib")
            print(f"prepared the stdlib's *.py into {data} in {time.perf_counter() - started:.1f}s")
        index = read_index(data)
        shard_bytes = index.tokens("train") * TOKEN_BYTES
        print(f"shards: {len(index.splits['train'])} train files, {shard_bytes / 2**20:.1f} MiB")

        # (a) loader throughput against a raw sequential read
        plan = BatchPlan([s.tokens for s in index.splits["train"]], batch_size, seq_len, 0, 1, seed=1)
        reader = ShardReader(index, "train")
        # One unmeasured round of each warms the page cache, the memory maps and the allocator.
        raw_read_rate(index)
        loader_rate(plan, reader, depth=4, epochs=1)
        raw, loader, first = [], [], []
        for _ in range(args.rounds):
            raw.append(statistics.mean(raw_read_rate(index) for _ in range(args.epochs)))
            rate, first_s = loader_rate(plan, reader, depth=4, epochs=args.epochs)
            loader.append(rate)
            first.append(first_s)
        ratios = [lo / ra for lo, ra in zip(loader, raw, strict=True)]
        print(f"(a) batches of {batch_size}x{seq_len}+1 tokens, {plan.per_rank} per epoch, {args.rounds} rounds")
        print(f"    raw numpy.fromfile  median {statistics.median(raw) / 1e9:6.2f} GB/s "
              f"(min {min(raw) / 1e9:.2f}, max {max(raw) / 1e9:.2f})")
        print(f"    training loader     median {statistics.median(loader) / 1e9:6.2f} GB/s "
              f"(min {min(loader) / 1e9:.2f}, max {max(loader) / 1e9:.2f}), {args.epochs} epochs a round; "
              f"first batch after {statistics.median(first) * 1e3:.2f} ms (median)")

        # (b) data stall of the tiny preset's training step: loader and in-memory steps alternate one by one,
        # so both see the same moment of a shared machine; the median of the pairs resists outliers.
        hp, _, _ = parse(["--preset", "tiny"], {})
        paths = RunPaths(data=data, checkpoints=Path(tmp) / "ckpt", model=Path(tmp) / "model",
                         output=Path(tmp) / "out")
        trainer = Trainer(hp, paths, Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu")),
                          Hosts(hosts=(), current="bench"), index)
        tplan, treader = trainer.train_plan(), ShardReader(index, "train")
        in_memory = [Batch(k, *tplan.location(k), treader.read(*tplan.location(k), tplan.batch_tokens))
                     for k in range(64)]
        cycle = itertools.cycle(in_memory)
        prefetch = Prefetcher(tplan, treader, start=0, depth=hp.prefetch, pin=False)
        ratios_b, waits, loader_time = [], 0.0, 0.0
        try:
            for step in range(1, 11):  # warm-up: allocator, optimizer state, the prefetch queue
                timed_step(trainer, step, prefetch.next)
                timed_step(trainer, step, lambda: next(cycle))
            for step in range(11, 11 + args.steps):
                with_loader, waited = timed_step(trainer, step, prefetch.next)
                from_memory, _ = timed_step(trainer, step, lambda: next(cycle))
                ratios_b.append(from_memory / with_loader)
                waits += waited
                loader_time += with_loader
        finally:
            prefetch.close()
        stall = 1 - statistics.median(ratios_b)
        print(f"(b) tiny preset ({trainer.parameters:,} parameters, batch {hp.batch_size}x{hp.seq_len}, "
              f"{torch.get_num_threads()} compute thread), {args.steps} alternating pairs of steps")
        print(f"    step {loader_time / args.steps * 1e3:.1f} ms with the loader; "
              f"1 - median(in-memory / loader step time) = {stall:+.4f}; "
              f"time blocked waiting for batches: {waits / loader_time:.4%} of loader steps")

    print(f"loader_vs_raw={statistics.median(ratios):.3f}")
    print(f"data_stall={max(0.0, stall):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
