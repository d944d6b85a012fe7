"""Where a model has several attention implementations (transformers' ``eager``, ``sdpa``,
``flex_attention``), they agree within the floor of the less precise one; under autocast the
model stays finite, with its mask and padding."""

from __future__ import annotations

import copy
import textwrap

import torch
from torch import Tensor, nn

from harness.doctor.findings import Outcome, failed, passed, skipped
from harness.doctor.model.call import SEQ_LEN, left_padded, no_autocast
from harness.doctor.model.patient import Patient, max_change
from harness.metrics import rounding
from harness.runner import as_dtype, describe

# flex_attention is compiled on first use: seconds on a CPU for a model that runs in
# milliseconds, so it is compared where it is cheap (CUDA) only
IMPLEMENTATIONS = ("eager", "sdpa")
LOW = (torch.float16, torch.bfloat16)


def _padded(patient: Patient) -> tuple[Tensor, dict[str, Tensor]]:
    """A batch whose first sequence is left-padded, with the mask (and positions) for it."""
    ids = patient.tokens()
    return ids, left_padded(patient.call, ids)


def _with(model: nn.Module, implementation: str) -> nn.Module:
    """A copy of the model running ``implementation``."""
    other = copy.deepcopy(model)
    other.set_attn_implementation(implementation)
    return other


def _current(model: nn.Module) -> str:
    """The attention implementation the model runs now (transformers' config records it)."""
    config = getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", None) or "as built")


def backends(patient: Patient) -> Outcome:
    """The implementation the model runs and every other one it runs here give the eager
    one's logits, on real tokens, within float32's floor, all in float32 (eager computes its
    softmax in float32, and in a float64 model fills its masks with float64's finfo.min, -inf
    there)."""
    model = as_dtype(patient.model, torch.device("cpu"), torch.float32).eval()
    if not callable(getattr(model, "set_attn_implementation", None)):
        return skipped("one attention implementation (no set_attn_implementation)")
    ids, given = _padded(patient)
    real = (given["mask"] if given else torch.ones_like(ids)).bool()  # (B, T)
    current = _current(model)
    outputs: dict[str, Tensor] = {}
    refused: list[str] = []
    for name in dict.fromkeys((*IMPLEMENTATIONS, current)):
        try:
            other = model if name == current else _with(model, name)
            outputs[name] = patient.logits(ids, other, **given)[real]
        except Exception as exc:
            refused.append(f"{name} ({textwrap.shorten(describe(exc), 80, placeholder=' ...')})")
    if "eager" not in outputs or len(outputs) < 2:
        return skipped(f"fewer than two implementations run here; refused: {', '.join(refused)}")
    base = outputs.pop("eager")
    floor = rounding(base.abs().max().item(), torch.float32)
    apart = {n: max_change(o, base) for n, o in outputs.items()}
    wrong = {n: m for n, m in apart.items() if m > floor}
    shown = ", ".join(f"{n}{' (the one it runs)' if n == current else ''} {m:.2g}"
                      for n, m in apart.items())  # fmt: skip
    skipped_note = f"; not run here: {', '.join(refused)}" if refused else ""
    if wrong:
        return failed(f"against eager on real tokens: {shown}, over the float32 floor "
                      f"{floor:.2g}{skipped_note}")  # fmt: skip
    return passed(f"against eager on real tokens: {shown} (floor {floor:.2g}){skipped_note}")


def low_precision(patient: Patient) -> Outcome:
    """Under autocast to float16 and bfloat16, a left-padded batch gives finite logits on its
    real tokens (accuracy is judged per layer, against SDPA in the same dtype)."""
    if patient.call.makes_cache(patient.model):
        return skipped(no_autocast(patient.model))
    ids, given = _padded(patient)
    real = (given["mask"] if given else torch.ones_like(ids)).bool()
    reference = patient.logits(ids, **given)[real]
    model = as_dtype(patient.model, torch.device("cpu"), torch.float32).eval()
    errors = []
    for dtype in LOW:
        with torch.autocast("cpu", dtype=dtype):
            got = patient.logits(ids, model, **given)[real]
        name = str(dtype).removeprefix("torch.")
        if not torch.isfinite(got).all():
            rows = (~torch.isfinite(got)).any(dim=-1).sum().item()
            return failed(
                f"under autocast({name}): {rows} of {len(got)} real tokens' logits are not "
                "finite (fill_overflow_half: a -1e9 or -inf fill; qk_overflow_half: scores past "
                "the dtype's range)",
                "fill_overflow_half",
                "qk_overflow_half",
            )
        scale = reference.abs().max().item()
        errors.append(f"{name} {(got - reference).abs().max().item() / scale:.2g}")
    padding = ", left padding included" if given else ""
    return passed(f"finite under autocast on {SEQ_LEN} tokens{padding}; error over the logits' "
                  f"scale: {', '.join(errors)}")  # fmt: skip
