"""The diagnosis report: the committed one agrees with a fresh run; deterministic; atomic.

One canonical report is generated per module and shared; only the determinism check runs the
command a second time. The other tests reuse its measurements, so they cost a picture or two.
"""

import inspect
import re
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness import cli, interrupts, report
from harness.catalogue import registry
from harness.report import TrapResult, build, doctor_tables
from harness.report import diff as report_diff
from harness.report import write as report_write

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "reports" / report.REPORT
CANONICAL = ["report", "--device", "cpu"]
REGENERATE = "regenerate it: python -m harness report --device cpu"


@dataclass(frozen=True)
class Run:
    """A report written by the command line, with the arguments it was written from."""

    out: Path
    written: dict[str, Any]  # write_report's arguments by name: results, grid, timed, ...

    @property
    def text(self) -> str:
        return (self.out / report.REPORT).read_text()

    @property
    def results(self) -> list[TrapResult]:
        return self.written["results"]


def files(folder: Path) -> dict[Path, bytes]:
    """Every file under ``folder`` by relative path, with its bytes."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The canonical CPU report, regenerated through the command line; measurements kept."""
    out = tmp_path_factory.mktemp("report")
    calls = []

    def keep(*args: Any, **kwargs: Any) -> Path:
        calls.append(inspect.signature(report.write_report).bind(*args, **kwargs).arguments)
        return report.write_report(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(build, "write_report", keep)
        assert cli.main([*CANONICAL, "--out", str(out)]) == 0
    [written] = calls
    return Run(out, dict(written))


@pytest.mark.numbers
def test_committed_report_agrees_with_a_fresh_run(fresh: Run) -> None:
    """Same sections, verdicts, expected verdicts and triggers as a fresh run; numbers in the noise.

    Not byte for byte: float32 kernels round differently on different CPUs, so floors differ in
    the second digit from machine to machine (and table padding with them). Each machine's
    number is the true value plus rounding noise bounded by its cell's floor rule (threshold =
    2 x floor + atol, 3 x for gradients; harness.metrics), so two machines' numbers may differ
    by the sum of their thresholds, read from each report's threshold columns and verdict
    lines, plus one unit in the third significant digit where `.3g` rounds them to either side
    of a boundary. Integers compare exactly. Anything more, or any changed word, is a change.
    """
    assert COMMITTED.exists(), REGENERATE
    problems = report_diff.compare(COMMITTED.read_text(), fresh.text)
    assert not problems, "\n".join(["stale report: " + REGENERATE, *problems])


def test_report_has_every_trap_and_its_picture(fresh: Run) -> None:
    text = fresh.text
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (fresh.out / image).read_bytes().startswith(b"\x89PNG"), image
    for pid in registry.ids():
        assert f'<a id="{pid}"></a>' in text
        section = text.split(f'<a id="{pid}"></a>')[1].split("<a id=")[0]
        picture = re.search(rf"\]\(img/{pid}(-[0-9a-f]+)?\.png\)", section)  # a name, or name-hash
        assert picture or "neither module returns" in section, pid
    assert "**The claimed trap does not hold.**" in text  # BENIGN traps say so
    assert "Not available here: cuda" in text or "cuda" in text.split("## Summary")[0]


# One trap of each kind of measurement: a trigger search, seeds, a sweep with line plots, a
# timing, a cached scenario with its per-step plot, long positions in bfloat16, an edge input.
SAMPLE = ("transpose", "init_unit_variance", "missing_scale", "head_loop", "cache_causal_alignment",
          "rope_low_precision", "fill_too_small", "mask_bool")  # fmt: skip
SAMPLE_CASES = ("mha-batch-first", "llama-gqa-cache-eager")  # the doctor on real modules


def test_same_command_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report command twice gives the same bytes, on a sample of the catalogue and of the
    real modules (the whole catalogue once more would double the suite's longest test)."""
    from harness import realmodules

    sample = [registry.load(i) for i in SAMPLE]
    monkeypatch.setattr(registry, "load_all", lambda: sample)
    cases = [c for c in realmodules.CASES if c.id in SAMPLE_CASES]
    monkeypatch.setattr(realmodules, "CASES", cases)
    first, second = tmp_path / "first", tmp_path / "second"
    for out in (first, second):
        assert cli.main([*CANONICAL, "--out", str(out)]) == 0
    again, before = files(second), files(first)
    assert again.keys() == before.keys() and len(before) > len(SAMPLE)
    assert all(f"`{pid}`" in (first / report.REPORT).read_text() for pid in SAMPLE)
    for path in before:
        if path.name != report.TIMINGS:
            assert again[path] == before[path], path


def measured_already(monkeypatch: pytest.MonkeyPatch, fresh: Run) -> None:
    """The fresh run's measurements and doctor section: what is under test is writing."""
    monkeypatch.setattr(build, "collect", lambda *a, **k: (fresh.results, fresh.written["timed"]))
    doctor = fresh.written["doctor"]
    monkeypatch.setattr(doctor_tables, "detection_table", lambda: None)
    monkeypatch.setattr(doctor_tables, "detection_markdown", lambda table: doctor)
    monkeypatch.setattr(doctor_tables, "real_table", lambda: None)
    monkeypatch.setattr(doctor_tables, "real_markdown", lambda table: "")


def test_interrupted_run_leaves_the_previous_report(
    fresh: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "reports"
    shutil.copytree(fresh.out, out)
    before = files(out)
    draw, drawn = report_write.draw, []

    def crash_on_the_second_trap(*args: Any, **kwargs: Any) -> list[str]:
        if drawn:
            raise KeyboardInterrupt
        drawn.append(draw(*args, **kwargs))  # staging is not empty when it stops
        return drawn[-1]

    measured_already(monkeypatch, fresh)
    monkeypatch.setattr(report_write, "draw", crash_on_the_second_trap)
    assert cli.main([*CANONICAL, "--out", str(out), "--no-store"]) == 130
    assert drawn, "interrupted before anything was staged"
    assert files(out) == before
    assert not list(out.glob(".staging-*"))


def test_a_swallowed_ctrl_c_stops_the_report_before_it_is_published(
    fresh: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python drops a KeyboardInterrupt raised inside a finalizer (matplotlib's clean-up runs
    them while drawing): the signal is recorded, and the report is not published after it."""
    out = tmp_path / "reports"
    shutil.copytree(fresh.out, out)
    (out / report.REPORT).write_text((out / report.REPORT).read_text() + "\nolder\n")
    before = files(out)
    draw = report_write.draw

    def swallowed_on_the_second_trap(r: TrapResult, folder: Path) -> list[str]:
        if r is fresh.results[1]:
            interrupts.ACTIVE.received.append(
                signal.SIGINT
            )  # what the handler records; raised in vain
        return draw(r, folder)

    measured_already(monkeypatch, fresh)
    monkeypatch.setattr(report_write, "draw", swallowed_on_the_second_trap)
    assert cli.main([*CANONICAL, "--out", str(out), "--no-store"]) == 130
    assert files(out) == before
    assert not list(out.glob(".staging-*"))
