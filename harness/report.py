"""The markdown diagnosis report: an opening that says how to read it, a way in from symptoms,
the summary, one section per trap with its pictures, the doctor's tables, and an appendix with
the tables behind each verdict.

Everything in ``report.md`` is deterministic for a given command on a given machine; wall-clock
numbers go to ``timings.md`` beside it. The folder is replaced as one unit (harness.publish), and
a report that agrees with the one already there within rounding noise leaves it untouched.
"""

from __future__ import annotations

import os
import platform
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from harness import __version__, learnreport, publish, reportdiff, symptoms
from harness.catalogue.card import CATEGORIES, NOT_NAMED, Card, Pair
from harness.catalogue.diffing import unified_diff
from harness.catalogue.judge import EDGE_NAMES, Measurement
from harness.catalogue.verdicts import FULL_PRECISION, Verdict, combine
from harness.consistency import position_errors
from harness.devices import cpu_name, device_description, dtype_name
from harness.files import IMAGES, REPORT, TIMINGS, ensure_writable
from harness.interrupts import uninterrupted
from harness.learning import Learning
from harness.metrics import GRAD_FACTOR, OUTPUT_FACTOR
from harness.pictures import draw
from harness.reportdiff import LEARNED_COLUMN
from harness.scenarios import bounds
from harness.symptoms import bug_nonfinite

FLOAT = ".3g"

Grid = list[tuple[torch.device, torch.dtype]]


@dataclass
class TrapResult:
    """Everything the report shows for one trap."""

    pair: Pair
    cells: list[Measurement]  # one per (device, dtype)
    extras: list[pd.DataFrame] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    learning: Learning | None = None  # the learning probe, unless the report skips it

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


OPENING = """\
# Hand-written attention: diagnosis report

A popular tutorial on writing attention by hand (a Chinese blog post, "why hand-writing attention
is the first hurdle") teaches `softmax(Q K^T / sqrt(d_k)) V` as a single-head
`ScaledDotProductAttention(d_model, d_k, d_v)` and a multi-head wrapper, and warns of five traps
(its §4.1-§4.5: the precision of the scale, bool vs float masks, the transpose of K, the layout of
V, the initialisation variance). This report measures them, a few more claims the tutorial makes
in passing, and the traps real code falls into that the tutorial does not name: the catalogue.
Each trap is a pair of short modules in `pitfalls/<id>/`: `buggy.py` and `fixed.py`, which differ
only in the marked lines. Both run with the same weights, inputs and upstream gradient; each
output and gradient is compared with fixed.py run in float64, and the verdict comes from that
measurement, not from the tutorial. Several of the tutorial's claims turn out to be false.

## How to read this report

Start from what you see going wrong (the symptoms below) or from the summary table. Each trap's
section then gives the tutorial's claim, the trap, what is true, what was measured, the diff of
the two files, a picture, why it matters and how to avoid it. The full tables behind each verdict
are in the appendix at the end.

| verdict | meaning |
|:--|:--|
| SILENT | runs without error and gives a wrong result: the dangerous kind |
| LOUD | raises an error, so you find it at once |
| CONDITIONAL | raises on most shapes, runs silently on some (trigger shapes, found by search) |
| NUMERIC | right in float32; NaN, Inf or an error only in low precision or on edge inputs |
| BENIGN | within rounding noise of fixed.py (or only slower): the claimed trap does not hold |
| INCONCLUSIVE | this dtype cannot tell: even fixed.py overflows on the inputs that would show it |

"SILENT, NaN": wrong without an error, and some of buggy.py's outputs or gradients are NaN where
fixed.py's are not — often a few rows only, so a loss that averages the other positions or skips
padding may not show it at once. It agrees with an expected SILENT; ", NaN" says how it shows.

- **Floor**: fixed.py's own largest error against the float64 run, in the same dtype: the rounding
  noise a correct module has. buggy.py *differs* when its error exceeds 2 x floor + atol (3 x for
  gradients), where atol is the dtype's rounding of values like the output's.
- **Entropy**: how spread out an attention row is, divided by log(number of keys the row may
  see): 1 is uniform over the allowed keys, 0 is all weight on one key (one-hot); rows with a
  single allowed key are left out. Above 1 means the row puts weight on keys it must not see, or
  is not a distribution at all (it does not sum to 1). A row is *saturated* when one key gets at
  least 0.99 of its weight (a causal mask's first row always is).
- **SDPA**: PyTorch's `F.scaled_dot_product_attention`. **Trigger shape**: a shape on which a bug
  that usually raises runs silently, found by search; its weights can be 1 x 1, so a gradient
  cosine of exactly 1 or -1 there says little. **The doctor**: this project's probes for anyone's
  attention module, run on the catalogue near the end.
- Summary columns: *§*, the tutorial's section that names the trap (— when none does);
  *verdict* per device, for each dtype in the order of the header; *combined*, one verdict per
  trap (a trap right in float32 but broken in a low precision is NUMERIC, however it breaks
  there); *expected*, the catalogue's verdict; *output error (floor)*, buggy.py's largest output
  error then the floor, in float32 (on the edge inputs where the trap's section says so);
  *entropy fix → bug*, the mean entropy of each module's attention rows (n/a: it returns no
  weights; "+k NaN rows" where buggy.py has NaN rows, which the mean leaves out); *grad cosine*,
  the smallest cosine between a weight's gradient in buggy.py and in fixed.py (1 the same
  direction, 0 unrelated, -1 opposite; NaN when a gradient holds NaN)."""

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


