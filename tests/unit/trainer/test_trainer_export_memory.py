"""export and generate read a model through memory maps: a 70B model (140+ GB) is never held whole in host memory.

What is asserted is what the code touches: the tensors written to each safetensors shard, and the parameters of the
model generate samples from, lie in a mapping of model.pt (this process's /proc/self/maps), not in copies.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
from lustrain_trainer import export, generate
from lustrain_trainer.model import CONFIG_FILE, MODEL_FILE, LlamaConfig, build
from lustrain_trainer.tokenizer import TOKENIZER_INFO

CONFIG = LlamaConfig(
    n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48, seq_len=16, tie_embeddings=False
)

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads /proc/self/maps (Linux)")


def model_dir(root: Path) -> Path:
    torch.manual_seed(0)
    model = build(CONFIG).eval()
    root.mkdir(parents=True)
    torch.save(model.state_dict(), root / MODEL_FILE)
    (root / CONFIG_FILE).write_text(json.dumps({"model": CONFIG.to_dict(), "tokenizer": TOKENIZER_INFO}))
    return root


def mapped(path: Path) -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of `path`."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path.resolve()):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def inside(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    return any(start <= tensor.data_ptr() < end for start, end in ranges)


def test_export_writes_each_shard_from_the_mapped_model_one_shard_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = model_dir(tmp_path / "model")
    weights = source / MODEL_FILE
    calls: list[tuple[int, bool]] = []
    real_save = safetensors.torch.save_file

    def save_file(tensors: dict[str, torch.Tensor], filename: str, metadata: dict[str, str]) -> None:
        ranges = mapped(weights)
        calls.append(
            (
                sum(t.numel() * t.element_size() for t in tensors.values()),
                all(inside(t, ranges) for t in tensors.values()),
            )
        )
        real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    export.export(source, tmp_path / "hf", max_shard_bytes=20_000)

    # every tensor handed to the writer is a view of model.pt's mapping, and each call holds at most one shard
    assert len(calls) > 2 and all(from_map for _, from_map in calls)
    largest = max(p.numel() * 4 for p in build(CONFIG).parameters())
    assert all(nbytes <= max(20_000, largest) for nbytes, _ in calls)


def test_generate_samples_from_the_mapped_weights_not_a_copy(tmp_path: Path) -> None:
    source = model_dir(tmp_path / "model")
    model = generate.load_model(source)
    ranges = mapped(source / MODEL_FILE)
    parameters = list(model.parameters())
    assert ranges and parameters and all(inside(p, ranges) for p in parameters)
    ours = build(CONFIG).eval()
    ours.load_state_dict(torch.load(source / MODEL_FILE, weights_only=True))
    idx = torch.randint(0, CONFIG.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(idx), ours(idx), rtol=0, atol=0)
