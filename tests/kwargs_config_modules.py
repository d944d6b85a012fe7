"""Layers built from config classes of their own files that do not hold one size per field: one
that takes its sizes as ``**kwargs`` and declares none of them (minGPT's
``GPTConfig(vocab_size, block_size, **kwargs)``), one that holds a size per stage (PVT's)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn


class KwargsConfig:
    """Sets whatever it is given beyond the two sizes every model has."""

    def __init__(self, vocab_size: int, block_size: int, **kwargs: object) -> None:
        self.vocab_size, self.block_size = vocab_size, block_size
        for name, value in kwargs.items():
            setattr(self, name, value)


class ReadsItsWidth(nn.Module):
    """Reads its width and head count off the config, which never declared them."""

    def __init__(self, config: KwargsConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)


class StagedConfig:
    """PVT's config: a size per stage of the model (lists), read by the model, not its layer,
    which is handed its own sizes."""

    def __init__(self, hidden_sizes=(64, 128), num_attention_heads=(1, 2), qkv_bias=True):
        self.hidden_sizes = list(hidden_sizes)
        self.num_attention_heads = list(num_attention_heads)
        self.qkv_bias = qkv_bias


class StagedAttention(nn.Module):
    """PVT's layer: the config for its bias, its width and heads as arguments."""

    def __init__(self, config: StagedConfig, hidden_size, num_attention_heads):
        super().__init__()
        self.num_attention_heads = num_attention_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=config.qkv_bias)
        self.out = nn.Linear(hidden_size, hidden_size)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.num_attention_heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)  # (B, h, T, d)
        return self.out(y.transpose(1, 2).reshape(B, T, C))
