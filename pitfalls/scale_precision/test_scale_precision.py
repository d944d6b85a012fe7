"""scale_precision: the shared pair checks, and every figure of the card measured."""

import math

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure
from harness.catalogue.verdicts import Verdict
from harness.testing import claimed
from pitfalls.scale_precision import (
    CARD,
    SCALE_D_KS,
    SWEEP_D_KS,
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


def test_only_torch_sqrt_misses_the_correctly_rounded_root_and_by_the_counted_ulp():
    off, count, first, last = claimed(
        CARD, r"sqrt is (\d+) ulp off .* for (\d+) of d_k = (\d+)\.\.(\d+)"
    )
    assert (SWEEP_D_KS[0], SWEEP_D_KS[-1]) == (int(first), int(last))
    as_float, as_tensor = roots()
    assert correctly_rounded(as_float).all()
    assert int((~correctly_rounded(as_tensor)).sum()) == int(count)
    apart = as_float != as_tensor
    assert torch.equal(apart, ~correctly_rounded(as_tensor))
    assert ulp_distance(as_float, as_tensor) == int(off)


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
        assert torch.equal(scores_apart, as_float != as_tensor)
        assert max(found["÷"]) == int(most)
        sweep = sqrt_sweep()
        assert sweep["max ulp (÷ float vs ÷ tensor)"].tolist() == found["÷"]
        assert sweep["max ulp (× 1/float vs ÷ tensor)"].tolist() == found["×"]


def test_the_table_widths_agree_and_its_last_row_sums_up_the_sweep():
    assert "for none of the table's first widths" in CARD.truth
    table = scale_table(registry.load("scale_precision"), CPU, torch.float32).set_index("d_k")
    widths = table.loc[[str(d_k) for d_k in SCALE_D_KS]]
    assert (widths["d_k with scales apart"] == 0).all() and (
        widths["d_k with scores apart"] == 0
    ).all()
    (count,) = claimed(CARD, r"for (\d+) of d_k")
    (most,) = claimed(CARD, r"at most (\d+) ulp apart")
    whole = table.loc[f"{SWEEP_D_KS[0]}..{SWEEP_D_KS[-1]}"]
    assert whole["d_k with scales apart"] == whole["d_k with scores apart"] == int(count)
    assert whole["max ulp (÷ float vs ÷ tensor)"] == int(most)


def test_benign_at_the_first_width_whose_roots_differ(device):
    (first,) = claimed(CARD, r"at d_k = (\d+), the first of those")
    sweep = sqrt_sweep()
    assert sweep.loc[sweep["scale ulp"] > 0, "d_k"].iloc[0] == int(first)
    pair = registry.load("scale_precision")
    shape = pair.card.shape.with_(d_k=int(first))
    m = measure(pair, device, torch.float32, shape=shape)
    assert m.verdict is Verdict.BENIGN, m.reason
    assert "The pair is BENIGN at the d_k of the tables below, and at d_k" in CARD.truth
