"""What a run loses, by the plan (issue 39, items 4 and 5): the checkpoint interval by Young-Daly's optimum, the
refusals of an interval the run cannot use, and the goodput figures of the 70B example against a hand computation
from the published numbers alone (docs/trainer.md, "What a run loses", shows the same one)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from lustrain_core import planner
from lustrain_core.config import Settings
from lustrain_core.errors import SpecInvalid
from lustrain_core.launch import compile_offline, registered
from lustrain_core.spec import load_spec_file, validate_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama70b-50x-persistent.yaml"

# --- the hand computation, from published figures only ------------------------------------------------------------
# Llama 3.1 70B (meta-llama/Llama-3.1-70B config.json): width 8192, 80 layers, 8 of 64 heads for keys and values
# (kv width 1024), SwiGLU 28672, vocabulary 128256, untied head, sequence 8192, micro-batch 1
D, LAYERS, KV, FFN, VOCAB, SEQ = 8192, 80, 1024, 28672, 128256, 8192
BLOCK = 2 * D + 2 * D * D + 2 * D * KV + 3 * D * FFN
PARAMETERS = 2 * VOCAB * D + LAYERS * BLOCK + D
GPUS, HOSTS, HOURS = 400, 50, 672
# a checkpoint is 12 bytes a parameter; the plan shards it over all 400 GPUs; a GPU copies its share to host memory
# at 10 GB/s (the catalogue's stage_gbps, an assumption) while training waits
CHECKPOINT = 12 * PARAMETERS
BLOCKING_S = (12 * PARAMETERS // GPUS) / 10e9
# Llama 3, section 3.3.4: 419 unexpected interruptions in 54 days on 16,384 GPUs
GPU_MTBF_H = 54 * 24 * 16384 / 419
FLEET_MTBF_S = GPU_MTBF_H / GPUS * 3600
# Lustre: 38,400 GiB at 1000 MB/s per TiB = 37,500 MB/s; the GPUs read 400 x 50 MB/s of data meanwhile
FS_MB_S, INGEST_MB_S = 38400 * 1000 / 1024, GPUS * 50
WRITE_S = CHECKPOINT / ((FS_MB_S - INGEST_MB_S) * 1e6)
RESUME_S = CHECKPOINT / (FS_MB_S * 1e6)
# a step: 6 FLOPs a multiplied parameter and attention's 12 x layers x width x sequence, a token; 8192 tokens a GPU,
# at 38% of the A100's 312 dense bf16 TFLOP/s
STEP_S = (6 * (PARAMETERS - VOCAB * D) + 12 * LAYERS * D * SEQ) * SEQ / (312e12 * 0.38)


def hand() -> dict[str, float]:
    every_min = round(math.sqrt(2 * BLOCKING_S * FLEET_MTBF_S) / 60, 2)
    interval_s = every_min * 60
    stop_to_saved = 10 + STEP_S + BLOCKING_S + 2 * WRITE_S
    interruptions = GPUS * HOURS / GPU_MTBF_H
    lost_s = HOURS * 3600 / interval_s * BLOCKING_S + interruptions * (interval_s / 2 + WRITE_S + RESUME_S) + stop_to_saved
    lost_h = GPUS * lost_s / 3600
    return {
        "checkpoint_every_minutes": every_min,
        "stop_to_saved_s": stop_to_saved,
        "stop_wait_s": math.ceil(stop_to_saved + 60),
        "expected_interruptions": interruptions,
        "lost_gpu_hours": lost_h,
        "fraction": 1 - lost_h / (GPUS * HOURS),
    }


def example(**changes: object):
    spec = load_spec_file(EXAMPLE)
    if not changes:
        return spec
    doc = spec.model_dump(mode="json")
    for path, value in changes.items():
        section, key = path.split("__")
        doc[section][key] = value
    return validate_spec(doc)


def errors_of(spec, **kw) -> dict[str, str]:
    with pytest.raises(SpecInvalid) as info:
        planner.plan(spec, **kw)
    return {e.path: e.message for e in info.value.errors}


@pytest.fixture(autouse=True)
def _llama3_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(planner.GPU_MTBF_SETTING, raising=False)


def test_the_70b_example_plans_and_its_goodput_is_the_hand_computation() -> None:
    g = planner.plan(example()).goodput
    assert g is not None
    expected = hand()
    assert g["checkpoint_every_minutes"] == expected["checkpoint_every_minutes"] == 7.32
    assert g["checkpoint_blocking_s"] == pytest.approx(BLOCKING_S, abs=1e-3)
    assert g["checkpoint_write_s"] == pytest.approx(WRITE_S, abs=0.05) and g["checkpoint_medium"] == "lustre"
    assert g["fleet_mtbf_hours"] == pytest.approx(126.69, abs=0.01)
    assert g["step_s"] == pytest.approx(STEP_S, abs=0.05)
    assert g["stop_request_poll_s"] == 10
    assert g["stop_to_saved_s"] == pytest.approx(expected["stop_to_saved_s"], abs=0.05)
    assert g["stop_wait_s"] == expected["stop_wait_s"]
    assert g["resume_read_gb_per_host"] == pytest.approx(CHECKPOINT / HOSTS / 1e9, abs=0.005)
    assert g["resume_s"] == pytest.approx(RESUME_S, abs=0.05)
    assert g["expected_interruptions"] == pytest.approx(expected["expected_interruptions"], abs=0.005)
    assert g["billed_gpu_hours"] == GPUS * HOURS
    assert g["lost_gpu_hours"] == pytest.approx(expected["lost_gpu_hours"], abs=0.05)
    assert g["fraction"] == pytest.approx(expected["fraction"], abs=1e-4)


def test_every_goodput_figure_names_its_source() -> None:
    g = planner.plan(example()).goodput
    assert g is not None
    for key in ("checkpoint_every_minutes", "checkpoint_blocking_s", "checkpoint_write_s", "step_s",
                "stop_request_poll_s", "stop_to_saved_s", "stop_wait_s", "resume_s", "expected_interruptions",
                "lost_gpu_hours", "fraction"):
        assert g["sources"][key], key
    assert "Young-Daly" in g["sources"]["checkpoint_every_minutes"]
    assert "419 unexpected interruptions in 54 days on 16,384" in g["sources"]["gpu_mtbf_hours"]
    assert "Llama 3" in g["sources"]["step_s"] and "38%" in g["sources"]["step_s"]
    assert "FSx for Lustre" in g["sources"]["checkpoint_write_s"]


def test_the_default_interval_is_young_dalys_optimum_and_never_shorter_than_a_write() -> None:
    blocking = planner.plan(example()).goodput["checkpoint_blocking_s"]
    # one GPU failing every 40,000 h: 400 GPUs every 100 h
    g = planner.plan(example(), gpu_mtbf_hours=40_000).goodput
    assert g is not None and g["fleet_mtbf_hours"] == 100
    assert g["checkpoint_every_minutes"] == pytest.approx(math.sqrt(2 * blocking * 100 * 3600) / 60, abs=0.01)
    # a fleet failing every hour: Young-Daly's 39 s is shorter than the 48 s a checkpoint takes to write to Lustre
    g = planner.plan(example(), gpu_mtbf_hours=400).goodput
    assert g is not None
    assert math.sqrt(2 * blocking * 3600) < g["checkpoint_write_s"]
    assert g["checkpoint_every_minutes"] == pytest.approx(g["checkpoint_write_s"] / 60, abs=0.01)
    assert "raised to a checkpoint's write" in g["sources"]["checkpoint_every_minutes"]


def test_the_stacks_setting_replaces_llama_3s_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(planner.GPU_MTBF_SETTING, "10000")
    g = planner.plan(example()).goodput
    assert g is not None and g["gpu_mtbf_hours"] == 10000 and g["fleet_mtbf_hours"] == 25
    assert g["expected_interruptions"] == pytest.approx(400 * 672 / 10000)
    assert "LUSTRAIN_GPU_MTBF_HOURS" in g["sources"]["gpu_mtbf_hours"]
    monkeypatch.setenv(planner.GPU_MTBF_SETTING, "0")
    assert planner.plan(example()).goodput["gpu_mtbf_hours"] == pytest.approx(50677.0, abs=0.1)
    monkeypatch.setenv(planner.GPU_MTBF_SETTING, "a week")
    with pytest.raises(ValueError, match=r"LUSTRAIN_GPU_MTBF_HOURS='a week'.*GpuMtbfHours"):
        planner.plan(example())


def test_an_interval_under_the_saves_blocking_time_is_refused_by_field() -> None:
    # 0.002 minutes is 0.12 s; the save blocks training 0.21 s on 50 p4d
    message = errors_of(example(checkpoints__every_minutes=0.002))["checkpoints.every_minutes"]
    assert "under the save's blocking time" in message and "0.21 s" in message and "at least 0.01 minutes" in message


def test_an_interval_longer_than_the_run_is_refused_by_field() -> None:
    day = example(compute__max_runtime_hours=24, checkpoints__every_minutes=24 * 60 + 1)
    message = errors_of(day)["checkpoints.every_minutes"]
    assert "longer than the run" in message and "compute.max_runtime_hours is 24 (1440 minutes)" in message
    whole = planner.plan(example(compute__max_runtime_hours=24, checkpoints__every_minutes=24 * 60)).goodput
    assert whole is not None and whole["checkpoint_every_minutes"] == 1440
    # beyond SageMaker's longest run (28 days) the spec itself refuses it
    with pytest.raises(SpecInvalid, match=r"checkpoints\.every_minutes"):
        example(checkpoints__every_minutes=672 * 60 + 1)


@pytest.mark.parametrize("bad", [0, -5, "often"])
def test_the_spec_refuses_an_interval_that_is_not_a_positive_number(bad: object) -> None:
    doc = load_spec_file(EXAMPLE).model_dump(mode="json")
    doc["checkpoints"]["every_minutes"] = bad
    with pytest.raises(SpecInvalid) as info:
        validate_spec(doc)
    assert [e.path for e in info.value.errors] == ["checkpoints.every_minutes"]


def test_an_interval_given_as_the_trainers_hyperparameter_too_is_refused() -> None:
    doc = load_spec_file(EXAMPLE).model_dump(mode="json")
    doc["checkpoints"]["every_minutes"] = 30
    doc["code"]["hyperparameters"]["checkpoint_every_minutes"] = 20
    message = errors_of(validate_spec(doc))["code.hyperparameters.checkpoint_every_minutes"]
    assert "given twice" in message and "checkpoints.every_minutes" in message


def test_a_shorter_interval_than_a_write_is_a_warning() -> None:
    p = planner.plan(example(checkpoints__every_minutes=0.5))
    assert any(w.startswith("checkpoints.every_minutes 0.5: shorter than a checkpoint's write") for w in p.warnings)


def test_checkpoints_through_sagemakers_sync_are_written_and_read_back_at_s3s_pace() -> None:
    # the 70B's 2 kept checkpoints through SageMaker's sync: every restart would copy them whole to every host
    with pytest.raises(SpecInvalid) as refused:
        planner.plan(example(checkpoints__to_filesystem=False))
    error = next(e for e in refused.value.errors if e.path == "checkpoints.to_filesystem")
    per_host_gb = 2 * CHECKPOINT / 1e9
    assert f"{per_host_gb:,.0f} GB" in error.message and f"{2 * CHECKPOINT / 0.625e9:,.0f} s" in error.message
    assert f"above the {planner.SYNC_RESUME_MAX_S} s" in error.message
    # a model whose prefix fits goes through the sync: written to local NVMe at 8 GB/s, then to S3 at one flow's
    # 5 Gbps; a restart copies the whole prefix (2 kept checkpoints) to every instance
    small = example(checkpoints__to_filesystem=False, code__hyperparameters={"preset": "1.2b"}, compute__instance_count=2)
    g = planner.plan(small).goodput
    assert g is not None and g["checkpoint_medium"] == "s3 (SageMaker checkpoint sync)"
    assert g["resume_read_gb_per_host"] <= g["checkpoint_sync_max_gb_per_host"] == 375.0
    assert g["resume_s"] == pytest.approx(g["resume_read_gb_per_host"] / 0.625, abs=0.1)


def test_checkpoints_on_a_scratch_file_system_are_refused_by_its_deployment_type() -> None:
    with pytest.raises(SpecInvalid) as refused:
        planner.plan(example(filesystem__deployment_type="scratch"))
    error = next(e for e in refused.value.errors if e.path == "filesystem.deployment_type")
    assert "needs persistent" in error.message and "file server" in error.message


def test_the_trainer_is_passed_the_plans_interval() -> None:
    plan, launch = compile_offline(example())
    assert plan.goodput is not None
    assert launch.hyperparameters["checkpoint_every_minutes"] == json.dumps(plan.goodput["checkpoint_every_minutes"])
    _, given = compile_offline(example(checkpoints__every_minutes=45))
    assert given.hyperparameters["checkpoint_every_minutes"] == "45.0"


def test_an_entry_point_that_is_not_lustrains_trainer_is_passed_no_interval_unless_the_spec_sets_one() -> None:
    doc = load_spec_file(EXAMPLE).model_dump(mode="json")
    doc["code"]["hyperparameters"] = {"epochs": 3}
    plan, launch = compile_offline(validate_spec(doc))
    assert plan.goodput is not None and plan.goodput["checkpoint_every_minutes"] is None
    assert "checkpoint_every_minutes" not in launch.hyperparameters
    doc["checkpoints"]["every_minutes"] = 60
    _, launch = compile_offline(validate_spec(doc))
    assert launch.hyperparameters["checkpoint_every_minutes"] == "60.0"


def test_the_record_keeps_the_same_goodput_start_training_sees() -> None:
    spec = example()
    made = registered(spec, "llama70b-0123abcd", Settings())
    assert made["plan"]["goodput"] == planner.plan(spec).to_dict()["goodput"]
    assert json.loads(made["launch"]["hyperparameters"]["checkpoint_every_minutes"]) == 7.32


def test_the_planners_poll_is_the_trainers() -> None:
    from lustrain_trainer import stopping

    assert stopping.DEFAULT_POLL_S == planner.STOP_REQUEST_POLL_SECONDS


def test_the_planners_trainer_defaults_are_the_trainers() -> None:
    from lustrain_trainer.hparams import Hyperparameters

    assert Hyperparameters.checkpoint_interval == planner.TRAINER_CHECKPOINT_INTERVAL
    assert Hyperparameters.grad_accum == planner.TRAINER_GRAD_ACCUM


def test_the_memory_plan_counts_a_micro_batchs_flops() -> None:
    memory = planner.plan(example()).memory
    assert memory is not None
    per_token = 6 * (PARAMETERS - VOCAB * D) + 12 * LAYERS * D * SEQ
    assert float(memory["micro_batch_tflop_per_gpu"]) == pytest.approx(per_token * SEQ / 1e12, abs=0.05)


def test_the_plans_text_shows_goodput_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from lustrain.cli import main

    assert main(["plan", str(EXAMPLE)]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("goodput")]
    assert re.search(
        r"checkpoint every 7\.32 min \(blocks 0\.212 s, written in 48\.4 s\); stop request polled every 10 s, "
        r"saved 140\.\d s after, StopTrainingJob after 201 s; resume reads 16\.93 GB a host in 22\.6 s; "
        r"5\.30 interruptions expected: 316\.\d of 268,800 GPU-hours lost, 99\.88% train",
        line,
    ), line


def test_the_plans_json_has_the_goodput_object(capsys: pytest.CaptureFixture[str]) -> None:
    from lustrain.cli import main

    assert main(["plan", str(EXAMPLE), "--json"]) == 0
    goodput = json.loads(capsys.readouterr().out)["goodput"]
    assert {"checkpoint_every_minutes", "checkpoint_blocking_s", "checkpoint_write_s", "stop_request_poll_s",
            "stop_to_saved_s", "stop_wait_s", "resume_read_gb_per_host", "resume_s", "expected_interruptions",
            "lost_gpu_hours", "fraction", "sources"} <= set(goodput)


def test_the_trainer_takes_checkpoint_every_minutes_as_a_number_of_minutes() -> None:
    from lustrain_trainer.hparams import HELP, HyperparameterError, parse

    assert parse([], {})[0].checkpoint_every_minutes == 0.0
    assert parse(["--checkpoint-every-minutes", "7.32"], {})[0].checkpoint_every_minutes == 7.32
    # as SageMaker passes it: JSON-encoded in SM_HPS
    assert parse([], {"SM_HPS": json.dumps({"checkpoint_every_minutes": "7.32"})})[0].checkpoint_every_minutes == 7.32
    assert "Young-Daly" in HELP["checkpoint_every_minutes"] and "0: by steps only" in HELP["checkpoint_every_minutes"]
    for bad, why in (("-1", "below the minimum 0"), ("nan", "not allowed"), ("inf", "not allowed"),
                     ("often", "not a number")):
        with pytest.raises(HyperparameterError, match=f"checkpoint_every_minutes: .*{why}"):
            parse(["--checkpoint_every_minutes", bad], {})
