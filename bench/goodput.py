"""Benchmark of what a stop costs a run, on this machine's CPU: train.py under torchrun (2 ranks, FSDP over gloo, a
model of about 7M parameters, whose shards outweigh what a load reads besides them), stopped the two ways
SageMaker's PyTorch image allows (its first process passes no SIGTERM on to the entry point:
lustrain_trainer/stopping.py):

- stop_request_to_saved_s: the run's stop request written (the stack's cancel; here a file, polled every
  --poll_s) to the stop's checkpoint committed, every rank at the same step;
- steps_lost_at_cancel: the last step the run logged less the step its stop's checkpoint holds (goal 0);
- stop_exit_code: the trainers' exit (0: saved and returned, so the job ends Completed);
- resume_read_ratio: the run stopped by its request, resumed on the same 2 ranks: the bytes the busiest rank read
  to load its checkpoint (the stored bytes of each item its load plan reads, counted by the trainer's DCP reader) over its own shards' bytes (goal <= 1.1: each rank reads its own share,
  where SageMaker's checkpoint sync copies every kept checkpoint to every host);
- steps_lost_at_kill: the same run killed without a request, as a StopTrainingJob alone ends it in SageMaker's
  PyTorch image (SIGKILL at the end of the grace): the steps since its last committed checkpoint, with
  checkpoint_interval 20 steps.

    python bench/goodput.py [--poll_s 1]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "trainer"
sys.path.insert(0, str(TRAINER))
sys.path.insert(0, str(ROOT / "bench"))

from trainer_scale import sm_env, torchrun  # noqa: E402

ARGS = ["--n_layer", "4", "--n_head", "6", "--n_embd", "384", "--seq_len", "64", "--batch_size", "4",
        "--eval_interval", "0", "--log_interval", "1", "--fsdp", "true", "--cpu_threads", "1",
        "--max_steps", "100000"]
STEP = re.compile(r"^step=(\d+) train_loss")
SAVED = re.compile(r"checkpoint saved step-\d+-\w+ at step (\d+) \((.*)")


def stopped_by_request(data: Path, root: Path, poll_s: float, after_step: int) -> dict[str, Any]:
    request = root / "stop-request.json"
    root.mkdir(parents=True)
    request.write_text('{"stop": false}')
    env = sm_env(root, data, LUSTRAIN_STOP_REQUEST=str(request), LUSTRAIN_STOP_POLL_SECONDS=str(poll_s))
    process = subprocess.Popen([*torchrun(2), "train.py", *ARGS, "--checkpoint_interval", "100000"], cwd=TRAINER,
                               env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    asked = saved_at = None
    last_step = saved_step = -1
    lines = []
    for line in process.stdout:
        lines.append(line)
        if (step := STEP.match(line)) is not None:
            last_step = int(step[1])
            if asked is None and last_step >= after_step:
                request.write_text(json.dumps({"stop": True, "reason": "bench/goodput.py"}))
                asked = time.monotonic()
        if (saved := SAVED.search(line)) is not None and "stop request" in saved[2]:
            saved_at, saved_step = time.monotonic(), int(saved[1])
    code = process.wait(timeout=600)
    if asked is None or saved_at is None:
        sys.stderr.write("".join(lines[-40:]))
        return {"stop_request_to_saved_s": -1, "steps_lost_at_cancel": -1, "stop_exit_code": code}
    return {"stop_request_to_saved_s": round(saved_at - asked, 2), "steps_lost_at_cancel": last_step - saved_step,
            "stop_exit_code": code}


def resumed_read_ratio(data: Path, root: Path) -> dict[str, Any]:
    """The stopped run of `root`, resumed on the same mesh for a few steps: its log's resume_read_ratio."""
    env = sm_env(root, data)
    args = [a if a != "100000" else "12" for a in ARGS]  # up to step 12: a few steps after the stop's
    done = subprocess.run([*torchrun(2), "train.py", *args, "--checkpoint_interval", "100000"], cwd=TRAINER,
                          env=env, text=True, capture_output=True, timeout=600)
    found = re.search(r"resume_read_ratio ([\d.]+)", done.stdout)
    if found is None:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        return {"resume_read_ratio": -1}
    return {"resume_read_ratio": float(found[1])}


def killed_without_request(data: Path, root: Path, kill_after_step: int) -> dict[str, Any]:
    root.mkdir(parents=True)
    process = subprocess.Popen([*torchrun(2), "train.py", *ARGS, "--checkpoint_interval", "20"], cwd=TRAINER,
                               env=sm_env(root, data), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    assert process.stdout is not None
    last_step = -1
    for line in process.stdout:
        if (step := STEP.match(line)) is not None:
            last_step = int(step[1])
            if last_step >= kill_after_step:
                import os
                import signal

                os.killpg(process.pid, signal.SIGKILL)  # the end of SageMaker's grace: every process at once
                break
    process.wait(timeout=60)
    committed = [int(m[1]) for p in (root / "checkpoints").glob("step-*.json")
                 if (m := re.fullmatch(r"step-(\d+)\.json", p.name))]
    return {"steps_lost_at_kill": last_step - max(committed, default=0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--poll_s", type=float, default=1.0)
    args = parser.parse_args(argv)
    from lustrain_trainer.prepare import prepare, stdlib_source_dir

    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = root / "data"
        prepare(stdlib_source_dir(), data, "json/*.py", shard_tokens=1 << 20, source_label="stdlib")
        figures.update(stopped_by_request(data, root / "request", args.poll_s, after_step=8))
        figures.update(resumed_read_ratio(data, root / "request"))
        figures.update(killed_without_request(data, root / "killed", kill_after_step=35))
    for key, value in figures.items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
