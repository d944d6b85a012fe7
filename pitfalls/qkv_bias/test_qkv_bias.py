"""qkv_bias: the shared pair checks, and the dead key bias."""

import re

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from pitfalls.qkv_bias import CARD, key_bias_table


def test_key_bias_is_dead_weight_and_the_others_are_not(device):
    table = key_bias_table(registry.load("qkv_bias"), device, torch.float32).set_index("bias")
    relative = table["grad norm"] / table["weight grad norm"]
    assert relative["W_k.bias"] < 1e-5  # zero up to float32 rounding
    assert relative["W_q.bias"] > 1e-2 and relative["W_v.bias"] > 1e-2
    change = table["max |output change| when zeroed"]
    assert change["W_k.bias"] < 1e-5 < change["W_q.bias"]


def test_key_bias_gradient_is_zero_up_to_float64_rounding():
    """Zero "in exact arithmetic": in float64 the key bias gradient is at rounding level."""
    assert "gets exactly zero gradient in exact arithmetic" in CARD.truth
    table = key_bias_table(registry.load("qkv_bias"), torch.device("cpu"), torch.float64)
    table = table.set_index("bias")
    assert table.loc["W_k.bias", "grad norm"] < 1e-14 * table.loc["W_k.bias", "weight grad norm"]
    assert table.loc["W_k.bias", "max |output change| when zeroed"] < 1e-14


def test_the_wasted_parameters_are_d_k_per_layer():
    found = re.search(r"at worst (\w+) wasted parameters", CARD.why)
    assert found, "the card no longer counts the wasted parameters"
    pair = registry.load("qkv_bias")
    _, buggy = build_pair(pair, CARD.shape, seed=0)
    assert buggy.W_k.bias.numel() == getattr(CARD.shape, found[1])
