"""The catalogue's commands: list, show, diff, run and learn its traps."""

from __future__ import annotations

import argparse
import math
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from harness import interrupts
from harness.catalogue import registry
from harness.catalogue.card import Card, Pair
from harness.catalogue.diffing import unified_diff
from harness.catalogue.judge import Grid, Measurement, measure_grid
from harness.catalogue.learn import learn
from harness.cli.parser import PROG
from harness.devices import DTYPES, available_devices, resolve_device, resolve_dtype
from harness.errors import UsageError, shorten
from harness.files import created_by, ensure_writable
from harness.interrupts import uninterrupted
from harness.learning import Learning
from harness.progress import Progress
from harness.report import publish


def resolve_grid(args: argparse.Namespace) -> Grid:
    """Every (device, dtype) asked for, validated up front."""
    names = args.device or available_devices()
    devices = list(dict.fromkeys(resolve_device(d) for d in names))  # cpu:0 is cpu: once
    dtypes = list(dict.fromkeys(args.dtype or DTYPES))
    return [(dev, resolve_dtype(name, dev)) for dev in devices for name in dtypes]


def resolve_pairs(ids: Sequence[str]) -> list[Pair]:
    try:
        return [registry.load(i) for i in dict.fromkeys(ids)] if ids else registry.load_all()
    except registry.UnknownPitfall as exc:
        hint = f"; {exc.suggestion}" if exc.suggestion else ""
        raise UsageError(
            f"unknown pitfall {shorten(exc.pitfall_id, quote=True)}{hint} ({PROG} list shows all)"
        ) from None


def summary_table(measurements: list[Measurement]) -> pd.DataFrame:
    """One row per measurement, with the card's expected verdict beside the measured one."""
    rows = []
    for m in measurements:
        row = m.summary()
        row["expected"] = str(registry.load(m.pitfall).card.expected)
        rows.append(row)
    columns = [
        "pitfall", "device", "dtype", "verdict", "expected", "err_bug", "floor", "threshold",
        "entropy_fix", "entropy_bug", "grad_cosine_min", "trigger", "reason",
    ]  # fmt: skip
    return pd.DataFrame(rows)[columns]


LIST_HEADER = ("id", "§", "category", "expected")


def cmd_list(args: argparse.Namespace) -> str:
    """A header row, then one aligned row per trap."""
    rows = [LIST_HEADER] + [
        (p.card.id, p.card.section, p.card.category, str(p.card.expected))
        for p in registry.load_all()
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(LIST_HEADER) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    )


def card_text(card: Card) -> str:
    """The card in words."""
    wrap = textwrap.TextWrapper(width=96, initial_indent="  ", subsequent_indent="  ")
    parts = [
        f"{card.id}: {card.title}",
        f"tutorial section {card.section} | category {card.category} | "
        f"expected verdict {card.expected}",
    ]
    for label, text in (
        ("The tutorial says", card.claim),
        ("The trap", card.trap),
        ("What is true (measured)", card.truth),
        ("Why it matters", card.why),
        ("How to avoid it", card.avoid),
    ):
        parts += ["", f"{label}:", wrap.fill(text)]
    setup = [f"mask: {card.mask} ({card.convention})", f"shape: {card.shape.label()}"]
    setup.append("weights: shared" if card.shared_weights else "weights: compared over seeds")
    if card.edge == "large":
        setup.append(f"then large activations (x scaled by {card.input_scale:g})")
    elif card.edge == "empty_row":
        setup.append("then a sequence that is all padding")
    parts += ["", "Measured with: " + "; ".join(setup)]
    if card.sources:
        parts.append("Sources: " + ", ".join(card.sources))
    return "\n".join(parts)


def colour_diff(diff: str) -> str:
    colours = {"+": "\033[32m", "-": "\033[31m", "@": "\033[36m"}
    lines = []
    for line in diff.splitlines():
        colour = colours.get(line[:1]) if not line.startswith(("+++", "---")) else "\033[1m"
        lines.append(f"{colour}{line}\033[0m" if colour else line)
    return "\n".join(lines)


