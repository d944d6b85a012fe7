"""transpose: the shared pair checks, and the trigger the search must find by itself."""

import re

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure
from pitfalls.transpose import CARD


def test_trigger_is_batch_eq_seq_len_eq_d_k(device):
    m = measure(registry.load("transpose"), device, torch.float32)
    assert m.error is not None and "RuntimeError" in m.error
    t = m.trigger
    assert t is not None and t.batch == t.seq_len == t.d_k > 1, t
    smallest = re.search(r"smallest at batch = seq_len = d_k = (\d+)\.", CARD.truth)
    assert smallest and t.batch == int(smallest[1]), t
    square = re.search(r"tiny square shapes \((\d+), (\d+), (\d+)\)", CARD.why)
    assert square and (t.batch, t.seq_len, t.d_k) == tuple(map(int, square.groups())), t
