"""The trainer's model presets: shapes and training defaults by name.

Pure Python (no torch): lustrain's control plane reads the same table (a copy in functions/lustrain_core/trainer/,
kept equal by a test) to plan a spec's memory before anything is created.
"""

from __future__ import annotations

from typing import Any

# Model shapes follow GPT-3 (Brown et al., 2020, table 2.1). With a 257-token vocabulary instead of 50,257
# the embeddings are tiny, so each preset is named for its own parameter count (a test holds them to it).
# batch_size is per GPU per micro-step for an A100 40 GB; lr is the paper's for that width.
PRESETS: dict[str, dict[str, Any]] = {
    # The local default: learns visibly within a minute on two CPU cores. One thread per process, because
    # at this size OpenMP threads spend more time waiting on each other (and on a busy machine, on other
    # processes) than computing: measured 2-10x slower with two threads than with one.
    "tiny": {"n_layer": 2, "n_head": 4, "n_embd": 64, "seq_len": 64, "batch_size": 16, "lr": 3e-3,
             "max_steps": 600, "warmup_steps": 20, "log_interval": 10, "eval_interval": 100,
             "checkpoint_interval": 100, "eval_batches": 8, "cpu_threads": 1},
    "85m": {"n_layer": 12, "n_head": 12, "n_embd": 768, "seq_len": 1024, "batch_size": 16, "lr": 6e-4},
    "300m": {"n_layer": 24, "n_head": 16, "n_embd": 1024, "seq_len": 1024, "batch_size": 8, "lr": 3e-4},
    "680m": {"n_layer": 24, "n_head": 16, "n_embd": 1536, "seq_len": 2048, "batch_size": 4, "lr": 2.5e-4},
    "1.2b": {"n_layer": 24, "n_head": 32, "n_embd": 2048, "seq_len": 2048, "batch_size": 4, "lr": 2e-4,
             "activation_checkpointing": True},
    # From here a replica (16 bytes per parameter with Adam) outgrows an A100: fsdp auto shards it.
    "2.5b": {"n_layer": 32, "n_head": 32, "n_embd": 2560, "seq_len": 2048, "batch_size": 2, "lr": 1.6e-4,
             "activation_checkpointing": True},
    "6.4b": {"n_layer": 32, "n_head": 32, "n_embd": 4096, "seq_len": 2048, "batch_size": 1, "lr": 1.2e-4,
             "activation_checkpointing": True},
    # The depth, width and heads of a published model (PRESET_SOURCES) in this block (a 4x GELU MLP, full
    # multi-head attention) with a 257-token vocabulary: 13b holds 12.6 billion parameters, gpt-64b 64.5 billion
    # (Llama 2 70B's depth and width; Llama 2 70B's own shape is llama2-70b). lr and seq_len are Llama 2's
    # (Touvron et al., 2023, table 1).
    "13b": {"n_layer": 40, "n_head": 40, "n_embd": 5120, "seq_len": 4096, "batch_size": 1, "lr": 3e-4,
            "activation_checkpointing": True},
    "gpt-64b": {"n_layer": 80, "n_head": 64, "n_embd": 8192, "seq_len": 4096, "batch_size": 1, "lr": 1.5e-4,
                "activation_checkpointing": True},
    # The Llama block (arch llama: RMSNorm, rotary positions, SwiGLU, grouped-query attention) in published
    # shapes: each takes its model's layers, width, heads, key/value heads, FFN width, rope theta, tied or untied
    # embeddings and context (PRESET_SOURCES), and holds its published parameter count (a test holds it) with
    # its vocabulary. That vocabulary is only the plan's: a model's embedding rows are its data's tokenizer's
    # (a tokenizer.json of that vocabulary gives the published model's shape exactly). lr is the paper's where it
    # gives one (Llama 2: 3e-4 for 7B and 13B; Llama 3: 3e-4 for 8B, 1.5e-4 for 70B), 3e-4 for Llama 3.2's.
    # Llama 3.1's and 3.2's rotary scaling (for 128K-token contexts: factor 8 for 3.1, 32 for 3.2, low and high
    # frequency factors 1 and 4 over an original context of 8,192) is their config.json's, so that their
    # published weights give their published logits; these presets train at Llama 3's 8,192 tokens.
    "llama-tiny": {"arch": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 64, "ffn_hidden": 176,
                   "seq_len": 64, "rope_theta": 10000.0, "tie_embeddings": True, "batch_size": 16, "lr": 3e-3,
                   "max_steps": 600, "warmup_steps": 20, "log_interval": 10, "eval_interval": 100,
                   "checkpoint_interval": 100, "eval_batches": 8, "cpu_threads": 1},
    "llama3.2-1b": {"arch": "llama", "n_layer": 16, "n_head": 32, "n_kv_head": 8, "n_embd": 2048,
                    "ffn_hidden": 8192, "seq_len": 8192, "rope_theta": 500000.0, "rope_scaling_factor": 32.0,
                    "tie_embeddings": True,
                    "vocab_size": 128256, "batch_size": 1, "lr": 3e-4, "activation_checkpointing": True},
    "llama3.2-3b": {"arch": "llama", "n_layer": 28, "n_head": 24, "n_kv_head": 8, "n_embd": 3072,
                    "ffn_hidden": 8192, "seq_len": 8192, "rope_theta": 500000.0, "rope_scaling_factor": 32.0,
                    "tie_embeddings": True,
                    "vocab_size": 128256, "batch_size": 1, "lr": 3e-4, "activation_checkpointing": True},
    "llama3.1-8b": {"arch": "llama", "n_layer": 32, "n_head": 32, "n_kv_head": 8, "n_embd": 4096,
                    "ffn_hidden": 14336, "seq_len": 8192, "rope_theta": 500000.0, "rope_scaling_factor": 8.0,
                    "tie_embeddings": False,
                    "vocab_size": 128256, "batch_size": 1, "lr": 3e-4, "activation_checkpointing": True},
    "llama3.1-70b": {"arch": "llama", "n_layer": 80, "n_head": 64, "n_kv_head": 8, "n_embd": 8192,
                     "ffn_hidden": 28672, "seq_len": 8192, "rope_theta": 500000.0, "rope_scaling_factor": 8.0,
                     "tie_embeddings": False,
                     "vocab_size": 128256, "batch_size": 1, "lr": 1.5e-4, "activation_checkpointing": True},
    "llama2-7b": {"arch": "llama", "n_layer": 32, "n_head": 32, "n_kv_head": 32, "n_embd": 4096,
                  "ffn_hidden": 11008, "seq_len": 4096, "rope_theta": 10000.0, "tie_embeddings": False,
                  "vocab_size": 32000, "batch_size": 1, "lr": 3e-4, "activation_checkpointing": True},
    "llama2-13b": {"arch": "llama", "n_layer": 40, "n_head": 40, "n_kv_head": 40, "n_embd": 5120,
                   "ffn_hidden": 13824, "seq_len": 4096, "rope_theta": 10000.0, "tie_embeddings": False,
                   "vocab_size": 32000, "batch_size": 1, "lr": 3e-4, "activation_checkpointing": True},
    "llama2-70b": {"arch": "llama", "n_layer": 80, "n_head": 64, "n_kv_head": 8, "n_embd": 8192,
                   "ffn_hidden": 28672, "seq_len": 4096, "rope_theta": 10000.0, "tie_embeddings": False,
                   "vocab_size": 32000, "batch_size": 1, "lr": 1.5e-4, "activation_checkpointing": True},
}
#: presets that were renamed, and their names now: a run that names the old one is refused with the new one named
RENAMED = {"70b": "gpt-64b"}


