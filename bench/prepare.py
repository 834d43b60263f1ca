"""Benchmark of `lustrain data prepare` on one machine: tokens per second per worker, for each tokenizer and number of
local workers, on the stdlib corpus.

    python bench/prepare.py [--tokenizers bytes,bpe:4096] [--workers 1,2] [--glob '**/*.py'] [--max-bytes SIZE]

For each tokenizer the plan stage is timed once (listing, and for bpe:VOCAB reading the sample and training the
tokenizer), then for each N the work stage in N local processes (`--stage work --worker K --workers N`, as a
Processing job's instances run it: each reads, encodes and writes its parts) and the merge. The one-worker
mb_per_s_per_worker figures are the rates of trainer/lustrain_trainer/prepare_estimate.py. Lines are key=value; the
cores this process may use and the load average (other work on the machine slows every figure) are printed too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from lustrain_trainer import prepare as prep
from lustrain_trainer import tokenizer as tok
from lustrain_trainer.shards import PLAN_LISTS_DIR, PLAN_NAME


def label(spec: str) -> str:
    return spec.replace(":", "")


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizers", default="bytes,bpe:4096", help="comma-separated --tokenizer values")
    parser.add_argument("--workers", default="1,2", help="comma-separated numbers of local workers")
    parser.add_argument("--glob", default="**/*.py")
    parser.add_argument("--max-bytes", type=prep.parse_size, default=None)
    parser.add_argument("--shard-size", type=prep.parse_size, default=16 << 20,
                        help="shard size, and so the text per part (default 16MiB: parts enough for 2 workers)")
    args = parser.parse_args()
    src = prep.store_of(prep.STDLIB)
    print(f"corpus=stdlib glob={args.glob} cpus={len(os.sched_getaffinity(0))} loadavg_before={load()}")
    for spec in args.tokenizers.split(","):
        name = label(spec)
        with tempfile.TemporaryDirectory() as tmp:
            planned = prep.store_of(Path(tmp) / "plan")
            started = time.perf_counter()
            plan = prep.plan(src, planned, args.glob, args.max_bytes, spec, shard_bytes=args.shard_size)
            plan_seconds = time.perf_counter() - started
            text = plan["source"]["bytes"]
            print(f"{name}_plan_seconds={plan_seconds:.2f} {name}_bytes={text} {name}_parts={len(plan['parts'])} "
                  f"{name}_vocab_size={plan['tokenizer']['vocab_size']}")
            for workers in (int(n) for n in args.workers.split(",")):
                out = Path(tmp) / f"out{workers}"
                out.mkdir()
                for file in (PLAN_NAME, tok.TOKENIZER_FILE):
                    if (Path(tmp) / "plan" / file).exists():
                        shutil.copy(Path(tmp) / "plan" / file, out / file)
                shutil.copytree(Path(tmp) / "plan" / PLAN_LISTS_DIR, out / PLAN_LISTS_DIR)  # the parts' lists
                target = prep.store_of(out)
                started = time.perf_counter()
                codes = prep.run_workers(src, target, workers)
                work_seconds = time.perf_counter() - started
                started = time.perf_counter()
                index = prep.merge(target)
                merge_seconds = time.perf_counter() - started
                assert codes == [0] * workers, codes
                tokens = sum(split["tokens"] for split in index["splits"].values())
                key = f"{name}_workers{workers}"
                print(f"{key}_work_seconds={work_seconds:.2f} {key}_merge_seconds={merge_seconds:.2f} "
                      f"{key}_tokens={tokens} {key}_bytes_per_token={text / tokens:.2f} "
                      f"{key}_tokens_per_s={tokens / work_seconds:.0f} "
                      f"{key}_tokens_per_s_per_worker={tokens / work_seconds / workers:.0f} "
                      f"{key}_mb_per_s_per_worker={text / work_seconds / workers / 1e6:.2f} loadavg={load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
