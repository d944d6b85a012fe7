"""transpose: the shared pair checks, and the trigger the search must find by itself."""

import torch

import pitfalls
from harness.measure import measure
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "transpose"
)


def test_trigger_is_batch_eq_seq_len_eq_d_k(device):
    m = measure(pitfalls.load("transpose"), device, torch.float32)
    assert m.error is not None and "RuntimeError" in m.error
    t = m.trigger
    assert t is not None and t.batch == t.seq_len == t.d_k > 1, t
