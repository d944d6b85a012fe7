"""Synthetic pairs for testing the engine without the catalogue's files."""

from __future__ import annotations

import types

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
    fixed.ScaledDotProductAttention = fixed_cls
    buggy = types.ModuleType("buggy")
    buggy.ScaledDotProductAttention = buggy_cls
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
