"""mask_to_additive_nan: NaN on every row in every dtype, a NaN first step, and finfo.min sums."""

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.masks import encode
from harness.testing import claimed
from pitfalls.mask_to_additive_nan import CARD

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def draw(device, dtype):
    """The pair on the card's draw: modules, x and the float keep mask, in ``dtype``."""
    fixed, buggy = build_pair(registry.load("mask_to_additive_nan"), CARD.shape, 0)
    inputs = CARD.inputs(CARD.shape, 0)
    mask = encode(inputs.keep, CARD.spec, device, dtype)  # (B, T, T) float: 1.0 = attend
    x = inputs.x.to(device, dtype)
    return fixed.to(device, dtype), buggy.to(device, dtype), x, mask, inputs.keep


def test_every_row_is_nan_in_every_dtype(device):
    (rows,) = claimed(CARD, r"all (\d+) attention rows and every output are NaN")
    assert "in float32 as in bfloat16 and float16" in CARD.truth
    for dtype in DTYPES:
        fixed, buggy, x, mask, keep = draw(device, dtype)
        assert keep.any(-1).all() and (mask.unique() == torch.tensor([0.0, 1.0]).to(mask)).all()
        with torch.no_grad():
            fix_out, fix_w = fixed(x, mask)
            out, weights = buggy(x, mask)
        assert fix_out.isfinite().all()
        assert (fix_w.cpu()[~keep[:, None].expand_as(fix_w)] == 0).all()  # blocked keys: 0
        nan_rows = weights.isnan().any(-1)  # (B, h, T)
        assert nan_rows.all() and nan_rows.numel() == int(rows), dtype
        assert out.isnan().all(), dtype


def test_the_first_training_step_has_a_nan_loss_and_nan_gradients(device):
    assert "the loss of the first step is NaN, and so is every entry of every gradient" in (
        CARD.truth
    )
    fixed, buggy, x, mask, _ = draw(device, torch.float32)
    target = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(device)
    for module, broken in ((fixed, False), (buggy, True)):
        loss = (module(x, mask)[0] - target).pow(2).mean()
        loss.backward()
        grads = [p.grad for p in module.parameters()]
        assert loss.isnan().item() is broken
        assert all(g.isnan().all().item() is broken for g in grads)
        assert broken or all(g.isfinite().all() for g in grads)


def test_finfo_min_keeps_an_empty_row_finite_until_two_masks_are_added(device):
    assert "or finfo.min (which keeps an all-padding row finite)" in CARD.avoid
    assert "give -inf in float16, bfloat16 and float32 alike" in CARD.truth
    for dtype in DTYPES:
        plane = torch.full((2, 4), torch.finfo(dtype).min, dtype=dtype, device=device)
        assert (plane.softmax(-1) == 0.25).all(), dtype  # every key blocked: uniform, no NaN
        assert ((plane + plane) == float("-inf")).all(), dtype
        assert (plane + plane).softmax(-1).isnan().all(), dtype
