"""A trained model directory (model.pt and config.json, what train.py writes) as a Hugging Face model directory.

    python -m lustrain_trainer.export MODEL_DIR -o OUT_DIR [--dtype float32|bfloat16] [--max-shard-gib 5]

OUT_DIR then holds what `transformers` loads with from_pretrained, without lustrain:

- config.json: a LlamaConfig (model_type llama, LlamaForCausalLM) for arch llama, a GPT2Config (gpt2,
  GPT2LMHeadModel) for arch gpt, each field mapped from ours;
- model.safetensors, or model-0000k-of-0000n.safetensors shards with model.safetensors.index.json (Hugging Face's
  layout) once the weights pass --max-shard-gib;
- the tokenizer: the model directory's tokenizer.json (a BPE or file tokenizer the trainer copied there) with a
  tokenizer_config.json naming its end-of-document token; for the byte tokenizer, a tokenizer.json written here
  that gives each byte its own id and the end-of-document token id 256 (a byte-level BPE with no merges);
- lustrain.json: this trainer's model config and tokenizer info, so that `generate` reads the export exactly.

The weights map one to one, so the logits are ours (a test loads both blocks in transformers and compares):
- Llama: our block already uses Hugging Face's names inside a layer (self_attn.q_proj, mlp.gate_proj,
  input_layernorm...) and its rotary layout (rotate-half: channel i turns with i + head_dim/2), so q and k need
  no permutation; only the outer names change (wte -> model.embed_tokens, blocks -> model.layers, ln_f ->
  model.norm, head -> lm_head, absent when tied).
- GPT: GPT-2's Conv1D keeps its weight as (in, out), the transpose of our Linear's; its LayerNorms and Conv1Ds
  have biases where ours have none (exported as zeros); our GELU is the exact one (activation "gelu", not GPT-2's
  tanh "gelu_new"); the head is tied to wte.

Imports safetensors (a dependency of lustrain, not of training: the trainer never imports this module) and never
transformers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .model import (
    CONFIG_FILE,
    LLAMA3_SCALING_KEYS,
    MODEL_FILE,
    GPTConfig,
    LlamaConfig,
    ModelConfig,
    config_from_dict,
)

#: Hugging Face's names for the weights files and the index of a sharded set (transformers' constants)
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
#: this trainer's own description of an export (model config and tokenizer info), beside Hugging Face's
LUSTRAIN_FILE = "lustrain.json"
#: transformers' default max_shard_size for save_pretrained
DEFAULT_MAX_SHARD_BYTES = 5 * 1000**3
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: the end-of-document token's text in a tokenizer.json written for the byte tokenizer
BYTE_EOS_TEXT = "<|endoftext|>"


class ExportError(ValueError):
    """The model directory cannot be exported; the message names the file or field and why."""


def read_model_dir(model_dir: Path) -> tuple[ModelConfig, dict[str, Any]]:
    """The model's config and the whole config.json of a model directory train.py wrote."""
    config_path, weights_path = model_dir / CONFIG_FILE, model_dir / MODEL_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise ExportError(
                f"{path} not found: a model directory holds {MODEL_FILE} and {CONFIG_FILE} from train.py"
            )
    saved = json.loads(config_path.read_text())
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
        raise ExportError(f'{config_path}: no "model" config (is this a model directory of train.py?)')
    try:
        return config_from_dict(saved["model"]), saved
    except (TypeError, ValueError) as exc:
        raise ExportError(f"{config_path}: model: {exc}") from exc


def hf_config(config: ModelConfig, tokenizer: dict[str, Any], dtype: str) -> dict[str, Any]:
    """Hugging Face's config.json for our config: LlamaConfig's or GPT2Config's fields."""
    eos = tokenizer.get("eos")
    common = {
        "vocab_size": config.vocab_size,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "torch_dtype": dtype,
        "use_cache": True,
    }
    if isinstance(config, LlamaConfig):
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **common,
            "hidden_size": config.n_embd,
            "intermediate_size": config.ffn_hidden,
            "num_hidden_layers": config.n_layer,
            "num_attention_heads": config.n_head,
            "num_key_value_heads": config.n_kv_head,
            "head_dim": config.head_dim,
            "max_position_embeddings": config.seq_len,
            "rms_norm_eps": config.norm_eps,
            "hidden_act": "silu",
            # transformers 5 reads rope_parameters, earlier versions rope_theta and rope_scaling: Llama 3's scaling
            # where the model has it, else none
            "rope_theta": config.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta}
            if config.rope_scaling is None
            else {**config.rope_scaling, "rope_theta": config.rope_theta},
            "rope_scaling": None if config.rope_scaling is None else dict(config.rope_scaling),
            "tie_word_embeddings": config.tie_embeddings,
            "attention_bias": False,
            "mlp_bias": False,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
        }
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        **common,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_positions": config.seq_len,
        "n_inner": 4 * config.n_embd,
        "activation_function": "gelu",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
    }


