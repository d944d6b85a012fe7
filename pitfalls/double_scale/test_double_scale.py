"""double_scale: the second scale is a temperature of sqrt(d), and the card's entropies."""

import math

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.testing import claimed_numbers
from pitfalls.double_scale import CARD, GAINS, WIDE, entropies

CPU = torch.device("cpu")


def test_buggy_is_fixed_with_q_divided_by_sqrt_d_again(device):
    """buggy.py is fixed.py run on scores sqrt(d) times smaller, and nothing else."""
    fixed, buggy = build_pair(registry.load("double_scale"), CARD.shape, 0)
    fixed, buggy = fixed.to(device, torch.float64), buggy.to(device, torch.float64)
    x = CARD.inputs(CARD.shape, 0).x.to(device)
    with torch.no_grad():
        apart = (buggy(x)[0] - fixed(x)[0]).abs().max().item()
        fixed.W_q.weight /= math.sqrt(fixed.d_head)
        out, weights = fixed(x)
        assert torch.allclose(buggy(x)[0], out, rtol=0, atol=1e-12)
        assert torch.allclose(buggy(x)[1], weights, rtol=0, atol=1e-12)
    (figure,) = claimed_numbers(CARD, r"outputs are off by (\d+\.\d+) in float32")
    assert abs(apart - figure) < 5e-3, apart


def test_the_entropies_are_the_cards():
    pair = registry.load("double_scale")
    fix, bug = claimed_numbers(CARD, r"entropy goes from (\d+\.\d+) to (\d+\.\d+) \(d = 8")
    found = entropies(pair, CPU, torch.float32, CARD.shape, GAINS["nn.Linear init"])
    assert abs(found["fixed"] - fix) < 1e-3 and abs(found["buggy"] - bug) < 1e-3, found
    assert (WIDE.d_model // WIDE.heads, WIDE.seq_len) == (64, 64)
    fix, bug = claimed_numbers(
        CARD, r"d = 64, T = 64 \(the table below\) it goes from (\d+\.\d+) to (\d+\.\d+)"
    )
    found = entropies(pair, CPU, torch.float32, WIDE, GAINS["unit-variance q, k"])
    assert abs(found["fixed"] - fix) < 1e-3 and abs(found["buggy"] - bug) < 1e-3, found
    catalogue = claimed_numbers(CARD, r"the case behind the catalogue's (\d+\.\d+) -> (\d+\.\d+)")
    assert abs(found["fixed"] - catalogue[0]) < 0.01 and abs(found["buggy"] - catalogue[1]) < 0.01
