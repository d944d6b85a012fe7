"""qkv_bias: the shared pair checks, and the dead key bias."""

import torch

from harness.catalogue import registry
from pitfalls.qkv_bias import key_bias_table


def test_key_bias_is_dead_weight_and_the_others_are_not(device):
    table = key_bias_table(registry.load("qkv_bias"), device, torch.float32).set_index("bias")
    relative = table["grad norm"] / table["weight grad norm"]
    assert relative["W_k.bias"] < 1e-5  # zero up to float32 rounding
    assert relative["W_q.bias"] > 1e-2 and relative["W_v.bias"] > 1e-2
    change = table["max |output change| when zeroed"]
    assert change["W_k.bias"] < 1e-5 < change["W_q.bias"]
