"""Trap sdpa_float_mask: a 0/1 float keep-mask given to SDPA.

buggy.py and fixed.py differ only in the lines marked BUG / FIX: diff them.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class ScaledDotProductAttention(nn.Module):
    """Single-head attention through F.scaled_dot_product_attention (it returns no weights)."""

    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.d_k = d_k
        self.W_q = nn.Linear(d_model, d_k, bias=False)
        self.W_k = nn.Linear(d_model, d_k, bias=False)
        self.W_v = nn.Linear(d_model, d_v, bias=False)

    def forward(self, x, mask=None):
        """x: (B, T, d_model); mask: (B, T, T), float, 1.0 = attend and 0.0 = blocked. Returns (output, None)."""
        Q = self.W_q(x)  # (B, T, d_k)
        K = self.W_k(x)  # (B, T, d_k)
        V = self.W_v(x)  # (B, T, d_v)
        attn_mask = None if mask is None else mask.bool()  # FIX: bool: True = attend
        output = F.scaled_dot_product_attention(Q, K, V, attn_mask=attn_mask)  # (B, T, d_v)
        return output, None