def renamed(name: str) -> str:
    """Why a renamed preset is refused, naming the one to use (the trainer's and the planner's words alike)."""
    return (f"{name!r} is now {RENAMED[name]!r} (the same GPT block, named for its parameter count; Llama 2 70B's own "
            "shape is 'llama2-70b')")
#: the presets that take a published model's shape, and which: the GPT block's take its depth, width and heads;
#: the Llama block's its whole shape (the Hugging Face config.json of each model, meta-llama/<name>, and the papers)
PRESET_SOURCES = {
    "13b": "Llama 2 13B (Touvron et al., 2023): 40 layers, d_model 5120, 40 heads",
    "gpt-64b": "Llama 2 70B (Touvron et al., 2023): 80 layers, d_model 8192, 64 heads",
    "llama3.2-1b": "Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json): 1.24B parameters",
    "llama3.2-3b": "Llama 3.2 3B (meta-llama/Llama-3.2-3B config.json): 3.21B parameters",
    "llama3.1-8b": "Llama 3.1 8B (Llama 3 Herd of Models, Dubey et al., 2024, table 3; meta-llama/Llama-3.1-8B "
                   "config.json): 8.03B parameters",
    "llama3.1-70b": "Llama 3.1 70B (Dubey et al., 2024, table 3; meta-llama/Llama-3.1-70B config.json): "
                    "70.6B parameters",
    "llama2-7b": "Llama 2 7B (Touvron et al., 2023; meta-llama/Llama-2-7b-hf config.json): 6.74B parameters",
    "llama2-13b": "Llama 2 13B (Touvron et al., 2023; meta-llama/Llama-2-13b-hf config.json): 13.0B parameters",
    "llama2-70b": "Llama 2 70B (Touvron et al., 2023, grouped-query attention with 8 key/value heads; "
                  "meta-llama/Llama-2-70b-hf config.json): 69.0B parameters",
}

