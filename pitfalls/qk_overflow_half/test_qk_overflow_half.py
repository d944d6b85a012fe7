"""qk_overflow_half: the shared pair checks, where the NaN appears, and the product's range."""

import math
import re

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.catalogue.judge import measure
from pitfalls.qk_overflow_half import CARD


def test_only_float16_overflows(device):
    pair = registry.load("qk_overflow_half")
    assert "= nan" in measure(pair, device, torch.float16).reason
    for dtype in (torch.float32, torch.bfloat16):
        assert (
            measure(pair, device, dtype).reason == "within the floor, also with large activations"
        )


def test_the_product_passes_the_float16_limit_only_before_the_scale():
    """On the card's large inputs, Q K^T (in float32) exceeds the limit the card names."""
    limit = re.search(r"Q K\^T passes (\d+) and becomes inf", CARD.truth)
    assert limit and torch.finfo(torch.float16).max == int(limit[1])
    pair = registry.load("qk_overflow_half")
    fixed, _ = build_pair(pair, CARD.shape, seed=0)
    x = CARD.inputs(CARD.shape, 0, edge=True).x.float()
    with torch.no_grad():
        q, k = fixed.float().W_q(x), fixed.float().W_k(x)
        product = (q @ k.mT).abs().max().item()
        scaled_first = (q / math.sqrt(CARD.shape.d_k) @ k.mT).abs().max().item()
    assert scaled_first < int(limit[1]) < product, (scaled_first, product)
