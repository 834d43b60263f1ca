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
    # Named for the published model whose depth, width and heads they take (PRESET_SOURCES); with this block
    # (a 4x GELU MLP, full multi-head attention) and a 257-token vocabulary they hold somewhat fewer parameters
    # (13b: 12.6 billion, 70b: 64.4 billion). lr and seq_len are Llama 2's (Touvron et al., 2023, table 1).
    "13b": {"n_layer": 40, "n_head": 40, "n_embd": 5120, "seq_len": 4096, "batch_size": 1, "lr": 3e-4,
            "activation_checkpointing": True},
    "70b": {"n_layer": 80, "n_head": 64, "n_embd": 8192, "seq_len": 4096, "batch_size": 1, "lr": 1.5e-4,
            "activation_checkpointing": True},
}
#: the presets that take a published model's shape, and which
PRESET_SOURCES = {
    "13b": "Llama 2 13B (Touvron et al., 2023): 40 layers, d_model 5120, 40 heads",
    "70b": "Llama 2 70B (Touvron et al., 2023): 80 layers, d_model 8192, 64 heads",
}

#: the byte tokenizer's vocabulary (tokenizer.VOCAB_SIZE; a test holds them equal): every preset's embedding rows
VOCAB_SIZE = 257
#: the shape and layout hyperparameters a plan reads, with the trainer's defaults where a preset leaves them
PLAN_DEFAULTS: dict[str, Any] = {"activation_checkpointing": False, "fsdp": "auto", "shard_group": 0,
                                 "precision": "auto"}
_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


def plan_inputs(hyperparameters: dict[str, Any]) -> dict[str, Any] | None:
    """The shape and layout a run's hyperparameters give, when they name one of the presets ("preset"; dashes or
    underscores, strings as SageMaker passes them); None otherwise, or where a value is not one the trainer would
    take (it refuses those itself, at start)."""
    given = {str(key).replace("-", "_"): value for key, value in hyperparameters.items()}
    name = str(given.get("preset", ""))
    if name not in PRESETS:
        return None
    values = {**PLAN_DEFAULTS, **PRESETS[name]}
    try:
        for key in ("n_layer", "n_head", "n_embd", "seq_len", "batch_size", "shard_group"):
            values[key] = int(float(given.get(key, values[key])))
        for key in ("activation_checkpointing",):
            raw = str(given.get(key, values[key])).strip().lower()
            if raw not in _TRUE | _FALSE:
                return None
            values[key] = raw in _TRUE
        for key in ("fsdp", "precision"):
            values[key] = str(given.get(key, values[key])).strip().lower()
    except (TypeError, ValueError):
        return None
    values["preset"] = name
    values["vocab_size"] = VOCAB_SIZE
    return values
