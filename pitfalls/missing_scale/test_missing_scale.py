"""missing_scale: the shared pair checks, damage that grows with d_k, and the card's figures."""

import pytest
import torch

from harness.catalogue import registry
from harness.testing import claimed
from pitfalls.missing_scale import CARD, scale_sweep


@pytest.fixture(scope="module")
def sweep():
    """The card's sweep over d_k on the CPU in float32, indexed by d_k."""
    table = scale_sweep(registry.load("missing_scale"), torch.device("cpu"), torch.float32)
    return table.set_index("d_k")


def test_entropy_falls_with_d_k_only_without_the_scale(sweep):
    buggy, fixed = sweep["entropy (buggy)"], sweep["entropy (fixed)"]
    assert buggy.is_monotonic_decreasing and buggy.iloc[-1] < 0.5 * buggy.iloc[0]
    assert fixed.max() - fixed.min() < 0.05  # the scale keeps it steady
    assert (buggy < fixed).all()


def test_entropies_are_the_cards(sweep):
    first, d_first, last, d_last, scaled = claimed(
        CARD,
        r"entropy ([\d.]+) at d_k (\d+), ([\d.]+) at d_k (\d+), against ([\d.]+) with the scale",
    )
    assert (int(d_first), int(d_last)) == (sweep.index[0], sweep.index[-1])
    buggy = sweep["entropy (buggy)"]
    assert round(buggy[int(d_first)], 2) == float(first)
    assert round(buggy[int(d_last)], 2) == float(last)
    assert (sweep["entropy (fixed)"].round(2) == float(scaled)).all()


def test_gradient_growth_and_saturation_are_the_cards(sweep):
    d_k, growth = claimed(CARD, r"up to d_k (\d+), the W_q gradient instead grows about (\d+)x")
    percent, at = claimed(CARD, r"only (\d+)% saturate at d_k (\d+)")
    assert int(d_k) == int(at) == sweep.index[-1]
    grad = sweep["grad norm W_q (buggy)"]
    assert round(grad.iloc[-1] / grad.iloc[0]) == int(growth)
    assert round(100 * sweep.loc[int(at), "saturated rows (buggy)"]) == int(percent)
