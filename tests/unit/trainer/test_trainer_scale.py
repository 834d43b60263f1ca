"""The trainer at giant scale, run for real on CPU ranks: two ranks' disjoint reads and pre-flight, sharded
checkpoints resumed on another world size, a stop under torchrun, HSDP, version 1 checkpoints, and the memory plan of
a model far larger than this machine. A torchrun of N ranks starts N + 1 processes that each import torch (about
3 CPU-s), so runs are shared where tests read the same one, and an unsharded reference trains in this process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lustrain_trainer import trainer
from test_trainer_runs import MICRO, lines_until, metric_values, run, sagemaker_env, train_in_process

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_ranks(data: Path, module_sourcedir: Path,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One uninterrupted run on 2 ranks under torchrun (9 steps, a checkpoint every 3, each rank's reads traced), which
    three tests read: a torchrun of 2 ranks starts three processes, each importing torch (about 3 CPU-s)."""
    root = tmp_path_factory.mktemp("two-ranks")
    env = sagemaker_env(root, data, SM_NUM_GPUS="0", LUSTRAIN_DATA_TRACE=str(root / "trace"))
    done = run(module_sourcedir, env, *MICRO, "--checkpoint_interval", "3", "--max_steps", "9", torchrun=2)
    assert done.returncode == 0, done.stderr
    return root, done


def read_trace(directory: Path, ranks: int) -> list[tuple[str, str]]:
    """Every (shard, offset) the ranks read, rank by rank (LUSTRAIN_DATA_TRACE)."""
    return [tuple(line.split()[1:]) for rank in range(ranks)  # type: ignore[misc]
            for line in (directory / f"rank-{rank}.txt").read_text().splitlines()]


