"""qk_overflow_half: the shared pair checks, and where the NaN appears."""

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure


def test_only_float16_overflows(device):
    pair = registry.load("qk_overflow_half")
    assert "= nan" in measure(pair, device, torch.float16).reason
    for dtype in (torch.float32, torch.bfloat16):
        assert (
            measure(pair, device, dtype).reason == "within the floor, also with large activations"
        )
