"""Modules built the ways real code builds them, for the doctor's construction tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class GPTConfig:
    """A nanoGPT-style config: every field has a default the doctor must override."""

    block_size: int = 1024
    n_embd: int = 768
    n_head: int = 12
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    """Built from an untyped ``config``: the doctor finds GPTConfig beside it."""

    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head, self.n_embd, self.block_size = config.n_head, config.n_embd, config.block_size
        self.config = config

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class TypedAttention(CausalSelfAttention):
    """The same, with its config annotated."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)


class Recorder(nn.Module):
    """Keeps the keyword arguments it was built with."""

    def __init__(self, **kwargs: object):
        super().__init__()
        self.kwargs = kwargs
        self.proj = nn.Linear(8, 8)


def real_names(hidden_size, num_attention_heads, attention_head_size, block_size, attn_pdrop,
               layer_idx, rope_theta=1.0, dim=3, heads=5):  # fmt: skip
    """A factory whose required names come from real code, with two sizes that have defaults."""
    return Recorder(
        hidden_size=hidden_size, num_attention_heads=num_attention_heads,
        attention_head_size=attention_head_size, block_size=block_size, attn_pdrop=attn_pdrop,
        layer_idx=layer_idx, rope_theta=rope_theta, dim=dim, heads=heads,
    )  # fmt: skip


def needs_unknown(n_embd, num_labels):
    """A required name no table has: the doctor must ask for it."""
    return Recorder(n_embd=n_embd, num_labels=num_labels)
