"""The way in from what a student sees: each symptom with the traps whose measurements show it
(the rules are ``symptoms``'). On the student's page, the traps by name, the tutorial's first;
on the tutorial's page, each with its evidence, then how the fixes meet each other's traps."""

from __future__ import annotations

from collections.abc import Callable

from harness.catalogue.card import NOT_NAMED
from harness.files import CLAIMS_PAGE
from harness.report import symptoms
from harness.report.format import TRAINED, anchor, named, prose
from harness.report.pages import linker, student_traps
from harness.report.results import TrapResult

OTHERS = 5  # traps from beyond the tutorial named in the student's index; more are counted
EVIDENCE = "symptoms-evidence"  # the anchor of the index with its evidence, on the tutorial's page


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
        f"{anchor(EVIDENCE)}",
        "## From a symptom to its traps, with the evidence",
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
    to = linker(results, here=CLAIMS_PAGE)
    for name, measured_as, hits in symptoms.index(results, timed):
        lines += ["", f"**{name}** ({measured_as}):", ""]
        lines += [f"- {to(trap)}{named(sections[trap])}: {evidence}" for trap, evidence in hits]
        lines += [] if hits else ["- none here"]
    return "\n".join([*lines, "", fixes_together(to)])


def _names(traps: list[str], to: Callable[[str], str], said: dict[str, str] | None = None) -> str:
    """The traps linked, each with what ``said`` says of it (its title, its training tally)."""
    said = said or {}
    return ", ".join(f"{to(t)}{f' ({said[t]})' if t in said else ''}" for t in traps)


def _lowered(title: str) -> str:
    """A card's title inside a sentence: a first word that is only capitalised (not code, not
    an initial like the V of V) in lower case, the rest as written."""
    first = title.split(" ", 1)[0]
    plain = first.isalpha() and (first in ("A", "An") or (len(first) > 1 and first[1:].islower()))
    return first.lower() + title[len(first) :] if plain else title


def tally(evidence: str) -> str | None:
    """The claim of training evidence's tally ("training: learns slower 4/5", the rest left to
    the evidence; marked, as the comparer reads it, as the learning probe's); None for other
    evidence."""
    if not evidence.startswith(TRAINED):
        return None
    return TRAINED + evidence.removeprefix(TRAINED).split(": seed")[0].split(" · ")[0]


def symptom_summary(results: list[TrapResult], timed: set[str]) -> str:
    """The student's index: each symptom with the traps that show it by name, the tutorial's
    own first, then those its claims are measured by or lead to, then the rest; where none of
    the tutorial's traps causes a symptom, it says so."""
    sections = {r.pair.card.id: r.pair.card.section for r in results}
    titles = {r.pair.card.id: _lowered(r.pair.card.title) for r in results}
    near = student_traps(results)
    to = linker(results)
    lines = [
        "## From a symptom to its traps",
        "",
        prose(
            "A trap is listed where its own measurement shows the symptom ([evidence]("
            f"{CLAIMS_PAGE}#{EVIDENCE})); *near it*: traps the table above points to."
        ),
    ]
    titled: set[str] = set()  # a trap's title is given where it is first listed
    for name, _, hits in symptoms.index(results, timed):
        found = [trap for trap, _ in hits]
        tallies = {trap: t for trap, evidence in hits if (t := tally(evidence))}
        said = {t: "; ".join(filter(None, [None if t in titled else titles[t], tallies.get(t)]))
                for t in found}  # fmt: skip
        said = {t: words for t, words in said.items() if words}
        titled |= {t for t in found if t in near}  # near: the tutorial's traps among them
        named = [t for t in found if sections[t] != NOT_NAMED]
        advice = [t for t in found if t in near and t not in named]
        rest = [t for t in found if t not in near]
        parts = [f"the tutorial's: {_names(named, to, said)}" if named
                 else "none of the tutorial's"]  # fmt: skip
        parts += [f"near it: {_names(advice, to, said)}"] if advice else []
        if len(rest) > OTHERS:
            parts.append(f"{len(rest)} others ([all]({CLAIMS_PAGE}#{EVIDENCE}))")
        elif rest:
            parts.append(f"others: {_names(rest, to)}")
        lines += ["", f"- **{name}**: " + "; ".join(parts) + "."]
    return "\n".join(lines)
