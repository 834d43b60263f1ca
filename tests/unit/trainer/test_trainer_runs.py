"""Real training runs of train.py in subprocesses: alone, under torchrun, killed, stopped with SIGTERM.

Each run uses the SageMaker contract the way the container does: the sourcedir's contents in the working
directory, `python train.py --key value`, SM_* variables for the directories.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from lustrain_trainer import faults, generate, shards, trainer

pytestmark = pytest.mark.slow

TRAINER = Path(__file__).resolve().parents[3] / "trainer"
# a model small enough that process start-up, not training, is most of each run
MICRO = ["--n_layer", "1", "--n_head", "2", "--n_embd", "32", "--seq_len", "32", "--batch_size", "4",
         "--eval_interval", "0", "--log_interval", "1"]
# the same, in the Llama block: grouped-query attention (two query heads share one key/value head), an untied head
LLAMA_MICRO = [*MICRO, "--arch", "llama", "--n_kv_head", "1", "--ffn_hidden", "48", "--tie_embeddings", "false"]


def sagemaker_env(root: Path, data: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "LUSTRAIN_"))}
    env.update({
        "PYTHONUNBUFFERED": "1",
        "SM_TRAINING_ENV": "{}",
        "SM_CHANNEL_TRAINING": str(data),
        "SM_MODEL_DIR": str(root / "model"),
        "SM_OUTPUT_DATA_DIR": str(root / "output"),
        "SM_CHECKPOINT_DIR": str(root / "checkpoints"),
        "SM_HOSTS": '["algo-1"]',
        "SM_CURRENT_HOST": "algo-1",
        **extra,
    })
    return env


def run(cwd: Path, env: dict[str, str], *args: str, torchrun: int = 0) -> subprocess.CompletedProcess[str]:
    # --standalone picks a free port: runs in parallel (pytest-xdist, the twin) must not share 29500
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(torchrun)] if torchrun else []
    return subprocess.run([sys.executable, *launcher, "train.py", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=300)


def metric_values(stdout: str, name: str) -> list[float]:
    definition = next(d for d in json.loads((TRAINER / "metric_definitions.json").read_text())
                      if d["Name"] == name)
    return [float(m.group(1)) for line in stdout.splitlines() if (m := re.search(definition["Regex"], line))]


def test_training_on_the_stdlib_lowers_the_loss_clearly(data: Path, sourcedir: Path, tmp_path: Path) -> None:
    env = sagemaker_env(tmp_path, data, SM_HPS=json.dumps({"max_steps": "80", "eval_interval": 40}))
    # hyperparameters arrive as strings, dashed or not, among arguments the trainer does not know
    done = run(sourcedir, env, "--preset", "tiny", "--log-interval", "10", "--max_steps", "80",
               "--sagemaker_extra", "x")

    assert done.returncode == 0, done.stderr
    losses, val_losses = metric_values(done.stdout, "train_loss"), metric_values(done.stdout, "val_loss")
    assert len(losses) == 8 and len(val_losses) == 2
    assert losses[0] > 4.0 and losses[-1] < losses[0] - 1.2, losses  # ln(257) = 5.55 is knowing nothing
    assert val_losses[-1] < math.log(257) - 2.0, val_losses
    # only the metric lines carry metric keys, so SageMaker's regexes read nothing else
    metric_lines = [line for line in done.stdout.splitlines() if line.startswith("step=")]
    # one per log_interval, after the first that says where training starts
    assert metric_lines[0] == "step=0 resumed_from=0" and len(metric_lines) == 9
    assert "ignoring arguments this trainer does not know: --sagemaker_extra x" in done.stdout

    summary = json.loads((tmp_path / "output" / "summary.json").read_text())
    assert (summary["status"], summary["step"], summary["host"]) == ("completed", 80, "algo-1")
    assert summary["hyperparameters"]["eval_interval"] == 40  # from SM_HPS
    assert summary["metrics"]["train_loss"] == pytest.approx(losses[-1], abs=1e-4)
    # each evaluation's perplexity and bits per byte (the val split's tokens over its source bytes: the byte
    # tokenizer adds one token per document), and the final figures in the summary
    val = json.loads((data / "index.json").read_text())["splits"]["val"]
    per_byte = val["tokens"] / val.get("bytes", val["tokens"] - val["documents"]) / math.log(2)
    assert metric_values(done.stdout, "val_ppl") == pytest.approx([math.exp(v) for v in val_losses], rel=1e-3)
    assert metric_values(done.stdout, "val_bpb") == pytest.approx([v * per_byte for v in val_losses], rel=1e-3)
    final = summary["final"]
    assert (final["step"], final["val_step"], final["tokens_seen"]) == (80, 80, 80 * 16 * 64)
    assert metric_values(done.stdout, "tokens_seen")[-1] == final["tokens_seen"] == summary["tokens_seen"]
    assert final["val_loss"] == pytest.approx(val_losses[-1], abs=1e-4)
    assert final["val_ppl"] == pytest.approx(math.exp(final["val_loss"]))
    assert final["val_bpb"] == pytest.approx(final["val_loss"] * per_byte)
    assert final["train_loss"] == pytest.approx(losses[-1], abs=1e-4) and final["elapsed_s"] > 0
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["model"]["n_embd"] == 64 and config["trained_steps"] == 80
    text = generate.sample(generate.load_model(tmp_path / "model"), "def ", 40, 0.8, 20, seed=1)
    assert text.startswith("def ") and len(text) > 10


def test_fsdp_trains_the_model_one_rank_trains_and_its_checkpoint_resumes_without_it(
    data: Path, sourcedir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FSDP (fully_shard, over gloo on CPU) on 2 ranks: the same weights as one unsharded rank training the same
    global batch (grad_accum 2, in this process: DDP's reference, without three more imports of torch), and a
    sharded run's checkpoint resumes in DDP on 2 ranks (a job may move between instance types). The Llama block
    (the GPT block's FSDP is the HSDP test's): each rank initialised only its shard, yet the weights are one rank's."""
    args = [*LLAMA_MICRO, "--max_steps", "6", "--checkpoint_interval", "3"]
    done = run(sourcedir, sagemaker_env(tmp_path / "fsdp-true", data), *args, "--fsdp", "true", torchrun=2)
    assert done.returncode == 0, done.stderr
    assert "fsdp True" in done.stdout
    assert train_in_process(monkeypatch, sagemaker_env(tmp_path / "fsdp-false", data), *args, "--fsdp", "false",
                            "--grad_accum", "2") == 0
    models = {fsdp: torch.load(tmp_path / f"fsdp-{fsdp}" / "model" / "model.pt", weights_only=True)
              for fsdp in ("true", "false")}
    assert models["true"].keys() == models["false"].keys()
    for name, tensor in models["true"].items():
        torch.testing.assert_close(tensor, models["false"][name], rtol=1e-5, atol=1e-6)

    assert "lm_head" not in models["true"] and "head.weight" in models["true"]  # untied: a matrix of its own
    sharded = tmp_path / "fsdp-true"
    done = run(sourcedir, sagemaker_env(sharded, data), *LLAMA_MICRO, "--max_steps", "9", "--checkpoint_interval", "3",
               "--fsdp", "false", torchrun=2)
    assert done.returncode == 0, done.stderr
    assert re.search(r"resumed from step-000000006-\w+ at step 6", done.stdout) and "fsdp False" in done.stdout
    summary = json.loads((sharded / "output" / "summary.json").read_text())
    assert (summary["status"], summary["resumed_from_step"], summary["step"]) == ("completed", 6, 9)


