"""A GPT-style decoder-only transformer whose size is set by hyperparameters (nanoGPT's shape).

Pre-norm blocks, causal attention through scaled_dot_product_attention (flash kernels on A100), learned
positions and an output head tied to the token embedding.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    seq_len: int
    vocab_size: int = VOCAB_SIZE
    dropout: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GPTConfig:
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"model config has unknown keys {sorted(unknown)}; known: {sorted(names)}")
        return cls(**data)

    def parameter_count(self) -> int:
        """Trainable parameters, counted without building the model (the head shares the embedding)."""
        d = self.n_embd
        per_block = 2 * d + (d * 3 * d) + (d * d) + (d * 4 * d) + (4 * d * d)
        return self.vocab_size * d + self.seq_len * d + self.n_layer * per_block + d


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


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, activation_checkpointing: bool = False) -> None:
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd {config.n_embd} must be a multiple of n_head {config.n_head}")
        self.config = config
        # Recomputing each block's activations in the backward pass trades ~30% compute for memory.
        self.activation_checkpointing = activation_checkpointing
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.seq_len, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=False)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.head.weight = self.wte.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # GPT-2's scheme: residual projections shrink with depth so the residual stream starts near unit size.
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if p.dim() < 2:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, mean=0.0, std=residual_std if name.endswith("proj.weight") else 0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (batch, time, vocab) without targets; the mean cross-entropy loss with them."""
        t = idx.shape[1]
        if t > self.config.seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than the model's seq_len {self.config.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
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
