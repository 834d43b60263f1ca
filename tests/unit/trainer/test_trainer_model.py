"""The GPT model, checkpoints on disk, and the metric line with its SageMaker MetricDefinitions."""

from __future__ import annotations

import ast
import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch
from lustrain_trainer import checkpoint
from lustrain_trainer.hparams import parse
from lustrain_trainer.metrics import format_line, metric_definitions
from lustrain_trainer.model import GPT, GPTConfig, LlamaConfig, build, config_from_dict
from lustrain_trainer.trainer import make_optimizer

TRAINER = Path(__file__).resolve().parents[3] / "trainer"
SMALL = GPTConfig(n_layer=2, n_head=2, n_embd=16, seq_len=8)
#: the Llama block at the same size: grouped-query attention (2 query heads, 1 key/value head), an untied head
SMALL_LLAMA = LlamaConfig(n_layer=2, n_head=2, n_kv_head=1, n_embd=16, ffn_hidden=40, seq_len=8)


def test_an_untrained_model_predicts_every_byte_about_equally() -> None:
    torch.manual_seed(0)
    model = GPT(SMALL)
    idx, targets = torch.randint(0, SMALL.vocab_size, (2, 3, 8))
    assert model(idx).shape == (3, 8, SMALL.vocab_size)
    assert model(idx, targets).item() == pytest.approx(math.log(SMALL.vocab_size), abs=0.1)


@pytest.mark.parametrize("config", [SMALL, SMALL_LLAMA], ids=["gpt", "llama"])
def test_activation_checkpointing_changes_memory_not_results(config: GPTConfig | LlamaConfig) -> None:
    torch.manual_seed(0)
    plain, recomputed = build(config), build(config, activation_checkpointing=True)
    recomputed.load_state_dict(plain.state_dict())
    idx = torch.randint(0, config.vocab_size, (2, 8))
    for model in (plain, recomputed):
        model(idx, idx).backward()
    for (name, p), q in zip(plain.named_parameters(), recomputed.parameters(), strict=True):
        assert p.grad is not None and torch.allclose(p.grad, q.grad, atol=1e-6), name


def test_the_llama_block_is_causal_rotary_and_grouped() -> None:
    """A token's logits depend on no later token; shifting a whole sequence's positions changes nothing but what
    rotary positions make relative (attention sees only offsets); k and v are n_kv_head heads wide."""
    torch.manual_seed(0)
    model = build(SMALL_LLAMA).eval()
    idx = torch.randint(0, SMALL_LLAMA.vocab_size, (1, 8))
    changed = idx.clone()
    changed[0, 5:] = (changed[0, 5:] + 1) % SMALL_LLAMA.vocab_size
    torch.testing.assert_close(model(idx)[0, :5], model(changed)[0, :5])
    assert not torch.allclose(model(idx)[0, 5:], model(changed)[0, 5:])
    attention = model.blocks[0].self_attn  # type: ignore[union-attr]
    assert attention.k_proj.weight.shape == (8, 16) and attention.q_proj.weight.shape == (16, 16)
    assert model.head.weight is not model.wte.weight
    assert config_from_dict(SMALL_LLAMA.to_dict()) == SMALL_LLAMA
    # a config written before arch existed is a GPT's
    assert config_from_dict({k: v for k, v in SMALL.to_dict().items() if k != "arch"}) == SMALL
    with pytest.raises(ValueError, match="arch 'rwkv' is not one this trainer builds"):
        config_from_dict({**SMALL.to_dict(), "arch": "rwkv"})


def test_generate_continues_a_prompt_and_refuses_a_context_too_long() -> None:
    model = GPT(SMALL).eval()
    out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=10, temperature=0.8, top_k=5,
                         generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, 13) and out[0, :3].tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="longer than the model's seq_len 8"):
        model(torch.zeros((1, 9), dtype=torch.long))


def test_a_config_round_trips_and_unknown_keys_are_named() -> None:
    assert GPTConfig.from_dict(SMALL.to_dict()) == SMALL
    with pytest.raises(ValueError, match=r"unknown keys \['n_experts'\]"):
        GPTConfig.from_dict({**SMALL.to_dict(), "n_experts": 8})


def trained_state(steps: int) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(SMALL)
    hp, _, _ = parse([], {})
    optimizer = make_optimizer(model, hp, torch.device("cpu"))
    for _ in range(steps):
        idx = torch.randint(0, SMALL.vocab_size, (2, 8))
        model(idx, idx).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def save(directory: Path, step: int, model: GPT, optimizer: torch.optim.Optimizer) -> Path:
    path = checkpoint.checkpoint_path(directory, step)
    state = checkpoint.optimizer_state_by_name(model, optimizer)
    checkpoint.save_atomic(checkpoint.make_payload(step, model.state_dict(), state, SMALL.to_dict(), {}), path)
    return path


