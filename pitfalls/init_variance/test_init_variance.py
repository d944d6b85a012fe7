"""init_variance: the shared pair checks, and the three inits side by side."""

import torch

from harness.catalogue import registry
from pitfalls.init_variance import init_table


def test_only_the_large_init_is_degenerate(device):
    table = init_table(registry.load("init_variance"), device, torch.float32).set_index("init")
    assert table["degenerate"].to_dict() == {
        "xavier_uniform_ (fixed.py)": False,
        "normal_(std=1) (buggy.py)": True,
        "nn.Linear default": False,
    }


def test_weight_variances_match_theory():
    table = init_table(registry.load("init_variance"), torch.device("cpu"), torch.float32)
    ratio = table["weight variance (measured)"] / table["weight variance (theory)"]
    assert ratio.between(0.9, 1.1).all(), table
