"""The cross-machine report comparison passes rounding noise and fails on a real change."""

import re
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest

from harness.report import diff as reportdiff
from harness.report.diff import agree, compare, primary_thresholds
from harness.report.format import LEARNED_COLUMN, OUTPUT_COLUMN
from harness.report.pages import joined, read_pages
from harness.report.parse import normalise, parse

COMMITTED = joined(read_pages(Path(__file__).resolve().parents[1] / "reports"))
SECTIONS_DIFFER = "sections differ (missing, extra or reordered):"
ATOL = 5.96e-08


def edit(text: str, old: str, new: str) -> str:
    """``text`` with its first ``old`` replaced; ``old`` must be there."""
    assert old in text, f"not in the report any more: {old!r}"
    return text.replace(old, new, 1)


def section(text: str, pid: str) -> str:
    """A trap's section, from its anchor to the next anchor."""
    anchor = f'<a id="{pid}"></a>'
    return anchor + text.split(anchor)[1].split('<a id="')[0]


def padding(row: str) -> list[int]:
    """How many spaces pad each cell of a table row."""
    return [len(cell) - len(cell.strip()) for cell in row.split("|")]


def snippet(floor: float, bug_error: float = 0.75, verdict: str = "SILENT") -> str:
    """A small report with one trap, shaped like the real one."""
    threshold = 2 * floor + ATOL
    summary = {
        "trap": "[`demo`](#demo)",
        "§": "§4.3",
        "cpu: float32 · bfloat16": f"{verdict} · SILENT",
        "combined": verdict,
        "expected": "SILENT",
        OUTPUT_COLUMN: f"{bug_error:.3g} ({floor:.3g})",
    }
    output = {
        "run": ["fix", "bug"],
        "max_abs": [floor, bug_error],
        "floor": [floor, floor],
        "threshold": [threshold, threshold],
        "shape": ["(2, 5, 6)", "(2, 5, 6)"],
    }
    lines = [
        "# Report",
        f"- Versions: torch 2.13.0, floor {floor}.",
        "## Summary",
        pd.DataFrame([summary]).to_markdown(index=False),
        "## Masks",
        '<a id="demo"></a>',
        "### `demo`: a demo trap",
        f"- cpu float32: **{verdict}**: output error {bug_error:.3g} > threshold {threshold:.3g}",
        "- cpu bfloat16: **SILENT**: output error 0.75 > threshold 0.00999",
        pd.DataFrame(output).to_markdown(index=False, floatfmt=".3g"),
    ]
    return "\n\n".join(lines) + "\n"


def test_the_committed_report_agrees_with_itself_whatever_the_versions() -> None:
    other = edit(COMMITTED, "torch 2.13.0+cpu", "torch 2.14.0+cu128")
    other = edit(other, " Not available here: cuda.", "")
    assert compare(COMMITTED, other) == []


def test_floors_that_differ_in_the_noise_and_shift_the_padding_pass() -> None:
    here, there = snippet(1.45e-07), snippet(1.51e-07, bug_error=0.751)
    assert padding(here.splitlines()[-1]) != padding(there.splitlines()[-1])
    assert compare(here, there) == []


def test_floors_four_times_apart_pass_on_each_reports_own_threshold() -> None:
    """Seen between two CPUs (transpose's W_v gradient: 3.17e-07 vs 7.87e-08)."""
    assert compare(snippet(4e-07), snippet(1e-07)) == []
    # The thresholds differ by more than twice the smaller one: one report's would not do.
    assert not agree("8.6e-07", "2.6e-07", 2 * Decimal("2.6e-07"))


@pytest.mark.parametrize(
    ("change", "found"),
    [
        ({"bug_error": 0.76}, "committed 0.75, fresh 0.76"),
        ({"bug_error": float("inf")}, "committed 0.75, fresh inf"),
        ({"verdict": "BENIGN"}, "summary, [`demo`](#demo), combined: committed 'SILENT'"),
    ],
)
def test_a_real_change_in_a_snippet_fails(change: dict, found: str) -> None:
    problems = compare(snippet(1.45e-07), snippet(**{"floor": 1.45e-07} | change))
    assert any(found in p for p in problems), problems


def found(pattern: str) -> re.Match[str]:
    """The committed report's first match of ``pattern``: its own numbers, whichever CPU wrote
    it (floors and thresholds are rounding, and move from machine to machine)."""
    match = re.search(pattern, COMMITTED)
    assert match, f"not in the report any more: {pattern!r}"
    return match


