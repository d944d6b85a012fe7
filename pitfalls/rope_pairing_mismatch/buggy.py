"""Trap rope_pairing_mismatch: interleaved rotary pairs on weights laid out for half-split pairs.

Modern (Llama-style) attention: rotary positions, grouped-query heads and a KV cache.
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


def rotary(x, positions, base=10000.0):
    """Rotate x (B, h, T, d) by its positions (B, T): half-split pairing (rotate_half)."""
    d = x.size(-1)
    inv_freq = base ** -(torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = positions[:, None, :, None].float() * inv_freq  # (B, 1, T, d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # BUG: pairs (2i, 2i + 1): GPT-J/Meta interleaved layout
    rotated = [x1 * cos - x2 * sin, x1 * sin + x2 * cos]  # each (B, h, T, d/2)
    return torch.stack(rotated, dim=-1).flatten(-2)  # BUG: the pairs back interleaved


class Attention(nn.Module):
    """Causal multi-head attention with rotary positions and n_kv_heads shared K/V heads."""

    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.W_q = nn.Linear(d_model, n_heads * self.d_head, bias=False)
        self.W_k = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.W_v = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.W_o = nn.Linear(n_heads * self.d_head, d_model, bias=False)

    def forward(self, x, mask=None, *, positions=None, cache=None):
        """x: (B, T, d_model); mask: (B, T, S) bool, True = attend, S = cached + T keys;
        positions: (B, T), by default following the cached tokens. Returns (output, weights)."""
        B, T, _ = x.shape
        if positions is None:
            start = 0 if cache is None else len(cache)
            positions = torch.arange(start, start + T, device=x.device).expand(B, T)
        q = self.W_q(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, h, T, d)
        k = self.W_k(x).view(B, T, self.n_kv_heads, self.d_head).transpose(1, 2)  # (B, h_kv, T, d)
        v = self.W_v(x).view(B, T, self.n_kv_heads, self.d_head).transpose(1, 2)  # (B, h_kv, T, d)
        q, k = rotary(q, positions), rotary(k, positions)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, h_kv, S, d)
        n_rep = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(n_rep, dim=1)  # (B, h, S, d)
        v = v.repeat_interleave(n_rep, dim=1)  # (B, h, S, d)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, h, T, S)
        S = k.size(2)
        ones = torch.ones(T, S, dtype=torch.bool, device=x.device)  # (T, S)
        causal = ones.tril(S - T)  # new query t is token S - T + t
        scores = scores.masked_fill(~causal, float("-inf"))
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None], float("-inf"))
        weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # (B, h, T, S)
        out = (weights @ v).transpose(1, 2).reshape(B, T, -1)  # (B, T, h * d)
        return self.W_o(out), weights
