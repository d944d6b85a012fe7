"""The report's rendering on a few small measurements, without generating the whole report.

Each trap is measured once on the CPU (float32, and float16 where a test needs it) without the
trigger search; pictures are stubbed where files are written, so every test here is cheap.
"""

import hashlib
import os
import re
import signal
import subprocess
import threading
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from harness import interrupts, report
from harness.catalogue.judge import Measurement, measure
from harness.catalogue.registry import load
from harness.catalogue.spread import SEEDS, Spread, output_spread
from harness.catalogue.verdicts import MEANING, Verdict
from harness.errors import UsageError
from harness.files import DOCTOR
from harness.report import TrapResult, publish
from harness.report import write as report_write
from harness.report.doctor_tables import TABLES
from harness.report.format import OUTPUT_COLUMN, over_seeds, seeds_column
from harness.report.opening import how_to_read, opening
from harness.report.pages import joined, read_pages, trap_pages

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
    assert row["cpu: float32 · float16"] == "BENIGN · LOUD"
    assert row["combined"] == "NUMERIC" and row["expected"] == "NUMERIC"
    assert row[OUTPUT_COLUMN] == report.output_cell(cell("fill_overflow_half"))
    assert row["trap"] == "[`fill_overflow_half`](#fill_overflow_half)"  # a claim leads to it
    assert row["§"] == "—"


# --- the output error over seeds --------------------------------------------------------------


def test_a_silent_traps_error_moves_with_the_seed_and_seed_0s_lies_in_its_range():
    m = cell("left_pad_positions")
    spread = output_spread(load("left_pad_positions"), m)
    assert spread.seeds == SEEDS and spread.within == 0
    assert spread.low <= m.summary()["err_bug"] <= spread.high
    assert spread.high > 2 * spread.low  # the 2-5x the summary warns of: each seed its own draw


def test_a_benign_traps_error_is_within_the_floor_on_every_seed():
    spread = output_spread(load("scale_precision"), cell("scale_precision"))
    assert spread == Spread(SEEDS, SEEDS)
    assert over_seeds(spread) == "within the floor"


def test_a_seed_within_twice_its_threshold_counts_as_within_the_floor(monkeypatch):
    """Another CPU's error and threshold each move by up to a threshold: a rounding-level seed
    at 1.19x its threshold (qkv_bias's seed 9 under MKL_CBWR=COMPATIBLE) is not a difference."""
    from harness.catalogue import spread as spread_module

    ratios = {1: 1.19, 2: 1.9, 3: 2.5}  # times the threshold; the other seeds 0.3x

    def compared(pair, device, dtype, shape, seed, edge, backward):
        ratio = ratios.get(seed, 0.3)
        output = pd.DataFrame(
            {"run": ["fix", "bug"], "max_abs": [1e-7, ratio * 1e-7],
             "threshold": [1e-7, 1e-7], "differs": [False, ratio > 1]}
        )  # fmt: skip
        return SimpleNamespace(output=output)

    monkeypatch.setattr(spread_module, "compare", compared)
    spread = output_spread(load("scale_precision"), cell("scale_precision"))
    assert spread == Spread(SEEDS, SEEDS - 1, 2.5e-7, 2.5e-7)


def test_no_range_where_a_seed_gives_no_number():
    assert output_spread(load("mask_rank"), cell("mask_rank")) is None  # raises
    assert output_spread(load("init_unit_variance"), cell("init_unit_variance")) is None


def test_the_range_is_printed_with_the_seeds_within_the_floor():
    assert over_seeds(Spread(10, 0, 0.1, 0.5)) == "0.1–0.5"
    assert over_seeds(Spread(10, 3, 0.1, 2.0)) == "up to 2 (3 within the floor)"
    assert over_seeds(Spread(10, 0, 0.25, 0.25)) == "0.25"


def test_the_summary_quotes_the_range_and_says_what_it_is():
    r = result("double_scale")
    (row,) = rows(report.summary([r]))
    assert row[seeds_column(SEEDS)] == "n/a"
    r.spread = Spread(SEEDS, 0, 0.0646, 0.212)
    (row,) = rows(report.summary([r]))
    assert row[seeds_column(SEEDS)] == "0.0646–0.212"
    assert f"*{seeds_column(SEEDS)}*" in how_to_read(learned=False).replace("\n  ", " ")
    assert "- cpu float32, seeds 0–9: output error 0.0646–0.212\n" in report.trap_section(r, [])


