"""head_loop: the shared pair checks, and the weight map between fused and per-head."""

import torch

import pitfalls
from harness.measure import build_pair
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "head_loop"
)


def test_weight_map_round_trips():
    pair = pitfalls.load("head_loop")
    shape = pair.card.shape
    fixed, buggy = build_pair(pair, shape, seed=3)
    back = pair.card.to_fixed(dict(buggy.state_dict()), shape)
    assert back.keys() == fixed.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in fixed.state_dict().items())
