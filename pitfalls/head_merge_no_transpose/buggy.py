"""Trap head_merge_no_transpose: heads merged by reshape without transposing back.

buggy.py and fixed.py differ only in the lines marked BUG / FIX: diff them.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MultiHeadAttention(nn.Module):
    """h heads of width d_k = d_model / h, split from fused projections and mixed by W_o."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model, bias=False)
        self.W_k = nn.Linear(d_model, d_model, bias=False)
        self.W_v = nn.Linear(d_model, d_model, bias=False)
        self.W_o = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, mask=None):
        """x: (B, T, d_model); mask: (B, T, T) with 1 = attend. Returns (output, weights)."""
        B, T, d_model = x.shape
        Q = self.W_q(x).view(B, T, self.n_heads, self.d_k).transpose(1, 2)  # (B, h, T, d_k)
        K = self.W_k(x).view(B, T, self.n_heads, self.d_k).transpose(1, 2)  # (B, h, T, d_k)
        V = self.W_v(x).view(B, T, self.n_heads, self.d_k).transpose(1, 2)  # (B, h, T, d_k)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, h, T, T)
        if mask is not None:
            scores = scores.masked_fill(mask[:, None] == 0, float("-inf"))  # one mask, every head
        weights = F.softmax(scores, dim=-1)  # (B, h, T, T)
        out = (weights @ V).reshape(B, T, d_model)  # BUG: (B, h, T, d_k) read as (B, T, h * d_k)
        return self.W_o(out), weights
