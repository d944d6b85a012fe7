"""Trap transpose (tutorial 3.2): K transposed over the wrong axes.

buggy.py and fixed.py differ only in the lines marked BUG / FIX: diff them.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class ScaledDotProductAttention(nn.Module):
    """Single-head attention: softmax(Q K^T / sqrt(d_k)) V."""

    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.d_k = d_k
        self.W_q = nn.Linear(d_model, d_k, bias=False)
        self.W_k = nn.Linear(d_model, d_k, bias=False)
        self.W_v = nn.Linear(d_model, d_v, bias=False)

    def forward(self, x, mask=None):
        """x: (B, T, d_model); mask: (B, T, T) with 1 = attend. Returns (output, weights)."""
        Q = self.W_q(x)  # (B, T, d_k)
        K = self.W_k(x)  # (B, T, d_k)
        V = self.W_v(x)  # (B, T, d_v)
        scale = math.sqrt(self.d_k)
        scores = torch.bmm(Q, K.transpose(0, 1)) / scale  # BUG: swaps batch and time
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        weights = F.softmax(scores, dim=-1)  # (B, T, T)
        output = torch.bmm(weights, V)  # (B, T, d_v)
        return output, weights
