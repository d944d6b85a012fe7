"""How report.md writes what its comparer reads back (``parse``, for ``diff``).

Numbers, table cells and prose, the links and anchors of each trap, the verdict label, the
environment lines that differ from machine to machine, the learning probe's markers and column,
the hash in a picture's name: the writer and the comparer both take them from here, so what one
writes is what the other expects.
"""

from __future__ import annotations

import re
import textwrap

import pandas as pd

from harness.catalogue.card import NOT_NAMED
from harness.catalogue.judge import Measurement
from harness.catalogue.spread import Spread
from harness.catalogue.verdicts import Verdict

SIGNIFICANT = 3  # significant digits of a measured number as the report prints it
FLOAT = f".{SIGNIFICANT}g"
WIDTH = 100  # characters per line of prose

SUMMARY = "## Summary"
TABLES = "tables-"  # a trap's anchor in the appendix is its id after this
LINK = r"\[`[\w-]+`\]\((?:[\w-]+\.md)?#([\w-]+)\)"  # link(): the trap's id in group 1
NAMED = r"(?: \(tutorial §[\d.]+\))?"  # named(): after a link, where the tutorial names the trap
ANCHOR = re.compile(rf'^<a id="(?:{TABLES})?([\w-]+)"></a>$')  # anchor(), for a trap or its tables
NAN = ", NaN"  # after a verdict whose buggy.py numbers hold NaN or Inf
TRAINED = "training: "  # evidence in the symptom index that comes from the learning probe

# What may differ from machine to machine: the environment lines of the opening.
VERSIONS, CPU, DEVICES = "- Versions:", "- CPU:", "- Devices:"
NOT_AVAILABLE = " Not available here: "  # devices this machine lacks, after the DEVICES line

# Training amplifies rounding, so the learning probe's numbers drift from CPU to CPU: its blocks
# stand between these markers, and they and its summary column are compared in their words
# only, and only between reports of the same CPU and kernels (parse, diff).
LEARNING_START, LEARNING_END = "<!-- learning -->", "<!-- /learning -->"
LEARNED_COLUMN = "learns? task: fix / bug"
OUTPUT_COLUMN = "output error / largest output (floor)"  # the summary's, in float32
# The note under the summary that compares learning with the one-pass verdicts, in either form.
LEARNING_AGREES = "Learning agrees with every one-pass verdict"
LEARNING_DISAGREES = "Where learning and the one-pass verdict disagree: "

HASH_DIGITS = 10  # hex digits of the hash a picture's name carries (publish.hashed_name)


def num(x: float) -> str:
    """A measured number as the report prints it."""
    return format(x, FLOAT)


def seeds_column(seeds: int) -> str:
    """The summary's column of the output error over seeds."""
    return f"seeds 0–{seeds - 1}"


def over_seeds(spread: Spread) -> str:
    """The output error over seeds as the report prints it: within the floor, a range, or the
    largest and how many seeds' are within the floor."""
    if spread.within == spread.seeds:
        return "within the floor"
    if spread.within:
        return f"up to {num(spread.high)} ({spread.within} within the floor)"
    return num(spread.low) if spread.low == spread.high else f"{num(spread.low)}–{num(spread.high)}"


def prose(text: str) -> str:
    """A paragraph, wrapped: its words are fixed, so every machine wraps them alike."""
    return textwrap.fill(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def escape(value: object) -> object:
    """A table cell that cannot break its row: a ``|`` in text is escaped."""
    return value.replace("|", "\\|") if isinstance(value, str) else value


def table(df: pd.DataFrame) -> str:
    cells = df.map(escape).rename(columns=escape)
    return cells.to_markdown(index=False, floatfmt=FLOAT)


def link(pitfall: str, page: str = "") -> str:
    """A link to a trap's section, on ``page`` ("": the page the link is on; ``LINK`` reads it
    back)."""
    return f"[`{pitfall}`]({page}#{pitfall})"


def named(section: str) -> str:
    """Where the tutorial names a trap, after its link ("" when it does not; ``NAMED`` reads
    it)."""
    return "" if section == NOT_NAMED else f" (tutorial {section})"


def anchor(name: str) -> str:
    """Where a link lands: a trap's section (its id) or its tables (``TABLES`` + id)."""
    return f'<a id="{name}"></a>'


def verdict_label(verdict: Verdict, cells: list[Measurement]) -> str:
    """The verdict, with ", NaN" when buggy.py's numbers hold NaN or Inf in one of ``cells``."""
    nan = verdict in (Verdict.SILENT, Verdict.CONDITIONAL) and any(m.bug_nonfinite for m in cells)
    return f"{verdict}{NAN}" if nan else str(verdict)
