"""rope_pairing_mismatch: two valid rotary layouts, and only the weights tell which is right."""

import math

import pytest
import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.catalogue.judge import measure
from harness.shapes import MODERN_SHAPE
from harness.testing import claimed, number
from pitfalls.rope_pairing_mismatch import CARD

PAIR = registry.load("rope_pairing_mismatch")
CPU = torch.device("cpu")


def modules(device):
    """fixed.py and buggy.py with the same weights, and the measurement's x, on ``device``."""
    fix, bug = build_pair(PAIR, MODERN_SHAPE, 0)
    x = PAIR.card.inputs(MODERN_SHAPE, 0).x.float()
    return fix.to(device), bug.to(device), x.to(device)


def positions(device, offset=0):
    """(B, T) positions offset, offset + 1, ..."""
    arange = torch.arange(offset, offset + MODERN_SHAPE.seq_len, device=device)
    return arange.expand(MODERN_SHAPE.batch, -1)


def logits(rotary, module, x, pos):
    """(B, h, T, T) attention logits of ``module`` with ``rotary``; the masked entries are 0."""
    B, T, _ = x.shape
    q = module.W_q(x).view(B, T, module.n_heads, module.d_head).transpose(1, 2)
    k = module.W_k(x).view(B, T, module.n_kv_heads, module.d_head).transpose(1, 2)
    q, k = rotary(q, pos), rotary(k, pos)
    k = k.repeat_interleave(module.n_heads // module.n_kv_heads, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(module.d_head)
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    return scores.masked_fill(~causal, 0.0)


def angles(x, pos):
    d = x.size(-1)
    inv_freq = 10000.0 ** -(torch.arange(0, d, 2, device=x.device).float() / d)
    return pos[:, None, :, None].float() * inv_freq  # (B, 1, T, d/2)


def half_split_reference(x, pos):
    """Hugging Face's Llama: x * cos + rotate_half(x) * sin, frequencies repeated per half."""
    d = x.size(-1)
    emb = torch.cat([angles(x, pos)] * 2, dim=-1)
    rotate_half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return x * emb.cos() + rotate_half * emb.sin()


def interleaved_reference(x, pos):
    """Meta's Llama: neighbouring pairs as complex numbers, times exp(i * angle)."""
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    a = angles(x, pos)
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(a), a)).flatten(-2)


def to_interleaved(weight, d_head):
    """Each head's rows reordered from half-split pairs (i, i + d/2) to neighbours (2i, 2i+1)."""
    order = torch.arange(d_head).view(2, d_head // 2).t().flatten()  # 0, d/2, 1, d/2 + 1, ...
    heads = weight.view(-1, d_head, weight.size(-1))
    return heads[:, order.to(weight.device)].reshape_as(weight)


def test_each_file_is_the_reference_implementation_of_one_layout(device):
    x = torch.randn(2, 4, 8, 16, generator=torch.Generator().manual_seed(0)).to(device)
    pos = torch.randint(0, 4096, (2, 8), generator=torch.Generator().manual_seed(1)).to(device)
    half, inter = half_split_reference(x, pos), interleaved_reference(x, pos)
    fixed_out, buggy_out = PAIR.fixed.rotary(x, pos), PAIR.buggy.rotary(x, pos)
    torch.testing.assert_close(fixed_out, half, rtol=0, atol=1e-5)
    torch.testing.assert_close(buggy_out, inter, rtol=0, atol=1e-5)
    assert (fixed_out - inter).abs().max() > 0.5  # the two layouts are different functions


@pytest.mark.parametrize("side", ["fixed", "buggy"])
def test_both_layouts_are_relative_so_a_shift_cannot_tell_them_apart(device, side):
    (offset,) = claimed(CARD, r"shifting every position by ([\d,]+) changes either file")
    fix, bug, x = modules(device)
    module = fix if side == "fixed" else bug
    with torch.no_grad():
        before, _ = module(x, positions=positions(device))
        after, _ = module(x, positions=positions(device, int(number(offset))))
    assert (after - before).abs().max() < 1e-5


def test_buggy_on_weights_permuted_to_its_layout_is_fixed(device):
    """The bug is the layout of the weights: permute W_q and W_k rows and buggy.py is fixed.py."""
    fix, bug, x = modules(device)
    with torch.no_grad():
        expected, _ = fix(x)
        unpermuted, _ = bug(x)
        for name in ("W_q", "W_k"):
            weight = getattr(bug, name).weight
            weight.copy_(to_interleaved(weight, bug.d_head))
        permuted, _ = bug(x)
    assert (unpermuted - expected).abs().max() > 0.1
    torch.testing.assert_close(permuted, expected, rtol=0, atol=1e-5)


def test_the_cards_figures_are_measured():
    out, rel = claimed(CARD, r"outputs differ by ([\d.]+) \(relative L2 ([\d.]+)\)")
    logit, largest = claimed(CARD, r"logits by up to ([\d.]+), where the largest logit is ([\d.]+)")
    (bound,) = claimed(CARD, r"its logits stay within ([\d.]+)\.")
    m = measure(PAIR, CPU, torch.float32)
    bug = m.output.set_index("run").loc["bug"]
    assert bug["max_abs"] == pytest.approx(float(out), abs=5e-4)
    assert bug["rel_l2"] == pytest.approx(float(rel), abs=5e-4)
    fix, _, x = modules(CPU)
    with torch.no_grad():
        right = logits(PAIR.fixed.rotary, fix, x, positions(CPU))
        wrong = logits(PAIR.buggy.rotary, fix, x, positions(CPU))
    assert (wrong - right).abs().max().item() == pytest.approx(float(logit), abs=5e-3)
    assert right.abs().max().item() == pytest.approx(float(largest), abs=5e-3)
    assert right.abs().max() < float(bound)
    for dtype in (torch.bfloat16, torch.float16):  # "about the same" in half precision
        low = measure(PAIR, CPU, dtype, search=False).output.set_index("run").loc["bug"]
        assert low["max_abs"] == pytest.approx(float(out), rel=0.05)