def launch(cwd: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "train.py", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def lines_until(process: subprocess.Popen[str], pattern: str) -> Iterator[str]:
    assert process.stdout is not None
    for line in process.stdout:
        yield line
        if re.match(pattern, line):
            return
    raise AssertionError(f"the run ended before printing {pattern!r}")


def train_in_process(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *args: str) -> int:
    """The same main() as train.py, in this process: no second import of torch for a run that is not killed."""
    with monkeypatch.context() as patch:
        for key in [k for k in os.environ if k not in env]:
            patch.delenv(key)
        for key, value in env.items():
            patch.setenv(key, value)
        return trainer.main(list(args))


def test_a_killed_run_resumes_from_its_checkpoint_to_the_same_state(
        data: Path, sourcedir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    args = [*MICRO, "--max_steps", "60", "--checkpoint_interval", "5", "--keep_checkpoints", "3"]
    straight = tmp_path / "straight"
    assert train_in_process(monkeypatch, sagemaker_env(straight, data), *args) == 0

    interrupted = tmp_path / "interrupted"
    env = sagemaker_env(interrupted, data)
    process = launch(sourcedir, env, *args)
    # committed in the background while training went on: by then step 10 is on disk, and later steps ran
    list(lines_until(process, r"lustrain: checkpoint saved step-000000010-"))
    process.kill()  # no chance to save anything: a lost spot instance
    process.wait(timeout=60)
    checkpoints = interrupted / "checkpoints"
    saved = sorted(p.name for p in checkpoints.glob("step-*.json"))  # the committed ones
    assert saved and "step-000000060.json" not in saved
    newest = int(saved[-1][5:14])
    # and a newer checkpoint that was still being copied when the instance went away: its manifest arrived, one
    # of its shards only in part
    manifest = json.loads((checkpoints / saved[-1]).read_text())
    copy = checkpoints / f"step-{newest + 1:09d}-cut"
    shutil.copytree(checkpoints / manifest["directory"], copy)
    shard = next(copy.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:5000])
    (checkpoints / f"step-{newest + 1:09d}.json").write_text(
        json.dumps({**manifest, "step": newest + 1, "directory": copy.name}))
    capsys.readouterr()

    assert train_in_process(monkeypatch, env, *args) == 0

    resumed = capsys.readouterr().out
    assert f"skipping checkpoint step-{newest + 1:09d}.json ({copy.name}/{shard.name}: 5000 bytes of" in resumed
    assert re.search(rf"resumed from step-{newest:09d}-\w+ at step {newest}", resumed)
    assert f"step={newest} resumed_from={newest}\n" in resumed
    first_step = int(re.search(r"^step=(\d+) train_loss", resumed, re.MULTILINE).group(1))  # type: ignore[union-attr]
    assert first_step == newest + 1
    summary = json.loads((interrupted / "output" / "summary.json").read_text())
    assert (summary["status"], summary["resumed_from_step"], summary["step"]) == ("completed", newest, 60)
    # same data position, optimizer state and weights: the final model is the uninterrupted run's
    a = torch.load(straight / "model" / "model.pt", weights_only=True)
    b = torch.load(interrupted / "model" / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_tiny_llama_learns_and_resumes_from_its_checkpoint_to_the_same_model(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # a constant learning rate after warm-up: a run stopped at step 20 trains as the first 20 steps of one to 40
    args = ["--preset", "llama-tiny", "--batch_size", "4", "--eval_interval", "0", "--log_interval", "5",
            "--warmup_steps", "5", "--min_lr_ratio", "1", "--checkpoint_interval", "20"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert train_in_process(monkeypatch, sagemaker_env(straight, data), *args, "--max_steps", "40") == 0
    losses = metric_values(capsys.readouterr().out, "train_loss")
    assert len(losses) == 8 and losses[-1] < losses[0] - 1.0, losses  # ln(257) = 5.55 is knowing nothing

    env = sagemaker_env(resumed, data)
    assert train_in_process(monkeypatch, env, *args, "--max_steps", "20") == 0
    assert train_in_process(monkeypatch, env, *args, "--max_steps", "40") == 0
    out = capsys.readouterr().out
    assert re.search(r"resumed from step-000000020-\w+ at step 20", out) and "step=20 resumed_from=20" in out
    summary = json.loads((resumed / "output" / "summary.json").read_text())
    assert (summary["resumed_from_step"], summary["step"]) == (20, 40)
    config = json.loads((resumed / "model" / "config.json").read_text())["model"]
    assert (config["arch"], config["n_kv_head"], config["tie_embeddings"]) == ("llama", 2, True)
    a = torch.load(straight / "model" / "model.pt", weights_only=True)
    b = torch.load(resumed / "model" / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    text = generate.sample(generate.load_model(resumed / "model"), "def ", 10, 0.8, 20, seed=1)
    assert text.startswith("def ")


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(data: Path, sourcedir: Path, tmp_path: Path) -> None:
    process = launch(sourcedir, sagemaker_env(tmp_path, data), *MICRO, "--max_steps", "100000",
                     "--checkpoint_interval", "1000")
    list(lines_until(process, r"step=5 "))
    process.send_signal(signal.SIGTERM)  # SageMaker stopping the job; it allows 120 s
    output, _ = process.communicate(timeout=60)

    assert process.returncode == 0, output
    saved = re.search(r"checkpoint saved step-(\d+)-\w+ at step \d+ \(stop requested by SIGTERM", output)
    assert saved, output
    payload = json.loads((tmp_path / "checkpoints" / f"step-{saved.group(1)}.json").read_text())  # committed
    assert payload["step"] == int(saved.group(1)) >= 5
    summary = json.loads((tmp_path / "output" / "summary.json").read_text())
    assert (summary["status"], summary["step"]) == ("interrupted", payload["step"])
    assert not (tmp_path / "model" / "model.pt").exists()  # an unfinished run publishes no model


def test_a_checkpoint_of_another_model_is_refused_not_loaded(data: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    env = sagemaker_env(tmp_path, data)
    assert train_in_process(monkeypatch, env, *MICRO, "--max_steps", "2") == 0
    capsys.readouterr()

    assert train_in_process(monkeypatch, env, *MICRO, "--max_steps", "4", "--n_embd", "16") == 2

    error = capsys.readouterr().err
    assert "holds {'n_layer': 1, 'n_head': 2, 'n_embd': 32" in error
    assert "use another checkpoint_dir or the same model hyperparameters" in error
    assert (tmp_path / "checkpoints" / "step-000000002.json").exists()  # refused, not set aside as corrupt


# ------------------------------------------------------------------ what failed: the machine, or the code


def test_an_nccl_fault_mid_training_exits_as_infrastructure_with_its_last_line(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    env = sagemaker_env(tmp_path, data)

    def lost(self: trainer.Trainer, stop: object) -> None:
        raise RuntimeError("NCCL communicator was aborted on rank 1. Original reason: Watchdog caught collective "
                           "operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE) ran for 600000 ms")

    monkeypatch.setattr(trainer.Trainer, "run", lost)
    code = train_in_process(monkeypatch, env, *MICRO, "--max_steps", "2")

    assert code == faults.INFRASTRUCTURE_EXIT_CODE
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"{faults.INFRASTRUCTURE_MARK} (nccl): RuntimeError: NCCL communicator was aborted")


def test_the_codes_own_error_is_not_called_infrastructure(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: trainer.Trainer, stop: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(trainer.Trainer, "run", broken)
    with pytest.raises(torch.OutOfMemoryError):
        train_in_process(monkeypatch, sagemaker_env(tmp_path, data), *MICRO, "--max_steps", "2")


def test_a_host_missing_a_gpu_fails_the_preflight_fast_as_infrastructure(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # an ml.p4d.24xlarge has 8 GPUs (SM_NUM_GPUS); this host shows fewer
    code = train_in_process(monkeypatch, sagemaker_env(tmp_path, data, SM_NUM_GPUS="8"), *MICRO, "--max_steps", "2")

    assert code == faults.INFRASTRUCTURE_EXIT_CODE
    assert "(preflight): InfrastructureFault: this host has 0 usable GPU(s) of the 8" in capsys.readouterr().err
    assert not (tmp_path / "checkpoints").exists() or not list((tmp_path / "checkpoints").iterdir())


@pytest.mark.parametrize(("error", "kind"), [
    (RuntimeError("CUDA error: uncorrectable ECC error encountered"), "ecc"),
    (RuntimeError("NET/OFI Error: libfabric fi_getinfo failed on EFA device"), "efa"),
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.7]:4771"),
     "lost-rank"),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), "cuda"),
    (ValueError("shapes (4, 32) and (16,) do not align"), None),
    (torch.OutOfMemoryError("CUDA out of memory"), None),
])
def test_faults_are_told_from_the_codes_errors(error: BaseException, kind: str | None) -> None:
    assert faults.kind_of(error) == kind


def test_a_shard_shorter_than_its_index_says_ends_the_run_at_its_start_with_an_error_naming_it(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Every shard's size is checked once at the start: a cut one ends the run before its first step (not hours in,
    when a rank opens it), exit 2 (the data's fault), with the shard named and no traceback."""
    cut = tmp_path / "data"
    shutil.copytree(data, cut)
    shard = sorted(cut.rglob("val*.bin"))[-1]  # one no training step would open
    shard.write_bytes(shard.read_bytes()[:1000])
    assert train_in_process(monkeypatch, sagemaker_env(tmp_path, cut), *MICRO, "--max_steps", "2") == 2
    said = capsys.readouterr()
    assert shard.name in said.err and "1 of the" in said.err and "Traceback" not in said.err
    assert "step " not in said.out and not (tmp_path / "checkpoints").exists()


def test_the_start_check_spreads_the_shards_over_the_ranks_and_every_rank_hears_every_bad_one(
        data: Path, sourcedir: Path, tmp_path: Path) -> None:
    """Under torchrun, rank 0 checks the even shards and rank 1 the odd ones; every rank hears of both bad shards
    and exits 2, and rank 0 names them once."""
    cut = tmp_path / "data"
    shutil.copytree(data, cut)
    index = shards.read_index(cut)
    every = [s for split in sorted(index.splits) for s in index.splits[split]]
    assert len(every) >= 2
    assert [shards.check_share(index, rank, 2) for rank in (0, 1)] == [[], []]
    for shard in every[:2]:  # one in each rank's share
        shard.path.write_bytes(shard.path.read_bytes()[:1000])
    assert [len(shards.check_share(index, rank, 2)) for rank in (0, 1)] == [1, 1]
    done = run(sourcedir, sagemaker_env(tmp_path, cut, SM_NUM_GPUS="0"), *MICRO, "--max_steps", "1", torchrun=2)
    assert done.returncode != 0 and "exitcode: 2" in done.stderr
    (error,) = [line for line in done.stderr.splitlines() if "error: 2 of the" in line]
    assert every[0].path.name in error and every[1].path.name in error
    assert "step " not in done.stdout
