"""mask_rank: the shared pair checks, and the tutorial's own example crashing."""

import torch

import pitfalls
from harness.measure import measure
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "mask_rank"
)


def test_tutorial_example_raises_on_its_own_sizes(device):
    pair = pitfalls.load("mask_rank")
    shape = pair.card.shape.with_(batch=1, seq_len=3, d_model=3, d_k=2, d_v=3)  # §3.3's sizes
    m = measure(pair, device, torch.float32, shape=shape, search=False)
    assert m.error is not None and "3D" in m.error