#: the byte tokenizer's vocabulary (tokenizer.VOCAB_SIZE; a test holds them equal): the plan's embedding rows for a
#: preset that names no vocabulary of its own
VOCAB_SIZE = 257
#: the shape and layout hyperparameters a plan reads, with the trainer's defaults where a preset leaves them
PLAN_DEFAULTS: dict[str, Any] = {"activation_checkpointing": False, "fsdp": "auto", "shard_group": 0,
                                 "precision": "auto", "arch": "gpt", "n_kv_head": 0, "ffn_hidden": 0,
                                 "tie_embeddings": True}
_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


def plan_inputs(hyperparameters: dict[str, Any]) -> dict[str, Any] | None:
    """The shape and layout a run's hyperparameters give, when they name one of the presets ("preset"; dashes or
    underscores, strings as SageMaker passes them); None otherwise, or where a value is not one the trainer would
    take (it refuses those itself, at start). n_kv_head and ffn_hidden 0 are the block's defaults (plan.Shape)."""
    given = {str(key).replace("-", "_"): value for key, value in hyperparameters.items()}
    name = str(given.get("preset", ""))
    if name not in PRESETS:
        return None
    values = {**PLAN_DEFAULTS, **PRESETS[name]}
    try:
        for key in ("n_layer", "n_head", "n_embd", "seq_len", "batch_size", "shard_group", "n_kv_head", "ffn_hidden"):
            values[key] = int(float(given.get(key, values[key])))
        for key in ("activation_checkpointing", "tie_embeddings"):
            raw = str(given.get(key, values[key])).strip().lower()
            if raw not in _TRUE | _FALSE:
                return None
            values[key] = raw in _TRUE
        for key in ("fsdp", "precision", "arch"):
            values[key] = str(given.get(key, values[key])).strip().lower()
    except (TypeError, ValueError):
        return None
    if values["arch"] not in ("gpt", "llama"):
        return None
    values["preset"] = name
    # the preset's planning vocabulary (its published model's), else the byte tokenizer's
    values["vocab_size"] = int(PRESETS[name].get("vocab_size", VOCAB_SIZE))
    return values
