"""A report read back, line by line, for the comparer (``diff``): each line's words with its
numbers masked, the numbers, the trap it belongs to and the threshold it prints; the sections,
the summary's rows, and the lines that differ from machine to machine.

What the writer writes that is read here (links, anchors, markers, the environment lines, the
picture names) comes from ``format``, which the writer uses too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from itertools import takewhile

from harness.files import IMAGES
from harness.report.format import (
    ANCHOR,
    CPU,
    DEVICES,
    HASH_DIGITS,
    LEARNED_COLUMN,
    LEARNING_AGREES,
    LEARNING_DISAGREES,
    LEARNING_END,
    LEARNING_START,
    LINK,
    NAMED,
    NAN,
    NOT_AVAILABLE,
    SUMMARY,
    TRAINED,
    VERSIONS,
)

# A number as the report prints it: 2, -0.1, 1.51e-07, 1.72e+04, inf, nan; not the 32 of
# float32 or the 2 of W_2, nor a version such as 2.13.0.
NUMBER = r"(?<![\w.])[-+]?(?:inf|nan|(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?)(?!\w|\.\d)"
NUMBERS = re.compile(NUMBER)
MASK = "<n>"
# What may differ from machine to machine: library versions and which devices exist.
ENVIRONMENT = re.compile(
    rf"^({re.escape(VERSIONS)}).*$"
    rf"|^({re.escape(DEVICES)} .*?)(?:{re.escape(NOT_AVAILABLE)}.*)?$"
    rf"|^({re.escape(CPU)}).*$"
)
SUMMARY_ROW = re.compile(rf"^\|\s*{LINK}")
LISTED = re.compile(rf"^- {LINK}{NAMED}: ")  # a symptom's evidence for one trap
# - cpu float16: **LOUD**: why
VERDICT_LINE = re.compile(rf"^- [^:,]+: \*\*[A-Z]+(?:{re.escape(NAN)})?\*\*: ")
PRINTED_THRESHOLD = re.compile(rf"(?:threshold|>) ({NUMBER})")  # "> threshold 2.13e-07"
# Training amplifies rounding, so the learning probe's numbers drift from CPU to CPU: in its
# blocks (LEARNING_START to LEARNING_END), its summary column (LEARNED_COLUMN), its symptom
# evidence and its note under the summary only the words are compared, and those only between
# reports made on the same CPU with the same kernels (a label near its threshold may fall on the
# other side elsewhere). Every line outside the blocks that quotes it carries TRAINED ("training:
# learns slower 4/5"): its symptom evidence, the scorecard's rows, the student's symptom index.
LEARNED_EVIDENCE = re.compile(
    rf"{re.escape(TRAINED)}|^{re.escape(LEARNING_AGREES)}|^{re.escape(LEARNING_DISAGREES)}"
)  # and the note under the summary on where learning and one pass disagree
# a picture's name with the hash of its bytes (publish.hashed_name)
PICTURE_HASH = re.compile(rf"({IMAGES}/[\w.-]+?)-[0-9a-f]{{{HASH_DIGITS}}}\.png")


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
                words=NUMBERS.sub(MASK, compared),  # the learning cell: compare_summary
                numbers=NUMBERS.findall(compared),
                trap=row.group(1) if row else trap,
                threshold=printed_threshold(text, header),
                in_table=in_table,
                learned=learning or bool(LEARNED_EVIDENCE.search(text)),
            )
        )
    return lines


def sections(report: str) -> list[str]:
    """Headings and anchors, in order."""
    return [line for line in report.splitlines() if line.startswith("#") or ANCHOR.match(line)]


def summary_rows(report: str) -> list[dict[str, str]]:
    """The summary table, one dict per trap; empty when there is none."""
    heading = f"\n{SUMMARY}\n"
    if heading not in report:
        return []
    after = report.split(heading, 1)[1].strip().splitlines()
    header, _, *rows = [cells(line) for line in takewhile(lambda s: s.startswith("|"), after)]
    return [dict(zip(header, row, strict=True)) for row in rows]


def versions(report: str) -> list[str]:
    """The line naming the library versions the report was made with."""
    return [line for line in report.splitlines() if line.startswith(VERSIONS)]


def cpus(report: str) -> list[str]:
    """The line naming the CPU the learning probe's numbers come from."""
    return [line for line in report.splitlines() if line.startswith(CPU)]


def learned(report: str) -> list[str]:
    """The learning probe's lines and summary cells, as printed (padding aside)."""
    pairs = zip(report.splitlines(), parse(report), strict=True)
    lines = [normalise(line) for line, parsed in pairs if parsed.learned]
    cells = [row.get(LEARNED_COLUMN, "") for row in summary_rows(report)]
    return lines + cells