def opening(grid: Grid, unavailable: list[str], cards: list[Card], learned: bool) -> str:
    devices = list(dict.fromkeys(d for d, _ in grid))
    dtypes = list(dict.fromkeys(dtype_name(t) for _, t in grid))
    has_cuda = any(d.type == "cuda" for d in devices)
    command = reproduce_command(grid) + ("" if learned else " --no-learn")
    learning = (
        "`python -m harness learn ID` trains one trap's pair again and writes its curves."
        if learned
        else "The learning probe was skipped (`--no-learn`)."
    )
    lines = [
        OPENING,
        *(["", learnreport.INTRO] if learned else []),
        "",
        "## Reproduce",
        "",
        f"`{command}` writes this file to `reports/{REPORT}` (`--out DIR` elsewhere). {learning}",
        "",
        f"- Versions: attention-pitfalls {__version__}, torch {torch.__version__}, "
        f"Python {platform.python_version()}, {platform.machine()}.",
        f"- CPU: {cpu_name()} (the learning probe's numbers are this CPU's)."
        if learned
        else None,
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
        f"- Wall-clock numbers vary from run to run, so they are not in this file: the run writes "
        f"them to `{TIMINGS}` beside it (not committed).",
    ]  # fmt: skip
    return "\n".join(line for line in lines if line is not None)


def verdict_label(verdict: Verdict, cells: list[Measurement]) -> str:
    """The verdict, with ", NaN" when buggy.py's numbers hold NaN or Inf in one of ``cells``."""
    nan = verdict in (Verdict.SILENT, Verdict.CONDITIONAL) and any(map(bug_nonfinite, cells))
    return f"{verdict}, NaN" if nan else str(verdict)


def _num(x: float) -> str:
    return format(x, FLOAT)


def output_cell(m: Measurement) -> str:
    """The bug's output error against the floor, or why there is none."""
    s = m.summary()
    if m.seeds:
        return "n/a (over seeds)"
    if m.raised:
        return "raises"
    return f"{_num(s['err_bug'])} ({_num(s['floor'])})"


def entropy_cell(m: Measurement) -> str:
    """Mean entropy of each module's rows; n/a where a module returns no weights or raises; the
    NaN rows the mean leaves out, where buggy.py has more than fixed.py."""
    s = m.summary()
    fix, bug = (_num(s[k]) if pd.notna(s[k]) else "n/a" for k in ("entropy_fix", "entropy_bug"))
    if fix == bug == "n/a":
        return "n/a"
    nan_rows = m.attention.set_index("run")["nan_rows"]
    extra = int(nan_rows["bug"] - nan_rows["fix"]) if nan_rows.notna().all() else 0
    return f"{fix} → {bug}" + (f" (+{extra} NaN rows)" if extra > 0 else "")


def cosine_cell(m: Measurement) -> str:
    """The smallest gradient cosine; NaN when a buggy gradient holds NaN, n/a when unmeasured."""
    grads = m.gradients
    if "nonfinite_bug" in grads and (grads["nonfinite_bug"] > 0).any():
        return "NaN"
    cosine = m.summary()["grad_cosine_min"]
    return _num(cosine) if pd.notna(cosine) else "n/a"


def link(pitfall: str) -> str:
    return f"[`{pitfall}`](#{pitfall})"


