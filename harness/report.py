"""The markdown diagnosis report: header, summary, one section per trap, heatmaps.

Everything in ``report.md`` is deterministic for a given command on a given machine; wall-clock
numbers go to ``timings.md`` beside it. Files are written to a staging folder first and moved
into place one by one with ``os.replace``, ``report.md`` last, so an interrupted run leaves the
previous report intact.
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from harness import __version__
from harness.catalogue import registry
from harness.catalogue.card import CATEGORIES, Card, Pair
from harness.catalogue.diffing import unified_diff
from harness.catalogue.judge import EDGE_NAMES, Measurement
from harness.catalogue.verdicts import FULL_PRECISION, Verdict, combine
from harness.devices import device_description, dtype_name
from harness.files import ensure_writable
from harness.metrics import GRAD_FACTOR, OUTPUT_FACTOR
from harness.plots import heatmap, line_plot

REPORT = "report.md"
TIMINGS = "timings.md"
IMAGES = "img"
FLOAT = ".3g"

Grid = list[tuple[torch.device, torch.dtype]]


@dataclass
class TrapResult:
    """Everything the report shows for one trap."""

    pair: Pair
    cells: list[Measurement]  # one per (device, dtype)
    extras: list[pd.DataFrame] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def primary(self) -> Measurement:
        """The first device's float32 cell (or its first cell): the one tabulated in full."""
        full = [m for m in self.cells if m.dtype in FULL_PRECISION]
        return (full or self.cells)[0]

    def overall(self, device: str) -> Verdict:
        return combine({m.dtype: m.verdict for m in self.cells if m.device == device})


def reproduce_command(grid: Grid) -> str:
    devices = dict.fromkeys(str(d) for d, _ in grid)
    dtypes = dict.fromkeys(dtype_name(t) for _, t in grid)
    words = ["python -m harness report"]
    words += [f"--device {d}" for d in devices] + [f"--dtype {t}" for t in dtypes]
    return " ".join(words)


def seeds_statement(cards: list[Card]) -> str:
    """Which seeds the measurements use."""
    text = "inputs, masks, weights and the upstream gradient from seed 0"
    over_seeds = [f"`{c.id}` over seeds 0-{c.n_seeds - 1}" for c in cards if not c.shared_weights]
    return "; ".join([text, *over_seeds, "the trigger search is derandomized."])


def header(grid: Grid, unavailable: list[str], cards: list[Card]) -> str:
    devices = list(dict.fromkeys(d for d, _ in grid))
    dtypes = list(dict.fromkeys(dtype_name(t) for _, t in grid))
    has_cuda = any(d.type == "cuda" for d in devices)
    lines = [
        "# Hand-written attention: diagnosis report",
        "",
        f"Reproduce: `{reproduce_command(grid)}` (writes `reports/{REPORT}` by default).",
        "",
        f"- Versions: attention-pitfalls {__version__}, torch {torch.__version__}, "
        f"Python {platform.python_version()}, {platform.machine()}.",
        f"- Devices: {', '.join(device_description(d) for d in devices)}."
        + (f" Not available here: {', '.join(unavailable)}." if unavailable else ""),
        f"- Dtypes: {', '.join(dtypes)}; the reference is always float64.",
        f"- Seeds: {seeds_statement(cards)}",
        "- TF32: "
        + ("disabled while measuring (float32 means float32)." if has_cuda else "not applicable "
           "(no CUDA device in this run; it is disabled whenever CUDA is measured)."),
        f"- Rule: buggy differs when its max abs error against the float64 reference exceeds "
        f"{OUTPUT_FACTOR:g} x floor + atol for the output ({GRAD_FACTOR:g} x for gradients); the "
        "floor is fixed.py's own error in the same dtype, atol = 2 max|ref + 0.3 - 0.3 - ref| "
        "in that dtype (FlashAttention's test rule).",
        f"- Wall-clock numbers are not in this file: see [{TIMINGS}]({TIMINGS}).",
    ]  # fmt: skip
    return "\n".join(lines)


def cell_label(m: Measurement) -> str:
    return f"{m.device} {m.dtype}"


def _num(x: float) -> str:
    return format(x, FLOAT)


def output_cell(m: Measurement) -> str:
    """The bug's output error against the floor, or why there is none."""
    s = m.summary()
    if m.seeds:
        return "n/a (over seeds)"
    if m.raised:
        return "raises"
    return f"{_num(s['err_bug'])} vs {_num(s['floor'])}"