def test_two_ranks_under_torchrun_read_disjoint_batches(
        two_ranks: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    root, done = two_ranks
    reads = [(root / "trace" / f"rank-{rank}.txt").read_text().split("\n")[:-1] for rank in (0, 1)]
    assert [len(r) for r in reads] == [9, 9]
    locations = [{tuple(line.split()[1:]) for line in r} for r in reads]
    assert len(locations[0]) == len(locations[1]) == 9 and not locations[0] & locations[1]
    summary = json.loads((root / "output" / "summary.json").read_text())
    assert (summary["status"], summary["world_size"], summary["tokens_seen"]) == ("completed", 2, 9 * 2 * 4 * 32)
    assert len(metric_values(done.stdout, "train_loss")) == 9  # rank 0 alone prints metrics


def test_the_preflight_all_reduces_across_every_rank_and_logs_its_bus_bandwidth(
        two_ranks: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    _, done = two_ranks
    line = next(line for line in done.stdout.splitlines() if "pre-flight" in line)
    found = re.search(r"0 GPU\(s\) on this host of 0 expected; all-reduce of 1 MiB across 2 ranks in [0-9.]+ ms, "
                      r"bus bandwidth ([0-9.]+) GB/s", line)
    assert found and float(found[1]) > 0, line


def test_a_run_resumed_on_another_world_size_reads_what_an_uninterrupted_run_reads(
        data: Path, sourcedir: Path, tmp_path: Path, two_ranks: tuple[Path, subprocess.CompletedProcess[str]],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """2 ranks under torchrun, then 1 alone (in this process, as a job of one process without torchrun runs), then
    2 again, from sharded checkpoints: the same steps, the same spans of data (none seen twice, none skipped) and
    the same tokens as one run on 2 ranks; grad_accum keeps the global batch."""
    args = [*MICRO, "--checkpoint_interval", "3"]
    straight, _ = two_ranks

    moved = tmp_path / "moved"
    env = sagemaker_env(moved, data, LUSTRAIN_DATA_TRACE=str(moved / "trace"))
    done = run(sourcedir, env, *args, "--max_steps", "3", torchrun=2)
    assert done.returncode == 0, done.stderr
    capsys.readouterr()
    assert train_in_process(monkeypatch, env, *args, "--max_steps", "6") == 0
    alone = capsys.readouterr().out
    assert "grad_accum 2 on 1 rank(s) keeps it" in alone
    assert re.search(r"resumed from step-000000003-\w+ at step 3", alone)
    done = run(sourcedir, env, *args, "--max_steps", "9", torchrun=2)
    assert done.returncode == 0, done.stderr

    reads = sorted(read_trace(moved / "trace", 2))
    assert reads == sorted(read_trace(straight / "trace", 2)) and len(set(reads)) == len(reads) == 18
    summaries = [json.loads((root / "output" / "summary.json").read_text()) for root in (straight, moved)]
    assert summaries[0]["tokens_seen"] == summaries[1]["tokens_seen"] == 9 * 2 * 4 * 32
    assert summaries[1]["resumed_from_step"] == 6 and summaries[1]["step"] == 9


#: wide enough (1.6M parameters) that a checkpoint is its shards, not the few small items every rank reads whole
#: (the step counters, the run's position in its data): the resume's read ratio then says what it says at scale
WIDER = ["--n_layer", "2", "--n_embd", "256", "--n_head", "4"]


def test_sigterm_under_torchrun_ends_in_a_committed_sharded_checkpoint(
        data: Path, sourcedir: Path, tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "train.py",
         *MICRO, *WIDER, "--max_steps", "100000", "--checkpoint_interval", "4", "--fsdp", "true"],
        cwd=sourcedir, env=sagemaker_env(tmp_path, data), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    list(lines_until(process, r"lustrain: checkpoint saved step-000000004-"))
    process.send_signal(signal.SIGTERM)  # SageMaker stopping the job: torchrun forwards it to every worker
    output, _ = process.communicate(timeout=60)

    # the step every rank stopped at is committed (by the stop's own save, or by the interval's at that very step)
    summary = json.loads((tmp_path / "output" / "summary.json").read_text())
    saved = re.findall(r"checkpoint saved (step-(\d+)-\w+) at step \d+ \((?:stop requested by SIGTERM|interval)",
                       output)[-1]
    assert summary["status"] == "interrupted" and int(saved[1]) == summary["step"], output
    manifest = json.loads((tmp_path / "checkpoints" / f"step-{saved[1]}.json").read_text())
    assert manifest["world_size"] == 2 and manifest["layout"] == "sharded"
    assert sorted(p.name for p in (tmp_path / "checkpoints" / saved[0]).glob("*.distcp")) == [
        "__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own part

    # resumed on the same 2 ranks, each reads its own part of the sharded (FSDP) checkpoint, not the whole: the
    # busiest rank's bytes of the checkpoint's files over its own shards' (goal <= 1.1; bench/goodput.py measures the
    # same figure; a replicated model's ranks each read the whole state)
    step = int(saved[1])
    done = run(sourcedir, sagemaker_env(tmp_path, data), *MICRO, *WIDER, "--checkpoint_interval", "4", "--fsdp",
               "true", "--max_steps", str(step + 1), torchrun=2)
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    ratio = re.search(r"resume_read_ratio ([\d.]+) of a rank's own shards", said)
    assert ratio and 0.9 <= float(ratio[1]) <= 1.1, said[-3000:]


def test_a_dry_run_plans_a_70b_model_without_building_it(
        sourcedir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def plan_of(*args: str, torchrun: int = 0) -> dict[str, str]:
        if torchrun:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "LUSTRAIN_"))}
            done = run(sourcedir, env, "--preset", "gpt-64b", "--dry_run", *args, torchrun=torchrun)
            assert done.returncode == 0, done.stderr
            out = done.stdout
        else:
            assert train_in_process(monkeypatch, {}, "--preset", "gpt-64b", "--dry_run", *args) == 0
            out = capsys.readouterr().out
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    one_host, fleet = plan_of("--world_size", "8"), plan_of("--world_size", "400")
    assert (one_host["fits"], fleet["fits"]) == ("no", "yes")
    assert (fleet["sharding"], fleet["shard_group"], fleet["replicas"]) == ("hsdp", "80", "5")
    assert float(fleet["stop_to_saved_s"]) < 120 and float(fleet["peak_gib_per_gpu"]) < 40
    # under torchrun the model is built on meta and sharded as the run would: what a rank holds, counted
    sharded = plan_of("--fsdp", "true", torchrun=2)
    assert sharded["measured_parameter_gib_per_rank"] == sharded["parameter_gib_per_rank"] == "120.07"
    assert float(sharded["peak_rss_mb"]) < 2000  # the whole model would be 240 GiB in fp32


def test_hsdp_shards_within_groups_and_trains_the_same_model_as_one_rank(
        data: Path, sourcedir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """4 ranks in 2 shard groups of 2 (HSDP: each group one replica): the same weights as one unsharded rank after
    the same steps of the same data, from the same initialisation (each rank drew only its shard's rows)."""
    done = run(sourcedir, sagemaker_env(tmp_path / "hsdp", data), *MICRO, "--max_steps", "3", "--shard_group", "2",
               torchrun=4)
    assert done.returncode == 0, done.stderr
    assert "shard group 2" in done.stdout
    # one rank with grad_accum 4 trains the same global batch of the same data (the order is the world's), in this
    # process: the unsharded reference without three more imports of torch
    assert train_in_process(monkeypatch, sagemaker_env(tmp_path / "one", data), *MICRO, "--max_steps", "3",
                            "--fsdp", "false", "--grad_accum", "4") == 0
    models = {name: torch.load(tmp_path / name / "model" / "model.pt", weights_only=True) for name in ("hsdp", "one")}
    assert models["hsdp"].keys() == models["one"].keys()
    for key, tensor in models["hsdp"].items():
        torch.testing.assert_close(tensor, models["one"][key], rtol=1e-5, atol=1e-6)


def test_a_version_1_checkpoint_of_an_earlier_trainer_still_resumes(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from lustrain_trainer import checkpoint
    from lustrain_trainer.hparams import parse
    from lustrain_trainer.model import GPT

    hp, _, _ = parse(MICRO, {})
    model = GPT(hp.model_config())
    optimizer = trainer.make_optimizer(model, hp, torch.device("cpu"))
    tokens = torch.randint(0, 257, (2, 33))
    model(tokens[:, :-1], tokens[:, 1:]).backward()
    optimizer.step()
    payload = checkpoint.make_payload(3, model.state_dict(), checkpoint.optimizer_state_by_name(model, optimizer),
                                      hp.model_config().to_dict(), {"tokens_seen": 3 * 4 * 32, "run": None})
    checkpoint.save_atomic(payload, checkpoint.checkpoint_path(tmp_path / "checkpoints", 3))

    assert train_in_process(monkeypatch, sagemaker_env(tmp_path, data), *MICRO, "--max_steps", "5") == 0
    assert "resumed from step-000000003.pt at step 3" in capsys.readouterr().out
    summary = json.loads((tmp_path / "output" / "summary.json").read_text())
    assert (summary["resumed_from_step"], summary["step"], summary["tokens_seen"]) == (3, 5, 5 * 4 * 32)
    assert list((tmp_path / "checkpoints").glob("step-000000005.json"))  # and goes on with sharded checkpoints


def test_the_gpu_check_runs_every_step_on_a_cpu_so_it_works_the_day_a_gpu_is_lent() -> None:
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, str(root / "bench" / "gpu_check.py"), "--smoke", "--steps", "2"],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr
    figures = dict(line.split("=", 1) for line in done.stdout.splitlines() if re.fullmatch(r"[a-z_0-9.]+=\S+", line))
    assert figures["sigterm_status"] == "interrupted" and float(figures["sigterm_to_saved_s"]) >= 0
    assert float(figures["tokens_per_s_tiny"]) > 0 and float(figures["ckpt_save_gbps"]) > 0
    assert float(figures["ckpt_load_gbps"]) > 0 and float(figures["ckpt_blocking_s"]) >= 0