def test_the_newest_good_checkpoint_wins_and_corrupt_ones_are_set_aside(tmp_path: Path) -> None:
    model, optimizer = trained_state(2)
    good = save(tmp_path, 10, model, optimizer)
    partial = checkpoint.checkpoint_path(tmp_path, 20)
    partial.write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # a copy cut short
    checkpoint.checkpoint_path(tmp_path, 30).write_bytes(b"not a checkpoint at all")
    misnamed = save(tmp_path, 40, model, optimizer)
    misnamed.rename(checkpoint.checkpoint_path(tmp_path, 50))  # holds step 40, named 50
    (tmp_path / ".step-000000060.pt.tmp-123").write_bytes(b"a write that never finished")
    messages: list[str] = []

    loaded = checkpoint.load_latest(tmp_path, messages.append)

    assert loaded is not None and loaded.step == 10 and loaded.path == good
    assert [m.split(" (")[0] for m in messages] == [
        "skipping checkpoint step-000000050.pt", "skipping checkpoint step-000000030.pt",
        "skipping checkpoint step-000000020.pt"]
    assert "holds step 40 but is named for step 50" in messages[0]
    assert sorted(p.name for p in tmp_path.glob("*.corrupt")) == [
        "step-000000020.pt.corrupt", "step-000000030.pt.corrupt", "step-000000050.pt.corrupt"]
    assert checkpoint.load_latest(tmp_path, messages.append).step == 10  # type: ignore[union-attr]


def test_saving_leaves_no_temporary_files_and_prune_keeps_the_newest(tmp_path: Path) -> None:
    model, optimizer = trained_state(1)
    for step in (5, 10, 15):
        save(tmp_path, step, model, optimizer)
    assert [p.name for p in checkpoint.prune(tmp_path, keep=2)] == ["step-000000005.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000010.pt", "step-000000015.pt"]


def test_optimizer_state_keyed_by_name_restores_the_exact_state() -> None:
    model, optimizer = trained_state(3)
    by_name = checkpoint.optimizer_state_by_name(model, optimizer)
    assert set(by_name["state"]) == {name for name, _ in model.named_parameters()}
    fresh_model, fresh_optimizer = trained_state(0)
    fresh_optimizer.load_state_dict(checkpoint.optimizer_state_by_id(fresh_model, fresh_optimizer, by_name))
    for before, after in zip(optimizer.state.values(), fresh_optimizer.state.values(), strict=True):
        assert torch.equal(before["exp_avg_sq"], after["exp_avg_sq"])


def test_metric_definitions_file_is_generated_from_the_log_format() -> None:
    shipped = json.loads((TRAINER / "metric_definitions.json").read_text())
    assert shipped == metric_definitions(), "regenerate: python -m lustrain_trainer.metrics > trainer/..."


def test_each_metric_regex_reads_its_own_value_from_a_log_line() -> None:
    line = format_line(120, {"train_loss": 2.34567, "tokens_per_s": 15234.25, "lr": 0.00286, "val_loss": 2.4})
    assert line == "step=120 train_loss=2.3457 tokens_per_s=15234.2 lr=2.860e-03 val_loss=2.4000"
    found = {d["Name"]: float(m.group(1)) for d in metric_definitions() if (m := re.search(d["Regex"], line))}
    assert found == {"step": 120, "train_loss": 2.3457, "tokens_per_s": 15234.2, "lr": 0.00286, "val_loss": 2.4}
    regex = {d["Name"]: d["Regex"] for d in metric_definitions()}
    assert re.search(regex["lr"], "min_lr=1.0") is None
    # the line each attempt starts with: where it resumed, which the control plane reads as a metric
    start = format_line(100, {"resumed_from": 100})
    assert start == "step=100 resumed_from=100"
    assert float(re.search(regex["resumed_from"], start).group(1)) == 100  # type: ignore[union-attr]


def test_the_trainer_imports_nothing_of_the_control_plane() -> None:
    allowed = {"torch", "numpy", "lustrain_trainer"}
    # imported inside the functions of data preparation alone (a BPE, a tokenizer.json from S3), never by training
    lazy = {"tokenizers", "boto3", "botocore"}
    imported, lazily = set(), set()
    # export.py writes safetensors (a dependency of lustrain): only export.py imports it, and no module imports
    # export.py but inside a function of generate (SageMaker's training image need not have safetensors)
    for path in TRAINER.rglob("*.py"):
        top_level = ast.parse(path.read_text()).body
        assert not [n for n in top_level if isinstance(n, ast.ImportFrom) and n.module == "export"], path
    for path in TRAINER.rglob("*.py"):
        if path.name == "export.py":
            continue
        tree = ast.parse(path.read_text())
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            names = set()
            if isinstance(node, ast.Import):
                names = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = {node.module.split(".")[0]}
            # stopping.py reads the run's stop request with boto3, which SageMaker's PyTorch image ships (its
            # training toolkit depends on it), inside a function: a run with no stop request never imports it
            lazy_ok = ("prepare.py", "tokenizer.py", "stopping.py")
            (imported if id(node) in top or path.name not in lazy_ok else lazily).update(names)
    third_party = {name for name in imported if name not in sys.stdlib_module_names}
    assert third_party <= allowed, third_party - allowed
    assert {name for name in lazily if name not in sys.stdlib_module_names} <= allowed | lazy


