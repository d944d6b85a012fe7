"""report.md's way in from what a student sees: each symptom with the traps whose measurements
show it (the rules are ``symptoms``'), then how the fixes meet each other's traps."""

from __future__ import annotations

from harness.report import symptoms
from harness.report.format import link
from harness.report.results import TrapResult

FIXES_TOGETHER = """\
**The fixes together.** Each section's fix repairs its own trap; some meet another trap on other
inputs. A `-inf` fill (the fix of [`mask_bool`](#mask_bool)) gives NaN on a row with no allowed
key ([`fully_masked_row`](#fully_masked_row)); a -1e9 fill raises in float16
([`fill_overflow_half`](#fill_overflow_half)) and -1e4 leaks at large logits
([`fill_too_small`](#fill_too_small)); `(Q K^T) / sqrt(d_k)`, the textbook order most fixed.py
files keep, overflows float16 at large activations ([`qk_overflow_half`](#qk_overflow_half)).
Code that avoids them all at once: scale Q before the product, fill with
`torch.finfo(scores.dtype).min` (or `-inf` and zero the rows with no allowed key), mask keys and
never queries, `softmax(dim=-1)`, `tril(diagonal=0)` for causality, dropout only through
`self.training` — or call SDPA, whose conventions the sections name."""


def symptom_index(results: list[TrapResult], timed: set[str]) -> str:
    """Symptoms a student sees, each with the traps whose measurements show it."""
    lines = [
        "## From a symptom to its traps",
        "",
        "Each trap is listed under a symptom only when its own measurement shows it; the "
        "evidence follows its name. "
        + (
            "Evidence that starts with *training:* comes from the learning probe (both "
            "modules trained on a tiny task); the rest from one forward and backward pass."
            if any(r.learning is not None for r in results)
            else "One forward and backward pass is measured, not training (the learning probe "
            "was skipped), so the training symptoms are read off what that pass shows."
        ),
    ]
    for name, measured_as, hits in symptoms.index(results, timed):
        lines += ["", f"**{name}** ({measured_as}):", ""]
        lines += [f"- {link(trap)}: {evidence}" for trap, evidence in hits] or ["- none here"]
    return "\n".join([*lines, "", FIXES_TOGETHER])