def test_each_line_takes_the_threshold_it_prints_else_its_traps_largest() -> None:
    bf16 = found(r"- cpu bfloat16: \*\*SILENT\*\*: output error 0\.268 > threshold (\S+)")
    f32 = found(r"- cpu float32: \*\*SILENT\*\*: output error 0\.269 > threshold \S+")[0]
    output_row = "| bug   |  0.269    | 0.282 "  # it prints float32's threshold
    attention = found(r"\|\s+0 \|\s+0 \|\s+(\S+) \|\n\| bug   \|\s+0\.888")
    # missing_scale's attention row prints no threshold: the trap's largest
    largest = float(primary_thresholds(parse(COMMITTED))["missing_scale"])
    step = float(bf16[1])  # bfloat16's threshold: on each side of the comparison

    def moved(line: str, number: str, new: str) -> list[str]:
        return compare(COMMITTED, edit(COMMITTED, line, line.replace(number, new, 1)))

    assert moved(bf16[0], "0.268", f"{0.268 + 1.5 * step:.3g}") == []  # within 2 x threshold
    assert moved(bf16[0], "0.268", f"{0.268 + 2.5 * step + 0.001:.3g}")
    assert moved(f32, "0.269", "0.27") == []  # one display step
    assert moved(f32, "0.269", "0.271")
    assert moved(output_row, "0.269", "0.27 ") == []
    assert moved(output_row, "0.269", "0.285")  # bfloat16's threshold is not float32's
    row, value = attention[0], attention[1]
    assert moved(row, value, f"{float(value) + 1.5 * largest:.3g}") == []  # within 2 x largest
    assert moved(row, value, f"{float(value) + 2.5 * largest:.3g}")


def test_printed_thresholds_are_read_from_tables_and_verdict_lines() -> None:
    lines = parse(COMMITTED)
    # missing_scale's full tables: its output row, then W_v's gradient row, the largest
    w_v = found(r"\| bug   \|  0\.269 [^\n]*\n(?:[^\n]*\n)*?\| W_v\.weight \|[^\n]*?(\S+) \| True")
    assert primary_thresholds(lines)["missing_scale"] == Decimal(w_v[1])
    printed = {line.words: line.threshold for line in lines if line.trap == "missing_scale"}
    bf16 = found(r"- cpu bfloat16: \*\*SILENT\*\*: output error \S+ > threshold (\S+)")
    assert printed["- cpu bfloat16: **SILENT**: output error <n> > threshold <n>"] == Decimal(
        bf16[1]
    )
    assert "init_unit_variance" not in primary_thresholds(lines)  # over seeds: no threshold


@pytest.mark.parametrize(
    ("old", "new", "found"),
    [
        (  # a verdict in a trap's section
            "- cpu bfloat16: **SILENT**: output error 0.268",
            "- cpu bfloat16: **BENIGN**: output error 0.268",
            "the text differs",
        ),
        (  # a verdict in the summary, padding and all
            "| LOUD · LOUD · LOUD    ",
            "| LOUD · LOUD · SILENT  ",
            "summary, [`mask_rank`](#mask_rank), cpu: float32 · bfloat16 · float16: committed "
            "'LOUD · LOUD · LOUD', fresh 'LOUD · LOUD · SILENT'",
        ),
        (  # an expected verdict
            "scale · expected SILENT",
            "scale · expected BENIGN",
            "the text differs",
        ),
        (  # a trigger shape
            "runs silently on B=2 T=2 d_model=1",
            "runs silently on B=2 T=3 d_model=1",
            "committed 2, fresh 3",
        ),
        (  # a symptom's evidence
            "entropy 0.982 → 0.239 (d_k 256)",
            "entropy 0.982 → 0.339 (d_k 256)",
            "committed 0.239, fresh 0.339",
        ),
        ("Mutation score: 35/35", "Mutation score: 34/35", "committed 35, fresh 34"),  # a count
        ("| (2, 5, 6) |", "| (2, 5, 7) |", "committed 6, fresh 7"),  # a shape
        ("| bug   |  0.269 ", "| bug   |  0.279 ", "committed 0.269, fresh 0.279"),  # too far
        ("1.53 / ", "inf / ", "committed 1.53, fresh inf"),  # finite -> inf
    ],
)
def test_a_real_change_in_the_committed_report_fails(old: str, new: str, found: str) -> None:
    problems = compare(COMMITTED, edit(COMMITTED, old, new))
    assert any(found in p for p in problems), problems