def test_initialisation_is_the_same_whatever_part_of_a_matrix_a_rank_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank initialises only the rows of its shard, drawn chunk by chunk from generators keyed by
    (seed, parameter, chunk): any cut of the rows gives the same weights as the whole model built at once."""
    for config in (GPTConfig(n_layer=2, n_head=2, n_embd=24, seq_len=8),
                   LlamaConfig(n_layer=2, n_head=2, n_kv_head=1, n_embd=24, ffn_hidden=72, seq_len=8)):
        _assert_init_is_the_same_whatever_rows_a_rank_holds(config, monkeypatch)


def _assert_init_is_the_same_whatever_rows_a_rank_holds(config: GPTConfig | LlamaConfig,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from lustrain_trainer import model as model_module

    whole = build(config)
    model_module.init_weights(whole, seed=3)
    for cut in (1, 7, model_module.INIT_ROWS + 5):
        parts = {}
        for first in (0, cut):
            part = build(config)

            def holds(p: torch.Tensor, first: int = first, cut: int = cut) -> tuple[torch.Tensor, int]:
                rows = p.data[first:cut] if first == 0 else p.data[cut:]
                return rows, first

            monkeypatch.setattr(model_module, "local_part", holds)
            model_module.init_weights(part, seed=3)
            parts[first] = part.state_dict()
        monkeypatch.undo()
        for name, tensor in whole.state_dict().items():
            assert torch.equal(tensor[:cut], parts[0][name][:cut]) and torch.equal(tensor[cut:], parts[cut][name][cut:])
    other = build(config)
    model_module.init_weights(other, seed=4)
    matrix = next(name for name, p in whole.named_parameters() if p.dim() == 2 and name.startswith("blocks.0"))
    assert not torch.equal(other.get_parameter(matrix), whole.get_parameter(matrix))


def test_a_model_built_on_meta_holds_no_memory_until_materialised() -> None:
    with torch.device("meta"):
        model = GPT(GPTConfig(n_layer=80, n_head=64, n_embd=8192, seq_len=4096))  # the 70b preset's shape
        llama = build(LlamaConfig(n_layer=80, n_head=64, n_kv_head=8, n_embd=8192, ffn_hidden=28672, seq_len=8192,
                                  vocab_size=128256, rope_theta=500000.0))  # llama3.1-70b's
    assert all(p.is_meta for p in model.parameters()) and model.head.weight is model.wte.weight
    assert all(p.is_meta for p in llama.parameters()) and llama.head.weight is not llama.wte.weight
    assert not list(llama.buffers())  # rotary positions are computed, not held: nothing left uninitialised


def test_efa_defaults_fill_only_what_the_launcher_and_the_spec_left_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    from lustrain_trainer import distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    env = {"SM_CURRENT_INSTANCE_TYPE": "ml.p4d.24xlarge", "FI_PROVIDER": "efa", "NCCL_SOCKET_IFNAME": "eth0"}
    added = distributed.apply_network_defaults(env)
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and "NCCL_SOCKET_IFNAME" not in added  # SageMaker's (or the spec's)
    assert added["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and "FI_PROVIDER" not in added
    assert distributed.apply_network_defaults({"SM_CURRENT_INSTANCE_TYPE": "ml.g5.2xlarge"}) == {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert distributed.apply_network_defaults({"SM_CURRENT_INSTANCE_TYPE": "ml.p4d.24xlarge"}) == {}


def test_a_rank_whose_host_has_a_checkpoint_directory_of_its_own_prunes_its_own_shards(tmp_path: Path) -> None:
    """On SageMaker each host writes /opt/ml/checkpoints locally and only rank 0's holds the manifests: every other
    rank removes its own shards of the checkpoints no longer kept, and writes no manifest."""
    model = GPT(SMALL)
    saver = checkpoint.Checkpointer(tmp_path, rank=1, world_size=1, keep=1, log=lambda _: None)
    for step in (1, 2, 3):
        saver.save(step, {"model": model.state_dict()}, {"run": None, "model_config": {}}, "ab", "test")
        saver.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000003-ab"]
    assert saver.committed_step == 3
