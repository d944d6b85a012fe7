"""The report's sections on the traps (on report.md and traps.md by category, on modern.md after
its introduction); each with the tutorial's claim, what was measured, the diff, its pictures,
what it does to learning, why it matters and how to avoid it."""

from __future__ import annotations

import pandas as pd

from harness.catalogue.card import CATEGORIES, NOT_NAMED, Card
from harness.catalogue.diffing import unified_diff
from harness.catalogue.judge import Measurement
from harness.catalogue.verdicts import Verdict
from harness.files import IMAGES, TABLES_PAGE
from harness.report import learning
from harness.report.choice import heatmap_absent
from harness.report.extras import caption, is_short
from harness.report.format import (
    TABLES,
    anchor,
    num,
    over_seeds,
    prose,
    seeds_column,
    table,
    verdict_label,
)
from harness.report.results import TrapResult


def trap_heading(r: TrapResult) -> str:
    card = r.pair.card
    measured = verdict_label(r.overall(r.primary.device), r.cells)
    where = f"Tutorial {card.section}" if card.section != NOT_NAMED else "Not in the tutorial"
    return f"{where} · {card.category} · expected {card.expected} · measured **{measured}**"


def trap_section(r: TrapResult, images: list[str]) -> str:
    card, m = r.pair.card, r.primary
    out = [
        anchor(card.id),
        f"### `{card.id}`: {card.title}",
        "",
        trap_heading(r),
        "",
        *([measured_on(card), ""] if card.modern else []),
        prose(f"**The tutorial says.** {card.claim}"),
        "",
        prose(f"**The trap.** {card.trap}"),
        "",
        prose(f"**What is true.** {card.truth}"),
        "",
        "**What was measured.**",
        "",
    ]
    out += [f"- {c.cell}: **{verdict_label(c.verdict, [c])}**: {c.reason}" for c in r.cells]
    if r.spread is not None:
        out += [f"- {m.cell}, {seeds_column(r.spread.seeds)}: output error {over_seeds(r.spread)}"]
    out += [f"- {m.cell}, {name}: {text}" for name, text in m.variants.items()]
    out += [f"- {m.cell}, {name}: {text}" for name, text in m.probes.items()]
    if r.overall(m.device) is Verdict.BENIGN:
        out += ["", benign_statement(m)]
    out += ["", "The pair (`diff -u buggy.py fixed.py`):", "", "```diff"]
    out += [unified_diff(r.pair.folder).rstrip("\n"), "```", ""]
    for extra in filter(is_short, r.extras):
        out += [f"{caption(extra)} ({m.cell}):", "", table(extra), ""]
    out += r.notes
    learned = [i for i in images if i.startswith(f"{IMAGES}/{card.id}-learning")]
    images = [i for i in images if i not in learned]
    if absent := heatmap_absent(r):
        out += [prose(f"No heatmap: {absent}."), ""]
    out += [f"![{card.id}]({image})\n" for image in images]
    if r.learning is not None:
        verdict = r.overall(m.device)
        image = learned[0] if learned else None
        out += [*learning.learning_block(card, verdict, r.learning, image), ""]
    out += [
        prose(f"**Why it matters.** {card.why}"),
        "",
        prose(f"**How to avoid it.** {card.avoid}"),
    ]
    if card.sources:
        out += ["", "Sources: " + ", ".join(card.sources) + "."]
    tables = f"{TABLES_PAGE}#{TABLES}{card.id}"
    out += ["", f"The tables behind this verdict: [{TABLES_PAGE}]({tables})."]
    return "\n".join(out)


def benign_statement(m: Measurement) -> str:
    s = m.summary()
    if pd.notna(s["err_bug"]):
        return (
            f"**The claimed trap does not hold.** On {m.cell} the buggy output's max abs "
            f"error is {num(s['err_bug'])} against a threshold of {num(s['threshold'])} (floor "
            f"{num(s['floor'])}), and every gradient is within its own threshold."
        )
    return f"**The claimed trap does not hold.** {m.reason}."


MODERN_INTRO = """\
# Modern attention

Part of the diagnosis report ([report.md](report.md), which defines its verdicts and columns).
The attention written after the tutorial, Llama-style: rotary positions, grouped-query heads (a
few K/V heads shared by blocks of query heads), a KV cache for generation, sometimes a sliding
window or soft-capped scores. Its traps are the most reported attention bugs of recent years and
they are quiet: training and a plain forward pass look right, and only generation, long positions,
padding or packing go wrong. So each pair here keeps an extended contract, `forward(x, mask=None,
*, positions=None, cache=None)`: positions (B, T) default to the cached length plus `arange(T)`,
and a `KVCache` in the same file is updated in place. Each trap is measured where it bites, and
its section says how: *decode* (prefill the first half, then one token per call through the
cache), *chunked* (prefill a few tokens per call), *reuse* (decode another prompt, reset the
cache, then this one), *long* (positions from 100,000), *packed* (two documents in a row,
positions restarting at the second) or left-padded rows. The reference is always fixed.py's full
forward in float64 on the same inputs, so a cache trap's error is the distance from the model
that was trained; its picture shows that error per position, prefill then each step."""

MORE_INTRO = """\
# Traps the tutorial does not name

Part of the diagnosis report ([report.md](report.md), which defines its verdicts and columns):
the traps real hand-written attention falls into that the tutorial does not warn of, by
category."""


def category_sections(results: list[TrapResult], images: dict[str, list[str]]) -> str:
    """The traps of ``results`` by category, in the catalogue's order of categories."""
    parts = []
    for category in CATEGORIES:
        if members := [r for r in results if r.pair.card.category == category]:
            parts.append(f"## {category.capitalize()}")
            parts += [trap_section(r, images.get(r.pair.card.id, [])) for r in members]
    return "\n\n".join(parts)


def modern_sections(results: list[TrapResult], images: dict[str, list[str]]) -> str:
    """The modern traps of ``results``, after the page's introduction."""
    ordered = [r for c in CATEGORIES for r in results if r.pair.card.category == c]
    return "\n\n".join(
        [MODERN_INTRO, *(trap_section(r, images.get(r.pair.card.id, [])) for r in ordered)]
    )


def measured_on(card: Card) -> str:
    """How a modern trap is fed: its scenario, and its inputs where they are unusual."""
    words = [card.how.description]
    if card.mask == "left_padding":
        words.append("rows left-padded by different amounts")
    return f"Measured on: {'; '.join(words)}."
