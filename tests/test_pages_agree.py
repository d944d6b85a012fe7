"""One number, one condition: the report's pages and the README never state the same quantity
of a trap twice with different values, unless each says what it was measured on.

A statement is a number of a known kind (an entropy, an output error, steps to 90%, ...) in one
unit of text (a table row, a list item, a sentence), about the trap that unit names first (or
whose section it is in), under the conditions the unit states (a d_k, a seed, a dtype, a task,
a number of heads). Two statements of one quantity of one trap must agree where their
conditions are the same, and one that states no condition must agree with every other.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.catalogue import registry
from harness.files import PAGES

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"(\d+(?:\.\d+)?(?:e[+-]\d+)?)"

# Each kind of number, and what its groups are: the quantity each group states.
QUANTITIES = (
    (rf"entropy:? {NUMBER} (?:→|to) {NUMBER}", ("entropy, fixed.py", "entropy, buggy.py")),
    (rf"mean entropy {NUMBER} with the default, {NUMBER} with xavier",
     ("entropy, buggy.py", "entropy, fixed.py")),
    (rf"yes \({NUMBER}\)", ("fixed.py's steps to 90%",)),
    (rf"fixed\.py: {NUMBER} steps to 90%", ("fixed.py's steps to 90%",)),
    (rf"fixed\.py reaches 90% in {NUMBER} steps", ("fixed.py's steps to 90%",)),
    (rf"{NUMBER} steps to 90% against {NUMBER}",
     ("buggy.py's steps to 90%", "fixed.py's steps to 90%")),
    (rf"output error {NUMBER}(?![\d–-]|\.\d)", ("output error",)),
    (rf"{NUMBER}x fixed\.py's", ("gradient ratio",)),
    (rf"{NUMBER}% of rows saturated", ("saturated rows, buggy.py",)),
)  # fmt: skip

# What a unit may say it was measured on: each as (kind, pattern of its value).
CONDITIONS = (
    ("d_k", r"\bd_k[ =](\d+)|\bd = (\d+)"),
    ("seed", r"\bseeds? (\d+(?:[–-]\d+)?)"),
    ("seeds", r"\bover (\d+) seeds"),
    ("task", r"\b(copy|recall)\b"),
    ("dtype", r"\b(b?float16|float32)\b"),
    ("heads", r"\b(\d+) heads?\b"),
)


@dataclass(frozen=True)
class Statement:
    trap: str
    quantity: str
    conditions: tuple[str, ...]
    value: str
    where: str  # the page, and the unit of text it is in

    def agrees(self, other: Statement) -> bool:
        """The same number, to the precision of the less precise of the two."""
        digits = min(_decimals(self.value), _decimals(other.value))
        return abs(float(self.value) - float(other.value)) <= 0.5 * 10**-digits + 1e-12


def _decimals(value: str) -> int:
    mantissa, _, exponent = value.partition("e")
    places = len(mantissa.partition(".")[2])
    return places - int(exponent or 0)


def units(text: str, traps: set[str]) -> Iterator[tuple[str | None, str]]:
    """Each unit of ``text`` with the trap it is about: the first trap it names in backticks,
    else the trap whose section (a heading naming it) it is in."""
    section = None
    for line in text.splitlines():
        if line.startswith("#"):
            named = re.match(r"#+ `(\w+)`", line)
            section = named.group(1) if named else None
            continue
        table_or_list = line.startswith(("|", "- "))
        for unit in [line] if table_or_list else re.split(r"(?<=[.;])\s+", line):
            named = [t for t in re.findall(r"`(\w+)`", unit) if t in traps]
            yield (named[0] if named else section), unit


def statements(text: str, page: str, traps: set[str]) -> Iterator[Statement]:
    """Every statement ``text`` (the page ``page``) makes about one of ``traps``."""
    for trap, unit in units(text, traps):
        if trap is None:
            continue
        found = (
            f"{kind} {next(g for g in match.groups() if g)}"
            for kind, pattern in CONDITIONS
            for match in re.finditer(pattern, unit)
        )
        conditions = tuple(sorted(set(found)))
        for pattern, quantities in QUANTITIES:
            for match in re.finditer(pattern, unit):
                for quantity, value in zip(quantities, match.groups(), strict=True):
                    yield Statement(trap, quantity, conditions, value, f"{page}: {unit[:120]}")


def contradictions(pages: dict[str, str], traps: set[str]) -> list[str]:
    """Pairs of statements of one quantity of one trap that disagree with nothing to tell
    them apart: the same conditions, or one of them none."""
    by_quantity: dict[tuple[str, str], list[Statement]] = defaultdict(list)
    for page, text in pages.items():
        for s in statements(text, page, traps):
            by_quantity[(s.trap, s.quantity)].append(s)
    found = []
    for (trap, quantity), said in by_quantity.items():
        for i, a in enumerate(said):
            for b in said[i + 1 :]:
                alike = a.conditions == b.conditions or not a.conditions or not b.conditions
                if alike and not a.agrees(b):
                    found.append(f"{trap}, {quantity}: {a.value} ({a.where}) against "
                                 f"{b.value} ({b.where})")  # fmt: skip
    return found


def committed_pages() -> dict[str, str]:
    """The committed report's pages and the README, by name."""
    pages = {name: (ROOT / "reports" / name).read_text() for name in PAGES}
    return pages | {"README.md": (ROOT / "README.md").read_text()}


def test_no_two_pages_state_one_quantity_with_two_values() -> None:
    assert contradictions(committed_pages(), set(registry.ids())) == []


# Two pages' texts about traps a and b, and whether they contradict each other.
PLANTED = [
    ("- `a`: entropy 0.645 → 0.98", "| `a` | mean entropy 0.98 with the default, 0.648 with "
     "xavier |", True),
    ("`a`: fixed.py reaches 90% in 37 steps.", "- `a`: (fixed.py: 41 steps to 90%)", True),
    ("- `a`: entropy 0.972 → 0.996", "| `a` | entropy 0.863 to 0.998 at d = 64 |", True),
    ("- `a`: entropy 0.972 → 0.996 (d_k 8)", "| `a` | entropy 0.863 to 0.998 at d = 64 |", False),
    ("- `a`: output error 0.397 (float32)", "- `a`: output error 0.27 (float32, 1 head)", False),
    ("- `a`: output error 0.4", "- `a`: output error 0.397", False),  # the same, rounded
    ("- `a`: output error 0.4", "- `b`: output error 0.3", False),  # two traps
]  # fmt: skip


@pytest.mark.parametrize(("first", "second", "caught"), PLANTED)
def test_a_planted_contradiction_is_caught(first: str, second: str, caught: bool) -> None:
    pages = {"one.md": first, "two.md": second}
    assert bool(contradictions(pages, {"a", "b"})) is caught


def test_a_statement_in_a_traps_section_is_about_that_trap() -> None:
    text = "### `a`: a trap\n\nIt moves: output error 0.5.\n\n## Next\n\noutput error 0.9."
    [said] = statements(text, "p.md", {"a"})
    assert (said.trap, said.value) == ("a", "0.5")
