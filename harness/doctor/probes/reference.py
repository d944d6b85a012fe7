"""Agreement with F.scaled_dot_product_attention on the module's own projections."""

from __future__ import annotations

import math

import torch

from harness.doctor.findings import Outcome, failed, passed, skipped
from harness.doctor.probes.registry import probe
from harness.doctor.subject import Subject
from harness.reference import attend, recognize

SDPA_TOLERANCE = 1e-6  # relative to the output's scale; float64 on both sides


@probe("agrees with SDPA")
def probe_sdpa(subject: Subject) -> Outcome:
    """Agreement with F.scaled_dot_product_attention on the module's own projections."""
    if subject.config.positional:
        return skipped("uses positions (--positional): SDPA would not")
    if not subject.deterministic:
        return skipped("not deterministic in eval mode (see above)")
    module = subject.copy()
    found = recognize(module)
    if found is None:
        reason = "projections not recognized (or other parameters or non-mask buffers present)"
        return skipped(reason)
    described = found[3]
    cfg = subject.config
    keep = subject.ordinary_keep(cfg.batch, cfg.seq_len)
    allowed = subject.effective_keep(keep, cfg.batch, cfg.seq_len)
    x = subject.x(cfg.batch, cfg.seq_len, 8)
    with torch.no_grad():
        ref = attend(found, x, allowed)
        out, _ = subject.call(module, x, keep)
    if out.shape != ref.shape:
        return failed(
            f"output {tuple(out.shape)} vs SDPA's {tuple(ref.shape)} on {described}",
        )
    diff = (out - ref).abs().nan_to_num(math.inf).max().item()
    if diff > SDPA_TOLERANCE * max(1.0, ref.abs().max().item()):
        return failed(
            f"max |output - SDPA| = {diff:.3g} on {described} (scale, mask or head layout?)",
        )
    return passed(f"within {SDPA_TOLERANCE:g} on {described}")
