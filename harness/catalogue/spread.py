"""How much a trap's headline number owes to its seed: the buggy output's error over seeds.

A measurement draws its weights, inputs and upstream gradient from one seed; the bug's output
error moves with them (often 2-5x from one seed to the next). ``output_spread`` measures it again
on the same shape and kind of inputs (ordinary or edge) over ``SEEDS`` seeds, so the report can
give the range beside the one seed's value it tabulates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.catalogue.card import Pair
from harness.catalogue.compare import MeasurementError, compare
from harness.catalogue.judge import Measurement

SEEDS = 10  # seeds 0..SEEDS-1
# A seed whose error is within this many times its threshold counts as within the floor here:
# rounding on any machine, since another CPU's error and threshold each move by up to a
# threshold (harness.report.diff). Within one threshold alone, a rounding-level bug's count of
# seeds depends on the CPU (qkv_bias's seed 9: 0.83x its threshold here, 1.19x with MKL_CBWR).
MARGIN = 2


@dataclass(frozen=True)
class Spread:
    """The buggy output error over seeds 0..seeds-1: how many seeds' lie within ``MARGIN`` times
    their threshold (rounding noise, no number to quote), and the smallest and largest of the
    others'."""

    seeds: int
    within: int
    low: float = math.nan  # nan when every seed's is within its threshold
    high: float = math.nan


def output_spread(pair: Pair, m: Measurement, seeds: int = SEEDS) -> Spread | None:
    """The bug's output error over ``seeds`` seeds, measured as cell ``m`` was (its device,
    dtype, shape and inputs); None where a seed gives no number (the bug raises or returns NaN,
    or the trap is judged over freshly seeded modules already)."""
    if m.seeds:
        return None
    device, dtype = torch.device(m.device), getattr(torch, m.dtype)
    errors, within = [], 0
    for seed in range(seeds):
        if seed == m.seed:  # the cell's own draw, measured already
            output = m.output
        else:
            try:
                found = compare(pair, device, dtype, m.shape, seed, edge=m.edge, backward=False)
                output = found.output
            except MeasurementError:
                return None
        bug = output.set_index("run").loc["bug"]
        if math.isnan(bug["max_abs"]):
            return None
        if bug["max_abs"] > MARGIN * bug["threshold"]:
            errors.append(float(bug["max_abs"]))
        else:
            within += 1
    if not errors:
        return Spread(seeds, within)
    return Spread(seeds, within, min(errors), max(errors))
