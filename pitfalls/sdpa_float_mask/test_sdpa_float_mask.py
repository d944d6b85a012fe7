"""sdpa_float_mask: the shared pair checks, and a mask that masks nothing."""

import math
import re

import torch
import torch.nn.functional as F

from harness.catalogue import registry
from harness.catalogue.judge import measure
from harness.inputs import generator
from pitfalls.sdpa_float_mask import CARD


def test_the_future_leaks_through_an_added_mask(device):
    probes = measure(registry.load("sdpa_float_mask"), device, torch.float32).probes
    assert probes["future leak"].startswith("fixed.py none; buggy.py output at position")


def test_sdpa_adds_the_float_mask_to_the_scores(device):
    """Allowed keys get +1.0 and blocked keys +0.0, as the card says: added, not masked."""
    found = re.search(r"allowed keys get \+([\d.]+), blocked keys \+([\d.]+)", CARD.truth)
    assert found, "the card no longer says what is added"
    gen = generator(0)
    q, k, v = (torch.randn(2, 5, 8, generator=gen, dtype=torch.float64).to(device) for _ in "qkv")
    keep = torch.ones(5, 5, dtype=torch.bool, device=device).tril()
    float_mask = torch.where(keep, 1.0, 0.0).double()  # the trap's 0/1 keep-mask
    added = torch.where(keep, float(found[1]), float(found[2])).double()
    scores = q @ k.mT / math.sqrt(8) + added
    expected = scores.softmax(-1) @ v
    assert torch.allclose(F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask), expected)
