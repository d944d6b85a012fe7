"""The report's rendering on a few small measurements, without generating the whole report.

Each trap is measured once on the CPU (float32, and float16 where a test needs it) without the
trigger search; pictures are stubbed where files are written, so every test here is cheap.
"""

import os
import re
from functools import cache

import pandas as pd
import pytest
import torch

from harness import report
from harness.catalogue.judge import Measurement, measure
from harness.catalogue.registry import load
from harness.catalogue.verdicts import Verdict
from harness.report import TrapResult

CPU = torch.device("cpu")
DTYPES = {"float32": torch.float32, "float16": torch.float16}
GRID = [(CPU, torch.float32)]


@cache
def cell(pitfall: str, dtype: str = "float32") -> Measurement:
    return measure(load(pitfall), CPU, DTYPES[dtype], search=False)


def result(pitfall: str, *dtypes: str) -> TrapResult:
    return TrapResult(load(pitfall), [cell(pitfall, d) for d in dtypes or ("float32",)])


def rows(markdown: str) -> list[dict[str, str]]:
    """The rows of the first pipe table in ``markdown``, by column name."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    split = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return [dict(zip(split[0], r, strict=True)) for r in split[2:]]


def numbers(text: str) -> list[float]:
    return [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", text)]


def output_row(m: Measurement, run: str) -> pd.Series:
    return m.output.set_index("run").loc[run]


# --- the summary table -------------------------------------------------------------------------


def test_summary_verdict_is_the_combined_one():
    """fill_overflow_half is BENIGN in float32 and LOUD in float16: NUMERIC overall."""
    r = result("fill_overflow_half", "float32", "float16")
    assert [str(m.verdict) for m in r.cells] == ["BENIGN", "LOUD"]
    (row,) = rows(report.summary([r]))
    assert row["cpu float32"] == "BENIGN" and row["cpu float16"] == "LOUD"
    assert row["verdict"] == "NUMERIC" and row["expected"] == "NUMERIC"
    assert row["output error vs floor"] == report.output_cell(cell("fill_overflow_half"))
    assert row["trap"] == "[`fill_overflow_half`](#fill_overflow_half)"


def test_summary_note_names_the_cells_that_differ_in_low_precision():
    mixed = report.summary([result("fill_overflow_half", "float32", "float16")])
    assert "`fill_overflow_half` (cpu float16: LOUD)" in mixed
    assert "cpu float32: BENIGN" not in mixed
    same = report.summary([result("missing_scale"), result("scale_precision")])
    assert same.endswith("Every trap gets the same verdict in every dtype measured.")


def test_the_primary_cell_is_float32_whatever_the_order():
    r = result("fill_overflow_half", "float16", "float32")
    assert r.primary.dtype == "float32"
    (row,) = rows(report.summary([r]))
    assert row["output error vs floor"] != "raises"  # float16's cell raises; float32's does not


# --- cells and statements ----------------------------------------------------------------------


def test_output_cell_is_the_bugs_error_then_the_floor():
    m = cell("missing_scale")  # SILENT: the bug's error is far above the floor
    text = report.output_cell(m)
    err, floor = output_row(m, "bug")["max_abs"], output_row(m, "fix")["max_abs"]
    assert text == f"{err:.3g} vs {floor:.3g}"
    first, second = numbers(text)
    assert first > 100 * second


def test_output_cell_of_a_bug_that_raises():
    m = cell("mask_rank")
    assert m.verdict is Verdict.LOUD and m.raised
    assert report.output_cell(m) == "raises"


def test_benign_statement_quotes_error_threshold_and_floor():
    m = cell("scale_precision")
    text = report.benign_statement(m)
    assert text.startswith("**The claimed trap does not hold.** On cpu float32 ")
    match = re.search(r"error is (\S+) against a threshold of (\S+) \(floor (\S+)\)", text)
    assert match, text
    err, threshold, floor = (float(g) for g in match.groups())
    assert err <= threshold and floor < threshold
    assert match.group(2) == f"{output_row(m, 'bug')['threshold']:.3g}"
    assert match.group(3) == f"{output_row(m, 'fix')['max_abs']:.3g}"


def test_a_numeric_trap_is_not_called_benign_in_its_section():
    section = report.trap_section(result("fill_overflow_half", "float32", "float16"), [])
    assert "measured **NUMERIC**" in section
    assert "does not hold" not in section
    assert "does not hold" in report.trap_section(result("scale_precision"), [])


# --- where the tables come from ----------------------------------------------------------------


def test_where_names_the_edge_input_the_tables_come_from():
    shape = cell("missing_scale").shape.label()
    assert report.where(cell("missing_scale"), load("missing_scale").card) == (
        f"cpu float32, {shape}"
    )
    large = cell("fill_too_small")
    assert large.edge
    text = report.where(large, load("fill_too_small").card)
    assert text.endswith(", with large activations (x scaled by 300)")
    empty = report.where(cell("fully_masked_row"), load("fully_masked_row").card)
    assert empty.endswith(", with an all-padding sequence")


def test_where_says_nothing_of_an_edge_the_tables_do_not_use():
    """qk_overflow_half is BENIGN in float32: its tables are the ordinary inputs'."""
    m = cell("qk_overflow_half")
    assert not m.edge
    assert "with" not in report.where(m, load("qk_overflow_half").card)


