"""The memory plan: what a rank holds to train each preset, on which fleet it fits, and how long a checkpoint
and a stop take, by the numbers (no model is built)."""

from __future__ import annotations

import pytest
from lustrain_trainer import plan
from lustrain_trainer.hparams import PRESETS, parse

GIB = plan.GIB


def plan_of(preset: str, world: int, **kw: object) -> plan.Plan:
    hp, _, _ = parse(["--preset", preset], {})
    return plan.plan(hp.plan_shape(), batch_size=hp.batch_size, activation_checkpointing=hp.activation_checkpointing,
                     world_size=world, **kw)  # type: ignore[arg-type]


def test_a_70b_model_does_not_fit_one_p4d_and_fits_50_with_replicas_of_whole_hosts() -> None:
    assert not plan_of("gpt-64b", 8).fits
    fleet = plan_of("gpt-64b", 400)
    assert fleet.fits and fleet.fsdp and fleet.shard % 8 == 0 and fleet.replicas * fleet.shard == 400
    # its state alone is 16 bytes a parameter: 1 TB over the shard group
    state = fleet.parameter_bytes + fleet.gradient_bytes + fleet.optimizer_bytes
    assert abs(state - 16 * fleet.parameters / fleet.shard) < 4
    assert fleet.peak_bytes < 0.92 * 40 * GIB
    assert fleet.stop_to_saved_s < plan.SAGEMAKER_STOP_GRACE_S


def test_the_shard_group_is_the_smallest_that_fits() -> None:
    small, large = plan_of("1.2b", 16), plan_of("6.4b", 16)
    assert (small.fsdp, small.shard) == (False, 1)  # a whole replica fits a GPU: DDP
    assert large.fsdp and large.shard <= 8  # a 6.4b replica fits within one host
    too_small = plan_of("6.4b", 16, fsdp=True, shard=2)
    assert not too_small.fits and plan.choose_shard(
        parse(["--preset", "6.4b"], {})[0].plan_shape(), batch_size=1, activation_checkpointing=True, world_size=16,
        bf16=True, hardware=plan.INSTANCES["ml.p4d.24xlarge"]) == large.shard


@pytest.mark.parametrize("preset", [name for name in PRESETS if name != "tiny"])
def test_every_preset_fits_some_p4d_fleet_and_stops_within_sagemakers_grace(preset: str) -> None:
    from lustrain_trainer import presets

    hosts = plan.smallest_fitting_count(presets.plan_inputs({"preset": preset}) or {}, "ml.p4d.24xlarge")
    assert hosts is not None
    fitting = plan_of(preset, hosts * 8)
    assert fitting.fits and (hosts == 1 or not plan_of(preset, (hosts - 1) * 8).fits)
    assert fitting.stop_to_saved_s < plan.SAGEMAKER_STOP_GRACE_S, fitting.lines()


def test_activation_checkpointing_keeps_one_layer_in_full() -> None:
    hp, _, _ = parse(["--preset", "6.4b"], {})
    kept = plan.plan(hp.plan_shape(), batch_size=1, activation_checkpointing=True, world_size=8, fsdp=True, shard=8)
    full = plan.plan(hp.plan_shape(), batch_size=1, activation_checkpointing=False, world_size=8, fsdp=True, shard=8)
    assert full.activation_bytes > 10 * kept.activation_bytes
    assert full.peak_bytes - kept.peak_bytes == full.activation_bytes - kept.activation_bytes


def test_a_shard_group_that_does_not_divide_the_world_is_refused() -> None:
    with pytest.raises(ValueError, match="shard group 3 does not divide the world size 8"):
        plan_of("6.4b", 8, fsdp=True, shard=3)


def test_a_dry_run_refuses_a_world_of_no_ranks_and_an_instance_type_it_does_not_know(
        capsys: pytest.CaptureFixture[str]) -> None:
    from lustrain_trainer.trainer import main

    assert main(["--preset", "gpt-64b", "--dry_run", "--world_size", "0"]) == 2
    assert "--world_size 0 is not allowed (use a number of ranks, 1 or more)" in capsys.readouterr().err
    assert main(["--preset", "gpt-64b", "--dry_run", "--instance_type", "ml.g5.48xlarge"]) == 2
    assert "'ml.g5.48xlarge' is not one the plan knows (use ml.p4d.24xlarge" in capsys.readouterr().err
    assert main(["--preset", "gpt-64b", "--dry_run", "--world_size", "16", "--shard_group", "3"]) == 2
    assert "hyperparameter shard_group: shard group 3 does not divide the world size 16" in capsys.readouterr().err


def test_mfu_is_measured_against_the_gpus_bf16_peak() -> None:
    assert plan.peak_tflops("NVIDIA A100-SXM4-40GB") == 312.0
    assert plan.peak_tflops("NVIDIA H100 80GB HBM3") == plan.peak_tflops("NVIDIA H200") == 989.0
    assert plan.peak_tflops("cpu") is None


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_a_layers_activations_are_what_autograd_saves(arch: str) -> None:
    """The plan's activation bytes per token and unit of width for one block, against the bytes of every tensor
    autograd keeps for the backward pass of a real block (fp32 here: half as many in 16-bit)."""
    import torch
    from lustrain_trainer.model import GPTConfig, LlamaConfig, build, rotary

    shape = plan.Shape(n_layer=1, n_embd=256, n_head=4, seq_len=64, vocab_size=257, arch=arch, n_kv_head=2,
                       ffn_hidden=704, tie_embeddings=True)
    config = (LlamaConfig(n_layer=1, n_head=4, n_kv_head=2, n_embd=256, ffn_hidden=704, seq_len=64)
              if arch == "llama" else GPTConfig(n_layer=1, n_head=4, n_embd=256, seq_len=64))
    block = build(config).blocks[0]
    weights = {p.untyped_storage().data_ptr() for p in block.parameters()}
    saved: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in weights:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(2, 64, 256, requires_grad=True)
    extra = rotary(config, 64, x.device) if isinstance(config, LlamaConfig) else ()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        block(x, *extra)
    measured = sum(saved.values()) / 2 / (2 * 64 * 256)
    assert abs(shape.activation_bytes_per_token_width / measured - 1) < 0.15, measured