def hf_tensors(config: ModelConfig, state: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """Our state dict's tensors under Hugging Face's names, in its layout (one at a time: a large model's
    model.pt is memory-mapped, and only the tensor being written is read)."""
    if isinstance(config, LlamaConfig):
        outer = {
            "wte.": "model.embed_tokens.",
            "blocks.": "model.layers.",
            "ln_f.": "model.norm.",
            "head.": "lm_head.",
        }
        for name, tensor in state.items():
            if name == "head.weight" and config.tie_embeddings:
                continue
            prefix = next((p for p in outer if name.startswith(p)), None)
            if prefix is None:
                raise ExportError(f"model.pt: weight {name!r} is not one of the Llama block's")
            yield outer[prefix] + name[len(prefix) :], tensor
        return
    d = config.n_embd
    for name, tensor in state.items():
        if name == "head.weight":
            continue  # tied to wte (GPT2LMHeadModel ties lm_head to transformer.wte)
        if name in ("wte.weight", "wpe.weight", "ln_f.weight"):
            yield f"transformer.{name}", tensor
            if name == "ln_f.weight":
                yield "transformer.ln_f.bias", torch.zeros(d, dtype=tensor.dtype)
            continue
        _, layer, rest = name.split(".", 2)
        prefix = f"transformer.h.{layer}."
        if rest in ("ln_1.weight", "ln_2.weight"):
            yield prefix + rest, tensor
            yield prefix + rest.replace("weight", "bias"), torch.zeros(d, dtype=tensor.dtype)
            continue
        target = {
            "attn.qkv.weight": "attn.c_attn",
            "attn.proj.weight": "attn.c_proj",
            "fc.weight": "mlp.c_fc",
            "proj.weight": "mlp.c_proj",
        }.get(rest)
        if target is None:
            raise ExportError(f"model.pt: weight {name!r} is not one of the GPT block's")
        yield prefix + target + ".weight", tensor.t()  # Conv1D: (in, out)
        yield prefix + target + ".bias", torch.zeros(tensor.shape[0], dtype=tensor.dtype)


def from_hf_tensors(config: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of hf_tensors: an export's tensors as our state dict (its zero biases dropped, checked zero)."""
    state: dict[str, torch.Tensor] = {}
    if isinstance(config, LlamaConfig):
        outer = {
            "model.embed_tokens.": "wte.",
            "model.layers.": "blocks.",
            "model.norm.": "ln_f.",
            "lm_head.": "head.",
        }
        for name, tensor in tensors.items():
            prefix = next((p for p in outer if name.startswith(p)), None)
            if prefix is None:
                raise ExportError(f"weight {name!r} is not one of LlamaForCausalLM's")
            state[outer[prefix] + name[len(prefix) :]] = tensor
        if config.tie_embeddings or "head.weight" not in state:
            state["head.weight"] = state["wte.weight"]
        return state
    ours = {"attn.c_attn": "attn.qkv", "attn.c_proj": "attn.proj", "mlp.c_fc": "fc", "mlp.c_proj": "proj"}
    for name, tensor in tensors.items():
        if name.endswith(".bias"):
            if torch.count_nonzero(tensor):
                raise ExportError(f"weight {name!r} is not zero: this trainer's GPT block has no biases")
            continue
        if name == "lm_head.weight":
            continue
        rest = name.removeprefix("transformer.")
        if rest.startswith("h."):
            _, layer, inner = rest.split(".", 2)
            module = inner.removesuffix(".weight")
            if module in ours:
                state[f"blocks.{layer}.{ours[module]}.weight"] = tensor.t()
            else:
                state[f"blocks.{layer}.{inner}"] = tensor
        else:
            state[rest] = tensor
    state["head.weight"] = state["wte.weight"]
    return state


def _shards(tensors: Iterator[tuple[str, torch.Tensor]], max_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """Tensors grouped into shards of at most max_bytes (a larger tensor alone in its own), in order."""
    shard: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > max_bytes:
            yield shard
            shard, size = {}, 0
        shard[name] = tensor
        size += nbytes
    if shard:
        yield shard


def write_weights(
    tensors: Iterator[tuple[str, torch.Tensor]], out: Path, dtype: torch.dtype, max_shard_bytes: int
) -> list[str]:
    """The tensors as safetensors files in out: one model.safetensors, or shards and their index when they pass
    max_shard_bytes. Returns the files written."""
    from safetensors.torch import save_file

    converted = ((name, tensor.to(dtype).contiguous()) for name, tensor in tensors)
    written: list[tuple[str, list[str]]] = []
    total = 0
    for k, shard in enumerate(_shards(converted, max_shard_bytes)):
        name = f".shard-{k:05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in shard.values())
        written.append((name, list(shard)))
    if len(written) == 1:
        (out / written[0][0]).rename(out / SAFETENSORS_FILE)
        return [SAFETENSORS_FILE]
    files, weight_map = [], {}
    for k, (name, keys) in enumerate(written, start=1):
        final = f"model-{k:05d}-of-{len(written):05d}.safetensors"
        (out / name).rename(out / final)
        files.append(final)
        weight_map.update(dict.fromkeys(keys, final))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return [*files, SAFETENSORS_INDEX]


def _byte_to_char() -> dict[int, str]:
    """The printable character byte-level BPE (GPT-2's scheme, Hugging Face's ByteLevel) writes for each byte:
    printable Latin-1 bytes stand for themselves, the others for code points from 256 up, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    mapping = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def byte_tokenizer_json(eos: int) -> dict[str, Any]:
    """A tokenizer.json for the byte tokenizer (token b is byte b, `eos` the end of a document): a byte-level BPE
    with no merges, so that transformers' tokenizers give the ids this model was trained on."""
    chars = _byte_to_char()
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": eos,
                "content": BYTE_EOS_TEXT,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {chars[b]: b for b in range(256)},
            "merges": [],
        },
    }


def _eos_text(tokenizer_json: dict[str, Any], eos: int | None) -> str | None:
    for token in tokenizer_json.get("added_tokens") or []:
        if token.get("id") == eos:
            return str(token["content"])
    vocab = (tokenizer_json.get("model") or {}).get("vocab") or {}
    return (
        next((str(text) for text, token_id in vocab.items() if token_id == eos), None)
        if eos is not None
        else None
    )


def write_tokenizer(model_dir: Path, out: Path, tokenizer: dict[str, Any], seq_len: int) -> list[str]:
    """The tokenizer's files: the model directory's tokenizer.json, or one written for the byte tokenizer, and a
    tokenizer_config.json (PreTrainedTokenizerFast, its end-of-document token)."""
    source = model_dir / TOKENIZER_FILE
    if source.is_file():
        shutil.copyfile(source, out / TOKENIZER_FILE)
        content = json.loads(source.read_text())
    elif tokenizer.get("kind", "bytes") == "bytes":
        content = byte_tokenizer_json(int(tokenizer.get("eos", 256)))
        (out / TOKENIZER_FILE).write_text(json.dumps(content, ensure_ascii=False, indent=2) + "\n")
    else:
        raise ExportError(
            f"{source} not found: the model was trained with a {tokenizer.get('kind')} tokenizer, "
            "whose tokenizer.json the trainer copies into the model directory"
        )
    eos_text = _eos_text(content, tokenizer.get("eos"))
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": seq_len,
        "clean_up_tokenization_spaces": False,
        # a special token's text is text, as the training data was encoded (lustrain_trainer.tokenizer)
        "split_special_tokens": True,
        **({"eos_token": eos_text} if eos_text else {}),
    }
    (out / TOKENIZER_CONFIG).write_text(json.dumps(settings, indent=2) + "\n")
    return [TOKENIZER_FILE, TOKENIZER_CONFIG]


