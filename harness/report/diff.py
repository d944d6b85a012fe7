"""Compare a diagnosis report with one made on another machine.

float32 kernels round differently on different CPUs, so a report regenerated elsewhere differs
from the committed one in the noise (a floor of 1.45e-07 here is 1.51e-07 there) and in table
padding, since tabulate pads each column to its widest cell. What must not differ: the words
(sections and their order, verdicts, expected verdicts, triggers) and any number by more than
rounding explains. ``compare`` checks both, on the two reports as ``parse`` reads them back, and
returns one message per disagreement.

How far a number may move comes from the thresholds each report prints (threshold = 2 x floor
+ atol, 3 x for gradients; harness.metrics): a machine's number is the true value plus rounding
noise within its threshold, so two machines' numbers may differ by the sum of their thresholds,
plus one display step where ``.3g`` rounds them to either side of a boundary.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import warnings
from decimal import Decimal
from itertools import zip_longest

from harness.catalogue.spread import SEEDS
from harness.report.format import LEARNED_COLUMN, OUTPUT_COLUMN, SIGNIFICANT, seeds_column
from harness.report.parse import (
    MASK,
    NUMBERS,
    Line,
    cells,
    cpus,
    learned,
    parse,
    sections,
    summary_rows,
    versions,
)
from harness.tally import ALPHA, Tally, differ

INTEGER = re.compile(r"[-+]?\d+")
NUMERIC_COLUMNS = {OUTPUT_COLUMN, seeds_column(SEEDS), "entropy fix → bug", "grad cosine"}
# A trap whose tables print no threshold (compared over seeds, or raising) measures no floor;
# its numbers (attention rows and their sums) are of order one, in the primary cell's float32.
FLOAT32_EPS = Decimal(2) ** -23
SHOWN = 40  # at most this many lines of a text diff in a message


def quantum(x: Decimal) -> Decimal:
    """The display step behind a printed number.

    ``format.FLOAT`` (``.3g``) rounds to one unit in the third (``SIGNIFICANT``) digit. A number
    printed with more digits (a count of 1000 or more, a float's repr) was not rounded so, and
    zero is exact: their step is 0.
    """
    if x.is_zero() or len(x.as_tuple().digits) > SIGNIFICANT:
        return Decimal(0)
    return Decimal(10) ** (x.adjusted() - (SIGNIFICANT - 1))


def agree(a: str, b: str, threshold: Decimal) -> bool:
    """Whether two printed numbers agree within ``threshold`` and one display step.

    Integers (counts, shapes, indices) take no threshold: equal, but for one display step of a
    three-digit ``.3g`` value. inf, -inf and nan match only themselves.
    """
    x, y = Decimal(a), Decimal(b)
    if not (x.is_finite() and y.is_finite()):
        return a.lstrip("+") == b.lstrip("+")
    if INTEGER.fullmatch(a) and INTEGER.fullmatch(b):
        threshold = Decimal(0)
    return abs(x - y) <= threshold + max(quantum(x), quantum(y))


def primary_thresholds(lines: list[Line]) -> dict[str, Decimal]:
    """Each trap's largest tabulated threshold: its primary (float32) cell's, output or gradient."""
    out: dict[str, Decimal] = {}
    for line in lines:
        if line.trap and line.in_table and line.threshold is not None:
            out[line.trap] = max(out.get(line.trap, line.threshold), line.threshold)
    return out


def threshold_of(line: Line, primary: dict[str, Decimal]) -> Decimal:
    """What bounds a line's noise: what it prints, else its trap's primary cell's."""
    if line.threshold is not None:
        return line.threshold
    return primary.get(line.trap, FLOAT32_EPS) if line.trap else Decimal(0)


def compare_sections(committed: str, fresh: str) -> list[str]:
    old, new = sections(committed), sections(fresh)
    if old == new:
        return []
    diff = list(difflib.unified_diff(old, new, "committed", "fresh", n=0, lineterm=""))
    return ["sections differ (missing, extra or reordered):", *diff[:SHOWN]]


def compare_summary(committed: str, fresh: str, same_cpu: bool = True) -> list[str]:
    """The summary's words (trap, §, every verdict, expected, trigger; the learning column with
    its numbers masked, between reports of the same machine) must match exactly; the learning
    probe's tallies as ``compare_tallies`` says."""
    problems = []
    old, new = summary_rows(committed), summary_rows(fresh)
    skipped = NUMERIC_COLUMNS | (set() if same_cpu else {LEARNED_COLUMN})
    for a, b in zip_longest(old, new, fillvalue={}):
        trap = a.get("trap") or b.get("trap")
        keys = [k for k in dict.fromkeys([*a, *b]) if k not in skipped]
        for k in (k for k in keys if words_of(k, a.get(k)) != words_of(k, b.get(k))):
            problems.append(f"summary, {trap}, {k}: committed {a.get(k)!r}, fresh {b.get(k)!r}")
        said = compare_tallies(a.get(LEARNED_COLUMN), b.get(LEARNED_COLUMN), same_cpu)
        problems += [f"summary, {trap}, {LEARNED_COLUMN}: {text}" for text in said]
    return problems


def words_of(column: str, cell: str | None) -> str | None:
    """A summary cell as compared: the learning column without its numbers."""
    if cell is None or column != LEARNED_COLUMN:
        return cell
    return NUMBERS.sub(MASK, cell)


def tally_of(cell: str) -> Tally | None:
    """The bug's tally over seeds in a learning cell (``copy: yes (36) / learns slower 4/5 ·
    learns normally 1/5``); None when it holds none."""
    _, _, said = cell.partition(" / ")
    return Tally.parse(said)


def compare_tallies(committed: str | None, fresh: str | None, same_machine: bool) -> list[str]:
    """What the learning probe claims, compared by the rule of ``harness.tally``: between two
    machines the tallies differ only where Fisher's exact test says so, whatever the claims
    their counts give (on one machine ``compare_learned`` holds them equal, as every number of
    the learning probe)."""
    if committed is None and fresh is None:
        return []  # neither report ran the learning probe
    old, new = tally_of(committed or ""), tally_of(fresh or "")
    if old is None or new is None:
        return [f"no tally to compare: committed {committed!r}, fresh {fresh!r}"]
    if same_machine:
        return []  # compared exactly there, with every line of the learning probe (compare_learned)
    return [
        f"{outcome}: committed {old.text()!r}, fresh {new.text()!r} (Fisher's exact test, "
        f"p < {ALPHA:g})"
        for outcome in differ(old, new)
    ]


def compare_words(old: list[Line], new: list[Line]) -> list[str]:
    a, b = [line.words for line in old], [line.words for line in new]
    if a == b:
        return []
    diff = list(difflib.unified_diff(a, b, "committed", "fresh", n=0, lineterm=""))
    return ["the text differs (numbers masked as <n>, padding ignored):", *diff[:SHOWN]]


def compare_numbers(old: list[Line], new: list[Line]) -> list[str]:
    """The numbers of lines whose words agree, within the sum of both reports' thresholds."""
    problems = []
    old_primary, new_primary = primary_thresholds(old), primary_thresholds(new)
    for a, b in zip(old, new, strict=True):
        threshold = threshold_of(a, old_primary) + threshold_of(b, new_primary)
        for x, y in zip(a.numbers, b.numbers, strict=True):
            if not agree(x, y, threshold):
                problems.append(
                    f"line {a.lineno} (`{a.trap}`): committed {x}, fresh {y}, further apart than "
                    f"{threshold:.3g} (the two thresholds) plus a display step\n    {a.words}"
                )
    return problems


REAL = "## The doctor on real modules"
OPTIONAL = ("transformers", "x_transformers", "timm")  # the real extra, and timm


def importable(name: str) -> bool:
    """Whether a library imports here (installed is not enough: timm needs a matching
    torchvision)."""
    if importlib.util.find_spec(name) is None:
        return False
    try:
        with warnings.catch_warnings():  # what a library says while it loads is not ours
            warnings.simplefilter("ignore")
            importlib.import_module(name)
    except Exception:
        return False
    return True


def without_uninstalled(report: str) -> str:
    """The report without the real-module rows of libraries not installed here (and the count
    that sums them): they depend on optional packages (the ``real`` extra), not on rounding."""
    missing = {name for name in OPTIONAL if not importable(name)}
    if REAL not in report or not missing:
        return report
    head, tail = report.split(REAL, 1)
    kept = [
        line for line in tail.splitlines()
        if not line.startswith("Right: ")
        and not (line.startswith("|") and cells(line)[1:2] and cells(line)[1] in missing)
    ]  # fmt: skip
    return head + REAL + "\n".join(kept)


def compare(committed: str, fresh: str, optional: bool = True) -> list[str]:
    """Every way ``committed`` disagrees with ``fresh``; empty when it agrees.

    Numbers are compared only where the words agree line for line. ``optional``: leave out the
    real-module rows of libraries not installed here.
    """
    if optional:
        committed, fresh = without_uninstalled(committed), without_uninstalled(fresh)
    old, new = parse(committed), parse(fresh)
    same_cpu = cpus(committed) == cpus(fresh)
    if not same_cpu:  # training drifts there: a label near its threshold may change sides
        old, new = [x for x in old if not x.learned], [x for x in new if not x.learned]
    problems = compare_sections(committed, fresh) + compare_summary(committed, fresh, same_cpu)
    words = compare_words(old, new)
    if same_cpu and not words:  # the same machine repeats its training exactly
        problems += compare_learned(committed, fresh)
    return problems + (words or compare_numbers(old, new))


def compare_learned(committed: str, fresh: str) -> list[str]:
    """The learning probe's lines, as printed, between two reports of one machine: training
    repeats itself there, so a number that moved is a change (in the code, or in the report)."""
    pairs = zip_longest(learned(committed), learned(fresh), fillvalue="")
    moved = [(a, b) for a, b in pairs if a != b]
    if not moved:
        return []
    a, b = moved[0]
    return [
        f"the learning probe's lines differ on the same machine ({len(moved)} of them), the first:"
        f"\n    committed {a[:200]}\n    fresh     {b[:200]}"
    ]


def equivalent(old: str, new: str) -> bool:
    """Whether ``new`` says what ``old`` says, run with the same versions: only the CPU's
    rounding (within the floor) or table padding differ. Then there is nothing to rewrite.
    (On the same machine the learning probe repeats itself exactly: ``compare`` holds its
    numbers equal there.)"""
    return versions(old) == versions(new) and not compare(old, new, optional=False)