def test_a_silent_trap_with_nan_output_says_so():
    (row,) = rows(report.summary([result("softmax_dim")]))
    assert row["combined"] == "SILENT, NaN" and row["expected"] == "SILENT"
    (row,) = rows(report.summary([result("missing_scale")]))
    assert row["combined"] == "SILENT" and row["§"] == "—"


def test_an_inconclusive_dtype_is_labelled_so_and_does_not_decide():
    r = result("fill_too_small", "float32", "float16")
    assert [str(m.verdict) for m in r.cells] == ["SILENT", "INCONCLUSIVE"]
    (row,) = rows(report.summary([r]))
    assert row["cpu: float32 · float16"] == "SILENT · INCONCLUSIVE"
    assert row["combined"] == "SILENT"


def test_entropy_and_cosine_cells_say_n_a_instead_of_nan():
    (row,) = rows(report.summary([result("sdpa_float_mask")]))  # SDPA returns no weights
    assert row["entropy fix → bug"] == "n/a"
    (row,) = rows(report.summary([result("mask_rank")]))  # buggy.py raises
    assert row["entropy fix → bug"].endswith("→ n/a") and row["grad cosine"] == "n/a"


def test_a_pipe_in_a_cell_or_a_column_name_cannot_break_its_row():
    text = report.table(pd.DataFrame({"max |change|": ["x | y"], "b": [1.0]}))
    header, rule, row = text.splitlines()
    unescaped = [line.count("|") - line.count("\\|") for line in (header, rule, row)]
    assert unescaped == [3, 3, 3], text


def test_nan_rows_and_nan_gradients_the_means_leave_out_are_shown():
    (row,) = rows(report.summary([result("padding_on_queries")]))
    assert re.search(r"\(\+\d+ NaN rows\)$", row["entropy fix → bug"]), row
    assert row["grad cosine"] == "NaN"
    (row,) = rows(report.summary([result("missing_scale")]))
    assert "NaN" not in row["entropy fix → bug"] and row["grad cosine"] != "NaN"


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
    assert row[OUTPUT_COLUMN] != "raises"  # float16's cell raises; float32's does not


# --- cells and statements ----------------------------------------------------------------------


def test_output_cell_is_the_bugs_error_over_the_largest_output_then_the_floor():
    m = cell("missing_scale")  # SILENT: the bug's error is far above the floor
    text = report.output_cell(m)
    err, floor = output_row(m, "bug")["max_abs"], output_row(m, "fix")["max_abs"]
    largest = m.outputs["ref"].abs().max().item()
    assert text == f"{err:.3g} / {largest:.3g} ({floor:.3g})"
    first, scale, second = numbers(text)
    assert first > 100 * second and scale > 0


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


# --- writing: as one unit, and cleaning up ----------------------------------------------------

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
    """One stub picture per trap, its bytes set by ``stub_pictures.version``."""

    class Stub:
        version = b"1"

        def __call__(self, r, folder):
            name = f"{report.IMAGES}/{r.pair.card.id}.png"
            (folder / name).write_bytes(PICTURE + self.version)
            return [name]

    stub = Stub()
    monkeypatch.setattr(report_write, "draw", stub)
    return stub


def write(out, doctor="## Doctor\n\nfirst"):
    results = [result("missing_scale"), result("scale_precision")]
    return report.write_report(results, GRID, out, [], {}, {TABLES: doctor})


def linked(folder):
    """The pictures the folder's pages link."""
    return publish.linked_images(joined(read_pages(folder)))


def test_report_md_is_replaced_last(tmp_path, stub_pictures, monkeypatch):
    """Interrupted at any move, the folder still holds the previous report.md."""
    write(tmp_path)
    before = (tmp_path / report.REPORT).read_bytes()
    real = os.replace
    moved = []

    def counting(src, dst):
        moved.append(os.path.basename(dst))
        real(src, dst)

    stub_pictures.version = b"2"
    monkeypatch.setattr(os, "replace", counting)
    write(tmp_path / "count", "## Doctor\n\nsecond")
    assert moved[-1] == report.REPORT
    for k in range(len(moved)):
        monkeypatch.setattr(os, "replace", _crashing_at(k, real))
        with pytest.raises((OSError, UsageError), match="disk full"):  # a different report: the
            write(tmp_path, "## Doctor\n\nsecond" + " again" * k)  # pages moved in stay
        assert (tmp_path / report.REPORT).read_bytes() == before, moved[k]
        assert all((tmp_path / name).is_file() for name in linked(tmp_path))  # none dangles
        assert not list(tmp_path.glob(".staging-*"))


