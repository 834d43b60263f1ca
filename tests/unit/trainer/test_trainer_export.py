"""`export`: a model directory of train.py as a Hugging Face directory that transformers loads with our logits.

The only test module that imports transformers (a dev dependency: neither training nor lustrain needs it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lustrain_trainer import export, generate
from lustrain_trainer.model import CONFIG_FILE, MODEL_FILE, GPTConfig, LlamaConfig, build
from lustrain_trainer.tokenizer import TOKENIZER_INFO

transformers = pytest.importorskip("transformers")

#: grouped-query attention, an untied head and a rope base other than the default: each a field to map right
LLAMA = LlamaConfig(
    n_layer=2,
    n_head=4,
    n_kv_head=2,
    n_embd=32,
    ffn_hidden=48,
    seq_len=16,
    rope_theta=500000.0,
    tie_embeddings=False,
)
GPT = GPTConfig(n_layer=2, n_head=2, n_embd=32, seq_len=16)
#: Llama 3.1's rotary scaling, over an original context that puts the small model's 4 frequencies (wavelengths 6.3,
#: 63, 628 and 6,283 positions at theta 10,000) on all three sides: two kept (under 1024 / 4), one blended, one
#: divided by the factor (over 1024): transformers' own `llama3` rope type must agree
LLAMA3 = LlamaConfig(**{
    **LLAMA.to_dict(),
    "rope_theta": 10000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 1024},
})  # fmt: skip


def model_dir(root: Path, config: GPTConfig | LlamaConfig, seed: int = 0) -> tuple[Path, torch.nn.Module]:
    """A model directory as train.py writes it (model.pt, config.json), of a model with random weights: gains and
    all, so that a weight mapped to the wrong place shows in the logits."""
    torch.manual_seed(seed)
    model = build(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    root.mkdir(parents=True)
    torch.save(model.state_dict(), root / MODEL_FILE)
    (root / CONFIG_FILE).write_text(
        json.dumps(
            {"model": config.to_dict(), "tokenizer": TOKENIZER_INFO, "trained_steps": 3, "metrics": {}}
        )
    )
    return root, model


@pytest.mark.parametrize(
    ("config", "loader"),
    [(LLAMA, "LlamaForCausalLM"), (LLAMA3, "LlamaForCausalLM"), (GPT, "GPT2LMHeadModel")],
    ids=["llama", "llama3-rope-scaling", "gpt"],
)
def test_transformers_loads_the_export_with_our_logits(
    config: GPTConfig | LlamaConfig, loader: str, tmp_path: Path
) -> None:
    source, ours = model_dir(tmp_path / "model", config)
    out = tmp_path / "hf"
    # shards of at most 20 kB: several files and their index, as a large model's export has
    files = export.export(source, out, max_shard_bytes=20_000)
    assert export.SAFETENSORS_INDEX in files and sum(f.endswith(".safetensors") for f in files) > 2

    theirs = getattr(transformers, loader).from_pretrained(out).eval()
    assert type(theirs.config).__name__ == ("GPT2Config" if config is GPT else "LlamaConfig")
    idx = torch.randint(0, config.vocab_size, (2, config.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits, ours(idx), rtol=1e-5, atol=1e-5)
    if config is not GPT:
        assert theirs.config.num_key_value_heads == 2 and not theirs.config.tie_word_embeddings
    if config is LLAMA3:  # the scaling is transformers' own, not ignored: without it the logits differ
        assert theirs.config.rope_parameters["rope_type"] == "llama3"
        plain = build(LlamaConfig(**{**LLAMA3.to_dict(), "rope_scaling": None})).eval()
        plain.load_state_dict(ours.state_dict())
        with torch.no_grad():
            assert not torch.allclose(plain(idx), ours(idx), atol=1e-4)
        assert export.config_of_hf(json.loads((out / "config.json").read_text())) == LLAMA3

    # generate reads the export as it reads the model directory
    again = generate.load_model(out)
    with torch.no_grad():
        torch.testing.assert_close(again(idx), ours(idx), rtol=0, atol=0)


def test_the_byte_tokenizer_is_exported_as_one_transformers_reads_to_the_same_ids(tmp_path: Path) -> None:
    source, _ = model_dir(tmp_path / "model", replace_tie(LLAMA))
    out = tmp_path / "hf"
    export.export(source, out, dtype="bfloat16")
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = "def f(x):\n\treturn 'é' + x"
    assert tokenizer(text)["input_ids"] == list(text.encode("utf-8"))
    # a special token's text is text, as training read it: its bytes, never the end-of-document token
    special = "the end token is <|endoftext|>"
    assert tokenizer(special)["input_ids"] == list(special.encode("utf-8"))
    assert (
        tokenizer.eos_token_id == TOKENIZER_INFO["eos"] and tokenizer.decode(list(b"caf\xc3\xa9")) == "café"
    )
    hf = json.loads((out / CONFIG_FILE).read_text())
    assert (hf["torch_dtype"], hf["tie_word_embeddings"], hf["eos_token_id"]) == ("bfloat16", True, 256)
    assert "lm_head.weight" not in json.dumps(sorted(p.name for p in out.iterdir()))
    model = transformers.LlamaForCausalLM.from_pretrained(out)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("config", [LLAMA, GPT], ids=["llama", "gpt"])
def test_a_bfloat16_export_is_read_in_bfloat16_not_widened_and_samples_the_same_model(
    tmp_path: Path, config: GPTConfig | LlamaConfig
) -> None:
    # a 70B model's bfloat16 export is 140 GB: widened to float32 it would need 280 GB of memory to sample from
    source, ours = model_dir(tmp_path / "model", config)
    export.export(source, tmp_path / "hf", dtype="bfloat16")
    theirs = generate.load_model(tmp_path / "hf")
    assert {p.dtype for p in theirs.parameters()} == {torch.bfloat16}
    idx = torch.randint(0, config.vocab_size, (2, config.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).float(), ours(idx), rtol=0.05, atol=0.1)
    assert generate.sample(theirs, "def ", 8, 1.0, None, 0).startswith("def ")


def test_a_model_directory_without_weights_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    with pytest.raises(
        export.ExportError,
        match=r"config\.json not found: a model directory holds model\.pt and config\.json",
    ):
        export.export(tmp_path / "model", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def replace_tie(config: LlamaConfig) -> LlamaConfig:
    return LlamaConfig(**{**config.to_dict(), "tie_embeddings": True})
