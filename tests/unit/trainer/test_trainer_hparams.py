"""Hyperparameters and paths under SageMaker's contract, and the local defaults."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from lustrain_trainer.hparams import (
    PRESET_SOURCES,
    PRESETS,
    HyperparameterError,
    parse,
    read_hosts,
    resolve_paths,
)
from lustrain_trainer.model import GPT, build


def test_sagemaker_strings_and_dashes_become_typed_values() -> None:
    hp, _, warnings = parse(["--max_steps", "3", "--lr", "0.001", "--activation-checkpointing", "true",
                             "--batch-size=5", "--precision", "FP32"], {})
    assert (hp.max_steps, hp.lr, hp.activation_checkpointing, hp.batch_size, hp.precision) == (
        3, 0.001, True, 5, "fp32")
    assert warnings == []


def test_unknown_arguments_are_reported_and_ignored() -> None:
    hp, _, warnings = parse(["--max_steps", "4", "--sagemaker_extra", "x", "--mystery"], {})
    assert hp.max_steps == 4
    assert warnings == ["ignoring arguments this trainer does not know: --sagemaker_extra x --mystery"]


def test_command_line_beats_sm_hps_which_beats_the_preset() -> None:
    sm_hps = json.dumps({"max_steps": 50, "seq_len": "32", "log-interval": 5, "sagemaker_program": "train.py",
                         "color": "blue"})
    hp, _, warnings = parse(["--max_steps", "7"], {"SM_HPS": sm_hps})
    assert (hp.max_steps, hp.seq_len, hp.log_interval) == (7, 32, 5)
    assert hp.batch_size == PRESETS["tiny"]["batch_size"] and hp.preset == "tiny"
    assert warnings == ["ignoring SM_HPS key this trainer does not know: color"]


def test_a_preset_sets_the_shape_and_single_keys_override_it() -> None:
    hp, _, _ = parse(["--preset", "85m", "--n_layer", "2"], {})
    assert (hp.n_layer, hp.n_embd, hp.seq_len) == (2, 768, 1024)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max_steps", "ten"], "hyperparameter max_steps: 'ten' is not an integer"),
        (["--max_steps", "2.5"], "hyperparameter max_steps: '2.5' is not an integer"),
        (["--max_steps", "0"], "hyperparameter max_steps: 0 is below the minimum 1"),
        (["--lr", "fast"], "hyperparameter lr: 'fast' is not a number"),
        (["--lr", "0"], "hyperparameter lr: 0.0 is not allowed"),
        (["--activation_checkpointing", "maybe"], "'maybe' is not a boolean (use true or false)"),
        (["--fsdp", "sometimes"], "hyperparameter fsdp: 'sometimes' is not allowed (use auto | true | false)"),
        (["--preset", "huge"], "hyperparameter preset: 'huge' is not allowed (use tiny | 85m"),
        (["--n_embd", "100", "--n_head", "3"], "n_embd: 100 is not a multiple of n_head 3"),
        (["--dropout", "1"], "hyperparameter dropout: 1.0 is not allowed"),
    ],
)
def test_bad_values_name_the_hyperparameter_and_what_is_allowed(argv: list[str], message: str) -> None:
    with pytest.raises(HyperparameterError) as exc:
        parse(argv, {})
    assert message in str(exc.value)


def test_local_runs_write_under_the_working_directory() -> None:
    warnings: list[str] = []
    _, given, _ = parse(["--data", "shards"], {})
    paths = resolve_paths(given, {}, warnings)
    assert paths.data == Path("shards")
    assert paths.checkpoints == Path("runs/trainer/checkpoints")
    assert paths.model == Path("runs/trainer/model") and paths.output == Path("runs/trainer/output")


def test_sagemaker_directories_come_from_its_environment() -> None:
    env = {"SM_CHANNEL_TRAINING": "/opt/ml/input/data/training", "SM_MODEL_DIR": "/opt/ml/model",
           "SM_OUTPUT_DATA_DIR": "/opt/ml/output/data", "SM_TRAINING_ENV": "{}"}
    warnings: list[str] = []
    _, given, _ = parse(["--model_dir", "s3://bucket/model"], env)
    paths = resolve_paths(given, env, warnings)
    assert paths.data == Path("/opt/ml/input/data/training")
    assert paths.checkpoints == Path("/opt/ml/checkpoints")
    assert paths.model == Path("/opt/ml/model") and paths.output == Path("/opt/ml/output/data")
    assert warnings == ["ignoring model_dir s3://bucket/model: the model is written to SM_MODEL_DIR and "
                        "uploaded from it"]
    _, given, _ = parse(["--checkpoint-dir", "/scratch/ckpt"], env)
    assert resolve_paths(given, {**env, "SM_CHECKPOINT_DIR": "/other"}, []).checkpoints == Path("/scratch/ckpt")
    _, given, _ = parse([], env)
    assert resolve_paths(given, {**env, "SM_CHECKPOINT_DIR": "/other"}, []).checkpoints == Path("/other")


def test_no_data_anywhere_says_where_to_give_it() -> None:
    _, given, _ = parse([], {})
    with pytest.raises(HyperparameterError, match="pass --data DIR or set SM_CHANNEL_TRAINING"):
        resolve_paths(given, {}, [])


def test_hosts_come_from_sm_hosts_and_the_current_host_must_be_one_of_them() -> None:
    hosts = read_hosts({"SM_HOSTS": '["algo-1", "algo-2"]', "SM_CURRENT_HOST": "algo-2"})
    assert hosts.hosts == ("algo-1", "algo-2") and not hosts.is_first
    with pytest.raises(HyperparameterError, match="SM_CURRENT_HOST 'algo-3' is not one of SM_HOSTS"):
        read_hosts({"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-3"})


GPT_PRESETS = [name for name, values in PRESETS.items() if values.get("arch", "gpt") == "gpt"]
LLAMA_PRESETS = [name for name in PRESETS if name not in GPT_PRESETS]


@pytest.mark.parametrize("name", [name for name in GPT_PRESETS if name != "tiny"])
def test_each_preset_has_the_parameter_count_in_its_name_or_its_sources_shape(name: str) -> None:
    hp, _, _ = parse(["--preset", name], {})
    with torch.device("meta"):  # shapes only: a 70b model is not built in memory
        model = GPT(hp.model_config())
    count = sum(p.numel() for p in model.parameters())
    assert count == hp.model_config().parameter_count() == hp.plan_shape().parameters
    named = re.search(r"([\d.]+)([bm])$", name)
    assert named, name
    size = float(named[1]) * (1e9 if named[2] == "b" else 1e6)
    if name in PRESET_SOURCES:  # a published model's depth, width and heads, in this trainer's block
        layers, width, heads = (int(n) for n in re.findall(r"\d+", PRESET_SOURCES[name].split(":")[1]))
        assert (hp.n_layer, hp.n_embd, hp.n_head) == (layers, width, heads)
    assert abs(count - size) / size < 0.05, count  # named for its own count (gpt-64b: 64.5 billion)


def test_a_renamed_preset_is_refused_with_its_name_now() -> None:
    with pytest.raises(HyperparameterError, match=r"'70b' is now 'gpt-64b'.*'llama2-70b'"):
        parse(["--preset", "70b"], {})


#: the parameter count each Llama model's publisher gives (the safetensors index's total size over 2 bytes, the model
#: card's rounded figure in PRESET_SOURCES)
PUBLISHED_PARAMETERS = {"llama3.2-1b": 1_235_814_400, "llama3.2-3b": 3_212_749_824, "llama3.1-8b": 8_030_261_248,
                        "llama3.1-70b": 70_553_706_496, "llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320,
                        "llama2-70b": 68_976_648_192}


def test_each_llama_preset_holds_its_published_models_parameters_by_the_plan_alone() -> None:
    assert sorted(PUBLISHED_PARAMETERS) == sorted(name for name in LLAMA_PRESETS if name != "llama-tiny")
    for name, published in PUBLISHED_PARAMETERS.items():
        hp, _, _ = parse(["--preset", name], {})
        shape = hp.plan_shape()  # the preset's own vocabulary: 128,256 (Llama 3) or 32,000 (Llama 2)
        assert (shape.arch, shape.parameters) == ("llama", published), name
        rounded = re.search(r"([\d.]+)B parameters", PRESET_SOURCES[name])
        assert rounded and round(published / 1e9, len(rounded.group(1).split(".")[1])) == float(rounded.group(1))


@pytest.mark.parametrize("name", ["llama-tiny", "llama3.1-8b", "llama3.2-1b"])
def test_a_llama_model_as_built_holds_what_the_plan_counts(name: str) -> None:
    hp, _, _ = parse(["--preset", name], {})
    with torch.device("meta"):
        model = build(hp.model_config(hp.plan_shape().vocab_size))
    assert sum(p.numel() for p in model.parameters()) == hp.plan_shape().parameters
    assert (model.head.weight is model.wte.weight) == hp.tie_embeddings


def test_llama_values_are_checked_and_refused_for_the_gpt_block() -> None:
    with pytest.raises(HyperparameterError, match="hyperparameter n_kv_head: 3 does not divide n_head 4"):
        parse(["--preset", "llama-tiny", "--n_kv_head", "3"], {})
    with pytest.raises(HyperparameterError, match="hyperparameter n_kv_head: 2 is for arch llama"):
        parse(["--preset", "tiny", "--n_kv_head", "2"], {})
    with pytest.raises(HyperparameterError, match="hyperparameter arch: 'mamba' is not allowed"):
        parse(["--arch", "mamba"], {})
    hp, _, _ = parse(["--preset", "tiny", "--arch", "llama"], {})
    config = hp.model_config()
    assert (config.arch, config.n_kv_head, config.ffn_hidden) == ("llama", 4, 256)  # type: ignore[union-attr]