def export(
    model_dir: Path, out: Path, dtype: str = "float32", max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
) -> list[str]:
    """Write the Hugging Face directory of model_dir into out (created; files of an earlier export replaced).
    Returns the files written."""
    if dtype not in DTYPES:
        raise ExportError(f"dtype {dtype!r} is not allowed (use {' | '.join(DTYPES)})")
    config, saved = read_model_dir(model_dir)
    tokenizer = saved.get("tokenizer") or {"kind": "bytes", "vocab_size": config.vocab_size, "eos": 256}
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("model*.safetensors"), out / SAFETENSORS_INDEX]:
        stale.unlink(missing_ok=True)
    # memory-mapped: a model larger than this machine's memory is read a tensor at a time
    state = torch.load(model_dir / MODEL_FILE, map_location="cpu", weights_only=True, mmap=True)
    files = write_weights(hf_tensors(config, state), out, DTYPES[dtype], max_shard_bytes)
    (out / CONFIG_FILE).write_text(json.dumps(hf_config(config, tokenizer, dtype), indent=2) + "\n")
    files.append(CONFIG_FILE)
    files += write_tokenizer(model_dir, out, tokenizer, config.seq_len)
    ours = {
        "model": config.to_dict(),
        "tokenizer": tokenizer,
        "trained_steps": saved.get("trained_steps"),
        "metrics": saved.get("metrics"),
    }
    (out / LUSTRAIN_FILE).write_text(json.dumps(ours, indent=2) + "\n")
    return [*files, LUSTRAIN_FILE]


