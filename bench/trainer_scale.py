"""Benchmark of the trainer at scale, on this machine's CPU over 2 ranks (torchrun, FSDP over gloo), with a model of
the 680m preset's width and depth (a short sequence and micro-batch so that a step takes seconds; about 12 GiB in
all for the 2 ranks and their checkpoints):

- init_peak_rss_ratio: the peak resident memory of one rank (its whole process) once the model is built, over the
  full fp32 model's bytes. Built on meta and sharded, a rank materialises half the model (goal <= 0.65); a trainer
  that builds the whole model first is at 1 or more;
- ckpt_blocking_s: the time training waits for one sharded asynchronous checkpoint (the copy of each rank's state
  to host memory; the slower rank's), against ckpt_full_save_s, a full-state save of the same state (gathered to
  rank 0 and written there, as the trainer did before); ckpt_blocking_ratio is their ratio (goal <= 0.2), the
  median of 3 rounds, measured side by side in one run;
- sigterm_to_saved_s: train.py under torchrun (2 ranks, the same model), SIGTERM to torchrun mid-training, to the
  moment the stop's checkpoint is committed (goal <= 60); sigterm_exit_code: the trainers' (0 when every rank saved
  and returned; torchrun itself exits 1 after any signal, torchrun_exit_code);
- plan_mb_20tb: the batch plan's memory (tracemalloc's peak) over an index of 20 TB of 256 MiB shards, 400 ranks,
  planning windows at the start, the middle and the end of an epoch (goal <= 64);
- resume_world_size_ok: a run on 2 ranks stopped, continued on 1, then on 2 again reads exactly the spans, and
  counts the tokens, of an uninterrupted run on 2 (yes | no);
- loader_vs_raw and data_stall: bench/trainer_data.py's figures.

    python bench/trainer_scale.py [--preset 680m] [--seq_len 64] [--skip-data]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "trainer"
sys.path.insert(0, str(TRAINER))

MICRO = ["--n_layer", "1", "--n_head", "2", "--n_embd", "32", "--seq_len", "32", "--batch_size", "4",
         "--eval_interval", "0", "--log_interval", "1"]


def model_args(preset: str, seq_len: int) -> list[str]:
    return ["--preset", preset, "--seq_len", str(seq_len), "--batch_size", "1", "--fsdp", "true",
            "--activation_checkpointing", "false", "--precision", "fp32"]


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- inside torchrun: build, checkpoint, full save ------------------------------------------------------------------


def worker(preset: str, seq_len: int, out: Path, rounds: int) -> int:
    import torch
    import torch.distributed as dist
    from lustrain_trainer import checkpoint, distributed
    from lustrain_trainer.hparams import parse
    from lustrain_trainer.trainer import build_model, make_optimizer
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    torch.set_num_threads(1)
    info = distributed.init(timeout_s=1800)
    hp, _, _ = parse(model_args(preset, seq_len), {})
    full_bytes = 4 * hp.model_config().parameter_count()
    before = rss_bytes()
    model = build_model(hp, info, True, info.world_size, False)
    built = rss_bytes()
    optimizer = make_optimizer(model, hp, info.device, sharded=True)
    tokens = torch.randint(0, hp.model_config().vocab_size, (1, seq_len + 1))
    model(tokens[:, :-1], tokens[:, 1:]).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    def slowest(seconds: float) -> float:
        box = torch.tensor([seconds])
        dist.all_reduce(box, op=dist.ReduceOp.MAX)
        return float(box.item())

    directory = out.parent / "ckpt"
    saver = checkpoint.Checkpointer(directory, info.rank, info.world_size, keep=1, log=lambda _: None)
    blocking, written, full = [], [], []
    for n in range(rounds):
        dist.barrier()
        started = time.monotonic()
        model_state, optim_state = get_state_dict(model, optimizer)
        saver.save(n + 1, {"model": model_state, "optimizer": optim_state}, {"run": None, "model_config": {}},
                   "bench", "bench")
        blocking.append(slowest(time.monotonic() - started))
        saver.wait()
        written.append(slowest(time.monotonic() - started))
        del model_state, optim_state

        dist.barrier()
        started = time.monotonic()
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state, optim_state = get_state_dict(model, optimizer, options=options)
        if info.is_main:
            checkpoint.save_atomic({"model": model_state, "optimizer": optim_state}, out.parent / "full.pt")
        del model_state, optim_state
        dist.barrier()
        full.append(slowest(time.monotonic() - started))
        (out.parent / "full.pt").unlink(missing_ok=True)
    peak = slowest(float(built))
    if info.is_main:
        out.write_text(json.dumps({
            "parameters": full_bytes // 4, "full_bytes": full_bytes, "rss_before_build": before, "rss_built": peak,
            "blocking": blocking, "written": written, "full": full,
            "checkpoint_bytes": sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()),
        }))
    distributed.shutdown(info)
    return 0


# -- outside: the figures ------------------------------------------------------------------------------------------


def torchrun(ranks: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]


def sm_env(root: Path, data: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "LUSTRAIN_"))}
    env.update({"PYTHONUNBUFFERED": "1", "SM_TRAINING_ENV": "{}", "SM_CHANNEL_TRAINING": str(data),
                "SM_MODEL_DIR": str(root / "model"), "SM_OUTPUT_DATA_DIR": str(root / "output"),
                "SM_CHECKPOINT_DIR": str(root / "checkpoints"), "SM_HOSTS": '["algo-1"]',
                "SM_CURRENT_HOST": "algo-1",
                # what lustrain puts in the training job's environment (steps/training.py): torchrun (torch >= 2.12)
                # gives its workers 110 s to save on a stop, not 30
                "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "110", **extra})
    return env


def sigterm_to_saved(preset: str, seq_len: int, data: Path, root: Path) -> dict[str, Any]:
    """SIGTERM to torchrun once the second step is logged; seconds to the stop's committed checkpoint."""
    args = [*model_args(preset, seq_len), "--max_steps", "100000", "--checkpoint_interval", "100000",
            "--log_interval", "1", "--eval_interval", "0", "--cpu_threads", "1"]
    process = subprocess.Popen([*torchrun(2), "train.py", *args], cwd=TRAINER, env=sm_env(root, data), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    sent = saved = None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if sent is None and line.startswith("step=2 "):
            process.send_signal(signal.SIGTERM)
            sent = time.monotonic()
        if sent is not None and "checkpoint saved" in line and "stop requested by SIGTERM" in line:
            saved = time.monotonic()
    code = process.wait(timeout=300)
    summary_file = root / "output" / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    if sent is None or saved is None:
        sys.stderr.write("".join(lines[-40:]))
    return {"sigterm_to_saved_s": round(saved - sent, 2) if sent and saved else -1,
            "sigterm_exit_code": 0 if summary.get("status") == "interrupted" else 1,
            "torchrun_exit_code": code}


def plan_mb_20tb() -> float:
    from lustrain_trainer.data import BatchPlan

    shard_tokens = (256 << 20) // 2
    shards = [shard_tokens] * int(20e12 // (256 << 20))
    tracemalloc.start()
    plan = BatchPlan(shards, 8, 4096, 3, 400, 1337, grad_accum=2)
    for k in (0, plan.per_rank // 2, plan.per_rank - 1, plan.per_rank + 5):
        plan.window_reads(k)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def trace(directory: Path, ranks: int) -> list[str]:
    return sorted(" ".join(line.split()[1:]) for rank in range(ranks)
                  for line in (directory / f"rank-{rank}.txt").read_text().splitlines())


def resume_world_size_ok(data: Path, root: Path) -> bool:
    args = [*MICRO, "--checkpoint_interval", "3"]
    straight, moved = root / "straight", root / "moved"
    done = subprocess.run([*torchrun(2), "train.py", *args, "--max_steps", "9"], cwd=TRAINER, capture_output=True,
                          env=sm_env(straight, data, LUSTRAIN_DATA_TRACE=str(straight / "trace")), timeout=300)
    ok = done.returncode == 0
    for ranks, steps in ((2, "3"), (1, "6"), (2, "9")):
        done = subprocess.run([*torchrun(ranks), "train.py", *args, "--max_steps", steps], cwd=TRAINER,
                              env=sm_env(moved, data, LUSTRAIN_DATA_TRACE=str(moved / "trace")),
                              capture_output=True, timeout=300)
        ok = ok and done.returncode == 0
    if not ok:
        return False
    summaries = [json.loads((r / "output" / "summary.json").read_text()) for r in (straight, moved)]
    return (trace(straight / "trace", 2) == trace(moved / "trace", 2)
            and summaries[0]["tokens_seen"] == summaries[1]["tokens_seen"]
            and (summaries[1]["resumed_from_step"], summaries[1]["step"]) == (6, 9))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="680m")
    parser.add_argument("--seq_len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-data", action="store_true", help="leave out bench/trainer_data.py's figures")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.preset, args.seq_len, args.worker, args.rounds)

    from lustrain_trainer.prepare import prepare, stdlib_source_dir

    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        out = root / "worker" / "result.json"
        out.parent.mkdir()
        started = time.monotonic()
        subprocess.run([*torchrun(2), __file__, "--worker", str(out), "--preset", args.preset,
                        "--seq_len", str(args.seq_len), "--rounds", str(args.rounds)], check=True, cwd=ROOT)
        result = json.loads(out.read_text())
        shutil.rmtree(out.parent / "ckpt", ignore_errors=True)
        print(f"model: {result['parameters']:,} parameters ({result['full_bytes'] / 2**30:.2f} GiB in fp32), "
              f"checkpoint {result['checkpoint_bytes'] / 2**30:.2f} GiB; {time.monotonic() - started:.0f}s")
        blocking, full = statistics.median(result["blocking"]), statistics.median(result["full"])
        figures["init_peak_rss_ratio"] = round(result["rss_built"] / result["full_bytes"], 3)
        figures["ckpt_blocking_s"] = round(blocking, 3)
        figures["ckpt_written_s"] = round(statistics.median(result["written"]), 3)
        figures["ckpt_full_save_s"] = round(full, 3)
        figures["ckpt_blocking_ratio"] = round(blocking / full, 3)

        data = root / "data"
        prepare(stdlib_source_dir(), data, "**/*.py", shard_tokens=8 << 20, source_label="stdlib")
        figures.update(sigterm_to_saved(args.preset, args.seq_len, data, root / "stop"))
        figures["plan_mb_20tb"] = round(plan_mb_20tb(), 2)
        figures["resume_world_size_ok"] = "yes" if resume_world_size_ok(data, root / "resume") else "no"
    if not args.skip_data:
        done = subprocess.run([sys.executable, str(ROOT / "bench" / "trainer_data.py")], capture_output=True,
                              text=True, check=True)
        for key in ("loader_vs_raw", "data_stall"):
            figures[key] = re.search(rf"^{key}=(\S+)$", done.stdout, re.MULTILINE).group(1)  # type: ignore[union-attr]
    for key, value in figures.items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
