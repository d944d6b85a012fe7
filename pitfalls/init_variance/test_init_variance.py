"""init_variance: the shared pair checks, and the tutorial's §4.5 claim against the three inits."""

import pytest
import torch

from harness.catalogue import registry
from harness.testing import claimed
from pitfalls.init_variance import CARD, init_table

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cpu_table():
    """init_table on the CPU in float32, indexed by init."""
    return init_table(registry.load("init_variance"), CPU, torch.float32).set_index("init")


def test_weight_variances_are_the_cards_formulas_and_not_one_over_fan_in(cpu_table):
    (default,) = claimed(CARD, r"default has variance 1/\((\d+) fan_in\)")
    (xavier,) = claimed(CARD, r"xavier_uniform_ (\d+)/\(fan_in \+ fan_out\)")
    (ratio,) = claimed(CARD, r"xavier's is the larger, ([\d.]+)x")
    assert "not 1/fan_in" in CARD.truth
    fan_in, fan_out = CARD.shape.d_model, CARD.shape.d_k
    measured = cpu_table["weight variance (measured)"]
    for name, theory in (
        ("nn.Linear default", 1 / (int(default) * fan_in)),
        ("xavier_uniform_", int(xavier) / (fan_in + fan_out)),
    ):
        assert 0.95 < measured[name] / theory < 1.05, (name, measured[name], theory)
        assert not 0.8 < measured[name] * fan_in < 1.25, name  # not 1/fan_in
    theory = cpu_table["weight variance (theory)"]
    assert round(theory["xavier_uniform_"] / theory["nn.Linear default"], 1) == float(ratio)


def test_both_are_healthy_and_xavier_is_the_sharper(device, cpu_table):
    (seeds,) = claimed(CARD, r"healthy attention over (\d+) seeds \(no saturated rows\)")
    assert int(seeds) == CARD.n_seeds
    table = cpu_table
    if device.type != "cpu":
        table = init_table(registry.load("init_variance"), device, torch.float32).set_index("init")
    for name in ("nn.Linear default", "xavier_uniform_"):
        assert table.loc[name, "saturated rows"] == 0 and not table.loc[name, "degenerate"]
    assert "xavier's is the sharper of the two" in CARD.truth
    entropy = table["entropy (mean)"]
    assert entropy["xavier_uniform_"] < entropy["nn.Linear default"]
    assert table.loc["normal_(std=1)", "degenerate"]  # the init that does saturate
