"""sdpa_float_mask: the shared pair checks, and a mask that masks nothing."""

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure


def test_the_future_leaks_through_an_added_mask(device):
    probes = measure(registry.load("sdpa_float_mask"), device, torch.float32).probes
    assert probes["future leak"].startswith("fixed.py none; buggy.py output at position")