def test_a_missing_or_reordered_trap_section_fails() -> None:
    missing = edit(COMMITTED, section(COMMITTED, "qkv_bias"), "")
    assert SECTIONS_DIFFER in compare(COMMITTED, missing)
    first, second = section(COMMITTED, "mask_bool"), section(COMMITTED, "mask_rank")
    swapped = edit(COMMITTED, first + second, second + first)
    assert SECTIONS_DIFFER in compare(COMMITTED, swapped)


@pytest.mark.parametrize(
    ("a", "b", "threshold", "same"),
    [
        ("0.645", "0.646", "0", True),  # either side of a rounding boundary
        ("0.645", "0.647", "0", False),
        ("0.0999", "0.1", "0", True),  # across a decade
        ("2", "3", "0", False),  # integers exactly...
        ("2", "3", "5", False),  # ...whatever the threshold
        ("416", "417", "0", True),  # .3g of 416.5: one step is a unit
        ("1000", "1001", "0", False),  # more digits than .3g prints: not rounded
        ("1.45e-07", "1.51e-07", "7e-07", True),
        ("1.51e-07", "9.51e-07", "7e-07", False),
        ("inf", "inf", "0", True),
        ("nan", "nan", "0", True),
        ("inf", "3.4e+38", "1", False),
        ("-inf", "inf", "1", False),
    ],
)
def test_agree(a: str, b: str, threshold: str, same: bool) -> None:
    assert agree(a, b, Decimal(threshold)) is same
    assert agree(b, a, Decimal(threshold)) is same


def test_normalise_drops_padding_and_the_environment() -> None:
    assert normalise("|  1.5e-07 |    2.13e-07 |") == normalise("| 1.5e-07 | 2.13e-07 |")
    assert normalise("|:------|-------:|") == normalise("|:---|---:|") != normalise("|---:|:---|")
    assert normalise("- Versions: torch 2.13.0") == normalise("- Versions: torch 2.14.0")
    assert normalise("- Devices: cpu. Not available here: cuda.") == "- Devices: cpu."


def test_real_module_rows_of_libraries_not_installed_here_are_left_out(monkeypatch):
    """A machine without the real extra compares only the rows it could run."""
    table = [
        reportdiff.REAL, "", "Right: 2/2 cases run (0 not run).", "",
        "| module | library | should | doctor | ok | probes |",
        "|:--|:--|:--|:--|:--|:--|",
        "| mha | torch | pass | healthy | True | |",
        "| bert | transformers | pass | healthy | True | |",
    ]  # fmt: skip
    report = "# Report\n\n" + "\n".join(table) + "\n"
    monkeypatch.setattr(reportdiff, "importable", lambda name: False)
    kept = reportdiff.without_uninstalled(report)
    assert "| mha | torch |" in kept and "transformers" not in kept and "Right:" not in kept
    monkeypatch.setattr(reportdiff, "importable", lambda name: True)
    assert reportdiff.without_uninstalled(report) == report


def test_a_report_made_with_other_versions_is_not_equivalent() -> None:
    """Same words and numbers, another torch: the report must be rewritten, not kept."""
    assert reportdiff.equivalent(COMMITTED, COMMITTED)
    other = COMMITTED.replace(
        "- Versions: attention-pitfalls", "- Versions: attention-pitfalls 9", 1
    )
    assert other != COMMITTED and not reportdiff.equivalent(COMMITTED, other)


def learned(steps: int, tally: str = "learns slower 5/5") -> str:
    """A report piece with a learning block, a learned symptom line and the summary column."""
    label = tally.removeprefix("mixed: ").split(" ", 2)[:2]
    return "\n".join(
        [
            "# A report",
            "## Summary",
            "",
            f"| trap | combined | {LEARNED_COLUMN} |",
            "|:--|:--|:--|",
            f"| [`demo`](#demo) | SILENT | copy: yes ({steps}) / {tally} |",
            "",
            f"- [`demo`](#demo): training: {tally}: seed 0: {' '.join(label)} (×{steps / 20:.2g})",
            "",
            '<a id="demo"></a>',
            "<!-- learning -->",
            f"**What it does to learning.** fixed.py reaches 90% in {steps} steps.",
            "<!-- /learning -->",
            "- cpu float32: **SILENT**: output error 0.75 > threshold 0.001 at step 40",
        ]
    )