def test_a_reader_never_sees_new_pictures_beside_an_old_report(
    tmp_path, stub_pictures, monkeypatch
):
    """At every step of a replacement, report.md links pictures of its own run, all present."""
    write(tmp_path)
    real, seen = os.replace, []

    def checking(src, dst):
        real(src, dst)
        if Path(dst).parent == tmp_path or Path(dst).parent.parent == tmp_path:
            names = linked(tmp_path)
            seen.append({(tmp_path / n).read_bytes()[-1:] for n in names})
            assert all((tmp_path / n).is_file() for n in names)

    stub_pictures.version = b"2"
    monkeypatch.setattr(os, "replace", checking)
    write(tmp_path, "## Doctor\n\nsecond")
    assert seen[0] == {b"1"} and seen[-1] == {b"2"}
    assert all(len(versions) == 1 for versions in seen)  # never old and new mixed


def test_only_pictures_the_old_report_linked_are_removed(tmp_path, stub_pictures):
    write(tmp_path)
    old = linked(tmp_path)
    img = tmp_path / report.IMAGES
    (img / "missing_scale-7.png").write_bytes(b"yours")  # named after a trap, never linked
    (img / "holiday.png").write_bytes(b"yours")
    stub_pictures.version = b"2"
    path, replaced = write(tmp_path, "## Doctor\n\nsecond")
    assert replaced and path == tmp_path / report.REPORT
    assert not any((tmp_path / name).exists() for name in old)
    assert all((tmp_path / name).read_bytes() == PICTURE + b"2" for name in linked(tmp_path))
    assert (img / "missing_scale-7.png").read_bytes() == b"yours"
    assert (img / "holiday.png").read_bytes() == b"yours"
    assert (tmp_path / report.TIMINGS).exists()
    assert not list(tmp_path.glob(".staging-*"))


def test_picture_names_carry_their_bytes(tmp_path, stub_pictures):
    write(tmp_path)
    for name in linked(tmp_path):
        assert re.fullmatch(r"img/[a-z_]+-[0-9a-f]{10}\.png", name), name
        digest = hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()[:10]
        assert name.endswith(f"-{digest}.png")


