"""fill_overflow_half: the shared pair checks, and the exact float16 error."""

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure


def test_float16_raises_the_overflow_error_and_the_others_are_fine(device):
    pair = registry.load("fill_overflow_half")
    half = measure(pair, device, torch.float16)
    assert "without overflow" in half.error
    assert measure(pair, device, torch.bfloat16).reason.startswith("output and every gradient")