HERE = "- CPU: Some CPU (GenuineIntel), ATen AVX512 kernels, no arithmetic settings.\n"
THERE = "- CPU: Some CPU (GenuineIntel), ATen AVX512 kernels, set: MKL_CBWR=COMPATIBLE.\n"


def test_on_one_machine_learning_numbers_and_tallies_must_match() -> None:
    """Training repeats itself on one machine: a number that moved is a change."""
    assert compare(learned(40), learned(40)) == []
    moved = compare(learned(40), learned(41))
    assert moved and "the learning probe's lines differ on the same machine" in moved[0], moved
    assert compare(HERE + learned(40), THERE + learned(41)) == []  # another machine: drift
    problems = compare(learned(40), learned(40, tally="learns slower 4/5 · learns normally 1/5"))
    assert any(p.startswith("summary, ") and "learns normally 1/5" in p for p in problems), problems
    # the same words, numbers masked: only the counts moved (held equal with every learning line)
    one = "mixed: learns slower 2/5 · learns normally 2/5 · does not learn 1/5"
    other = "mixed: learns slower 2/5 · learns normally 1/5 · does not learn 2/5"
    assert compare(learned(40, one), learned(40, other))
    assert compare(HERE + learned(40, one), THERE + learned(40, other)) == []


def test_numbers_after_a_learning_block_are_compared_again() -> None:
    here, there = learned(40), learned(40).replace("at step 40", "at step 41")
    assert any("committed 40, fresh 41" in p for p in compare(here, there))


def test_on_the_same_machine_learning_numbers_must_match_to_be_equivalent() -> None:
    here = HERE + learned(40)
    assert reportdiff.equivalent(here, here)
    assert not reportdiff.equivalent(here, HERE + learned(41))  # the code moved them
    assert reportdiff.equivalent(here, THERE + learned(41))  # rounding moved them
    step = "fixed.py reaches 90% in 40 steps."
    accurate = here.replace(step, "fixed.py reaches 90% in 40 steps; accuracy 0.5.")
    within = accurate.replace("accuracy 0.5.", "accuracy 0.5004.")  # within the 0.001 threshold
    assert not reportdiff.equivalent(accurate, within)  # one machine: exactly, not within a floor
    assert reportdiff.equivalent(accurate, within.replace(HERE, THERE))


def test_on_another_machine_a_tally_may_move_within_chance_but_not_further() -> None:
    """Training drifts across machines (and across settings of one): a seed near a threshold
    may fall on the other side, so tallies are compared by Fisher's exact test there."""
    split = "mixed: learns slower 3/5 · does not learn 2/5"
    assert compare(HERE + learned(40), HERE + learned(40, split))  # same machine: a change
    assert compare(HERE + learned(40), THERE + learned(41, split)) == []  # chance, elsewhere
    flipped = compare(HERE + learned(40), THERE + learned(40, "does not learn 5/5"))
    assert flipped and all("Fisher" in p for p in flipped), flipped  # all against none
    moved = THERE + learned(40, split).replace("at step 40", "at step 41")  # outside learning
    assert any("committed 40, fresh 41" in p for p in compare(HERE + learned(40), moved))
    note = "Where learning and the one-pass verdict disagree: SILENT by one pass, yet `demo`."
    assert compare(HERE + learned(40), THERE + learned(40) + "\n" + note) == []
    assert compare(HERE + learned(40), HERE + learned(40) + "\n" + note)


def test_a_line_quoting_a_training_tally_is_the_learning_probes_wherever_it_is() -> None:
    """The student's symptom index and the scorecard quote tallies: on another machine they
    drift with the learning probe, on this one they must repeat."""
    quoted = "- **The loss is flat**: near it: [`demo`](#demo) (training: {})."
    here, there = (HERE + learned(40) + "\n" + quoted.format(t) for t in
                   ("learns slower 4/5", "mixed: does not learn 3/5"))  # fmt: skip
    assert compare(here, there.replace(HERE, THERE)) == []
    assert compare(here, there)  # one machine: a change
    plain = "- **The loss is flat**: near it: [`demo`](#demo) (output error {})."
    assert compare(plain.format("0.75"), plain.format("0.5"))  # no tally: compared as ever


def test_a_learning_cell_without_a_tally_cannot_be_compared() -> None:
    old_style = learned(40).replace("learns slower 5/5", "learns slower (×2)")
    assert any("no tally to compare" in p for p in compare(old_style, learned(40)))
