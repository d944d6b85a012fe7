"""Synthetic pairs for testing the engine without the catalogue's files."""

from __future__ import annotations

import math
import types

import torch
from torch import nn

from harness.catalogue import registry
from harness.catalogue.card import Card, Pair
from harness.catalogue.verdicts import Verdict


def correct_class() -> type[nn.Module]:
    """A known-correct single-head module: the catalogue's fixed softmax_dim."""
    return registry.load("softmax_dim").fixed.ScaledDotProductAttention


def make_pair(fixed_cls: type[nn.Module], buggy_cls: type[nn.Module], **card) -> Pair:
    """A Pair whose modules are the given classes, under a throwaway card."""
    fixed = types.ModuleType("fixed")
    fixed.ScaledDotProductAttention = fixed.MultiHeadAttention = fixed_cls
    buggy = types.ModuleType("buggy")
    buggy.ScaledDotProductAttention = buggy.MultiHeadAttention = buggy_cls
    fields = dict(
        id="synthetic",
        title="synthetic",
        section="-",
        category="scale",
        claim="-",
        trap="-",
        truth="-",
        why="-",
        avoid="-",
        expected=Verdict.BENIGN,
    )
    return Pair(Card(**{**fields, **card}), buggy, fixed)


def offset_class(offset: float) -> type[nn.Module]:
    """The correct module with ``offset`` added to its output."""
    base = correct_class()

    class Offset(base):
        def forward(self, x, mask=None):
            out, weights = super().forward(x, mask)
            return out + offset, weights

    return Offset


class Raising(nn.Module):
    """The correct module's parameters, and a forward that always raises."""

    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.W_q = nn.Linear(d_model, d_k, bias=False)
        self.W_k = nn.Linear(d_model, d_k, bias=False)
        self.W_v = nn.Linear(d_model, d_v, bias=False)

    def forward(self, x, mask=None):
        raise RuntimeError("deliberate failure")


def altered_class(
    offset: float = 0.0, grad_gain: float = 0.0, *, low_precision_only: bool = False
) -> type[nn.Module]:
    """The correct module with ``offset`` added to its output and every gradient (parameters and
    input) scaled by ``1 + grad_gain``, its forward values untouched by the latter.

    With ``low_precision_only`` the change applies only when the module runs below float64: as
    a pair's fixed module it then sets the noise floor exactly (its float64 reference is exact).
    """
    base = correct_class()

    class Altered(base):
        def forward(self, x, mask=None):
            out, weights = super().forward(x, mask)
            if low_precision_only and self.W_q.weight.dtype == torch.float64:
                return out, weights
            out = out + grad_gain * (out - out.detach())  # forward: + 0 exactly
            return out + offset, weights

    return Altered


def detached_key_class() -> type[nn.Module]:
    """The correct module with its keys detached: the same forward, no gradient reaches W_k."""
    base = correct_class()

    class DetachedKey(base):
        def __init__(self, d_model, d_k, d_v):
            super().__init__(d_model, d_k, d_v)
            self.W_k.register_forward_hook(lambda module, args, out: out.detach())

    return DetachedKey


def sharpened_class(factor: float) -> type[nn.Module]:
    """The correct module with its queries (so its scores) multiplied by ``factor``."""
    base = correct_class()

    class Sharpened(base):
        def __init__(self, d_model, d_k, d_v):
            super().__init__(d_model, d_k, d_v)
            self.W_q.register_forward_hook(lambda module, args, out: out * factor)

    return Sharpened


class MultiHead(nn.Module):
    """Multi-head attention with a fused projection; ``split_by_view`` splits the heads as
    ``(B, h, T, d)`` straight from memory (mixing positions across heads), harmless with one
    head."""

    split_by_view = False

    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.W_qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.W_o = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, mask=None):
        B, T, D = x.shape
        h, d = self.heads, D // self.heads

        def split(t):
            if self.split_by_view:
                return t.reshape(B, h, T, d)
            return t.reshape(B, T, h, d).transpose(1, 2)

        q, k, v = (split(t) for t in self.W_qkv(x).chunk(3, dim=-1))  # (B, h, T, d)
        weights = (q @ k.transpose(-2, -1) / math.sqrt(d)).softmax(dim=-1)  # (B, h, T, T)
        out = (weights @ v).transpose(1, 2).reshape(B, T, D)
        return self.W_o(out), weights


class MultiHeadSplitByView(MultiHead):
    split_by_view = True


# The tutorial's own code (pitfalls/tutorial.py) with one student's edit each: (trap, the line
# as written, the edit).
TUTORIAL_EDITS = [
    ("softmax_dim", "F.softmax(scores, dim=-1)", "F.softmax(scores, dim=1)"),
    ("mask_bool", "masked_fill(mask == 0,", "masked_fill(mask == 1,"),
    ("scale_d_model", "torch.tensor(d_k, dtype", "torch.tensor(d_model, dtype"),
    ("missing_scale", "K.transpose(1, 2)) / self.scale", "K.transpose(1, 2))"),
    ("transpose", "K.transpose(1, 2)", "K.transpose(0, 1)"),
]  # fmt: skip
