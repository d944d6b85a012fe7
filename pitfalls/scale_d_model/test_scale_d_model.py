"""scale_d_model: the shared pair checks, flatter attention, and a bug one head hides."""

import math

import torch

from harness.catalogue import registry
from harness.catalogue.compare import compare
from harness.testing import assert_hidden_by_one_head
from pitfalls.scale_d_model import CARD


def test_attention_is_flatter_and_invisible_with_one_head(device):
    m = assert_hidden_by_one_head("scale_d_model", device)
    entropy = m.attention.set_index("run")["entropy_mean"]
    assert entropy["bug"] > entropy["fix"]


def test_logits_shrink_by_sqrt_h(device):
    """softmax(s / c) from softmax(s): the buggy weights are the fixed ones tempered by sqrt(h)."""
    assert "Logits shrink by sqrt(h)" in CARD.truth
    pair = registry.load("scale_d_model")
    c = compare(pair, device, torch.float32, pair.card.shape)
    fix, bug = c.fix.weights, c.bug.weights  # (B, h, T, T), float64
    tempered = (fix.log() / math.sqrt(pair.card.shape.heads)).softmax(-1)
    assert torch.allclose(bug, tempered, atol=1e-6)
