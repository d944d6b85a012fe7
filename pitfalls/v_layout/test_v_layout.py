"""v_layout: the shared pair checks, and the trigger d_v == seq_len."""

import re

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure
from pitfalls.v_layout import CARD


def test_trigger_is_d_v_eq_seq_len(device):
    t = measure(registry.load("v_layout"), device, torch.float32).trigger
    assert t is not None and t.d_v == t.seq_len > 1, t
    smallest = re.search(r"smallest at d_v = seq_len = (\d+)\.", CARD.truth)
    assert smallest and t.d_v == int(smallest[1]), t
