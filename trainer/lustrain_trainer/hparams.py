"""Hyperparameters and paths, from SageMaker's contract or the command line.

SageMaker passes hyperparameters as `--key value` strings ("true", "3", "0.001") and again as SM_HPS
(JSON); names may use dashes or underscores. Precedence: command line, then SM_HPS, then the preset's
defaults, then the global defaults. Arguments this trainer does not know are reported and ignored, since
SageMaker and launchers add their own.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .model import ARCHS, GPTConfig, LlamaConfig, ModelConfig
from .plan import Shape, llama_ffn_hidden
from .presets import PRESET_SOURCES, PRESETS, RENAMED, renamed

__all__ = ["PRESETS", "PRESET_SOURCES", "HyperparameterError", "Hyperparameters"]
from .tokenizer import VOCAB_SIZE

CHOICES = {"fsdp": ("auto", "true", "false"), "precision": ("auto", "bf16", "fp32"), "arch": ARCHS}
#: seconds a collective waits for every rank: long enough for a checkpoint's blocking part and a first step
COLLECTIVE_TIMEOUT_S = 1800


class HyperparameterError(ValueError):
    """A hyperparameter or path is missing or has a value that is not allowed; the message names it."""


@dataclass(frozen=True)
class Hyperparameters:
    preset: str = "tiny"
    arch: str = "gpt"
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    seq_len: int = 1024
    dropout: float = 0.0
    # the Llama block's (arch llama): 0 takes n_head, and the block's default width (plan.llama_ffn_hidden)
    n_kv_head: int = 0
    ffn_hidden: int = 0
    rope_theta: float = 10000.0
    # Llama 3.1's and 3.2's rotary scaling (model.llama3_frequencies): 0 for none, else its factor (8 and 32) with
    # the three figures beside it, as their config.json's rope_scaling gives them
    rope_scaling_factor: float = 0.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_context: int = 8192
    tie_embeddings: bool = True
    batch_size: int = 8
    grad_accum: int = 1
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 500
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    max_steps: int = 20000
    log_interval: int = 10
    eval_interval: int = 500
    eval_batches: int = 20
    checkpoint_interval: int = 500
    #: minutes between checkpoints by the clock, besides checkpoint_interval's steps (whichever comes first); 0: by
    #: steps only. lustrain passes its plan's (goodput.checkpoint_every_minutes: Young-Daly's optimum by default)
    checkpoint_every_minutes: float = 0.0
    keep_checkpoints: int = 2
    seed: int = 1337
    prefetch: int = 4
    cpu_threads: int = 0
    fsdp: str = "auto"
    activation_checkpointing: bool = False
    precision: str = "auto"
    shard_group: int = 0
    collective_timeout_s: int = COLLECTIVE_TIMEOUT_S

    def model_config(self, vocab_size: int = VOCAB_SIZE) -> ModelConfig:
        """The model these hyperparameters build, with `vocab_size` embedding rows (the data's tokenizer's)."""
        if self.arch == "llama":
            return LlamaConfig(n_layer=self.n_layer, n_head=self.n_head, n_kv_head=self.n_kv_head or self.n_head,
                               n_embd=self.n_embd, ffn_hidden=self.ffn_hidden or llama_ffn_hidden(self.n_embd),
                               seq_len=self.seq_len, vocab_size=vocab_size, rope_theta=self.rope_theta,
                               tie_embeddings=self.tie_embeddings, dropout=self.dropout,
                               rope_scaling=self.rope_scaling())
        return GPTConfig(n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd, seq_len=self.seq_len,
                         vocab_size=vocab_size, dropout=self.dropout)

    def rope_scaling(self) -> dict[str, Any] | None:
        """The model's rope_scaling (Llama 3's, as its config.json writes it), None where rope_scaling_factor is 0."""
        if not self.rope_scaling_factor:
            return None
        return {"rope_type": "llama3", "factor": self.rope_scaling_factor,
                "low_freq_factor": self.rope_low_freq_factor, "high_freq_factor": self.rope_high_freq_factor,
                "original_max_position_embeddings": self.rope_original_context}

    def plan_shape(self, vocab_size: int | None = None) -> Shape:
        """The memory plan's shape; without `vocab_size`, the preset's planning vocabulary (its published
        model's), else the byte tokenizer's."""
        vocab = vocab_size or int(PRESETS[self.preset].get("vocab_size", VOCAB_SIZE))
        return Shape(n_layer=self.n_layer, n_embd=self.n_embd, n_head=self.n_head, seq_len=self.seq_len,
                     vocab_size=vocab, arch=self.arch, n_kv_head=self.n_kv_head, ffn_hidden=self.ffn_hidden,
                     tie_embeddings=self.tie_embeddings)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: the hyperparameters that decide the model's shape (a checkpoint continues only under the same ones)
SHAPE_KEYS = ("arch", "n_layer", "n_head", "n_embd", "seq_len", "dropout", "n_kv_head", "ffn_hidden", "rope_theta",
              "tie_embeddings", "rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor",
              "rope_original_context")


def shape_of(hp: Hyperparameters) -> dict[str, Any]:
    """The model's shape as its preset and the values that differ from the preset: what a checkpoint's manifest
    records, so that lustrain can tell, from a spec's hyperparameters alone, whether it trains the same model."""
    preset = PRESETS[hp.preset]
    differs = {key: getattr(hp, key) for key in SHAPE_KEYS
               if getattr(hp, key) != preset.get(key, getattr(Hyperparameters, key))}
    return {"preset": hp.preset, "default_preset": Hyperparameters.preset, "overrides": differs}


@dataclass(frozen=True)
class RunPaths:
    data: Path
    checkpoints: Path
    model: Path
    output: Path


@dataclass(frozen=True)
class Hosts:
    hosts: tuple[str, ...]
    current: str

    @property
    def is_first(self) -> bool:
        return not self.hosts or self.current == self.hosts[0]


PATH_ARGS = ("data", "checkpoint_dir", "model_dir", "output_data_dir")
SAGEMAKER_CHECKPOINTS = "/opt/ml/checkpoints"
#: the read-write Lustre channel lustrain gives the job for its checkpoints (checkpoints.to_filesystem)
CHECKPOINT_CHANNEL_VARIABLE = "SM_CHANNEL_CHECKPOINTS"
LOCAL_RUN_DIR = Path("runs") / "trainer"

# Minimum allowed value of each numeric hyperparameter (inclusive), so a typo fails before a long job does.
MINIMUM = {"n_layer": 1, "n_head": 1, "n_embd": 1, "seq_len": 2, "batch_size": 1, "grad_accum": 1,
           "max_steps": 1, "log_interval": 1, "eval_interval": 0, "eval_batches": 1, "checkpoint_interval": 1,
           "keep_checkpoints": 1, "prefetch": 1, "warmup_steps": 0, "lr": 0, "weight_decay": 0,
           "grad_clip": 0, "seed": 0, "cpu_threads": 0, "shard_group": 0, "collective_timeout_s": 60,
           "n_kv_head": 0, "ffn_hidden": 0, "checkpoint_every_minutes": 0}
BOOLEANS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


def _convert(name: str, kind: type, raw: Any) -> Any:
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        flag = BOOLEANS.get(str(raw).strip().lower())
        if flag is None:
            raise HyperparameterError(f"hyperparameter {name}: {raw!r} is not a boolean (use true or false)")
        return flag
    try:
        if kind is int:
            number = float(raw)
            if not number.is_integer():
                raise ValueError
            return int(number)
        if kind is float:
            return float(raw)
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise HyperparameterError(f"hyperparameter {name}: {raw!r} is not {what}") from None
    if name not in CHOICES:
        return str(raw)
    choice = str(raw).strip().lower()
    if choice not in CHOICES[name]:
        allowed = " | ".join(CHOICES[name])
        raise HyperparameterError(f"hyperparameter {name}: {raw!r} is not allowed (use {allowed})")
    return choice


def _check(hp: Hyperparameters) -> None:
    for name, low in MINIMUM.items():
        if getattr(hp, name) < low:
            raise HyperparameterError(f"hyperparameter {name}: {getattr(hp, name)} is below the minimum {low}")
    if not math.isfinite(hp.checkpoint_every_minutes):
        raise HyperparameterError(
            f"hyperparameter checkpoint_every_minutes: {hp.checkpoint_every_minutes} is not allowed (use a number of "
            "minutes above 0, or 0 for checkpoints by steps only)")
    if hp.lr <= 0:
        raise HyperparameterError(f"hyperparameter lr: {hp.lr} is not allowed (use a number above 0)")
    if not 0 <= hp.dropout < 1:
        raise HyperparameterError(f"hyperparameter dropout: {hp.dropout} is not allowed (use 0 <= dropout < 1)")
    if not 0 <= hp.min_lr_ratio <= 1:
        raise HyperparameterError(f"hyperparameter min_lr_ratio: {hp.min_lr_ratio} is not allowed (use 0..1)")
    if hp.n_embd % hp.n_head:
        raise HyperparameterError(
            f"hyperparameter n_embd: {hp.n_embd} is not a multiple of n_head {hp.n_head}"
        )
    if hp.arch == "gpt":
        # the GPT block has full multi-head attention, a 4x MLP and a tied head: a Llama-only value is a mistake
        for name, ok in (("n_kv_head", hp.n_kv_head in (0, hp.n_head)),
                         ("ffn_hidden", hp.ffn_hidden in (0, 4 * hp.n_embd)), ("tie_embeddings", hp.tie_embeddings),
                         ("rope_scaling_factor", not hp.rope_scaling_factor)):
            if not ok:
                raise HyperparameterError(
                    f"hyperparameter {name}: {getattr(hp, name)} is for arch llama; arch gpt has n_kv_head = n_head, "
                    "ffn_hidden = 4 x n_embd, tied embeddings and no rope scaling (use --arch llama, or leave it unset)")
        return
    if hp.rope_theta <= 0:
        raise HyperparameterError(f"hyperparameter rope_theta: {hp.rope_theta} is not allowed (use a number above 0)")
    if hp.rope_scaling_factor and hp.rope_scaling_factor < 1:
        raise HyperparameterError(f"hyperparameter rope_scaling_factor: {hp.rope_scaling_factor} is not allowed (use "
                                  "0 for none, or Llama 3's factor: 1 or more, such as 8)")
    if hp.rope_scaling_factor and not 0 < hp.rope_low_freq_factor < hp.rope_high_freq_factor:
        raise HyperparameterError(
            f"hyperparameter rope_low_freq_factor: {hp.rope_low_freq_factor} is not allowed (use a number above 0 "
            f"and below rope_high_freq_factor {hp.rope_high_freq_factor})")
    if hp.rope_scaling_factor and hp.rope_original_context < 1:
        raise HyperparameterError(f"hyperparameter rope_original_context: {hp.rope_original_context} is not allowed "
                                  "(use the context the model was first trained at, such as 8192)")
    if hp.n_kv_head and hp.n_head % hp.n_kv_head:
        raise HyperparameterError(
            f"hyperparameter n_kv_head: {hp.n_kv_head} does not divide n_head {hp.n_head} (each key/value head "
            "serves the same number of query heads)")
    if (hp.n_embd // hp.n_head) % 2:
        raise HyperparameterError(
            f"hyperparameter n_head: the head width n_embd / n_head = {hp.n_embd // hp.n_head} is odd; rotary "
            "positions turn pairs of channels (use an even head width)")


HELP = {
    "preset": f"model size and its training defaults: {' | '.join(PRESETS)}",
    "arch": "the block: gpt (LayerNorm, learned positions, GELU, multi-head attention) | llama (RMSNorm, rotary "
            "positions, SwiGLU, grouped-query attention)",
    "n_kv_head": "key/value heads, arch llama (0: n_head, full multi-head attention)",
    "ffn_hidden": "the SwiGLU MLP's width, arch llama (0: 2/3 of 4 x n_embd, a multiple of 256)",
    "rope_theta": "rotary positions' base, arch llama",
    "rope_scaling_factor": "Llama 3.1's rotary scaling factor, arch llama (0: none; Llama 3.1 8, Llama 3.2 32)",
    "rope_low_freq_factor": "Llama 3's rope scaling: its low_freq_factor (1)",
    "rope_high_freq_factor": "Llama 3's rope scaling: its high_freq_factor (4)",
    "rope_original_context": "Llama 3's rope scaling: its original_max_position_embeddings (8192)", "tie_embeddings": "the head shares the token embedding "
    "(true | false; arch gpt always does)",
    "n_layer": "transformer blocks", "n_head": "attention heads", "n_embd": "model width",
    "seq_len": "tokens per sequence (the context)", "dropout": "dropout probability",
    "batch_size": "sequences per rank per micro-step", "grad_accum": "micro-steps per optimizer step",
    "lr": "peak learning rate", "min_lr_ratio": "final learning rate as a share of lr (cosine decay)",
    "warmup_steps": "linear warm-up steps", "weight_decay": "AdamW weight decay",
    "grad_clip": "gradient norm clip (0: off)", "max_steps": "optimizer steps to train",
    "log_interval": "steps between metric lines", "eval_interval": "steps between validations (0: off)",
    "eval_batches": "validation batches per rank", "checkpoint_interval": "steps between checkpoints",
    "checkpoint_every_minutes": "minutes between checkpoints by the clock, besides checkpoint_interval's steps "
                                "(whichever comes first; 0: by steps only); lustrain's plan passes Young-Daly's optimum",
    "keep_checkpoints": "checkpoints kept", "seed": "initialisation and data order",
    "prefetch": "batches read ahead", "cpu_threads": "torch threads on CPU (0: torch's default)",
    "fsdp": "auto | true | false (auto: when the memory plan says a whole replica does not fit one GPU)",
    "shard_group": "ranks that shard one replica (FSDP; HSDP when fewer than the world); 0: the memory plan's",
    "collective_timeout_s": "seconds a collective waits for every rank before the run fails as infrastructure",
    "activation_checkpointing": "recompute activations in backward (true | false)",
    "precision": "auto | bf16 | fp32 (auto: bf16 autocast on GPUs that have it)",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="train.py", allow_abbrev=False,
        description="Train a GPT or Llama-style model on lustrain token shards (SageMaker script mode or local). "
                    "Every hyperparameter also takes dashes (--max-steps) and may come from SM_HPS.",
    )
    for f in fields(Hyperparameters):
        parser.add_argument(f"--{f.name}", *([f"--{f.name.replace('_', '-')}"] if "_" in f.name else []),
                            dest=f.name, default=None, metavar="VALUE", help=HELP[f.name])
    parser.add_argument("--data", default=None, help="token shard directory (default: $SM_CHANNEL_TRAINING)")
    parser.add_argument("--checkpoint_dir", "--checkpoint-dir", dest="checkpoint_dir", default=None,
                        help="default: $SM_CHANNEL_CHECKPOINTS (lustrain's Lustre channel), $SM_CHECKPOINT_DIR, "
                             "/opt/ml/checkpoints under SageMaker, "
                             "else runs/trainer/checkpoints")
    parser.add_argument("--model_dir", "--model-dir", dest="model_dir", default=None,
                        help="default: $SM_MODEL_DIR, else runs/trainer/model")
    parser.add_argument("--output_data_dir", "--output-data-dir", dest="output_data_dir", default=None,
                        help="default: $SM_OUTPUT_DATA_DIR, else runs/trainer/output")
    return parser


def parse(argv: list[str], env: Mapping[str, str]) -> tuple[Hyperparameters, dict[str, str | None], list[str]]:
    """Hyperparameters, the path arguments given, and warnings about what was ignored."""
    warnings: list[str] = []
    args, unknown = _parser().parse_known_args(argv)
    if unknown:
        warnings.append(f"ignoring arguments this trainer does not know: {' '.join(unknown)}")
    given = {k: v for k, v in vars(args).items() if v is not None}

    from_env: dict[str, Any] = {}
    if env.get("SM_HPS"):
        try:
            hps = json.loads(env["SM_HPS"])
        except json.JSONDecodeError as exc:
            raise HyperparameterError(f"SM_HPS is not JSON: {exc}") from exc
        if not isinstance(hps, dict):
            raise HyperparameterError("SM_HPS must be a JSON object of hyperparameters")
        known = {f.name for f in fields(Hyperparameters)} | set(PATH_ARGS)
        for key, value in hps.items():
            name = key.replace("-", "_")
            if name in known:
                from_env[name] = value
            elif not name.startswith("sagemaker_"):
                warnings.append(f"ignoring SM_HPS key this trainer does not know: {key}")

    def pick(name: str) -> Any:
        return given.get(name, from_env.get(name))

    preset_name = str(pick("preset") or Hyperparameters.preset)
    if preset_name in RENAMED:
        raise HyperparameterError(f"hyperparameter preset: {renamed(preset_name)}")
    if preset_name not in PRESETS:
        raise HyperparameterError(f"hyperparameter preset: {preset_name!r} is not allowed (use {' | '.join(PRESETS)})")
    preset = PRESETS[preset_name]
    values: dict[str, Any] = {}
    for f in fields(Hyperparameters):
        raw = pick(f.name)
        if raw is None:
            raw = preset.get(f.name)
        if raw is not None:
            values[f.name] = _convert(f.name, type(getattr(Hyperparameters, f.name)), raw)
    values["preset"] = preset_name
    hp = Hyperparameters(**values)
    _check(hp)
    paths = {name: (None if pick(name) is None else str(pick(name))) for name in PATH_ARGS}
    return hp, paths, warnings


def resolve_paths(given: dict[str, str | None], env: Mapping[str, str], warnings: list[str]) -> RunPaths:
    """SageMaker's directories when it runs us, the working directory's runs/trainer/ otherwise."""
    in_sagemaker = "SM_TRAINING_ENV" in env or "SM_MODEL_DIR" in env
    data = given["data"] or env.get("SM_CHANNEL_TRAINING")
    if not data:
        raise HyperparameterError("no training data: pass --data DIR or set SM_CHANNEL_TRAINING")
    model = given["model_dir"]
    if model and "://" in model:
        # Some launchers pass the S3 destination as model_dir; SageMaker uploads SM_MODEL_DIR there itself.
        warnings.append(f"ignoring model_dir {model}: the model is written to SM_MODEL_DIR and uploaded from it")
        model = None
    # a "checkpoints" channel is the run's Lustre directory (checkpoints.to_filesystem): written there, not to
    # /opt/ml/checkpoints, which SageMaker would sync to S3
    checkpoints = given["checkpoint_dir"] or env.get(CHECKPOINT_CHANNEL_VARIABLE) or env.get("SM_CHECKPOINT_DIR") or (
        SAGEMAKER_CHECKPOINTS if in_sagemaker else str(LOCAL_RUN_DIR / "checkpoints"))
    return RunPaths(
        data=Path(data),
        checkpoints=Path(checkpoints),
        model=Path(model or env.get("SM_MODEL_DIR") or LOCAL_RUN_DIR / "model"),
        output=Path(given["output_data_dir"] or env.get("SM_OUTPUT_DATA_DIR") or LOCAL_RUN_DIR / "output"),
    )


def read_hosts(env: Mapping[str, str]) -> Hosts:
    raw = env.get("SM_HOSTS")
    try:
        hosts = tuple(json.loads(raw)) if raw else ()
    except (json.JSONDecodeError, TypeError) as exc:
        raise HyperparameterError(f"SM_HOSTS is not a JSON list of host names: {raw!r}") from exc
    current = env.get("SM_CURRENT_HOST") or (hosts[0] if hosts else os.uname().nodename)
    if hosts and current not in hosts:
        raise HyperparameterError(f"SM_CURRENT_HOST {current!r} is not one of SM_HOSTS {list(hosts)}")
    return Hosts(hosts=hosts, current=current)
