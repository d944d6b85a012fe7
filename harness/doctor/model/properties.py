"""What a whole model must show, whatever its attention looks like inside: the future does not
reach the past, sequences in a batch do not mix, left padding with the model's own mask and
positions changes nothing real. Each failure names the catalogue trap it fits."""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from harness.doctor.findings import Outcome, failed, passed, skipped, warned
from harness.doctor.model.call import BATCH, PAD, SEQ_LEN, left_padded
from harness.doctor.model.patient import Patient, max_change


def eval_determinism(patient: Patient) -> Outcome:
    """Two identical forwards in eval mode give the same finite logits. Where they do not, two fresh
    copies of the model, each called once, tell state it keeps from randomness: agreeing,
    the second call read what the first left (a cache read before it is written)."""
    ids = patient.tokens()
    pristine = copy.deepcopy(patient.model)
    first, second = patient.logits(ids), patient.logits(ids)
    moved = 0.0 if _same(first, second) else max_change(first, second)
    if moved == 0 and not bool(torch.isfinite(first).all()):
        rows = int((~torch.isfinite(first)).any(dim=-1).sum())
        return failed(
            f"{rows} of {first.shape[0] * first.shape[1]} positions' logits are not finite on "
            "ordinary ids, the same every time: a query left with no key to attend to "
            "(fully_masked_row: a mask that blocks the diagonal, as triu(diagonal=0), or a "
            "row of -inf)",
            "fully_masked_row",
        )
    if moved > 0 and _fresh_copies_agree(patient, ids, pristine):
        return failed(
            f"a second identical forward differs from the first by {moved:.3g}, while two "
            "fresh copies called once agree: a forward reads state an earlier one left "
            "(stale_cache: keys read from the cache before this call writes them, or never "
            "cleared)",
            "stale_cache",
        )
    if moved > 0:
        return failed(
            f"two identical forwards in eval mode differ by {moved:.3g}: dropout left on, or "
            "sampling (dropout_in_eval: F.dropout without training=self.training)",
            "dropout_in_eval",
        )
    return passed("two identical forwards agree exactly")


def _same(a: Tensor, b: Tensor) -> bool:
    """Equal, NaN where the other is NaN (a row with no key, every time alike)."""
    return torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True)


def _fresh_copies_agree(patient: Patient, ids: Tensor, pristine: torch.nn.Module) -> bool:
    """Two copies of the model as it was, each called once on ``ids``, agree exactly."""
    once = [patient.logits(ids, copy.deepcopy(pristine)) for _ in range(2)]
    return _same(*once)


def _future_change(patient: Patient) -> tuple[Tensor, Tensor, float, float]:
    """Logits before and after the tokens from position SEQ_LEN // 2 on change, how far the
    earlier ones move and the floor."""
    ids = patient.tokens()
    j = SEQ_LEN // 2
    later = ids.clone()
    later[:, j:] = patient.tokens(seed=1)[:, j:]
    before, after = patient.logits(ids), patient.logits(later)
    return before, after, max_change(before[:, :j], after[:, :j]), patient.floor(before)


def masks_future(patient: Patient) -> bool:
    """Earlier logits ignore later tokens (a model that says nothing of its causality)."""
    _, _, moved, floor = _future_change(patient)
    return moved <= floor


def causal_no_leak(patient: Patient) -> Outcome:
    """Changing the tokens after position j leaves every logit up to j as it was."""
    if not patient.causal:
        return skipped("not a causal model: every token may see every other")
    j = SEQ_LEN // 2
    before, after, moved, floor = _future_change(patient)
    if moved > floor:
        first = int(((before - after).abs().amax(dim=(0, 2)) > floor).nonzero()[0])
        return failed(
            f"changing tokens {j}.. moves the logits of position {first} (before them) by "
            f"{moved:.3g}, over the {floor:.2g} floor: the future leaks into the past "
            "(causal_leak: a causal mask dropped or built wrong)",
            "causal_leak",
        )
    return passed(f"tokens {j}.. changed: earlier logits move by {moved:.2g} (floor {floor:.2g})")


