"""scale_precision: the shared pair checks, and every figure of the card measured."""

import math

import pytest
import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure
from harness.catalogue.verdicts import Verdict
from harness.testing import claimed
from pitfalls.scale_precision import (
    CARD,
    ROOT_ULPS,
    SCALE_D_KS,
    SCORE_ULPS,
    SWEEP_D_KS,
    at_most,
    scale_table,
    sqrt_sweep,
    sweep_scores,
    tensor_scale,
    ulp_distance,
)

CPU = torch.device("cpu")


def roots() -> tuple[torch.Tensor, torch.Tensor]:
    """sqrt(d_k) for the sweep: math.sqrt rounded to float32, and torch's float32 sqrt."""
    as_float = torch.tensor([math.sqrt(d_k) for d_k in SWEEP_D_KS], dtype=torch.float32)
    return as_float, torch.stack([tensor_scale(d_k) for d_k in SWEEP_D_KS])


def correctly_rounded(root: torch.Tensor) -> torch.Tensor:
    """Per d_k: is ``root`` (float32) the float32 nearest to sqrt(d_k)?

    The midpoints to the neighbouring floats have 25 bits, so their squares are exact in float64.
    """
    d_k = torch.tensor(list(SWEEP_D_KS), dtype=torch.float64)
    below = (root.double() + torch.nextafter(root, torch.tensor(0.0)).double()) / 2
    above = (root.double() + torch.nextafter(root, torch.tensor(math.inf)).double()) / 2
    return (below**2 <= d_k) & (d_k <= above**2)


def test_both_scales_are_exactly_the_claimed_value():
    value, d_k = claimed(CARD, r"exactly ([\d.]+) for d_k = (\d+)")
    assert (1 / tensor_scale(int(d_k))).item() == float(value) == 1 / math.sqrt(int(d_k))


def test_only_torch_sqrt_misses_the_correctly_rounded_root_and_by_at_most_the_claimed_ulp():
    off, first, last = claimed(
        CARD, r"sqrt is at most (\d+) ulp off .* for some d_k of (\d+)\.\.(\d+)"
    )
    assert (SWEEP_D_KS[0], SWEEP_D_KS[-1]) == (int(first), int(last))
    assert int(off) == ROOT_ULPS
    as_float, as_tensor = roots()
    assert correctly_rounded(as_float).all()
    apart = as_float != as_tensor
    assert torch.equal(apart, ~correctly_rounded(as_tensor))
    assert ulp_distance(as_float, as_tensor) <= int(off)


def faithful(device: torch.device) -> dict[str, list[int]]:
    """Per d_k of the sweep, on ``device``: scores divided by the Python float itself."""
    scores = sweep_scores().to(device)
    found: dict[str, list[int]] = {"÷": [], "×": []}
    for i, d_k in enumerate(SWEEP_D_KS):
        by_tensor = scores[i] / tensor_scale(d_k)
        found["÷"].append(ulp_distance(scores[i] / math.sqrt(d_k), by_tensor))
        found["×"].append(ulp_distance(scores[i] * (1 / math.sqrt(d_k)), by_tensor))
    return found


def test_scores_differ_only_where_the_roots_do_and_by_at_most_the_claimed_ulp(device):
    found = faithful(device)
    as_float, as_tensor = roots()
    scores_apart = torch.tensor(found["÷"]) > 0
    assert not (scores_apart & (as_float == as_tensor)).any()
    if device.type == "cpu":  # the card's figures, and the sweep's shortcut, are the CPU's
        (most,) = claimed(CARD, r"at most (\d+) ulp apart on the CPU")
        assert int(most) == SCORE_ULPS
        assert torch.equal(scores_apart, as_float != as_tensor)
        assert max(found["÷"]) <= int(most)
        sweep = sqrt_sweep()
        assert sweep["max ulp (÷ float vs ÷ tensor)"].tolist() == found["÷"]
        assert sweep["max ulp (× 1/float vs ÷ tensor)"].tolist() == found["×"]


def test_the_table_widths_agree_and_its_last_row_keeps_the_bounds_of_the_sweep():
    assert "for none of the table's first widths" in CARD.truth
    table = scale_table(registry.load("scale_precision"), CPU, torch.float32).set_index("d_k")
    widths = table.loc[[str(d_k) for d_k in SCALE_D_KS]]
    assert (widths["d_k with scales apart"] == 0).all() and (
        widths["d_k with scores apart"] == 0
    ).all()
    whole = table.loc[f"{SWEEP_D_KS[0]}..{SWEEP_D_KS[-1]}"]
    sweep = sqrt_sweep()
    assert whole["scale ulp"] == f"≤ {ROOT_ULPS}" and sweep["scale ulp"].max() <= ROOT_ULPS
    for column in ("max ulp (÷ float vs ÷ tensor)", "max ulp (× 1/float vs ÷ tensor)"):
        assert whole[column] == f"≤ {SCORE_ULPS}" and sweep[column].max() <= SCORE_ULPS


def test_a_bound_that_does_not_hold_shows_the_value():
    assert at_most(1, 1) == "≤ 1" and at_most(3, 2) == "3"


def test_benign_at_the_first_width_whose_roots_differ(device):
    assert "at the first d_k whose roots differ on the CPU that runs this trap's own test" in (
        " ".join(CARD.truth.split())
    )
    sweep = sqrt_sweep()
    differ = sweep.loc[sweep["scale ulp"] > 0, "d_k"]
    if differ.empty:
        pytest.skip("this CPU's float32 sqrt is correctly rounded for every d_k of the sweep")
    pair = registry.load("scale_precision")
    shape = pair.card.shape.with_(d_k=int(differ.iloc[0]))
    m = measure(pair, device, torch.float32, shape=shape)
    assert m.verdict is Verdict.BENIGN, m.reason