def summary(results: list[TrapResult]) -> str:
    devices = list(dict.fromkeys(m.device for r in results for m in r.cells))
    rows = []
    for r in results:
        row = {"trap": link(r.pair.card.id), "§": r.pair.card.section}
        for device in devices:
            here = [m for m in r.cells if m.device == device]
            header = f"{device}: " + " · ".join(m.dtype for m in here)
            row[header] = " · ".join(verdict_label(m.verdict, [m]) for m in here)
        row |= {
            "combined": verdict_label(r.overall(r.primary.device), r.cells),
            "expected": str(r.pair.card.expected),
            "output error (floor)": output_cell(r.primary),
            "entropy fix → bug": entropy_cell(r.primary),
            "grad cosine": cosine_cell(r.primary),
        }
        if r.learning is not None:
            row[LEARNED_COLUMN] = learnreport.learns_cell(r.learning)
        rows.append(row)
    table = pd.DataFrame(rows).to_markdown(index=False, disable_numparse=True)  # cells are text
    differing = [
        f"`{r.pair.card.id}` ({'; '.join(f'{m.cell}: {m.verdict}' for m in low)})"
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
    learned = [(r.pair.card, r.overall(r.primary.device), r.learning) for r in results]
    if rows_learned := [(c, v, lr) for c, v, lr in learned if lr is not None]:
        note += "\n\n" + learnreport.findings_note(rows_learned)
    return "## Summary\n\n" + table + "\n\n" + note


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


def escape(value: object) -> object:
    """A table cell that cannot break its row: a ``|`` in text is escaped."""
    return value.replace("|", "\\|") if isinstance(value, str) else value


def table(df: pd.DataFrame) -> str:
    cells = df.map(escape).rename(columns=escape)
    return cells.to_markdown(index=False, floatfmt=FLOAT)


def where(m: Measurement, card: Card) -> str:
    """Which cell, shape and inputs a measurement's tables come from."""
    text = f"{m.cell}, {m.shape.label()}"
    if m.edge:
        text += f", with {EDGE_NAMES[card.edge]}"
        text += f" (x scaled by {card.input_scale:g})" if card.edge == "large" else ""
    return text


OUTPUT_COLUMNS = ["run", "max_abs", "rel_l2", "threshold", "differs", "shape"]
ATTENTION_COLUMNS = ["run", "entropy_mean", "entropy_min", "saturated", "nan_rows", "row_sum_err"]
GRADIENT_COLUMNS = ["param", "norm_fix", "norm_bug", "cosine", "err_fix", "err_bug", "threshold",
                    "differs"]  # fmt: skip
WIDTH = 100  # characters per line of prose
SHORT = 12  # a trap-specific table of at most this many rows stays in its section


def columns(df: pd.DataFrame, wanted: list[str]) -> pd.DataFrame:
    return df[[c for c in wanted if c in df.columns]]


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
        table(columns(m.output, OUTPUT_COLUMNS)),
        "",
        *attention_table(m),
        "Gradients (a norm is NaN when the gradient holds a NaN, or the module has no such "
        "weight):",
        "",
        table(columns(m.gradients, GRADIENT_COLUMNS)),
        "",
    ]


def attention_table(m: Measurement) -> list[str]:
    att = columns(m.attention, ATTENTION_COLUMNS)
    if att.drop(columns="run").isna().all(axis=None):
        return ["Attention rows: neither module returns attention weights.", ""]
    return ["Attention rows:", "", table(att), ""]


def is_short(df: pd.DataFrame) -> bool:
    return len(df) <= SHORT


def trap_heading(r: TrapResult) -> str:
    card = r.pair.card
    measured = verdict_label(r.overall(r.primary.device), r.cells)
    where = f"Tutorial {card.section}" if card.section != NOT_NAMED else "Not in the tutorial"
    return f"{where} · {card.category} · expected {card.expected} · measured **{measured}**"