def batch_independence(patient: Patient) -> Outcome:
    """Each sequence of a batch gets the logits it gets alone."""
    ids = patient.tokens()
    together = patient.logits(ids)
    moved = max(max_change(together[b], patient.logits(ids[b : b + 1])[0]) for b in range(BATCH))
    floor = patient.floor(together)
    if moved > floor:
        return failed(
            f"a sequence's logits in a batch of {BATCH} differ from its logits alone by "
            f"{moved:.3g}, over the {floor:.2g} floor: sequences mix (transpose: an axis swap "
            "or reshape that crosses the batch)",
            "transpose",
        )
    return passed(f"batch of {BATCH} vs alone: {moved:.2g} (floor {floor:.2g})")


def left_padding(patient: Patient) -> Outcome:
    """With PAD padding tokens on the left, the model's attention mask over them and the
    positions a generator gives (counting real tokens only), the real tokens' logits are their
    unpadded ones."""
    call = patient.call
    if call.mask is None:
        return skipped("the model takes no attention mask: it cannot batch sequences of "
                       "different lengths")  # fmt: skip
    ids = patient.tokens()
    padded = torch.cat([torch.zeros(BATCH, PAD, dtype=ids.dtype), ids], dim=1)  # (B, PAD + T)
    padded[1, :PAD] = patient.tokens(seed=2)[1, :PAD]  # sequence 1 is longer by PAD real tokens
    given = left_padded(call, padded)  # sequence 0 is left-padded
    mask = given["mask"]
    got = patient.logits(padded, **given)[0, PAD:]
    # unpadded, with positions passed the same way (RoBERTa's own count starts elsewhere)
    alone_given = {"positions": torch.arange(SEQ_LEN)[None]} if call.positions else {}
    alone = patient.logits(ids[:1], **alone_given)[0]
    moved = max_change(got, alone)
    floor = patient.floor(alone)
    if moved <= floor:
        how = "positions counted from the first real token" if call.positions else "no positions"
        return passed(f"{PAD} padding tokens on the left, {how}: {moved:.2g} (floor {floor:.2g})")
    evidence = f"{PAD} padding tokens on the left move the real tokens' logits by {moved:.3g}"
    if not torch.isfinite(got).all():
        return failed(
            f"{PAD} padding tokens on the left make real tokens' logits non-finite: a padding "
            "query with no key to attend gives NaN, and NaN reaches the real tokens through "
            "the next layer (fully_masked_row: a -inf fill, or a mask added twice that reaches "
            "-inf, on a row with no allowed key)",
            "fully_masked_row",
        )
    ignored = patient.logits(padded, **{**given, "mask": torch.ones_like(mask)})[0, PAD:]
    if max_change(ignored, got) <= floor:
        return failed(f"{evidence}: the same as with no padding masked, so the model ignores "
                      "its attention mask there")  # fmt: skip
    if call.positions is None and patient.causal:  # a decoder generates left-padded batches
        return failed(
            f"{evidence}; the model takes an attention mask but no position ids, and counts "
            f"positions from the padding: its real tokens sit {PAD} positions on "
            "(left_pad_positions: count them from the mask, as OPT's learned positions do)",
            "left_pad_positions",
        )
    if call.positions is None:  # an encoder: its caller pads on the right
        return warned(
            f"{evidence}; the model takes no position ids, so its real tokens sit {PAD} "
            "positions on (left_pad_positions: pad it on the right, or give it position ids)",
            "left_pad_positions",
        )
    return failed(
        f"{evidence}, with the model's mask and positions: the padding reaches real tokens "
        "(sdpa_mask_inverted: a mask read the other way round; padding_on_queries)",
        "sdpa_mask_inverted",
        "padding_on_queries",
    )