def is_export(directory: Path) -> bool:
    return (directory / SAFETENSORS_FILE).is_file() or (directory / SAFETENSORS_INDEX).is_file()


def config_of_hf(hf: dict[str, Any]) -> ModelConfig:
    """Our config for a Hugging Face config.json of a LlamaForCausalLM or GPT2LMHeadModel (ours or another's)."""
    kind = hf.get("model_type")
    if kind == "llama":
        rope = hf.get("rope_parameters") or {}
        scaled = rope if rope.get("rope_type") == "llama3" else hf.get("rope_scaling") or {}
        scaled = {"rope_type": scaled.get("rope_type", scaled.get("type")), **scaled}  # older configs say "type"
        scaling = {key: scaled[key] for key in LLAMA3_SCALING_KEYS} if scaled["rope_type"] == "llama3" else None
        return LlamaConfig(
            n_layer=hf["num_hidden_layers"],
            n_head=hf["num_attention_heads"],
            n_kv_head=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            n_embd=hf["hidden_size"],
            ffn_hidden=hf["intermediate_size"],
            seq_len=hf["max_position_embeddings"],
            vocab_size=hf["vocab_size"],
            rope_theta=float(rope.get("rope_theta") or hf.get("rope_theta") or 10000.0),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_scaling=scaling,
        )
    if kind == "gpt2":
        return GPTConfig(
            n_layer=hf["n_layer"],
            n_head=hf["n_head"],
            n_embd=hf["n_embd"],
            seq_len=hf["n_positions"],
            vocab_size=hf["vocab_size"],
        )
    raise ExportError(f"config.json: model_type {kind!r} is not one this trainer reads (use llama | gpt2)")


def load_export(directory: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, Any] | None]:
    """An exported directory as (our config, our state dict, the tokenizer info lustrain.json records, if any)."""
    from safetensors import safe_open

    ours = (
        json.loads((directory / LUSTRAIN_FILE).read_text()) if (directory / LUSTRAIN_FILE).is_file() else {}
    )
    hf = json.loads((directory / CONFIG_FILE).read_text())
    config = config_from_dict(ours["model"]) if ours.get("model") else config_of_hf(hf)
    if (directory / SAFETENSORS_INDEX).is_file():
        index = json.loads((directory / SAFETENSORS_INDEX).read_text())
        files = sorted(set(index["weight_map"].values()))
    else:
        files = [SAFETENSORS_FILE]
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(directory / name), framework="pt") as weights:
            for key in weights.keys():  # noqa: SIM118 - safe_open has no __iter__
                # in the export's own type, as safetensors maps it (no copy until a page is read): a bfloat16 70B
                # export is its 140 GB on disk, not 280 GB of float32 in memory; the model computes in that type
                tensors[key] = weights.get_tensor(key)
    return config, from_hf_tensors(config, tensors), ours.get("tokenizer")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lustrain_trainer.export",
        description="Write a model directory of train.py as a Hugging Face directory.",
    )
    parser.add_argument("model_dir", metavar="MODEL_DIR", type=Path)
    parser.add_argument(
        "-o", "--output", type=Path, required=True, help="the Hugging Face directory to write"
    )
    parser.add_argument(
        "--dtype", default="float32", choices=list(DTYPES), help="the weights' type (default float32)"
    )
    parser.add_argument(
        "--max-shard-gib",
        type=float,
        default=DEFAULT_MAX_SHARD_BYTES / 2**30,
        help="the largest safetensors file before the weights are sharded (default 4.66, 5 GB)",
    )
    args = parser.parse_args(argv)
    if args.max_shard_gib <= 0:
        parser.error(f"--max-shard-gib {args.max_shard_gib}: use a size above 0")
    try:
        files = export(args.model_dir, args.output, args.dtype, int(args.max_shard_gib * 2**30))
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"exported {args.model_dir} to {args.output}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