def trap_section(r: TrapResult, images: list[str]) -> str:
    card, m = r.pair.card, r.primary
    out = [
        f'<a id="{card.id}"></a>',
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
    if not images:
        out += ["No picture: neither module returns attention weights or an output.", ""]
    out += [f"![{card.id}]({image})\n" for image in images]
    if r.learning is not None:
        verdict = r.overall(m.device)
        image = learned[0] if learned else None
        out += [*learnreport.learning_block(card, verdict, r.learning, image), ""]
    out += [
        prose(f"**Why it matters.** {card.why}"),
        "",
        prose(f"**How to avoid it.** {card.avoid}"),
    ]
    if card.sources:
        out += ["", "Sources: " + ", ".join(card.sources) + "."]
    out += ["", f"The tables behind this verdict: [appendix](#tables-{card.id})."]
    return "\n".join(out)


def prose(text: str) -> str:
    """A card's paragraph, wrapped: its words are fixed, so every machine wraps them alike."""
    return textwrap.fill(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def caption(extra: pd.DataFrame) -> str:
    return extra.attrs.get("caption", "Trap-specific measurement")


def benign_statement(m: Measurement) -> str:
    s = m.summary()
    if pd.notna(s["err_bug"]):
        return (
            f"**The claimed trap does not hold.** On {m.cell} the buggy output's max abs "
            f"error is {_num(s['err_bug'])} against a threshold of {_num(s['threshold'])} (floor "
            f"{_num(s['floor'])}), and every gradient is within its own threshold."
        )
    return f"**The claimed trap does not hold.** {m.reason}."


MODERN_INTRO = """\
## Modern attention

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


def category_sections(results: list[TrapResult], images: dict[str, list[str]]) -> str:
    """The classic traps by category, then the part on modern attention."""
    parts = []
    for category in CATEGORIES:
        members = [r for r in results if r.pair.card.category == category]
        if members := [r for r in members if not r.pair.card.modern]:
            parts.append(f"## {category.capitalize()}")
            parts += [trap_section(r, images.get(r.pair.card.id, [])) for r in members]
    modern = [r for c in CATEGORIES for r in results if r.pair.card.category == c]
    if modern := [r for r in modern if r.pair.card.modern]:
        parts.append(MODERN_INTRO)
        parts += [trap_section(r, images.get(r.pair.card.id, [])) for r in modern]
    return "\n\n".join(parts)


def measured_on(card: Card) -> str:
    """How a modern trap is fed: its scenario, and its inputs where they are unusual."""
    words = [card.how.description]
    if card.mask == "left_padding":
        words.append("rows left-padded by different amounts")
    return f"Measured on: {'; '.join(words)}."


def generation_steps(m: Measurement, card: Card) -> pd.DataFrame:
    """A cached scenario's error against the full forward in float64, per position."""
    ref = m.outputs["ref"]
    table = pd.DataFrame({"position": range(ref.shape[1])})
    for name, label in (("fix", "fixed.py"), ("bug", "buggy.py")):
        errors = position_errors(m.outputs.get(name), ref)
        table[f"max error ({label})"] = float("nan") if errors is None else errors.tolist()
    prefill = bounds(card.how.steps, ref.shape[1])[0][1]
    table["call"] = ["prefill" if t < prefill else "step" for t in table["position"]]
    table.attrs["caption"] = f"Error per position against the full forward ({card.scenario})"
    table.attrs["plots"] = [
        dict(
            x="position",
            y=["max error (fixed.py)", "max error (buggy.py)"],
            logy=True,
            title=f"{card.id}: {card.scenario} vs the full forward (float64)",
            xlabel=f"position (0-{prefill - 1}: prefill; then the cached calls)",
            ylabel="max |error|",
        )
    ]
    return table


APPENDIX_INTRO = """\
## Appendix: the tables behind each verdict

Each trap's tables come from its first device in float32 (the cell its section names). Output:
*run* is fixed.py (`fix`) or buggy.py (`bug`); *max_abs* the largest absolute error against the
float64 run (fix's is the floor); *rel_l2* the error's L2 norm over the reference's; *threshold*
2 x floor + atol; *differs* whether max_abs exceeds it; *shape* the output's. Attention rows:
*entropy_mean* and *entropy_min* over rows (normalized as above); *saturated* the fraction of rows
with one weight of at least 0.99; *nan_rows* rows holding a NaN; *row_sum_err* the largest
distance of a row's sum from 1 (1 where a module zeroes a row with no allowed key, as
fully_masked_row's fixed.py does on purpose). Gradients, one row per weight and for the input:
*norm_fix* and *norm_bug* their L2 norms; *cosine* between the two; *err_fix* and *err_bug* the
largest errors against the float64 gradient; *threshold* 3 x err_fix + atol; *differs* as
above."""


def appendix(results: list[TrapResult]) -> str:
    parts = [APPENDIX_INTRO]
    for r in results:
        card, m = r.pair.card, r.primary
        out = [f'<a id="tables-{card.id}"></a>', f"### Tables: `{card.id}`", ""]
        out += measurement_tables(m, card)
        for extra in (e for e in r.extras if not is_short(e)):
            out += [f"{caption(extra)} ({m.cell}):", "", table(extra), ""]
        parts.append("\n".join(out).rstrip("\n"))
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


def render(
    results: list[TrapResult],
    grid: Grid,
    unavailable: list[str],
    timed: set[str],
    images: dict[str, list[str]],
    doctor: str | None,
) -> str:
    """The whole report.md."""
    cards = [r.pair.card for r in results]
    sections = [
        opening(grid, unavailable, cards, any(r.learning is not None for r in results)),
        symptom_index(results, timed),
        summary(results),
        category_sections(results, images),
    ]
    if doctor is not None:
        sections.append(doctor)
    sections.append(appendix(results))
    return "\n\n".join(sections).rstrip("\n") + "\n"


def write_report(
    results: list[TrapResult],
    grid: Grid,
    out: Path,
    unavailable: list[str],
    timed: dict[str, pd.DataFrame],
    doctor: str | None = None,
    progress: Callable[[str], None] = lambda label: None,
) -> tuple[Path, bool]:
    """Write ``out/report.md`` with its pictures, and ``out/timings.md``, as one unit.

    When ``out`` already holds a report that agrees with this one within rounding noise (and
    every picture it links), it is kept as it is: a machine that differs only in its CPU leaves
    a committed report unchanged. Returns the report's path and whether it was replaced.
    ``doctor`` is an optional section before the appendix (the doctor's tables).
    """
    ensure_writable(out)
    with publish.staging(out) as staged:
        (staged / IMAGES).mkdir()
        images = {}
        for r in results:
            progress(f"drawing {r.pair.card.id}")
            drawn = draw(r, staged)
            hashed = [publish.hashed_name(staged / name) for name in drawn]
            for name, new in zip(drawn, hashed, strict=True):
                os.replace(staged / name, staged / new)
            images[r.pair.card.id] = hashed
        progress("writing")
        text = render(results, grid, unavailable, set(timed), images, doctor)
        (staged / REPORT).write_text(text)
        (staged / TIMINGS).write_text(timings_text(timed))
        pictures = [name for names in images.values() for name in names]
        with publish.locked(out):
            old = out / REPORT
            old_text = old.read_text() if old.is_file() else None
            if is_current(out, old_text, text):
                with uninterrupted(f"{out / TIMINGS} was replaced (the report was current)"):
                    os.replace(staged / TIMINGS, out / TIMINGS)
                return out / REPORT, False
            linked = publish.linked_images(old_text or "")
            with uninterrupted(f"{out / REPORT} is the new report"):
                publish.install(staged, out, REPORT, pictures, [TIMINGS], linked)
    return out / REPORT, True


def is_current(out: Path, old_text: str | None, text: str) -> bool:
    """The report ``out`` holds (``old_text``; None: none) is equivalent to ``text``
    (reportdiff), with every picture it links."""
    if old_text is None:
        return False
    pictures = publish.linked_images(old_text)
    return all((out / p).is_file() for p in pictures) and reportdiff.equivalent(old_text, text)


def collect(
    pairs: list[Pair],
    grid: Grid,
    measure_all: Callable[[list[Pair], Grid], list[Measurement]],
    progress: Callable[[str], None] = lambda label: None,
    learn: Callable[[Pair, torch.device], Learning] | None = None,
) -> tuple[list[TrapResult], dict[str, pd.DataFrame]]:
    """Measure everything, then each trap's extra on the first device in float32, and (with
    ``learn``) its learning probe on that device."""
    cells = measure_all(pairs, grid)
    device = grid[0][0]
    results, timed = [], {}
    for pair in pairs:
        progress(f"{pair.card.id}: its own measurement")
        r = TrapResult(pair, [m for m in cells if m.pitfall == pair.card.id])
        if pair.card.how.cached and r.primary.outputs.get("ref") is not None:
            r.extras.append(generation_steps(r.primary, pair.card))
        if pair.card.extra is not None:
            extra = pair.card.extra(pair, device, torch.float32)
            if extra.attrs.get("timing"):
                timed[pair.card.id] = extra
                r.notes.append(f"Wall-clock timing: `{TIMINGS}` beside the report (uncommitted).\n")
            else:
                r.extras.append(extra)
        if learn is not None:
            progress(f"{pair.card.id}: training")
            r.learning = learn(pair, device)
        results.append(r)
    return results, timed
