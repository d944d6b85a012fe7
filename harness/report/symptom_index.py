"""report.md's way in from what a student sees: each symptom with the traps whose measurements
show it (the rules are ``symptoms``'), then how the fixes meet each other's traps."""

from __future__ import annotations

from collections.abc import Callable

from harness.report import symptoms
from harness.report.format import named, prose
from harness.report.pages import linker
from harness.report.results import TrapResult


def fixes_together(to: Callable[[str], str]) -> str:
    """How the fixes meet each other's traps, linked with ``to``."""
    return prose(
        "**The fixes together.** Each section's fix repairs its own trap; some meet another trap "
        f"on other inputs. A `-inf` fill (the fix of {to('mask_bool')}) gives NaN on a row with "
        f"no allowed key ({to('fully_masked_row')}); a -1e9 fill raises in float16 "
        f"({to('fill_overflow_half')}) and -1e4 leaks at large logits ({to('fill_too_small')}); "
        "`(Q K^T) / sqrt(d_k)`, the textbook order most fixed.py files keep, overflows float16 "
        f"at large activations ({to('qk_overflow_half')}). Code that avoids them all at once: "
        "scale Q before the product, fill with `torch.finfo(scores.dtype).min` (or `-inf` and "
        "zero the rows with no allowed key), mask keys and never queries, `softmax(dim=-1)`, "
        "`tril(diagonal=0)` for causality, dropout only through `self.training` — or call SDPA, "
        "whose conventions the sections name."
    )


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
    sections = {r.pair.card.id: r.pair.card.section for r in results}
    to = linker(results)
    for name, measured_as, hits in symptoms.index(results, timed):
        lines += ["", f"**{name}** ({measured_as}):", ""]
        lines += [f"- {to(trap)}{named(sections[trap])}: {evidence}" for trap, evidence in hits]
        lines += [] if hits else ["- none here"]
    return "\n".join([*lines, "", fixes_together(to)])
