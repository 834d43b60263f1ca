"""A stand-in training entry point for the twin's tests of a long run's control (tests/e2e/test_budget_run.py):
it keeps the real trainer's contract with SageMaker and the control plane, but sleeps where the trainer computes,
so a run that must train for a minute costs the suite no CPU.

What it keeps of lustrain_trainer: a committed checkpoint is a step-N.json file in SM_CHECKPOINT_DIR (written
whole, then renamed: SageMaker syncs the directory to S3, and the twin's `hardware-failure` fault waits for the
first one); a job starts from the newest one there and logs `step=N resumed_from=N` once; each step logs
`step=N train_loss=...` (metric_definitions.json beside it gives SageMaker both regexes); the run's stop request
(read each second) or a SIGTERM where one arrives saves a checkpoint of the step reached and exits; the deadline
(LUSTRAIN_MAX_RUNTIME_SECONDS less LUSTRAIN_STOP_RESERVE_SECONDS: no signal reaches an entry point in SageMaker's
PyTorch images) saves it and waits for SageMaker's stop, as lustrain_trainer/stopping.py does; the model goes to
SM_MODEL_DIR at the end, however it came.

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


def stop_requested(client: list[object]) -> bool:
    """Whether the run's stop request asks to stop (a read that fails says no: it is tried again)."""
    uri = os.environ.get("LUSTRAIN_STOP_REQUEST", "")
    if not uri.startswith("s3://"):
        return False
    try:
        import boto3

        if not client:
            client.append(boto3.client("s3"))
        bucket, _, key = uri[len("s3://") :].partition("/")
        body = client[0].get_object(Bucket=bucket, Key=key)["Body"].read()  # type: ignore[attr-defined]
        return bool(json.loads(body).get("stop") is True)
    except Exception:
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--step_s", type=float, default=0.1)
    parser.add_argument("--checkpoint_interval", type=int, default=10)
    args, _ = parser.parse_known_args()
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    started = time.monotonic()
    runtime = float(os.environ.get("LUSTRAIN_MAX_RUNTIME_SECONDS") or "inf")
    deadline = started + runtime - float(os.environ.get("LUSTRAIN_STOP_RESERVE_SECONDS") or 0)
    client: list[object] = []
    looked = started

    checkpoints = Path(os.environ["SM_CHECKPOINT_DIR"])
    step = start = newest(checkpoints)
    if start:
        print(f"step={start} resumed_from={start}", flush=True)
    at_deadline = False
    while step < args.steps and not stopping:
        if time.monotonic() >= deadline:
            at_deadline = True
            break
        if time.monotonic() - looked >= 1.0:
            looked = time.monotonic()
            if stop_requested(client):
                break
        time.sleep(args.step_s)
        step += 1
        print(f"step={step} train_loss={1.0 / step:.4f}", flush=True)
        if step % args.checkpoint_interval == 0:
            save(checkpoints, step)
    if (stopping or at_deadline or step < args.steps) and step > start:
        save(checkpoints, step)
    if at_deadline:
        # the job must end Stopped at MaxRuntimeInSeconds, as SageMaker ends a deadline's job
        print(f"checkpoint step {step} saved before the deadline; waiting for SageMaker's stop", flush=True)
        time.sleep(max(0.0, started + runtime + 300 - time.monotonic()))
    model_dir = Path(os.environ["SM_MODEL_DIR"])
    model_dir.mkdir(parents=True, exist_ok=True)
    model = {"training_job_name": os.environ.get("TRAINING_JOB_NAME", ""), "step": step, "resumed_from": start}
    (model_dir / "model.json").write_text(json.dumps(model), encoding="utf-8")


if __name__ == "__main__":
    main()
