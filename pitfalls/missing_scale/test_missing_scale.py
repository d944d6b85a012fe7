"""missing_scale: the shared pair checks, and damage that grows with d_k."""

import torch

from harness.catalogue import registry
from pitfalls.missing_scale import scale_sweep


def test_entropy_falls_with_d_k_only_without_the_scale():
    sweep = scale_sweep(registry.load("missing_scale"), torch.device("cpu"), torch.float32)
    buggy, fixed = sweep["entropy (buggy)"], sweep["entropy (fixed)"]
    assert buggy.is_monotonic_decreasing and buggy.iloc[-1] < 0.5 * buggy.iloc[0]
    assert fixed.max() - fixed.min() < 0.05  # the scale keeps it steady
    assert (buggy < fixed).all()
