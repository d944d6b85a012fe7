"""head_loop: the shared pair checks, and the weight map between fused and per-head."""

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair


def test_weight_map_round_trips():
    pair = registry.load("head_loop")
    shape = pair.card.shape
    fixed, buggy = build_pair(pair, shape, seed=3)
    back = pair.card.to_fixed(dict(buggy.state_dict()), shape)
    assert back.keys() == fixed.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in fixed.state_dict().items())
