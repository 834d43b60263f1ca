"""The trainer on one GPU (an H100 or H200 as lent; an A100 alike), in one short script that installs nothing and
runs on the torch the machine has (2.11 with CUDA or later), under 5 minutes in all:

- bf16 tokens/s and MFU (against the card's dense bf16 peak, lustrain_trainer.plan) of the 1.2b preset, and of
  the largest preset the memory plan fits on this one GPU;
- a sharded checkpoint of the 1.2b model and its AdamW state: the time training is blocked (the copy to host
  memory), the write's and the load's GB/s;
- SIGTERM to a committed checkpoint: train.py under torchrun (1 rank, the 1.2b preset, bf16), SIGTERM to torchrun
  mid-training, the seconds to the stop's checkpoint.

    python bench/gpu_check.py [--steps 10]
    python bench/gpu_check.py --smoke      (on a CPU, the tiny preset: every step of the check, in seconds)

It prints key=value lines and the device. Record them, with the card's name, in the README.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "trainer"
sys.path.insert(0, str(TRAINER))

import torch  # noqa: E402
from lustrain_trainer import checkpoint, plan  # noqa: E402
from lustrain_trainer.distributed import Dist  # noqa: E402
from lustrain_trainer.hparams import PRESETS, parse  # noqa: E402
from lustrain_trainer.trainer import build_model, make_optimizer  # noqa: E402


def say(key: str, value: Any) -> None:
    print(f"{key}={value}", flush=True)


#: the presets the check trains: the 1.2b on a GPU; the tiny one in a smoke run on a CPU
PRESET = {"gpu": "1.2b", "smoke": "tiny"}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def largest_fitting_preset(gpu_bytes: int) -> str:
    hardware = plan.Hardware(gpus=1, gpu_bytes=gpu_bytes, host_bytes=0, write_gbps=1.0, stage_gbps=1.0)
    best = "tiny"
    for preset in PRESETS:
        hp, _, _ = parse(["--preset", preset], {})
        layout = plan.plan(hp.plan_shape(), batch_size=hp.batch_size, world_size=1, bf16=True, fsdp=False,
                           activation_checkpointing=hp.activation_checkpointing, hardware=hardware)
        if layout.fits:
            best = preset
    return best


def throughput(preset: str, info: Dist, steps: int, peak: float) -> tuple[float, float, Any, Any]:
    """(tokens/s, MFU) of bf16 training steps of `preset` on this GPU, and the model and optimizer."""
    hp, _, _ = parse(["--preset", preset, "--fsdp", "false"], {})
    # the preset's planning vocabulary (a Llama preset's published one), as the plan and its FLOPs count it
    config = hp.model_config(hp.plan_shape().vocab_size)
    model = build_model(hp, info, False, 1, info.device.type == "cuda", config)
    optimizer = make_optimizer(model, hp, info.device)
    tokens = torch.randint(0, config.vocab_size, (hp.batch_size, hp.seq_len + 1), device=info.device)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step() -> None:
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=info.device.type == "cuda"):
            loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):  # warm-up: kernels chosen, allocator and optimizer state in place
        step()
    sync(info.device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    sync(info.device)
    rate = hp.batch_size * hp.seq_len * steps / (time.perf_counter() - started)
    return rate, rate * hp.plan_shape().flops_per_token() / (peak * 1e12), model, optimizer


def checkpoint_rates(model: Any, optimizer: Any, directory: Path) -> dict[str, float]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    saver = checkpoint.Checkpointer(directory, 0, 1, keep=1, log=lambda _: None)
    model_state, optim_state = get_state_dict(model, optimizer)
    device = next(model.parameters()).device
    sync(device)
    started = time.monotonic()
    blocked = saver.save(1, {"model": model_state, "optimizer": optim_state}, {"run": None, "model_config": {}},
                         "gpu", "gpu-check")
    saver.wait()
    written = time.monotonic() - started
    size = sum(p.stat().st_size for p in directory.rglob("*.distcp"))
    found = checkpoint.load_latest(directory, lambda _: None)
    assert found is not None and found.sharded
    state = {"model": model_state, "optimizer": optim_state}
    sync(device)
    started = time.monotonic()
    dcp.load(state, checkpoint_id=str(found.path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    sync(device)
    loaded = time.monotonic() - started
    # three significant figures: the smoke run's checkpoint is a few MB, and two decimals of its GB/s read 0.0
    return {"ckpt_gb": float(f"{size / 1e9:.3g}"), "ckpt_blocking_s": round(blocked, 3),
            "ckpt_save_gbps": float(f"{size / 1e9 / written:.3g}"), "ckpt_load_gbps": float(f"{size / 1e9 / loaded:.3g}")}


def sigterm_to_saved(root: Path, timeout: float, preset: str) -> dict[str, Any]:
    from lustrain_trainer.prepare import prepare, stdlib_source_dir

    data = root / "data"
    prepare(stdlib_source_dir(), data, "**/*.py", shard_tokens=8 << 20, source_label="stdlib")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SM_TRAINING_ENV": "{}", "SM_CHANNEL_TRAINING": str(data),
           "SM_MODEL_DIR": str(root / "model"), "SM_OUTPUT_DATA_DIR": str(root / "output"),
           "SM_CHECKPOINT_DIR": str(root / "checkpoints")}
    args = ["--preset", preset, "--max_steps", "100000", "--checkpoint_interval", "100000", "--log_interval", "1",
            "--eval_interval", "0"]
    process = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                "1", "train.py", *args], cwd=TRAINER, env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    assert process.stdout is not None
    sent = saved = None
    deadline = time.monotonic() + timeout
    for line in process.stdout:
        if sent is None and (line.startswith("step=5 ") or time.monotonic() > deadline):
            process.send_signal(signal.SIGTERM)
            sent = time.monotonic()
        if sent is not None and "checkpoint saved" in line:
            saved = time.monotonic()
    code = process.wait(timeout=180)
    summary = root / "output" / "summary.json"
    status = json.loads(summary.read_text())["status"] if summary.is_file() else "none"
    return {"sigterm_to_saved_s": round(saved - sent, 2) if sent and saved else -1,
            "sigterm_status": status, "torchrun_exit_code": code}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="on a CPU with the tiny preset: the check's own test")
    args = parser.parse_args()
    kind = "smoke" if args.smoke else "gpu"
    if not args.smoke and not torch.cuda.is_available():
        print("error: no CUDA device (--smoke runs the check on a CPU)", file=sys.stderr)
        return 2
    started = time.monotonic()
    if args.smoke:
        device, name, memory, peak = torch.device("cpu"), "cpu", 0, 1.0
    else:
        device = torch.device("cuda", 0)
        props = torch.cuda.get_device_properties(device)
        # the catalogue's peak for this GPU (lustrain_core/data/instance_types.json); a GPU it lacks has no MFU
        name, memory, peak = props.name, props.total_memory, plan.peak_tflops(props.name) or math.nan
    say("device", name.replace(" ", "_"))
    say("torch", torch.__version__)
    say("gpu_gib", round(memory / 2**30, 1))
    say("bf16_peak_tflops", peak)
    info = Dist(rank=0, local_rank=0, world_size=1, device=device)
    preset = PRESET[kind]
    rate, mfu, model, optimizer = throughput(preset, info, args.steps, peak)
    say(f"tokens_per_s_{preset}", round(rate))
    say(f"mfu_{preset}", round(mfu, 3))
    with tempfile.TemporaryDirectory() as tmp:
        for key, value in checkpoint_rates(model, optimizer, Path(tmp) / "ckpt").items():
            say(key, value)
        del model, optimizer
        if not args.smoke:
            torch.cuda.empty_cache()
            largest = largest_fitting_preset(memory)
            say("largest_preset_one_gpu", largest)
            if largest != preset:
                rate, mfu, model, optimizer = throughput(largest, info, max(3, args.steps // 2), peak)
                say(f"tokens_per_s_{largest}", round(rate))
                say(f"mfu_{largest}", round(mfu, 3))
                del model, optimizer
                torch.cuda.empty_cache()
        shutil.rmtree(Path(tmp) / "ckpt", ignore_errors=True)
        for key, value in sigterm_to_saved(Path(tmp) / "stop", timeout=90, preset=preset).items():
            say(key, value)
    say("elapsed_s", round(time.monotonic() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
