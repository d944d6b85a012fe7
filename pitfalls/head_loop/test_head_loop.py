"""head_loop: the shared pair checks, the weight map, and the shape of the timing table."""

import re

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from pitfalls.head_loop import CARD, TIMING_SHAPES, timing_table


def test_weight_map_round_trips():
    pair = registry.load("head_loop")
    shape = pair.card.shape
    fixed, buggy = build_pair(pair, shape, seed=3)
    back = pair.card.to_fixed(dict(buggy.state_dict()), shape)
    assert back.keys() == fixed.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in fixed.state_dict().items())


def test_the_card_names_the_timing_table_from_its_first_to_its_last_shape():
    """The card's "from h heads of width w to h' heads of width w'" is the table's range."""
    found = re.search(r"from (\d+) heads of width (\d+) to (\d+) heads of width (\d+)", CARD.truth)
    assert found, "the card no longer names the timing table's first and last shapes"
    named = [(int(found[1]), int(found[2])), (int(found[3]), int(found[4]))]
    heads_and_width = [(h, d_model // h) for _, _, d_model, h in TIMING_SHAPES]
    assert named == [heads_and_width[0], heads_and_width[-1]]


def test_the_loop_falls_behind_as_heads_get_many_and_narrow(device):
    """Wall-clock, so only the direction: slower at the last shape, more so than at the first."""
    assert "where the loop is the slower of the two" in CARD.truth
    ratio = timing_table(registry.load("head_loop"), device, torch.float32, repeats=5)
    ratio = ratio["buggy / fixed"]
    assert ratio.iloc[-1] > 1.0, ratio.tolist()
    assert ratio.iloc[-1] > ratio.iloc[0], ratio.tolist()
