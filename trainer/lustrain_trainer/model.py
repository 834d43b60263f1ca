"""The decoder-only transformers this trainer trains, chosen by the model config's `arch`, sized by hyperparameters.

- "gpt" (a config without `arch` is one): GPT-2's block in nanoGPT's shape. Pre-norm LayerNorm, full multi-head
  causal attention, a 4x GELU MLP, learned positions, an output head tied to the token embedding.
- "llama": the Llama family's block (Touvron et al., 2023; Meta's Llama 3 reference code). Pre-norm RMSNorm,
  rotary positions (the rotate-half layout Hugging Face's LlamaForCausalLM uses, so an export copies q and k as
  they are), grouped-query attention (n_kv_head key/value heads shared by n_head query heads), a SwiGLU MLP of
  ffn_hidden, no biases, and an output head tied to the embedding or not.

Both attend through scaled_dot_product_attention (flash kernels on GPUs), name their blocks `blocks` (what FSDP
shards one by one and activation checkpointing recomputes), and are built on `meta` and initialised in place by
init_weights.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .tokenizer import VOCAB_SIZE

# A model directory (SM_MODEL_DIR): the weights, and the config that rebuilds the model around them.
MODEL_FILE = "model.pt"
CONFIG_FILE = "config.json"


ARCHS = ("gpt", "llama")


def _from_dict(cls: Any, data: dict[str, Any]) -> Any:
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"model config has unknown keys {sorted(unknown)}; known: {sorted(names)}")
    return cls(**data)


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    seq_len: int
    vocab_size: int = VOCAB_SIZE
    dropout: float = 0.0
    arch: str = "gpt"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GPTConfig:
        config: GPTConfig = _from_dict(cls, {"arch": "gpt", **data})
        return config

    def parameter_count(self) -> int:
        """Trainable parameters, counted without building the model (the head shares the embedding)."""
        d = self.n_embd
        per_block = 2 * d + (d * 3 * d) + (d * d) + (d * 4 * d) + (4 * d * d)
        return self.vocab_size * d + self.seq_len * d + self.n_layer * per_block + d


@dataclass(frozen=True)
class LlamaConfig:
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    ffn_hidden: int
    seq_len: int
    vocab_size: int = VOCAB_SIZE
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    norm_eps: float = 1e-5
    dropout: float = 0.0
    arch: str = "llama"
    #: Llama 3.1's and 3.2's rotary scaling, as their config.json gives it ({"rope_type": "llama3", "factor",
    #: "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}); None: the frequencies as they are
    rope_scaling: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} must be a multiple of n_head {self.n_head}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head {self.n_head} must be a multiple of n_kv_head {self.n_kv_head}")
        if (self.n_embd // self.n_head) % 2:
            raise ValueError(f"the head width n_embd / n_head = {self.n_embd // self.n_head} must be even (rotary)")
        if self.rope_scaling is not None:
            scaling = self.rope_scaling
            if scaling.get("rope_type") != "llama3" or set(scaling) != set(LLAMA3_SCALING_KEYS):
                raise ValueError(f"rope_scaling {scaling} is not llama3's: {{rope_type: llama3, "
                                 f"{', '.join(LLAMA3_SCALING_KEYS[1:])}}}")
            if not 0 < scaling["low_freq_factor"] < scaling["high_freq_factor"] or scaling["factor"] < 1:
                raise ValueError(f"rope_scaling {scaling}: needs factor >= 1 and 0 < low_freq_factor < "
                                 "high_freq_factor")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LlamaConfig:
        config: LlamaConfig = _from_dict(cls, data)
        return config

    def parameter_count(self) -> int:
        """Trainable parameters, counted without building the model."""
        d, kv = self.n_embd, self.n_kv_head * self.head_dim
        per_block = 2 * d + d * d + 2 * d * kv + d * d + 3 * d * self.ffn_hidden
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return self.vocab_size * d + head + self.n_layer * per_block + d


ModelConfig = GPTConfig | LlamaConfig


def config_from_dict(data: dict[str, Any]) -> ModelConfig:
    """The model config a config.json or checkpoint manifest holds; one without `arch` is a GPT's (written before
    there was a choice)."""
    arch = data.get("arch", "gpt")
    if arch == "llama":
        return LlamaConfig.from_dict(data)
    if arch == "gpt":
        return GPTConfig.from_dict(data)
    raise ValueError(f"model config arch {arch!r} is not one this trainer builds (use {' | '.join(ARCHS)})")


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        out: torch.Tensor = self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return out


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=False)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=False)
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_1(x)))
        out: torch.Tensor = x + self.drop(self.proj(F.gelu(self.fc(self.ln_2(x)))))
        return out


class CausalLM(nn.Module):
    """What both blocks share: the token embedding `wte`, the `blocks`, the final norm and the `head`, the loss,
    generation and initialisation. A subclass builds them and says how tokens enter the residual stream."""

    config: ModelConfig
    wte: nn.Embedding
    blocks: nn.ModuleList
    ln_f: nn.Module
    head: nn.Linear

    def __init__(self, activation_checkpointing: bool) -> None:
        super().__init__()
        # Recomputing each block's activations in the backward pass trades ~30% compute for memory.
        self.activation_checkpointing = activation_checkpointing

    @property
    def tied(self) -> bool:
        return True

    def init_std(self, name: str) -> float:
        """The standard deviation of a matrix's initial weights (gains start at one). GPT-2's scheme: residual
        projections shrink with depth so the residual stream starts near unit size."""
        if name.endswith("proj.weight"):
            return 0.02 / math.sqrt(2 * self.config.n_layer)
        return 0.02

    def reset_parameters(self, seed: int = 0) -> None:
        init_weights(self, seed)

    def tie_weights(self) -> None:
        """The head shares the token embedding (again, after to_empty gave each its own tensor), where tied."""
        if self.tied:
            self.head.weight = self.wte.weight

    def embed(self, idx: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The residual stream's input and the extra arguments every block takes."""
        raise NotImplementedError

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (batch, time, vocab) without targets; the mean cross-entropy loss with them."""
        t = idx.shape[1]
        if t > self.config.seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than the model's seq_len {self.config.seq_len}")
        x, extra = self.embed(idx)
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, *extra, use_reentrant=False)
            else:
                x = block(x, *extra)
        logits: torch.Tensor = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.config.seq_len :])[:, -1, :]
            if temperature <= 0:
                next_token = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                next_token = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat((idx, next_token), dim=1)
        return idx


class GPT(CausalLM):
    def __init__(self, config: GPTConfig, activation_checkpointing: bool = False) -> None:
        super().__init__(activation_checkpointing)
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd {config.n_embd} must be a multiple of n_head {config.n_head}")
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.seq_len, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=False)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.tie_weights()
        if self.wte.weight.device.type != "meta":
            self.reset_parameters()

    def embed(self, idx: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(pos)), ()


#: the fields of Llama 3's rotary scaling, as its config.json names them
LLAMA3_SCALING_KEYS = ("rope_type", "factor", "low_freq_factor", "high_freq_factor",
                       "original_max_position_embeddings")


def llama3_frequencies(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's rotary frequencies for long contexts (Dubey et al., 2024; the `llama3` rope type of its
    config.json): a frequency whose wavelength fits the original context many times (high frequency) stays; one
    whose wavelength exceeds it (low frequency) is divided by `factor`; between the two, a blend that moves
    linearly from one to the other with the number of wavelengths the original context holds."""
    factor, low, high = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    context = float(scaling["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    blend = ((context / wavelength - low) / (high - low)).clamp(0.0, 1.0)
    scaled = (1 - blend) * inv_freq / factor + blend * inv_freq
    return torch.where(wavelength < context / high, inv_freq, torch.where(wavelength > context / low,
                                                                          inv_freq / factor, scaled))


def rotary(config: LlamaConfig, t: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (t, head_dim) of rotary positions 0..t-1, in fp32, in the rotate-half layout: frequency i
    turns the pair (i, i + head_dim/2), its frequency scaled as Llama 3.1's where the config says so. Computed
    each forward (a few kFLOPs): nothing to keep in a buffer that `meta` construction and to_empty would leave
    uninitialised."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, half, device=device, dtype=torch.float32) / half))
    if config.rope_scaling is not None:
        inv_freq = llama3_frequencies(inv_freq, config.rope_scaling)
    angles = torch.outer(torch.arange(t, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((-second, first), dim=-1) * sin.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        kv = config.n_kv_head * config.head_dim
        self.q_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.k_proj = nn.Linear(config.n_embd, kv, bias=False)
        self.v_proj = nn.Linear(config.n_embd, kv, bias=False)
        self.o_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q = self.q_proj(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        # grouped-query attention: each key/value head serves n_head / n_kv_head query heads, without copies
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_head != self.n_head,
                                           dropout_p=self.dropout if self.training else 0.0)
        out: torch.Tensor = self.o_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return out


class SwiGLU(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(config.ffn_hidden, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class LlamaBlock(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.mlp = SwiGLU(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.self_attn(self.input_layernorm(x), cos, sin))
        out: torch.Tensor = x + self.drop(self.mlp(self.post_attention_layernorm(x)))
        return out


class Llama(CausalLM):
    def __init__(self, config: LlamaConfig, activation_checkpointing: bool = False) -> None:
        super().__init__(activation_checkpointing)
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(LlamaBlock(config) for _ in range(config.n_layer))
        self.ln_f = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.tie_weights()
        if self.wte.weight.device.type != "meta":
            self.reset_parameters()

    @property
    def tied(self) -> bool:
        return self.config.tie_embeddings

    def init_std(self, name: str) -> float:
        """0.02 (Hugging Face's initializer_range for Llama), the residual stream's output projections (o_proj,
        down_proj) shrunk with depth as in GPT-2."""
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            return 0.02 / math.sqrt(2 * self.config.n_layer)
        return 0.02

    def embed(self, idx: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        assert isinstance(self.config, LlamaConfig)
        cos, sin = rotary(self.config, idx.shape[1], idx.device)
        return self.drop(self.wte(idx)), (cos, sin)


def build(config: ModelConfig, activation_checkpointing: bool = False) -> CausalLM:
    """The model of a config, on the current default device (`with torch.device("meta")`: no memory)."""
    if isinstance(config, LlamaConfig):
        return Llama(config, activation_checkpointing)
    return GPT(config, activation_checkpointing)


#: rows drawn from one generator: the unit of deterministic initialisation, whatever a rank holds of a matrix
INIT_ROWS = 64


def _stream_seed(seed: int, name: str, chunk: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{name}/{chunk}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def local_part(p: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The tensor this rank holds of parameter p and the global row its first row is: all of it at row 0, or the
    local shard of an FSDP-sharded (DTensor) parameter, which shards dim 0."""
    from torch.distributed.tensor import DTensor

    if isinstance(p, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
        if any(offset[1:]):
            raise ValueError(f"parameter sharded along a dimension other than 0: offset {offset}")
        return p.to_local(), int(offset[0]) if len(offset) else 0
    return p.data, 0


@torch.no_grad()
def init_weights(model: CausalLM, seed: int) -> None:
    """Initialise each parameter where it lives, rank by rank, only the rows this rank holds.

    A matrix is drawn in chunks of INIT_ROWS rows, each from a generator seeded by (seed, parameter name, chunk):
    a rank draws only the chunks its shard overlaps, so no rank ever holds more than its shard plus one chunk, and
    the weights are the same for the same seed whatever the world size or sharding (a test holds them equal).
    """
    for name, p in model.named_parameters():
        local, first_row = local_part(p)
        if local.numel() == 0:
            continue
        std = model.init_std(name)
        if p.dim() < 2:
            local.fill_(1.0)
            continue
        rows, width = p.shape[0], math.prod(p.shape[1:])
        view = local.reshape(local.shape[0], width)
        last_row = first_row + local.shape[0]
        for chunk in range(first_row // INIT_ROWS, (last_row - 1) // INIT_ROWS + 1):
            lo, hi = chunk * INIT_ROWS, min(rows, (chunk + 1) * INIT_ROWS)
            generator = torch.Generator().manual_seed(_stream_seed(seed, name, chunk))
            drawn = torch.empty(hi - lo, width).normal_(0.0, std, generator=generator)
            a, b = max(lo, first_row), min(hi, last_row)
            view[a - first_row : b - first_row].copy_(drawn[a - lo : b - lo])