def summary(results: list[TrapResult]) -> str:
    rows = []
    for r in results:
        p = r.primary.summary()
        row = {"trap": f"[`{r.pair.card.id}`](#{r.pair.card.id})", "§": r.pair.card.section}
        row |= {cell_label(m): str(m.verdict) for m in r.cells}
        row |= {
            "verdict": str(r.overall(r.primary.device)),
            "expected": str(r.pair.card.expected),
            "output error vs floor": output_cell(r.primary),
            "entropy fix → bug": f"{_num(p['entropy_fix'])} → {_num(p['entropy_bug'])}",
            "grad cosine (min)": "n/a" if r.primary.seeds else _num(p["grad_cosine_min"]),
            "trigger": p["trigger"],
        }
        rows.append(row)
    table = pd.DataFrame(rows).to_markdown(index=False)
    differing = [
        f"`{r.pair.card.id}` ({'; '.join(f'{cell_label(m)}: {m.verdict}' for m in low)})"
        for r in results
        if (low := [m for m in r.cells if m.verdict is not r.primary.verdict])
    ]
    note = (
        "Verdicts that differ in low precision from the full-precision one: "
        + ", ".join(differing)
        + ". The sections say why (an error only float16 raises, or a range it lacks)."
        if differing
        else "Every trap gets the same verdict in every dtype measured."
    )
    return "## Summary\n\n" + table + "\n\n" + note


def table(df: pd.DataFrame) -> str:
    return df.to_markdown(index=False, floatfmt=FLOAT)


def where(m: Measurement, card: Card) -> str:
    """Which cell, shape and inputs a measurement's tables come from."""
    text = f"{cell_label(m)}, {m.shape.label()}"
    if m.edge:
        text += f", with {EDGE_NAMES[card.edge]}"
        text += f" (x scaled by {card.input_scale:g})" if card.edge == "large" else ""
    return text


def measurement_tables(m: Measurement, card: Card) -> list[str]:
    if m.seeds:
        return [
            f"Compared over {m.seeds} seeds, each module freshly initialised ({where(m, card)}): "
            "the bug is the weights, so outputs are not compared with each other.",
            "",
            "Attention rows, averaged over seeds:",
            "",
            table(m.attention),
            "",
            "Gradient norms, averaged over seeds:",
            "",
            table(m.gradients),
            "",
        ]
    if m.raised:
        return [f"On {where(m, card)} buggy.py raises: `{m.error}`", ""]
    return [
        f"Output against the float64 reference ({where(m, card)}):",
        "",
        table(m.output),
        "",
        "Attention rows (entropy normalized by log(allowed keys); above 1 when a row is not a "
        "distribution or spreads over blocked keys):",
        "",
        table(m.attention),
        "",
        "Gradients (norms are NaN when the gradient holds a NaN):",
        "",
        table(m.gradients),
        "",
    ]


def trap_section(r: TrapResult, images: list[str]) -> str:
    card, m = r.pair.card, r.primary
    measured = r.overall(m.device)
    out = [
        f'<a id="{card.id}"></a>',
        f"### `{card.id}`: {card.title}",
        "",
        f"Tutorial section {card.section} · category {card.category} · expected {card.expected} · "
        f"measured **{measured}**",
        "",
        f"**The tutorial says.** {card.claim}",
        "",
        f"**The trap.** {card.trap}",
        "",
        f"**What is true.** {card.truth}",
        "",
        "**What was measured.**",
        "",
    ]
    out += [f"- {cell_label(c)}: **{c.verdict}**: {c.reason}" for c in r.cells]
    out += [f"- {cell_label(m)}, {name}: {text}" for name, text in m.variants.items()]
    out += [f"- {cell_label(m)}, {name}: {text}" for name, text in m.probes.items()]
    if measured is Verdict.BENIGN:
        out += ["", benign_statement(m)]
    out += ["", "The pair (`diff -u buggy.py fixed.py`):", "", "```diff"]
    out += [unified_diff(r.pair.folder).rstrip("\n"), "```", ""]
    out += measurement_tables(m, card)
    for extra in r.extras:
        caption = extra.attrs.get("caption", "Trap-specific measurement")
        out += [f"{caption} ({cell_label(m)}):", "", table(extra), ""]
    out += r.notes
    if f"{IMAGES}/{card.id}.png" not in images:
        out += ["No heatmap: neither module returns its attention weights.", ""]
    out += [f"![{card.id}]({image})\n" for image in images]
    out += [f"**Why it matters.** {card.why}", "", f"**How to avoid it.** {card.avoid}"]
    if card.sources:
        out += ["", "Sources: " + ", ".join(card.sources) + "."]
    return "\n".join(out)


