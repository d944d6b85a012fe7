"""scale_d_model: the shared pair checks, flatter attention, and a bug one head hides."""

import torch

import pitfalls
from harness.measure import measure
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "scale_d_model"
)


def test_attention_is_flatter_and_invisible_with_one_head(device):
    m = measure(pitfalls.load("scale_d_model"), device, torch.float32)
    entropy = m.attention.set_index("run")["entropy_mean"]
    assert entropy["bug"] > entropy["fix"]
    assert m.variants["1 head"].startswith("BENIGN")
