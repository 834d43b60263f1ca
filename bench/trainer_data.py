"""Benchmark of the trainer's data path, measured side by side in one run on the same shards and model.

(a) loader throughput: the training loader (memory-mapped shards, shuffled contiguous batches, a prefetch
    thread, tensors ready for the model) against a raw sequential read of the same shard files with
    numpy.fromfile, both from the page cache, in alternating rounds;
(b) data stall: 1 - (step rate with the real loader / step rate with batches already in memory), for the
    same model and optimizer, in alternating rounds (pairs cancel the drift of a shared machine).

    python bench/trainer_data.py [--data DIR] [--rounds 7]

It ends with two lines: loader_vs_raw=<ratio> and data_stall=<fraction>. Targets: >= 0.8 and <= 0.02.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
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


def loader_rate(plan: BatchPlan, reader: ShardReader, depth: int) -> float:
    """Shard bytes per second the training loop receives, as model-ready tensors, over one epoch."""
    started = time.perf_counter()
    prefetch = Prefetcher(plan, reader, start=0, depth=depth, pin=False)
    try:
        for _ in range(plan.per_rank):
            prefetch.next().inputs_targets(torch.device("cpu"), plan.batch_size, plan.seq_len)
    finally:
        prefetch.close()
    return plan.per_rank * plan.batch_tokens * TOKEN_BYTES / (time.perf_counter() - started)


def step_rate(trainer: Trainer, steps: int, next_batch: object, first_step: int) -> float:
    started = time.perf_counter()
    for step in range(first_step, first_step + steps):
        trainer.train_step(step, lr_at(step, trainer.hp), next_batch)  # type: ignore[arg-type]
    return steps / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="prepared shards (default: prepare the stdlib's *.py now)")
    parser.add_argument("--rounds", type=int, default=7, help="alternating measurement rounds per figure")
    parser.add_argument("--steps", type=int, default=30, help="training steps per round for (b)")
    parser.add_argument("--loader-batch", default="16x1024",
                        help="batch_size x seq_len for (a): the 125m preset's, the smallest p4d shape")
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
        raw_read_rate(index), loader_rate(plan, reader, depth=4)  # warm the page cache and the allocator
        raw, loader = [], []
        for _ in range(args.rounds):
            raw.append(raw_read_rate(index))
            loader.append(loader_rate(plan, reader, depth=4))
        ratios = [lo / ra for lo, ra in zip(loader, raw, strict=True)]
        print(f"(a) batches of {batch_size}x{seq_len}+1 tokens, {plan.per_rank} per epoch, {args.rounds} rounds")
        print(f"    raw numpy.fromfile  median {statistics.median(raw) / 1e9:6.2f} GB/s "
              f"(min {min(raw) / 1e9:.2f}, max {max(raw) / 1e9:.2f})")
        print(f"    training loader     median {statistics.median(loader) / 1e9:6.2f} GB/s "
              f"(min {min(loader) / 1e9:.2f}, max {max(loader) / 1e9:.2f})")

        # (b) data stall of the tiny preset's training step
        hp, _, _ = parse(["--preset", "tiny"], {})
        paths = RunPaths(data=data, checkpoints=Path(tmp) / "ckpt", model=Path(tmp) / "model",
                         output=Path(tmp) / "out")
        trainer = Trainer(hp, paths, Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu")),
                          Hosts(hosts=(), current="bench"), index)
        tplan, treader = trainer.train_plan, trainer.train_reader
        in_memory = [Batch(k, *tplan.location(k), treader.read(*tplan.location(k), tplan.batch_tokens))
                     for k in range(64)]
        cycle = itertools.cycle(in_memory)
        prefetch = Prefetcher(tplan, treader, start=0, depth=hp.prefetch, pin=False)
        try:
            step_rate(trainer, 10, prefetch.next, 1)
            step_rate(trainer, 10, lambda: next(cycle), 1)
            pairs = []
            for r in range(args.rounds):
                first = 11 + r * args.steps
                with_loader = step_rate(trainer, args.steps, prefetch.next, first)
                from_memory = step_rate(trainer, args.steps, lambda: next(cycle), first)
                pairs.append((with_loader, from_memory))
        finally:
            prefetch.close()
        stalls = [1 - lo / mem for lo, mem in pairs]
        print(f"(b) tiny preset ({trainer.parameters:,} parameters, batch {hp.batch_size}x{hp.seq_len}, "
              f"{torch.get_num_threads()} compute thread), {args.rounds} rounds of {args.steps} steps each way")
        print(f"    steps/s with loader median {statistics.median(p[0] for p in pairs):.2f}, "
              f"from memory median {statistics.median(p[1] for p in pairs):.2f}; "
              f"stall per round {', '.join(f'{s:+.3f}' for s in stalls)}")

    print(f"loader_vs_raw={statistics.median(ratios):.3f}")
    print(f"data_stall={max(0.0, statistics.median(stalls)):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
