"""Trap head_loop (tutorial 5.2): multi-head attention as a Python loop over single heads.

buggy.py and fixed.py differ only in the lines marked BUG / FIX: diff them.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def linear(d_in, d_out):
    """A bias-free projection, as in the tutorial."""
    return nn.Linear(d_in, d_out, bias=False)


def attention(Q, K, V, mask=None):
    """softmax(Q K^T / sqrt(d_k)) V over the last two axes; mask: 1 = attend."""
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))  # (..., T, T)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, float("-inf"))
    weights = F.softmax(scores, dim=-1)  # (..., T, T)
    return weights @ V, weights  # (..., T, d_k), (..., T, T)


class MultiHeadAttention(nn.Module):
    """h heads of width d_k = d_model / h, concatenated and mixed by W_o."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        h, d_k = n_heads, d_model // n_heads
        self.n_heads, self.d_k = h, d_k
        self.W_q = linear(d_model, d_model)  # FIX: every head in one matmul
        self.W_k = linear(d_model, d_model)  # FIX: every head in one matmul
        self.W_v = linear(d_model, d_model)  # FIX: every head in one matmul
        self.W_o = linear(d_model, d_model)

    def forward(self, x, mask=None):
        """x: (B, T, d_model); mask: (B, T, T) with 1 = attend. Returns (output, weights)."""
        Q = self.W_q(x).unflatten(-1, (self.n_heads, -1)).transpose(1, 2)  # FIX: (B, h, T, d_k)
        K = self.W_k(x).unflatten(-1, (self.n_heads, -1)).transpose(1, 2)  # FIX: (B, h, T, d_k)
        V = self.W_v(x).unflatten(-1, (self.n_heads, -1)).transpose(1, 2)  # FIX: (B, h, T, d_k)
        out, weights = attention(Q, K, V, None if mask is None else mask[:, None])  # FIX: batched
        out = out.transpose(1, 2).flatten(2)  # FIX: (B, T, d_model)
        return self.W_o(out), weights  # (B, T, d_model), (B, h, T, T)
