"""Benchmark of data preparation on the twin's SageMaker Processing: tokens per second per instance of the work
stage, its instances being local processes that read and write the twin's S3 through boto3.

    python bench/prepare_twin.py [--tokenizer bpe:4096] [--instances 2] [--glob '**/*.py'] [--shard-size 16MiB]

The corpus is the stdlib's source, put in the twin's S3; the run is lustrain.twin.prepare_run's (plan on 1
instance, work on N, merge on 1, as the stack would start them). Each stage's time is its job's
ProcessingStartTime to ProcessingEndTime (as SageMaker reports it), which includes the twin's start of each process
and the code's unpacking. Lines are key=value, with the cores and the load average (other work slows every figure).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from lustrain_core.config import Settings
from lustrain_core.prepare_plan import PrepareRun
from lustrain_trainer import prepare as prep
from moto import mock_aws

from lustrain.twin import patches, simulator
from lustrain.twin.prepare_run import run_on_twin


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="bpe:4096")
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--glob", default="**/*.py")
    parser.add_argument("--shard-size", type=prep.parse_size, default=16 << 20)
    args = parser.parse_args()
    for name, value in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ.setdefault(name, value)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    root = prep.stdlib_source_dir()
    corpus = [
        (path.relative_to(root).as_posix(), path.read_bytes())
        for path in sorted(root.glob(args.glob))
        if path.is_file() and "site-packages" not in path.parts
    ]
    run = PrepareRun(
        job_id="bench-prepare-twin",
        source="s3://lustrain-bench-corpus/stdlib/",
        output="s3://lustrain-bench-corpus/shards/",
        tokenizer=args.tokenizer,
        instances=args.instances,
        shard_size=args.shard_size,
    )
    settings = Settings(jobs_table="lustrain-bench-jobs", stack_name="lustrain-bench")
    print(
        f"corpus=stdlib glob={args.glob} files={len(corpus)} bytes={sum(len(b) for _, b in corpus)} "
        f"tokenizer={args.tokenizer} instances={args.instances} cpus={len(os.sched_getaffinity(0))} "
        f"loadavg_before={load()}"
    )
    patches.install()
    with tempfile.TemporaryDirectory() as tmp:
        simulator.configure(start_delay_s=0.05, work_root=Path(tmp))
        with mock_aws():
            finished = run_on_twin(run, corpus, settings)
    index = json.loads(finished.written["index.json"])
    tokens = sum(split["tokens"] for split in index["splits"].values())
    work = finished.seconds("work")
    print(" ".join(f"{stage}_seconds={finished.seconds(stage):.2f}" for stage in ("plan", "work", "merge")))
    print(
        f"tokens={tokens} work_tokens_per_s={tokens / work:,.0f} "
        f"work_tokens_per_s_per_instance={tokens / work / args.instances:,.0f} loadavg_after={load()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
