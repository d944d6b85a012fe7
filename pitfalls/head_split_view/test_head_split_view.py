"""head_split_view: the shared pair checks, and a bug one head cannot show."""

import torch

import pitfalls
from harness.measure import measure
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "head_split_view"
)


def test_benign_with_one_head_silent_with_four(device):
    m = measure(pitfalls.load("head_split_view"), device, torch.float32)
    assert m.shape.heads == 4 and str(m.verdict) == "SILENT"
    assert m.variants["1 head"].startswith("BENIGN")