def cmd_show(args: argparse.Namespace) -> str:
    pair = resolve_pairs([args.id])[0]
    return card_text(pair.card) + "\n\n" + unified_diff(pair.folder).rstrip("\n")


def cmd_diff(args: argparse.Namespace) -> str:
    pair = resolve_pairs([args.id])[0]
    diff = unified_diff(pair.folder).rstrip("\n")
    colour = args.color == "always" or (
        args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    )  # NO_COLOR set and not empty: no colour unless asked for (https://no-color.org)
    return colour_diff(diff) if colour else diff


def cmd_run(args: argparse.Namespace) -> str:
    pairs = resolve_pairs(args.ids)
    grid = resolve_grid(args)
    with Progress(len(pairs) * len(grid)) as bar:  # on a terminal
        table = summary_table(measure_grid(pairs, grid, bar.step))
    if args.format == "csv":
        return table.to_csv(index=False).rstrip("\n")
    if args.format == "json":  # JSON has no Inf: keep it apart from null (not measured)
        finite = table.astype(object).replace({math.inf: "inf", -math.inf: "-inf"})
        return finite.to_json(orient="records", indent=2, double_precision=15)
    return table.to_markdown(index=False, floatfmt=".3g")


def learning_text(pair: Pair, learning: Learning, steps: int) -> str:
    """One trap's learning probe: the task, the table, what the bug does, and any caveat."""
    d = learning.diagnosis
    seeds = f"seeds {d.first_seed}–{d.first_seed + len(d.seeds) - 1}"
    lines = [
        f"{pair.card.id}: {learning.task.describe()}; {steps} steps, {seeds} (the table: seed "
        f"{d.first_seed + d.shown})",
        "",
        learning.table().to_markdown(index=False, floatfmt=".3g", missingval="n/a"),
        "",
        f"buggy.py: {d.label}: {d.evidence}",
    ]
    return "\n".join(lines + ([learning.note] if learning.note else []))


def cmd_learn(args: argparse.Namespace) -> str:
    pairs = resolve_pairs(args.ids)
    device = resolve_device(args.device)
    names = [name for pair in pairs for name in curve_files(pair.card.id)]
    created = ensure_writable(args.out, files=names, folders=())
    texts = []
    with created_by(created), publish.staging(args.out) as staged:
        with Progress(len(pairs)) as bar:
            for pair in pairs:
                bar.step(f"training {pair.card.id}")
                learning = learn(pair, seed=args.seed, device=device, steps=args.steps)
                texts.append(learning_text(pair, learning, args.steps))
                write_curves(staged, pair.card.id, learning)
        interrupts.ACTIVE.check()  # a Ctrl-C that matplotlib's clean-up swallowed stops here
        written = [args.out / name for name in names]
        with publish.locked(args.out), uninterrupted("wrote " + ", ".join(map(str, written))):
            for name in names:  # a link in the way is replaced, never written through
                os.replace(staged / name, args.out / name)
    return "\n\n".join(texts) + "\n\nwrote " + ", ".join(str(p) for p in written)


def curve_files(trap: str) -> tuple[str, str]:
    """The files ``learn`` writes for a trap: its curves as a table and as a picture."""
    return f"{trap}.csv", f"{trap}.png"


def write_curves(folder: Path, trap: str, learning: Learning) -> None:
    """``folder/<trap>.csv`` (loss and accuracy per step) and ``folder/<trap>.png``, into a
    run's own staging folder (``publish.staging``), which nothing else writes."""
    csv, png = curve_files(trap)
    (folder / csv).write_text(learning.curves().to_csv(index=False))
    from harness.report.pictures import learning_plot  # matplotlib, for this command only

    learning_plot(folder / png, trap, learning)
