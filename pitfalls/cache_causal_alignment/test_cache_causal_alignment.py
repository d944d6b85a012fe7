"""cache_causal_alignment: decode goes wrong from the first generated token, prefill does not."""

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure
from harness.scenarios import bounds


def test_error_starts_at_the_first_decode_step(device):
    m = measure(registry.load("cache_causal_alignment"), device, torch.float32)
    floor = m.output.set_index("run").loc["bug", "threshold"]
    ref = m.outputs["ref"]
    per_step = {
        name: (m.outputs[name] - ref).abs().amax(dim=(0, 2)) for name in ("fix", "bug")
    }  # (T,) each
    prefill = bounds("decode", m.shape.seq_len)[0][1]
    assert (per_step["fix"] <= floor).all()
    assert (per_step["bug"][:prefill] <= floor).all(), "the prefill itself is already wrong"
    assert (per_step["bug"][prefill:] > 100 * floor).all(), per_step["bug"]


def test_first_decode_step_sees_only_the_first_key(device):
    m = measure(registry.load("cache_causal_alignment"), device, torch.float32)
    prefill = bounds("decode", m.shape.seq_len)[0][1]
    row = m.weights["bug"][..., prefill, :]  # (B, h, T): the first generated token's weights
    assert torch.equal(row[..., 0], torch.ones_like(row[..., 0]))
