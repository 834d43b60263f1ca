"""A stand-in training entry point for the twin's tests of a long run's control (tests/e2e/test_budget_run.py):
it keeps the real trainer's contract with SageMaker and the control plane, but sleeps where the trainer computes,
so a run that must train for a minute costs the suite no CPU.

What it keeps of lustrain_trainer: a committed checkpoint is a step-N.json file in SM_CHECKPOINT_DIR (written
whole, then renamed: SageMaker syncs the directory to S3, and the twin's `hardware-failure` fault waits for the
first one); a job starts from the newest one there and logs `step=N resumed_from=N` once; each step logs
`step=N train_loss=...` (metric_definitions.json beside it gives SageMaker both regexes); SIGTERM (a stop, or
MaxRuntimeInSeconds) saves a checkpoint of the step reached and ends the job cleanly, within SageMaker's grace;
the model goes to SM_MODEL_DIR at the end, however it came.

Hyperparameters: --steps (the last step), --step_s (seconds per step), --checkpoint_interval (steps).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import time
from pathlib import Path

COMMITTED = re.compile(r"^step-(\d+)\.json$")


def newest(checkpoints: Path) -> int:
    found = [int(m[1]) for p in checkpoints.glob("step-*.json") if (m := COMMITTED.match(p.name))]
    return max(found, default=0)


def save(checkpoints: Path, step: int) -> None:
    checkpoints.mkdir(parents=True, exist_ok=True)
    partial = checkpoints / f".step-{step}.json.partial"
    partial.write_text(json.dumps({"step": step, "stand_in": True}), encoding="utf-8")
    partial.rename(checkpoints / f"step-{step}.json")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--step_s", type=float, default=0.1)
    parser.add_argument("--checkpoint_interval", type=int, default=10)
    args, _ = parser.parse_known_args()
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))

    checkpoints = Path(os.environ["SM_CHECKPOINT_DIR"])
    step = start = newest(checkpoints)
    if start:
        print(f"step={start} resumed_from={start}", flush=True)
    while step < args.steps and not stopping:
        time.sleep(args.step_s)
        step += 1
        print(f"step={step} train_loss={1.0 / step:.4f}", flush=True)
        if step % args.checkpoint_interval == 0:
            save(checkpoints, step)
    if stopping and step > start:
        save(checkpoints, step)
    model_dir = Path(os.environ["SM_MODEL_DIR"])
    model_dir.mkdir(parents=True, exist_ok=True)
    model = {"training_job_name": os.environ.get("TRAINING_JOB_NAME", ""), "step": step, "resumed_from": start}
    (model_dir / "model.json").write_text(json.dumps(model), encoding="utf-8")


if __name__ == "__main__":
    main()
