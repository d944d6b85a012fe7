"""gqa_kv_grouping: which query heads each K/V head reaches, and the one-head blind spot."""

import re

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.catalogue.judge import measure
from harness.shapes import MODERN_SHAPE
from pitfalls.gqa_kv_grouping import CARD


def reached_heads(module, x, kv_head):
    """The query heads whose attention weights move when K/V head ``kv_head``'s keys change."""
    d_head = module.d_head
    with torch.no_grad():
        _, before = module(x)  # (B, h, T, T)
        module.W_k.weight[kv_head * d_head : (kv_head + 1) * d_head] *= 2.0
        _, after = module(x)
        module.W_k.weight[kv_head * d_head : (kv_head + 1) * d_head] /= 2.0
    moved = (after - before).abs().amax(dim=(0, 2, 3))  # (h,)
    return set((moved > 1e-6).nonzero().flatten().tolist())


def test_kv_head_0_reaches_its_own_block_only_when_fixed(device):
    claimed = re.search(r"reaches query heads (\d) and (\d) instead of (\d) and (\d)", CARD.truth)
    assert claimed, "the card no longer says which heads K/V head 0 reaches"
    fixed, buggy = build_pair(registry.load("gqa_kv_grouping"), MODERN_SHAPE, 0)
    x = torch.randn(
        2, MODERN_SHAPE.seq_len, MODERN_SHAPE.d_model, generator=torch.Generator().manual_seed(0)
    )
    fixed, buggy, x = fixed.to(device), buggy.to(device), x.to(device)
    assert reached_heads(fixed, x, 0) == {int(claimed[3]), int(claimed[4])}
    assert reached_heads(buggy, x, 0) == {int(claimed[1]), int(claimed[2])}


def test_one_head_hides_it(device):
    """One query head per K/V head: the two expansions agree, single-head tests cannot see it."""
    m = measure(registry.load("gqa_kv_grouping"), device, torch.float32)
    assert m.verdict.value == "SILENT" and m.variants["1 head"].startswith("BENIGN"), m.variants
