"""left_pad_positions: a row's real tokens do not depend on its left padding; rotary hides it."""

import re

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.catalogue.judge import measure
from harness.masks import CONVENTIONS
from harness.scenarios import SCENARIOS, bounds, make_call
from harness.shapes import MODERN_SHAPE
from harness.testing import assert_rounding_only
from pitfalls.left_pad_positions import CARD
from pitfalls.rope_cache_offset.fixed import rotary

PAIR = registry.load("left_pad_positions")
KEY_PADDING = CONVENTIONS["key_padding"]


def said(pattern):
    found = re.search(pattern, CARD.truth)
    assert found, f"the card no longer says {pattern!r}"
    return float(found[1].rstrip("."))


def behind_padding(module, x, pad):
    """Outputs (1, L, d) of the real tokens x (1, L, d) behind ``pad`` random padding tokens."""
    gen = torch.Generator().manual_seed(pad)
    noise = torch.randn(1, pad, x.size(-1), generator=gen, dtype=x.dtype).to(x.device)
    real = torch.arange(pad + x.size(1), device=x.device) >= pad  # (S,)
    return module(torch.cat([noise, x], dim=1), real[None])[0][:, pad:]


def test_real_tokens_ignore_how_much_padding_precedes_them(device):
    fixed, buggy = build_pair(PAIR, MODERN_SHAPE, 0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 5, MODERN_SHAPE.d_model, generator=gen, dtype=torch.float64).to(device)
    with torch.no_grad():
        for module, moves in ((fixed, False), (buggy, True)):
            module = module.to(device, torch.float64)
            alone = behind_padding(module, x, 0)
            for pad in (1, 2, 3):
                change = (behind_padding(module, x, pad) - alone).abs().max().item()
                assert change > 0.05 if moves else change < 1e-6, (pad, change)


def test_card_numbers_are_measured(device):
    m = measure(PAIR, device, torch.float32, search=False)
    real = PAIR.card.inputs(m.shape, m.seed).keep.any(-1)  # (B, T) the real query rows
    error = (m.outputs["bug"] - m.outputs["ref"]).abs().amax(-1)  # (B, T)
    claimed = said(r"real tokens are off by ([\d.]+) in float32")
    assert abs(error[real].max().item() - claimed) <= 0.05 * claimed
    claimed = said(r"its padding rows move too, by ([\d.]+)")
    assert abs(error[~real].max().item() - claimed) <= 0.05 * claimed


class RotaryOnly:
    """The pair with rotary positions instead of the absolute embedding: the embedding is
    replaced by zeros, and hooks on W_q and W_k rotate q and k by the positions it was given."""

    def __init__(self, monkeypatch):
        self.positions = None
        for files in (PAIR.fixed, PAIR.buggy):
            monkeypatch.setattr(files, "sinusoidal", self.record)

    def record(self, positions, d):
        self.positions = positions
        return torch.zeros(*positions.shape, d, device=positions.device)

    def attach(self, module):
        def rotate(linear, inputs, out):
            B, T, _ = out.shape
            heads = out.view(B, T, -1, module.d_head).transpose(1, 2)  # (B, h, T, d)
            return rotary(heads, self.positions).transpose(1, 2).reshape(B, T, -1)

        module.W_q.register_forward_hook(rotate)
        module.W_k.register_forward_hook(rotate)
        return module


def mixed_decode(module, new_cache, x, keep):
    """Prefill with positions from the mask, then decode steps at the cache length."""
    cache, outputs = new_cache(), []
    for i, (t0, t1) in enumerate(bounds("decode", x.size(1))):
        mask = KEY_PADDING.encode(keep[:, t0:t1, :t1], x.device, x.dtype)
        steps = None if i == 0 else torch.arange(t0, t1, device=x.device).expand(x.size(0), -1)
        outputs.append(module(x[:, t0:t1], mask, positions=steps, cache=cache)[0])
    return torch.cat(outputs, dim=1)


def test_rotary_alone_hides_it_unless_prefill_and_decode_disagree(device, monkeypatch):
    hooks = RotaryOnly(monkeypatch)
    hidden, size, mixed = 0.0, 0.0, 0.0
    with torch.no_grad():
        for seed in range(20):
            inputs = PAIR.card.inputs(MODERN_SHAPE, seed)
            real = inputs.keep.any(-1).to(device)  # (B, T)
            x = inputs.x.to(device)
            pair = build_pair(PAIR, MODERN_SHAPE, seed)
            fixed, buggy = (hooks.attach(m.to(device, torch.float64)) for m in pair)
            full = make_call(SCENARIOS["full"], inputs.keep, KEY_PADDING, None, None)
            ref = full(fixed, x)[0]
            size = max(size, ref.abs().max().item())
            for scenario in ("full", "decode"):
                how = SCENARIOS[scenario]
                call = make_call(how, inputs.keep, KEY_PADDING, None, PAIR.buggy.KVCache)
                error = (call(buggy, x)[0] - ref).abs().amax(-1)  # (B, T)
                hidden = max(hidden, error[real].max().item())
            steps = mixed_decode(fixed, PAIR.fixed.KVCache, x, inputs.keep)
            error = (steps - ref).abs().amax(-1)  # (B, T)
            mixed = max(mixed, error[real].max().item())
    assert_rounding_only(CARD, hidden, size)  # rounding, not the bug
    claimed = said(r"that is off by ([\d.]+) \(float64, 20 seeds\)")
    assert abs(mixed - claimed) <= 0.05 * claimed, mixed
