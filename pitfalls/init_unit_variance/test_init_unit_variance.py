"""init_unit_variance: the shared pair checks, the three inits side by side, the card's figures."""

import math

import pytest
import torch

from harness import metrics
from harness.catalogue import registry
from harness.runner import seed_stats, seeded
from harness.testing import claimed
from pitfalls.init_unit_variance import CARD
from pitfalls.init_variance import init_table

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cpu_table():
    """init_table on the CPU in float32, indexed by init."""
    return init_table(registry.load("init_unit_variance"), CPU, torch.float32).set_index("init")


def test_only_the_large_init_is_degenerate(device, cpu_table):
    table = cpu_table
    if device.type != "cpu":
        pair = registry.load("init_unit_variance")
        table = init_table(pair, device, torch.float32).set_index("init")
    assert table["degenerate"].to_dict() == {
        "xavier_uniform_": False,
        "normal_(std=1)": True,
        "nn.Linear default": False,
    }


def test_weight_variances_are_the_cards_formulas_and_not_one_over_fan_in(cpu_table):
    (default,) = claimed(CARD, r"default has variance 1/\((\d+) fan_in\)")
    (xavier,) = claimed(CARD, r"xavier_uniform_ (\d+)/\(fan_in \+ fan_out\)")
    assert "not 1/fan_in" in CARD.truth
    fan_in, fan_out = CARD.shape.d_model, CARD.shape.d_k
    measured = cpu_table["weight variance (measured)"]
    for name, theory in (
        ("nn.Linear default", 1 / (int(default) * fan_in)),
        ("xavier_uniform_", int(xavier) / (fan_in + fan_out)),
    ):
        assert 0.95 < measured[name] / theory < 1.05, (name, measured[name], theory)
        assert not 0.8 < measured[name] * fan_in < 1.25, name  # not 1/fan_in
    assert 0.95 < measured["normal_(std=1)"] < 1.05


def test_rows_saturated_as_the_card_says(cpu_table):
    percent, weight = claimed(CARD, r"about (\d+)% of rows put ([\d.]+) of their weight on one key")
    assert float(weight) == metrics.SATURATED  # the harness's definition of a saturated row
    assert round(100 * cpu_table.loc["normal_(std=1)", "saturated rows"]) == int(percent)


def test_the_gradient_swings_seed_by_seed_as_the_card_says():
    """Each seed alone: the W_q gradient norm of normal_(std=1) over xavier's."""
    low, high = claimed(CARD, r"ranges from under ([\d.]+)x to over (\d+)x xavier's")
    pair = registry.load("init_unit_variance")
    ratios = []
    for seed in range(CARD.n_seeds):
        norms = [
            seed_stats(
                lambda s, m=module: CARD.build(m, s),
                CARD.inputs,
                CARD.spec,
                CPU,
                torch.float32,
                CARD.shape,
                range(seed, seed + 1),
            ).grad_norms["W_q.weight"]
            for module in (pair.buggy, pair.fixed)
        ]
        ratios.append(norms[0] / norms[1])
    assert min(ratios) < float(low) and max(ratios) > float(high), ratios


def test_scaled_scores_spread_about_d_model():
    """The trap's "Q K^T / sqrt(d_k) has a spread of about d_model": std over d_model near 1."""
    assert "has a spread of about d_model" in CARD.trap
    pair = registry.load("init_unit_variance")
    for seed in range(4):
        with seeded(seed):
            module = CARD.build(pair.buggy, CARD.shape)
        x = CARD.inputs(CARD.shape, seed).x.float()
        with torch.no_grad():
            scores = module.W_q(x) @ module.W_k(x).mT / math.sqrt(CARD.shape.d_k)
        assert 0.9 < scores.std().item() / CARD.shape.d_model < 1.1
