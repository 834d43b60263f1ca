"""The trainer's memory plan in the control plane: lustrain plan, validate and register_job refuse a model that
cannot fit its instances, by the same numbers as `train.py --dry_run`."""

from __future__ import annotations

from pathlib import Path

import pytest
from lustrain_core.errors import SpecInvalid
from lustrain_core.planner import plan
from lustrain_core.spec import load_spec_file, validate_spec

ROOT = Path(__file__).resolve().parents[2]


def spec_with(hyperparameters: dict[str, object], count: int, instance_type: str = "ml.p4d.24xlarge"):
    # checkpoints on Lustre: a 70B's through SageMaker's sync would be refused for its restarts' copy
    return validate_spec({
        "name": "gpt", "data": {"s3_uri": "s3://bkt/data/"}, "output": {"s3_uri": "s3://bkt/out/"},
        "compute": {"instance_type": instance_type, "instance_count": count},
        "code": {"source": "s3://bkt/code/", "hyperparameters": hyperparameters},
        "checkpoints": {"to_filesystem": True}, "filesystem": {"deployment_type": "persistent"},
    })


@pytest.mark.parametrize("name", ["plan.py", "presets.py", "prepare_estimate.py", "layout.py"])
def test_the_control_planes_copy_is_the_trainers(name: str) -> None:
    source = ROOT / "trainer" / "lustrain_trainer" / name
    copy = ROOT / "functions" / "lustrain_core" / "trainer" / name
    assert copy.read_text() == source.read_text(), "run scripts/refresh_trainer_plan.py"


@pytest.mark.parametrize("where", ["trainer/lustrain_trainer", "functions/lustrain_core/trainer"])
def test_the_plans_copies_of_the_instance_catalogue_are_the_control_planes(where: str) -> None:
    source = ROOT / "functions" / "lustrain_core" / "data" / "instance_types.json"
    assert (ROOT / where / "instance_types.json").read_text() == source.read_text(), (
        "run scripts/refresh_trainer_plan.py"
    )


def test_the_vocabulary_the_plan_counts_is_the_tokenizers() -> None:
    from lustrain_core.trainer import presets
    from lustrain_trainer.tokenizer import VOCAB_SIZE

    assert presets.VOCAB_SIZE == VOCAB_SIZE


def test_a_70b_model_on_too_few_p4d_is_refused_naming_the_count_that_fits() -> None:
    with pytest.raises(SpecInvalid) as info:
        plan(spec_with({"preset": "gpt-64b"}, 2))
    (error,) = [e for e in info.value.errors if e.path == "compute.instance_count"]
    assert "use at least 6 instances (the smallest count it fits)" in error.message
    assert "code.hyperparameters" in error.message and "GiB per GPU on 2 x ml.p4d.24xlarge" in error.message
    fits = plan(spec_with({"preset": "gpt-64b"}, 6))
    assert fits.memory is not None and fits.memory["fits"] == "yes"


def test_the_50_p4d_example_plans_its_model_and_its_checkpoint() -> None:
    memory = plan(load_spec_file(str(ROOT / "examples" / "p4d-50x-persistent.yaml"))).memory
    assert memory is not None
    assert memory["fits"] == "yes" and float(memory["stop_to_saved_s"]) < 120
    assert memory["world_size"] == "400"


def test_hyperparameters_as_sagemaker_passes_them_are_read_and_overrides_count() -> None:
    small = plan(spec_with({"preset": "6.4b", "batch-size": "1"}, 1)).memory
    assert small is not None and small["fits"] == "yes"
    # activations do not shrink with sharding: no fleet fits a micro-batch this large without recomputation
    with pytest.raises(SpecInvalid, match=r"no count of this instance type fits it, or change code\.hyperparameters"):
        plan(spec_with({"preset": "6.4b", "batch_size": "16", "activation_checkpointing": "false"}, 1))


def test_a_shard_group_that_does_not_divide_the_fleet_is_refused_at_its_field() -> None:
    with pytest.raises(SpecInvalid) as info:
        plan(spec_with({"preset": "gpt-64b", "shard_group": "24"}, 8))
    (error,) = info.value.errors
    assert error.path == "code.hyperparameters.shard_group"
    assert "shard group 24 does not divide the world size 64" in error.message


def test_no_preset_or_an_unknown_instance_type_plans_no_memory() -> None:
    assert plan(spec_with({"n_layer": "4"}, 1)).memory is None
    assert plan(spec_with({"preset": "gpt-64b"}, 1, "ml.g5.48xlarge")).memory is None


def test_a_renamed_preset_is_refused_before_anything_is_created_with_its_name_now() -> None:
    with pytest.raises(SpecInvalid) as refused:
        plan(spec_with({"preset": "70b"}, 50))
    (error,) = [e for e in refused.value.errors if e.path == "code.hyperparameters.preset"]
    assert "is now 'gpt-64b'" in error.message and "'llama2-70b'" in error.message


def test_llama2_70b_fits_50_p4d_with_its_published_parameter_count() -> None:
    fleet = plan(spec_with({"preset": "llama2-70b"}, 50))
    assert fleet.memory is not None and int(fleet.memory["parameters"]) == 68_976_648_192
    assert fleet.memory["fits"] == "yes"
