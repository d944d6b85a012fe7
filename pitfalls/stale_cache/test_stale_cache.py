"""stale_cache: a reused cache differs from a fresh one in buggy.py only."""

import re

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.catalogue.judge import measure
from harness.scenarios import SCENARIOS, make_call
from harness.shapes import MODERN_SHAPE
from pitfalls.stale_cache import CARD

PAIR = registry.load("stale_cache")


def through(scenario, module, new_cache, x):
    return make_call(SCENARIOS[scenario], None, None, None, new_cache)(module, x)[0]


def test_a_reused_instance_differs_from_a_fresh_one_only_when_buggy(device):
    fixed, buggy = build_pair(PAIR, MODERN_SHAPE, 0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, MODERN_SHAPE.seq_len, MODERN_SHAPE.d_model, generator=gen)
    x = x.to(device, torch.float64)
    found = {}
    with torch.no_grad():
        for name, module, files in (("fixed", fixed, PAIR.fixed), ("buggy", buggy, PAIR.buggy)):
            module = module.to(device, torch.float64)
            fresh = through("decode", module, files.KVCache, x)
            reused = through("reuse", module, files.KVCache, x)
            found[name] = (reused - fresh).abs().max().item()
    assert found["fixed"] < 1e-6 and found["buggy"] > 0.1, found


def test_reset_keeps_the_old_length_only_when_buggy():
    for files, kept in ((PAIR.fixed, 0), (PAIR.buggy, 8)):
        cache = files.KVCache()
        cache.update(torch.ones(1, 2, 8, 4), torch.ones(1, 2, 8, 4))
        cache.reset()
        assert len(cache) == kept
        assert cache.k is None or not cache.k.any()  # what is left is zeros


def test_card_numbers_are_measured(device):
    said = re.search(r"off by ([\d.]+) at the first token, ([\d.]+) at the last", CARD.truth)
    assert said, "the card no longer gives the first and last token errors"
    m = measure(PAIR, device, torch.float32, search=False)
    per_step = (m.outputs["bug"] - m.outputs["ref"]).abs().amax(dim=(0, 2))  # (T,)
    for got, claimed in ((per_step[0], said[1]), (per_step[-1], said[2])):
        assert abs(got.item() - float(claimed)) <= 0.05 * float(claimed), per_step
