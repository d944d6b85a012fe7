"""Compare a diagnosis report with one made on another machine.

float32 kernels round differently on different CPUs, so a report regenerated elsewhere differs
from the committed one in the noise (a floor of 1.45e-07 here is 1.51e-07 there) and in table
padding, since tabulate pads each column to its widest cell. What must not differ: the words
(sections and their order, verdicts, expected verdicts, triggers) and any number by more than
rounding explains. ``compare`` checks both and returns one message per disagreement.

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
from dataclasses import dataclass
from decimal import Decimal
from itertools import takewhile, zip_longest

# A number as the report prints it: 2, -0.1, 1.51e-07, 1.72e+04, inf, nan; not the 32 of
# float32 or the 2 of W_2, nor a version such as 2.13.0.
NUMBER = r"(?<![\w.])[-+]?(?:inf|nan|(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?)(?!\w|\.\d)"
NUMBERS = re.compile(NUMBER)
INTEGER = re.compile(r"[-+]?\d+")
MASK = "<n>"
# What may differ from machine to machine: library versions and which devices exist.
ENVIRONMENT = re.compile(
    r"^(- Versions:).*$|^(- Devices: .*?)(?: Not available here: .*)?$|^(- CPU:).*$"
)
ANCHOR = re.compile(r'^<a id="(?:tables-)?([\w-]+)"></a>$')  # a trap's section or its tables
SUMMARY_ROW = re.compile(r"^\|\s*\[`[\w-]+`\]\(#([\w-]+)\)")
LISTED = re.compile(r"^- \[`[\w-]+`\]\(#([\w-]+)\): ")  # a symptom's evidence for one trap
VERDICT_LINE = re.compile(r"^- [^:,]+: \*\*[A-Z]+(?:, NaN)?\*\*: ")  # - cpu float16: **LOUD**: why
PRINTED_THRESHOLD = re.compile(rf"(?:threshold|>) ({NUMBER})")  # "> threshold 2.13e-07"
NUMERIC_COLUMNS = {"output error (floor)", "entropy fix → bug", "grad cosine"}
# Training amplifies rounding, so the learning probe's numbers drift from CPU to CPU: in its
# blocks, its summary column and its symptom evidence only the words are compared.
LEARNING_START, LEARNING_END = "<!-- learning -->", "<!-- /learning -->"
LEARNED_COLUMN = "learns? fix / bug"
LEARNED_EVIDENCE = re.compile(r"^- \[`[\w-]+`\]\(#[\w-]+\): training: ")
# A trap whose tables print no threshold (compared over seeds, or raising) measures no floor;
# its numbers (attention rows and their sums) are of order one, in the primary cell's float32.
FLOAT32_EPS = Decimal(2) ** -23
PICTURE_HASH = re.compile(r"(img/[\w.-]+?)-[0-9a-f]{10}\.png")  # harness.publish.hashed_name
SHOWN = 40  # at most this many lines of a text diff in a message


@dataclass(frozen=True)
class Line:
    """A report line with its numbers masked, and the threshold it prints, if any."""

    lineno: int  # 1-based
    words: str
    numbers: list[str]
    trap: str | None  # None: outside every trap (header, doctor): nothing but display steps
    threshold: Decimal | None  # its table row's "threshold" column, or its verdict's
    in_table: bool
    learned: bool = False  # from the learning probe: its numbers are not compared


def quantum(x: Decimal) -> Decimal:
    """The display step behind a printed number.

    ``.3g`` rounds to one unit in the third significant digit. A number printed with more
    digits (a count of 1000 or more, a float's repr) was not rounded to three, and zero is
    exact: their step is 0.
    """
    if x.is_zero() or len(x.as_tuple().digits) > 3:
        return Decimal(0)
    return Decimal(10) ** (x.adjusted() - 2)


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


def cells(row: str) -> list[str]:
    """A markdown table row's cells, without padding."""
    return [c.strip() for c in row.strip().strip("|").split("|")]


def normalise(line: str) -> str:
    """A line without what may differ between machines: padding, versions, absent devices, and
    the hash in a picture's name (a picture's bytes move with rounding as its numbers do)."""
    line = PICTURE_HASH.sub(r"\1.png", line)
    if line.startswith("|"):
        return "|" + "|".join(re.sub("-{3,}", "---", c) for c in cells(line)) + "|"
    return ENVIRONMENT.sub(lambda m: m.group(1) or m.group(2) or m.group(3), line)


def finite(text: str) -> Decimal | None:
    value = Decimal(text) if NUMBERS.fullmatch(text) else None
    return value if value is not None and value.is_finite() else None


def printed_threshold(text: str, header: list[str]) -> Decimal | None:
    """The threshold a table row or a verdict line prints; None when it prints none."""
    if text.startswith("|") and "threshold" in header:
        row = cells(text)
        return finite(row[header.index("threshold")]) if len(row) == len(header) else None
    if VERDICT_LINE.match(text) or LISTED.match(text):
        values = [finite(v) for v in PRINTED_THRESHOLD.findall(text)]
        return max((v for v in values if v is not None), default=None)
    return None


def parse(report: str) -> list[Line]:
    """Every line of ``report``, normalised and masked, with its trap and printed threshold."""
    lines: list[Line] = []
    trap, header, learning = None, [], False
    for lineno, raw in enumerate(report.splitlines(), start=1):
        text = normalise(raw)
        learning = (learning or text == LEARNING_START) and text != LEARNING_END
        if anchor := ANCHOR.match(text):
            trap = anchor.group(1)
        elif text.startswith("## "):
            trap = None  # a new part: the summary, a category, the doctor
        in_table = text.startswith("|")
        if in_table and not (lines and lines[-1].in_table):
            header = cells(text)
        row = SUMMARY_ROW.match(text) or LISTED.match(text)
        compared = text
        if in_table and LEARNED_COLUMN in header and len(cells(text)) == len(header):
            kept = cells(text)
            del kept[header.index(LEARNED_COLUMN)]  # the learning probe's numbers drift
            compared = "|".join(kept)
        lines.append(
            Line(
                lineno=lineno,
                words=NUMBERS.sub(MASK, text),
                numbers=NUMBERS.findall(compared),
                trap=row.group(1) if row else trap,
                threshold=printed_threshold(text, header),
                in_table=in_table,
                learned=learning or bool(LEARNED_EVIDENCE.match(text)),
            )
        )
    return lines


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


def sections(report: str) -> list[str]:
    """Headings and anchors, in order."""
    return [line for line in report.splitlines() if line.startswith("#") or ANCHOR.match(line)]


def summary_rows(report: str) -> list[dict[str, str]]:
    """The summary table, one dict per trap; empty when there is none."""
    if "\n## Summary\n" not in report:
        return []
    after = report.split("\n## Summary\n", 1)[1].strip().splitlines()
    header, _, *rows = [cells(line) for line in takewhile(lambda s: s.startswith("|"), after)]
    return [dict(zip(header, row, strict=True)) for row in rows]


def compare_sections(committed: str, fresh: str) -> list[str]:
    old, new = sections(committed), sections(fresh)
    if old == new:
        return []
    diff = list(difflib.unified_diff(old, new, "committed", "fresh", n=0, lineterm=""))
    return ["sections differ (missing, extra or reordered):", *diff[:SHOWN]]


def compare_summary(committed: str, fresh: str) -> list[str]:
    """The summary's words (trap, §, every verdict, expected, trigger; the learning column with
    its numbers masked) must match exactly."""
    problems = []
    old, new = summary_rows(committed), summary_rows(fresh)
    for a, b in zip_longest(old, new, fillvalue={}):
        keys = [k for k in dict.fromkeys([*a, *b]) if k not in NUMERIC_COLUMNS]
        for k in (k for k in keys if words_of(k, a.get(k)) != words_of(k, b.get(k))):
            trap = a.get("trap") or b.get("trap")
            problems.append(f"summary, {trap}, {k}: committed {a.get(k)!r}, fresh {b.get(k)!r}")
    return problems


def words_of(column: str, cell: str | None) -> str | None:
    """A summary cell as compared: the learning column without its numbers."""
    if cell is None or column != LEARNED_COLUMN:
        return cell
    return NUMBERS.sub(MASK, cell)


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
        if a.learned or b.learned:
            continue
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
    problems = compare_sections(committed, fresh) + compare_summary(committed, fresh)
    words = compare_words(old, new)
    return problems + (words or compare_numbers(old, new))


def versions(report: str) -> list[str]:
    return [line for line in report.splitlines() if line.startswith("- Versions:")]


def cpus(report: str) -> list[str]:
    return [line for line in report.splitlines() if line.startswith("- CPU:")]


def learned(report: str) -> list[str]:
    """The learning probe's lines and summary cells, as printed (padding aside)."""
    pairs = zip(report.splitlines(), parse(report), strict=True)
    lines = [normalise(line) for line, parsed in pairs if parsed.learned]
    cells = [row.get(LEARNED_COLUMN, "") for row in summary_rows(report)]
    return lines + cells


def equivalent(old: str, new: str) -> bool:
    """Whether ``new`` says what ``old`` says, run with the same versions: only the CPU's
    rounding (within the floor) or table padding differ. Then there is nothing to rewrite.

    On the same CPU the learning probe repeats itself exactly, so there its numbers must be
    the same too (a change in the code that moves them is a change)."""
    if versions(old) != versions(new) or compare(old, new, optional=False):
        return False
    return cpus(old) != cpus(new) or learned(old) == learned(new)
