"""v_layout: the shared pair checks, and the trigger d_v == seq_len."""

import torch

import pitfalls
from harness.measure import measure
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "v_layout"
)


def test_trigger_is_d_v_eq_seq_len(device):
    t = measure(pitfalls.load("v_layout"), device, torch.float32).trigger
    assert t is not None and t.d_v == t.seq_len > 1, t
