"""Trap left_pad_positions: positions counted from the first column of a left-padded row.

Modern attention with absolute positions, as GPT-2 has them: a sinusoidal position embedding is
added to the input. No rotary here: rotary is relative, and shifting every real token of a row
by its padding changes no distance (the card gives what that measures). Grouped-query heads and
a KV cache; the mask is the (B, S) key-padding mask of a left-padded batch, True = a real token.
buggy.py and fixed.py differ only in the lines marked BUG / FIX: diff them.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class KVCache:
    """Keys and values of every token seen so far, updated in place by the module."""

    def __init__(self):
        self.k = self.v = None  # (B, h_kv, S, d_head)

    def __len__(self):
        return 0 if self.k is None else self.k.size(2)

    def reset(self):
        self.k = self.v = None

    def update(self, k, v):
        """Append this call's k, v (B, h_kv, T, d_head); return every cached key and value."""
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


def sinusoidal(positions, d, base=10000.0):
    """Absolute position embeddings (B, T, d) for positions (B, T): sines on the first half of
    the features, cosines on the second (Vaswani et al.); d is even."""
    inv_freq = base ** -(torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d)
    angles = positions[..., None].float() * inv_freq  # (B, T, d/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class Attention(nn.Module):
    """Causal multi-head attention with absolute positions and n_kv_heads shared K/V heads."""

    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.W_q = nn.Linear(d_model, n_heads * self.d_head, bias=False)
        self.W_k = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.W_v = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.W_o = nn.Linear(n_heads * self.d_head, d_model, bias=False)

    def forward(self, x, mask=None, *, positions=None, cache=None):
        """x: (B, T, d_model); mask: (B, S) bool, True = a real key, False = padding, S = cached
        + T keys; positions: (B, T), by default each row's real tokens counted from 0 (the
        tokens following the cached ones when there is no mask). Returns (output, weights)."""
        B, T, _ = x.shape
        if positions is None and mask is not None:  # FIX: count a row's real tokens only
            real = mask.long().cumsum(-1) - 1  # FIX: (B, S) real tokens before each key
            positions = real.clamp(min=0)[:, -T:]  # FIX: the T new tokens'; padding at 0
        elif positions is None:  # FIX: no mask: every token is real
            start = 0 if cache is None else len(cache)
            positions = torch.arange(start, start + T, device=x.device).expand(B, T)
        x = x + sinusoidal(positions, x.size(-1)).to(x.dtype)  # absolute positions, as GPT-2
        q = self.W_q(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, h, T, d)
        k = self.W_k(x).view(B, T, self.n_kv_heads, self.d_head).transpose(1, 2)  # (B, h_kv, T, d)
        v = self.W_v(x).view(B, T, self.n_kv_heads, self.d_head).transpose(1, 2)  # (B, h_kv, T, d)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, h_kv, S, d)
        n_rep = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(n_rep, dim=1)  # (B, h, S, d)
        v = v.repeat_interleave(n_rep, dim=1)  # (B, h, S, d)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, h, T, S)
        if mask is not None:  # finfo.min, not -inf: a padding query that sees no key stays finite
            padding = ~mask[:, None, None, :]  # (B, 1, 1, S)
            scores = scores.masked_fill(padding, torch.finfo(scores.dtype).min)
        S = k.size(2)
        ones = torch.ones(T, S, dtype=torch.bool, device=x.device)  # (T, S)
        causal = ones.tril(S - T)  # new query t is token S - T + t
        scores = scores.masked_fill(~causal, float("-inf"))  # after padding: -inf wins
        softmax_dtype = torch.promote_types(scores.dtype, torch.float32)  # float64 stays: finfo.min
        weights = F.softmax(scores, dim=-1, dtype=softmax_dtype).to(q.dtype)  # (B, h, T, S)
        out = (weights @ v).transpose(1, 2).reshape(B, T, -1)  # (B, T, h * d)
        return self.W_o(out), weights
