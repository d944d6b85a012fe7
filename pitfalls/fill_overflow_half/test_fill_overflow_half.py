"""fill_overflow_half: the shared pair checks, and the exact float16 error."""

import re

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure
from pitfalls.fill_overflow_half import CARD


def test_float16_raises_the_overflow_error_and_the_others_are_fine(device):
    pair = registry.load("fill_overflow_half")
    quoted = re.search(r"masked_fill raises '([^']*)'", CARD.truth)
    half = measure(pair, device, torch.float16)
    assert quoted and half.error is not None and quoted[1] in half.error, half.error
    assert "float32 and bfloat16 are fine" in CARD.truth
    for dtype in (torch.float32, torch.bfloat16):
        assert measure(pair, device, dtype).reason.startswith("output and every gradient")


def test_float16_tops_out_where_the_card_says():
    top = re.search(r"float16 tops out at (\d+)", CARD.truth)
    assert top and torch.finfo(torch.float16).max == int(top[1])
    assert "-1e9" in CARD.trap and -torch.finfo(torch.float16).max > -1e9