def test_measurement_tables_in_order_output_attention_gradients():
    m = cell("missing_scale")
    lines = report.measurement_tables(m, load("missing_scale").card)
    text = "\n".join(lines)
    blocks = {
        "Output against": ["max_abs", "threshold", "differs"],
        "Attention rows": ["entropy_mean", "saturated"],
        "Gradients": ["param", "cosine"],
    }
    for start, columns in blocks.items():
        i = next(i for i, line in enumerate(lines) if line.startswith(start))
        header = lines[i + 2]
        assert all(c in header for c in columns), (start, header)
    assert text.index("Output against") < text.index("Attention rows") < text.index("Gradients")


def test_measurement_tables_of_a_bug_that_raises_say_so_and_nothing_else():
    m = cell("mask_rank")
    lines = report.measurement_tables(m, load("mask_rank").card)
    assert lines == [
        f"On {report.where(m, load('mask_rank').card)} buggy.py raises: `{m.error}`",
        "",
    ]


# --- writing: atomically, and cleaning up ------------------------------------------------------

PICTURE = b"\x89PNG stub"


def _crashing_at(k, real):
    """os.replace that moves ``k`` files, then fails."""
    calls = []

    def replace(src, dst):
        if len(calls) == k:
            raise OSError("disk full")
        calls.append(dst)
        real(src, dst)

    return replace


@pytest.fixture
def stub_pictures(monkeypatch):
    def heatmap(path, *args, **kwargs):
        path.write_bytes(PICTURE)

    monkeypatch.setattr(report, "heatmap", heatmap)


def write(out, unavailable=()):
    results = [result("missing_scale"), result("scale_precision")]
    return report.write_report(results, GRID, out, list(unavailable), {})


def test_report_md_is_replaced_last(tmp_path, stub_pictures, monkeypatch):
    """Interrupted at any move, the folder still holds the previous report.md."""
    write(tmp_path)
    before = (tmp_path / report.REPORT).read_bytes()
    real = os.replace
    moved = []

    def counting(src, dst):
        moved.append(os.path.basename(dst))
        real(src, dst)

    monkeypatch.setattr(os, "replace", counting)
    write(tmp_path / "count", ["cuda"])
    assert moved[-1] == report.REPORT
    for k in range(len(moved)):
        crash = _crashing_at(k, real)
        monkeypatch.setattr(os, "replace", crash)
        with pytest.raises(OSError, match="disk full"):
            write(tmp_path, ["cuda"])  # a different header: a different report
        assert (tmp_path / report.REPORT).read_bytes() == before, moved[k]
        assert not list(tmp_path.glob(".staging-*"))


def test_a_written_report_leaves_no_staging_and_only_its_own_pictures(tmp_path, stub_pictures):
    img = tmp_path / "img"
    img.mkdir()
    (img / "missing_scale.png").write_bytes(b"old")  # drawn again: replaced
    (img / "scale_precision-1.png").write_bytes(b"stale")  # ours, not drawn this time
    (img / "mask_bool.png").write_bytes(b"stale")  # ours, a trap not in this run
    (img / "holiday.png").write_bytes(b"yours")  # not ours: left alone
    path = write(tmp_path)
    assert path == tmp_path / report.REPORT and path.read_text().startswith("# Hand-written")
    assert (img / "missing_scale.png").read_bytes() == PICTURE
    assert (img / "scale_precision.png").read_bytes() == PICTURE
    assert not (img / "scale_precision-1.png").exists()
    assert not (img / "mask_bool.png").exists()
    assert (img / "holiday.png").read_bytes() == b"yours"
    assert (tmp_path / report.TIMINGS).exists()
    assert not list(tmp_path.glob(".staging-*"))