def test_an_equivalent_report_is_kept_as_it_is(tmp_path, stub_pictures):
    """Only the CPU's rounding differs (here: nothing): report.md and its pictures stay."""
    write(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.*") if p.name != report.TIMINGS}
    stub_pictures.version = b"2"  # a picture that moved with rounding
    _, replaced = write(tmp_path)
    assert not replaced
    assert {p: p.read_bytes() for p in before} == before
    (tmp_path / sorted(linked(tmp_path))[0]).unlink()
    _, replaced = write(tmp_path)  # a picture it links is gone: written afresh
    assert replaced and all((tmp_path / name).is_file() for name in linked(tmp_path))


def test_staging_of_a_killed_run_is_removed_and_a_live_ones_kept(tmp_path, stub_pictures):
    child = subprocess.Popen(["true"])  # its pid is free once it has exited
    child.wait()
    abandoned = tmp_path / f"{publish.STAGING}{child.pid}-abc"
    live = tmp_path / f"{publish.STAGING}{os.getpid()}-xyz"
    abandoned.mkdir()
    live.mkdir()
    write(tmp_path)
    assert not abandoned.exists() and live.exists()


def test_two_runs_into_one_folder_take_turns(tmp_path, stub_pictures):
    errors = []

    def run(doctor):
        try:
            write(tmp_path, doctor)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f"## Doctor\n\n{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert all((tmp_path / name).is_file() for name in linked(tmp_path))
    assert not list(tmp_path.glob(".staging-*"))


def test_a_picture_both_reports_link_stays(tmp_path, stub_pictures):
    write(tmp_path)
    _, replaced = write(tmp_path, "## Doctor\n\nsecond")  # another report, the same pictures
    assert replaced
    assert linked(tmp_path) and all((tmp_path / name).is_file() for name in linked(tmp_path))


def test_pictures_an_install_stopped_halfway_left_are_removed_by_the_next_run(
    tmp_path, stub_pictures, monkeypatch
):
    """Killed outright (or failing) after moving a new picture in, an install leaves it; the
    journal it wrote first lets the next run remove it, and nothing else."""
    write(tmp_path)
    img = tmp_path / report.IMAGES
    (img / "holiday.png").write_bytes(b"yours")
    before = {p.name for p in img.iterdir()}
    real = os.replace
    stub_pictures.version = b"2"
    into_out = []

    def crash_after_one_picture(src, dst):  # the journal, one picture, then the disk is full
        if ".staging-" not in str(dst):
            into_out.append(dst)
            if len(into_out) == 3:
                raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(os, "replace", crash_after_one_picture)
    with pytest.raises(OSError, match="disk full"):
        write(tmp_path, "## Doctor\n\nsecond")
    left = {p.name for p in img.iterdir()} - before
    assert left and (tmp_path / publish.JOURNAL).is_file()
    monkeypatch.setattr(os, "replace", real)
    stub_pictures.version = b"3"
    write(tmp_path, "## Doctor\n\nthird")
    assert not any((img / name).exists() for name in left)
    assert (img / "holiday.png").read_bytes() == b"yours"
    assert not (tmp_path / publish.JOURNAL).exists()


def test_ctrl_c_while_publishing_waits_for_the_whole_install(
    tmp_path, stub_pictures, monkeypatch, not_ignored
):
    """A stop signal once report.md is replaced is held until the old pictures are removed,
    and then says what was done: a 130 that means nothing changed is never a lie."""
    not_ignored(signal.SIGINT)
    write(tmp_path)
    old = linked(tmp_path)
    real = os.replace

    def interrupting(src, dst):
        real(src, dst)
        if Path(dst).name == report.REPORT:
            signal.raise_signal(signal.SIGINT)

    stub_pictures.version = b"2"
    monkeypatch.setattr(os, "replace", interrupting)
    with interrupts.stop_signals() as signals, pytest.raises(KeyboardInterrupt):
        write(tmp_path, "## Doctor\n\nsecond")
    assert signals.done == [f"{tmp_path / report.REPORT} is the new report"]
    assert "second" in (tmp_path / DOCTOR).read_text()  # the doctor's page, replaced before
    assert not any((tmp_path / name).exists() for name in old)
    assert not (tmp_path / publish.JOURNAL).exists()


def test_finishing_a_killed_install_removes_only_the_listed_pictures_the_report_does_not_link(
    tmp_path,
):
    img = tmp_path / report.IMAGES
    img.mkdir()
    (tmp_path / report.REPORT).write_text("![kept](img/kept-1.png)\n")
    for name in ("kept-1.png", "moved_in-2.png", "holiday.png"):
        (img / name).write_bytes(b"png")
    listed = ["img/moved_in-2.png", "img/kept-1.png", "../outside.png", "img/../report.md"]
    (tmp_path / publish.JOURNAL).write_text("\n".join(listed) + "\n")
    publish.finish_abandoned(tmp_path, report.REPORT)
    assert sorted(p.name for p in img.iterdir()) == ["holiday.png", "kept-1.png"]
    assert (tmp_path / report.REPORT).is_file() and not (tmp_path / publish.JOURNAL).exists()


def test_a_trap_the_tutorial_names_is_on_the_students_page_with_or_without_a_claim_row():
    def trap(pid, section):
        card = SimpleNamespace(id=pid, section=section, modern=False)
        return SimpleNamespace(pair=SimpleNamespace(card=card))

    pages = trap_pages([trap("named_only", "§4.2"), trap("not_named", "—")])
    assert pages == {"named_only": report.CLAIMS_PAGE, "not_named": "traps.md"}


def test_the_cpu_line_names_the_kernels_and_settings_the_learning_probe_ran_on(monkeypatch):
    """The same CPU with ATEN_CPU_CAPABILITY=default or MKL_CBWR=COMPATIBLE rounds otherwise:
    its learning is another machine's."""
    from harness.arithmetic import cpu_name
    from harness.devices import cpu_kernels
    from harness.report.opening import reproduce

    def line():
        text = reproduce(GRID, [], [load("mask_bool").card], True)
        return next(x for x in text.splitlines() if x.startswith("- CPU: "))

    plain = line()
    assert plain.startswith(f"- CPU: {cpu_name()} (")
    assert f"ATen {cpu_kernels()} kernels" in plain
    assert cpu_kernels() == torch.backends.cpu.get_cpu_capability()
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    assert "set: MKL_CBWR=COMPATIBLE" in line() and line() != plain


def test_the_learning_cell_names_the_task():
    from harness.catalogue.learn import learn
    from harness.report.learning import learns_cell

    learned = learn(load("mask_rank"), steps=3)
    assert learns_cell(learned).startswith(f"{learned.task.name}: ")


def test_every_verdict_is_explained_once_in_the_legend_and_on_the_students_page():
    legend = how_to_read(learned=False)
    assert set(MEANING) == set(Verdict)
    for verdict, meaning in MEANING.items():
        assert legend.count(f"| {verdict} | {meaning} |") == 1
        if verdict is not Verdict.INCONCLUSIVE:  # no trap's combined verdict
            assert opening().count(f"**{verdict}**") == 1
