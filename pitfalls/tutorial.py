"""The tutorial's own attention, rebuilt from its description (not one of the pairs).

The same classes, signatures, operations and masks as the tutorial's §3.1 and §5.2, so that what
the doctor says about this file is about the tutorial's design. Diagnose it yourself:

    python -m harness doctor pitfalls/tutorial.py:MultiHeadAttention --mask keep
    python -m harness doctor pitfalls/tutorial.py:MultiHeadAttention --mask keep --mask-shape b1qk
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ScaledDotProductAttention(nn.Module):
    """One head: softmax(Q K^T / sqrt(d_k)) V, bias-free projections, a float32 tensor scale."""

    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.W_q = nn.Linear(d_model, d_k, bias=False)
        self.W_k = nn.Linear(d_model, d_k, bias=False)
        self.W_v = nn.Linear(d_model, d_v, bias=False)
        self.scale = torch.sqrt(torch.tensor(d_k, dtype=torch.float32))  # the tutorial's §4.1

    def forward(self, x, mask=None):
        """x: (B, T, d_model); mask: 1 = attend, documented as (B, 1, T, T) "broadcast to
        (B, T, T)". Returns (output, weights)."""
        Q = self.W_q(x)  # (B, T, d_k)
        K = self.W_k(x)  # (B, T, d_k)
        V = self.W_v(x)  # (B, T, d_v)
        scores = torch.bmm(Q, K.transpose(1, 2)) / self.scale  # (B, T, T)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        weights = F.softmax(scores, dim=-1)  # (B, T, T)
        output = torch.bmm(weights, V)  # (B, T, d_v)
        return output, weights


class MultiHeadAttention(nn.Module):
    """num_heads single heads of width d_model / num_heads, each fed all of x, concatenated and
    mixed by W_o (the tutorial's §5.2 ModuleList design). Returns the output only."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        d_k = d_v = d_model // num_heads
        self.heads = nn.ModuleList(
            ScaledDotProductAttention(d_model, d_k, d_v) for _ in range(num_heads)
        )
        self.W_o = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, mask=None):
        """x: (B, T, d_model); mask as ScaledDotProductAttention's. Returns (B, T, d_model)."""
        head_outputs = []
        for head in self.heads:
            head_out, _ = head(x, mask)  # (B, T, d_v)
            head_outputs.append(head_out)
        return self.W_o(torch.cat(head_outputs, dim=-1))  # (B, T, d_model)