def benign_statement(m: Measurement) -> str:
    s = m.summary()
    if pd.notna(s["err_bug"]):
        return (
            f"**The claimed trap does not hold.** On {cell_label(m)} the buggy output's max abs "
            f"error is {_num(s['err_bug'])} against a threshold of {_num(s['threshold'])} (floor "
            f"{_num(s['floor'])}), and every gradient is within its own threshold."
        )
    return f"**The claimed trap does not hold.** {m.reason}."


def category_sections(results: list[TrapResult], images: dict[str, list[str]]) -> str:
    parts = []
    for category in CATEGORIES:
        members = [r for r in results if r.pair.card.category == category]
        if not members:
            continue
        parts.append(f"## {category.capitalize()}")
        parts += [trap_section(r, images.get(r.pair.card.id, [])) for r in members]
    return "\n\n".join(parts)


def timings_text(timed: dict[str, pd.DataFrame]) -> str:
    lines = [
        "# Wall-clock measurements",
        "",
        f"Not deterministic: they vary from run to run and machine to machine, so they live apart "
        f"from [{REPORT}]({REPORT}).",
    ]
    for pid, df in timed.items():
        lines += ["", f"## `{pid}`", "", table(df)]
    return "\n".join(lines) + "\n"


def draw(r: TrapResult, folder: Path) -> list[str]:
    """Write a trap's pictures under ``folder/img``; their paths relative to ``folder``."""
    m, card = r.primary, r.pair.card
    keep = card.inputs(m.shape, m.seed, m.edge).keep
    names = []
    if m.weights.get("fix") is not None or m.weights.get("bug") is not None:
        name = f"{IMAGES}/{card.id}.png"
        note = f"raises:\n{m.error}" if m.raised else "returns no attention weights"
        heatmap(folder / name, card.id, m.weights.get("fix"), m.weights.get("bug"), keep, note)
        names.append(name)
    specs = [(extra, spec) for extra in r.extras for spec in extra.attrs.get("plots", [])]
    for i, (extra, spec) in enumerate(specs, start=1):
        plot_name = f"{IMAGES}/{card.id}-{i}.png"
        line_plot(folder / plot_name, extra, **spec)
        names.append(plot_name)
    return names


def _stale_images(out: Path, written: list[str]) -> list[Path]:
    """Pictures of ours in ``out/img`` (named after a trap) that this run no longer writes."""
    ids = set(registry.ids())
    keep = {Path(name).name for name in written}

    def ours(path: Path) -> bool:
        return path.stem in ids or path.stem.rsplit("-", 1)[0] in ids

    return [p for p in (out / IMAGES).glob("*.png") if ours(p) and p.name not in keep]


def write_report(
    results: list[TrapResult],
    grid: Grid,
    out: Path,
    unavailable: list[str],
    timed: dict[str, pd.DataFrame],
    doctor: str | None = None,
) -> Path:
    """Render and write ``out/report.md``, its images and ``out/timings.md``, atomically.

    ``doctor`` is an optional last section (the doctor's detection table).
    """
    ensure_writable(out)
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".staging-"))
    try:
        (staging / IMAGES).mkdir()
        images = {r.pair.card.id: draw(r, staging) for r in results}
        cards = [r.pair.card for r in results]
        sections = [
            header(grid, unavailable, cards),
            summary(results),
            category_sections(results, images),
        ]
        if doctor is not None:
            sections.append(doctor)
        text = "\n\n".join(sections)
        (staging / REPORT).write_text(text.rstrip("\n") + "\n")
        (staging / TIMINGS).write_text(timings_text(timed))
        (out / IMAGES).mkdir(exist_ok=True)
        written = [i for names in images.values() for i in names]
        for name in [*written, TIMINGS, REPORT]:
            os.replace(staging / name, out / name)
        for stale in _stale_images(out, written):  # only once the new report is in place
            stale.unlink()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out / REPORT


def collect(
    pairs: list[Pair],
    grid: Grid,
    measure_all: Callable[[list[Pair], Grid], list[Measurement]],
) -> tuple[list[TrapResult], dict[str, pd.DataFrame]]:
    """Measure everything, then each trap's extra on the first device in float32."""
    cells = measure_all(pairs, grid)
    device = grid[0][0]
    results, timed = [], {}
    for pair in pairs:
        r = TrapResult(pair, [m for m in cells if m.pitfall == pair.card.id])
        if pair.card.extra is not None:
            extra = pair.card.extra(pair, device, torch.float32)
            if extra.attrs.get("timing"):
                timed[pair.card.id] = extra
                r.notes.append(f"Wall-clock timing: see [{TIMINGS}]({TIMINGS}).\n")
            else:
                r.extras.append(extra)
        results.append(r)
    return results, timed
