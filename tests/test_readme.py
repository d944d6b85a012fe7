"""README.md: its catalogue tables and its Verdicts section agree with the cards and the harness.

Every number in a catalogue row must appear on that trap's card, whose own tests measure it, so
the README cannot state a figure that no run checks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from harness import metrics
from harness.catalogue import registry
from harness.catalogue.card import Card
from harness.catalogue.verdicts import Verdict

README = Path(__file__).resolve().parents[1] / "README.md"
NUMBER = re.compile(r"(?<!\w)-?\d+(?:\.\d+)?(?:e-?\d+)?")  # 0.87, 99, -1e9; not float16, §4
TEXT_FIELDS = ("title", "claim", "trap", "truth", "why", "avoid")


def section(title: str) -> str:
    """The README's text under ``## title``, up to the next ``## `` heading."""
    text = README.read_text(encoding="utf-8")
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.M | re.S)
    assert found, f"README has no section {title!r}"
    return found[1]


def tables(text: str) -> list[list[dict[str, str]]]:
    """Every markdown table in ``text``: a list of rows, each a dict keyed by the header."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1]):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in row.strip("|").split("|")]
                assert len(cells) == len(header), row
                rows.append(dict(zip(header, cells, strict=True)))
            found.append(rows)
    return found


def catalogue() -> list[list[dict[str, str]]]:
    """The three catalogue tables: the tutorial's traps, the others, modern attention."""
    found = tables(section("The catalogue (measured on CPU, torch 2.13.0)"))
    assert len(found) == 3, "expected three catalogue tables"
    return found


def rows() -> list[dict[str, str]]:
    return [row for table in catalogue() for row in table]


def card(row: dict[str, str]) -> Card:
    return registry.load(row["id"].strip("`")).card


def card_numbers(c: Card) -> set[str]:
    return {n for field in TEXT_FIELDS for n in NUMBER.findall(getattr(c, field))}


def test_every_trap_is_listed_once():
    listed = [row["id"].strip("`") for row in rows()]
    assert sorted(listed) == sorted(registry.ids())


def test_the_tutorial_table_holds_only_traps_the_tutorial_names():
    tutorial, _, _ = catalogue()
    for row in tutorial:
        assert not card(row).claim.startswith("Not named by the tutorial"), row["id"]


def test_the_modern_table_holds_the_modern_pairs_with_their_scenario():
    *_, modern = catalogue()
    assert sorted(row["id"].strip("`") for row in modern) == sorted(
        i for i in registry.ids() if registry.load(i).card.modern
    )
    for row in modern:
        assert row["measured on"] == card(row).scenario, row["id"]


@pytest.mark.parametrize("row", rows(), ids=lambda row: row["id"].strip("`"))
def test_row_matches_its_card(row):
    c = card(row)
    assert row["category"] == c.category
    assert row["verdict"] == str(c.expected)
    if "§" in row:
        assert row["§"] == c.section


@pytest.mark.parametrize("row", rows(), ids=lambda row: row["id"].strip("`"))
def test_every_number_in_a_row_is_on_its_card(row):
    """The card's own tests measure its numbers; a README number no card states is unchecked."""
    stated = set(NUMBER.findall(row["what measurement shows"]))
    assert stated <= card_numbers(card(row)), f"not on the card: {stated - card_numbers(card(row))}"


def verdicts() -> str:
    return section("Verdicts")


def test_the_verdict_words_are_the_harness_verdicts():
    (table,) = tables(verdicts())
    assert [row["verdict"] for row in table] == [str(v) for v in Verdict]


def test_the_floor_factors_are_the_harness_factors():
    found = re.search(
        r"`(\d+) × floor \+ atol` for the output \(`(\d+) ×` for gradients\)", verdicts()
    )
    assert found, "the Verdicts section no longer states the floor factors"
    assert (float(found[1]), float(found[2])) == (metrics.OUTPUT_FACTOR, metrics.GRAD_FACTOR)


def test_atol_is_the_stated_formula(dtype):
    found = re.search(r"atol = (\d+)·max\|ref \+ ([\d.]+) − ([\d.]+) − ref\|", verdicts())
    assert found, "the Verdicts section no longer states atol"
    factor, plus, minus = (float(g) for g in found.groups())
    ref = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    r = (ref * 4).to(dtype)
    assert metrics.atol(ref * 4, dtype) == factor * (r + plus - minus - r).abs().max().item()


def test_the_seed_rule_is_the_harness_rule():
    found = re.search(
        r"compared over (\d+) seeds instead: it is SILENT when at least (\d+)% of the buggy "
        r"module's attention\s+rows saturate \(one key gets at least ([\d.]+) of a row's weight\) "
        r"and under (\d+)% of the fixed one's",
        verdicts(),
    )
    assert found, "the Verdicts section no longer states the seed rule"
    assert int(found[1]) == registry.load("init_variance").card.n_seeds
    assert int(found[2]) == int(found[4]) == 100 * metrics.DEGENERATE
    assert float(found[3]) == metrics.SATURATED


def doctor_examples() -> list[tuple[list[str], str]]:
    """The README's first doctor commands on the tutorial's module: each command's arguments
    (after ``.ci/task doctor``) and the comment that says what it shows."""
    block = re.search(r"```bash\n(.*?)```", section("Check your own module"), re.S)
    assert block, "the section shows no commands"
    found = []
    for line in block[1].splitlines():
        command, _, comment = line.partition("#")
        words = command.split()
        assert words[:2] == [".ci/task", "doctor"], line
        if words[2].startswith("pitfalls/"):
            found.append((words[2:], comment.strip()))
    return found


def test_the_first_doctor_example_shows_the_tutorials_documented_crash(capsys):
    """The README's first example is the tutorial's module with the mask its text documents:
    run as written, it fails and names the trap its comment says, at the line the prose says."""
    from harness import cli

    [(args, says)] = doctor_examples()
    assert cli.main(["doctor", *args]) == 1
    out = capsys.readouterr().out
    trap = says.removeprefix("fails: ")
    first = next(line for line in out.splitlines() if line.startswith("FAIL"))
    assert first.split()[1] == trap and "pitfalls/tutorial.py:33 " in first, out
    assert f"naming `{trap}` at `pitfalls/tutorial.py:33`" in section("Check your own module")
