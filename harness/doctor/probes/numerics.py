"""Numerics: determinism in eval mode, and robustness in float16 and bfloat16."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from harness.doctor.findings import Outcome, failed, passed, warned
from harness.doctor.probes.registry import probe
from harness.doctor.subject import Subject
from harness.metrics import first_nonfinite
from harness.reference import attend, recognize
from harness.runner import describe

HALF_LARGE = 200.0  # activation scale for the float16 overflow check


@probe("eval determinism")
def probe_determinism(subject: Subject) -> Outcome:
    """Two identical calls in eval mode give identical outputs."""
    diff = subject.repeat_difference
    if diff > 0:
        return failed(
            f"two identical calls in eval mode differ by up to {diff:.3g} (dropout left on?)"
        )
    return passed("identical")


def probe_half(subject: Subject, dtype: torch.dtype) -> Outcome:
    """No error and no NaN in a low-precision dtype on ordinary inputs."""
    cfg = subject.config
    try:
        module = subject.copy(dtype)
        x = subject.x(cfg.batch, cfg.seq_len, 9).to(dtype)
        with torch.no_grad():
            out, _ = subject.call(module, x, subject.ordinary_keep(cfg.batch, cfg.seq_len))
    except Exception as exc:
        return failed(f"raises: {describe(exc)}")
    if not torch.isfinite(out).all():
        return failed(f"non-finite output{first_nonfinite(out)}")
    if dtype is torch.float16:
        with torch.no_grad():
            big, _ = subject.call(
                module,
                (x.double() * HALF_LARGE).to(dtype),
                subject.ordinary_keep(cfg.batch, cfg.seq_len),
            )
        if not torch.isfinite(big).all():
            return _half_overflow(subject, module, x, big)
    return passed("no error, no NaN")


def _half_overflow(subject: Subject, module: nn.Module, x: Tensor, big: Tensor) -> Outcome:
    """float16 overflowed at large activations: a warning when SDPA on the same projections
    stays finite there (so the module's order of operations is to blame), else a pass."""
    where = f"with activations scaled by {HALF_LARGE:g}: output{first_nonfinite(big)}"
    found = recognize(module)
    if found is None:
        advice = "Q K^T overflowing float16's 65504? scale Q first, or compute it in float32"
        return warned(f"{where} ({advice})")
    cfg = subject.config
    keep = subject.ordinary_keep(cfg.batch, cfg.seq_len)
    allowed = subject.effective_keep(keep, cfg.batch, cfg.seq_len)
    with torch.no_grad():
        ref = attend(found, (x.double() * HALF_LARGE).to(x.dtype), allowed)
    if not torch.isfinite(ref).all():
        reason = "but SDPA on the same projections overflows too: beyond float16's range"
        return passed(f"{where}, {reason}")
    advice = "Q K^T overflows before the scale? Scale Q first, or compute it in float32"
    return warned(f"{where}, while SDPA on the same projections stays finite: {advice}")


@probe("float16 robustness")
def probe_float16(subject: Subject) -> Outcome:
    return probe_half(subject, torch.float16)


@probe("bfloat16 robustness")
def probe_bfloat16(subject: Subject) -> Outcome:
    return probe_half(subject, torch.bfloat16)
