"""A stand-in training entry point for the twin's fault, duplicate and load tests: no torch, done in milliseconds.

It keeps SageMaker's contract the way the real trainer does: reads the Lustre channel (SM_CHANNEL_TRAINING),
writes the model under SM_MODEL_DIR, and prints one metric line. The model names the training job, so a test
can tell which run's archive holds which job's model. `--sleep_s N` (a hyperparameter) keeps it busy for N
seconds first, for a run that must still be training when something stops it; `--hold_until PATH` keeps it busy
until the file PATH exists (the fault matrix releases it once what it did to the run has been handled), on the
host the twin runs it on. While it waits it reads the run's stop request (LUSTRAIN_STOP_REQUEST, with the job's
role, as lustrain's trainer does): asked, it writes its model and exits 0, as a trainer that saves when asked.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


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
        return json.loads(body).get("stop") is True
    except Exception:
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sleep_s", type=float, default=0.0)
    parser.add_argument("--hold_until", default="")
    args, _ = parser.parse_known_args()
    client: list[object] = []
    until = time.monotonic() + args.sleep_s
    while time.monotonic() < until or (args.hold_until and not Path(args.hold_until).exists()):
        if stop_requested(client):
            break
        time.sleep(0.2)
    channel = Path(os.environ["SM_CHANNEL_TRAINING"])
    files = sorted(p for p in channel.rglob("*") if p.is_file())
    model_dir = Path(os.environ["SM_MODEL_DIR"])
    model_dir.mkdir(parents=True, exist_ok=True)
    model = {
        "training_job_name": os.environ.get("TRAINING_JOB_NAME", ""),
        "files_read": len(files),
        "bytes_read": sum(p.stat().st_size for p in files),
    }
    (model_dir / "model.pt").write_text(json.dumps(model), encoding="utf-8")
    print("step=1 train_loss=1.0 tokens_per_s=1", flush=True)


if __name__ == "__main__":
    main()
