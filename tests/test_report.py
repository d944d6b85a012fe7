"""The diagnosis report: the committed one agrees with a fresh run; deterministic; atomic.

One canonical report is generated per module and shared; only the determinism check runs the
command a second time. The other tests reuse its measurements, so they cost a picture or two.
"""

import inspect
import re
import shutil
import signal
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness import cli, interrupts, report
from harness.catalogue import registry
from harness.catalogue.card import NOT_NAMED
from harness.catalogue.verdicts import Verdict
from harness.report import TrapResult, build
from harness.report import diff as report_diff
from harness.report import write as report_write
from harness.report.doctor_tables import assembled
from harness.report.pages import joined, read_pages
from harness.report.scorecard import scorecard_table

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "reports" / report.REPORT
CANONICAL = ["report", "--device", "cpu"]
REGENERATE = "regenerate it: python -m harness report --device cpu"


@dataclass(frozen=True)
class Run:
    """A report written by the command line, with the arguments it was written from."""

    out: Path
    written: dict[str, Any]  # write_report's arguments by name (results, grid, timed, ...) and
    # the doctor's pieces, by name, as build_report assembled them (doctor_pieces)

    @property
    def text(self) -> str:
        """Its pages, joined in reading order."""
        return joined(read_pages(self.out))

    @property
    def results(self) -> list[TrapResult]:
        return self.written["results"]


def files(folder: Path) -> dict[Path, bytes]:
    """Every file under ``folder`` by relative path, with its bytes."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Run:
    """The canonical CPU report, regenerated through the command line; measurements kept (and
    the folder copied where ``--keep-report`` says)."""
    out = tmp_path_factory.mktemp("report")
    calls, pieces = [], []

    def keep(*args: Any, **kwargs: Any) -> Path:
        calls.append(inspect.signature(report.write_report).bind(*args, **kwargs).arguments)
        return report.write_report(*args, **kwargs)

    def keep_pieces(detection: list, made: dict, out: Path) -> dict:
        pieces.append(made)
        return assembled(detection, made, out)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(build, "write_report", keep)
        patch.setattr(build, "assembled", keep_pieces)
        assert cli.main([*CANONICAL, "--out", str(out)]) == 0
    [written], [doctor] = calls, pieces
    if keep := request.config.getoption("--keep-report"):
        shutil.copytree(out, keep, dirs_exist_ok=True)
    return Run(out, dict(written, doctor_pieces=doctor))


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
    problems = report_diff.compare(joined(read_pages(COMMITTED.parent)), fresh.text)
    assert not problems, "\n".join(["stale report: " + REGENERATE, *problems])


def test_detection_table_flags_every_non_benign_bug_and_passes_every_fixed_module(
    fresh: Run,
) -> None:
    """The doctor on every catalogue module and the two reference modules, read from the rows
    the fresh report diagnosed (the table doctor.md prints), not diagnosed a second time."""
    rows = [row for r in fresh.results for row in r.detection]
    table = pd.DataFrame(rows + fresh.written["doctor_pieces"]["references"])
    assert len(rows) == 2 * len(registry.ids())
    misses = table[~table["ok"]]
    assert misses.empty, misses.to_string()
    assert (table["should"] == "flag").sum() >= 19
    assert {"torch.nn.MultiheadAttention (drop)", "SDPA module (keep)"} <= set(table["module"])


def test_the_same_command_again_is_answered_from_the_receipt(
    fresh: Run, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fresh run kept a receipt of the folder it wrote: run again, it measures nothing
    and changes nothing."""

    def measured(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("measured again with nothing changed")

    monkeypatch.setattr(build, "build_report", measured)
    before = files(fresh.out)
    capsys.readouterr()
    assert cli.main([*CANONICAL, "--out", str(fresh.out)]) == 0
    assert "nothing it is made from changed since the last run" in capsys.readouterr().out
    assert files(fresh.out) == before


def test_report_has_every_trap_and_its_picture(fresh: Run) -> None:
    text = fresh.text
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (fresh.out / image).read_bytes().startswith(b"\x89PNG"), image
    for pid in registry.ids():
        assert f'<a id="{pid}"></a>' in text
        section = text.split(f'<a id="{pid}"></a>')[1].split("<a id=")[0]
        picture = re.search(rf"\]\(img/{pid}(-[0-9a-f]+)?\.png\)", section)  # a name, or name-hash
        assert picture or "No heatmap: " in section, pid  # and why not
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
    assert all(f"`{pid}`" in joined(read_pages(first)) for pid in SAMPLE)
    assert (first / "timings-head_loop-1.png").is_file()  # the time ratio, beside timings.md
    assert "](timings-head_loop-1.png)" in (first / report.TIMINGS).read_text()
    for path in before:
        if path.name != report.TIMINGS and not path.name.startswith("timings-"):  # wall-clock
            assert again[path] == before[path], path


def measured_already(monkeypatch: pytest.MonkeyPatch, fresh: Run) -> list[str]:
    """The fresh run's measurements (their pictures left to draw) and doctor section: what is
    under test is writing, in this process (the arguments that say so)."""
    results = [replace(r, pictures=None) for r in fresh.results]
    monkeypatch.setattr(build, "collect", lambda *a, **k: (results, fresh.written["timed"]))
    made = fresh.written["doctor_pieces"]
    monkeypatch.setattr(build, "doctor_pieces", lambda kept, submit, keys: (dict(made), {}))
    return ["--workers", "1"]


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

    here = measured_already(monkeypatch, fresh)
    monkeypatch.setattr(report_write, "draw", crash_on_the_second_trap)
    assert cli.main([*CANONICAL, "--out", str(out), "--no-store", *here]) == 130
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
        if r.pair is fresh.results[1].pair:
            interrupts.ACTIVE.received.append(
                signal.SIGINT
            )  # what the handler records; raised in vain
        return draw(r, folder)

    here = measured_already(monkeypatch, fresh)
    monkeypatch.setattr(report_write, "draw", swallowed_on_the_second_trap)
    assert cli.main([*CANONICAL, "--out", str(out), "--no-store", *here]) == 130
    assert files(out) == before
    assert not list(out.glob(".staging-*"))


# The catalogue's answer to each claim of the tutorial (../shared/CATALOGUE.md), which the
# measurements must give: the scorecard's rows by section and the start of the claim.
CLAIMED = {
    ("§2", "a large d_k"): "true",
    ("§2", "a d_k too small"): "true",
    ("§3.1", "the scale keeps"): "**false**",
    ("§3.2", "`bias=False`"): "partly",
    ("§3.2", "`bmm` is safer"): "true",
    ("§3.2", "`K.transpose(0, 1)`"): "true",
    ("§3.2", "leaving out K's transpose"): "partly",
    ("§3.2", "`masked_fill(mask == 0"): "partly",
    ("§3.2", "without `dim=-1`"): "**false**",
    ("§3.2", "a (B, 1, T, T) mask"): "**false**",
    ("§3.3", "the example"): "**false**",
    ("§4.1", "`1 / math.sqrt"): "**false**",
    ("§4.1", "`1 / torch.sqrt"): "**false**",
    ("§4.2", "`masked_fill(mask.bool()"): "true",
    ("§4.2", "use float masks"): "partly",
    ("§4.2", "PyTorch converts"): "**false**",
    ("§4.3", "bmm needs"): "true",
    ("§4.4", "V laid out"): "partly",
    ("§4.4", "always use `bmm`"): "partly",
    ("§4.5", "nn.Linear's default"): "**false**",
    ("§4.5", "xavier's variance"): "**false**",
    ("§5.1", "heads of width"): "true",
    ("§5.1", "heads specialise"): "true",
    ("§5.2", "multi-head attention"): "partly",
    ("§5.2", "the heads are computed"): "**false**",
    ("§6.3", "`exp(Q K^T)`"): "**false**",
}


def holds(table: pd.DataFrame) -> dict[tuple[str, str], str]:
    """The scorecard's verdicts, keyed as ``CLAIMED``."""
    out = {}
    for row in table.itertuples(index=False):
        section, says, verdict = row[0], row[1], row[2]  # §, the tutorial says, holds?
        [key] = [k for k in CLAIMED if k[0] == section and says.startswith(k[1])]
        out[key] = verdict
    return out


def test_the_scorecard_gives_each_claim_the_measured_answer(fresh: Run) -> None:
    table = scorecard_table(fresh.results)
    assert holds(table) == CLAIMED
    assert table["the number that decides it"].str.len().gt(20).all()
    assert table.iloc[0].equals(scorecard_table(fresh.results).iloc[0])  # seeded: repeatable


def test_a_claim_follows_its_measurement(fresh: Run) -> None:
    """Measured SILENT instead of BENIGN, the tutorial's §4.1 would be right."""
    [r] = [r for r in fresh.results if r.pair.card.id == "scale_precision"]
    cells = [replace(m, verdict=Verdict.SILENT) for m in r.cells]
    silent = [replace(r, cells=cells) if x is r else x for x in fresh.results]
    assert holds(scorecard_table(silent))[("§4.1", "`1 / math.sqrt")] == "true"


def reading_words(markdown: str) -> int:
    """The words a reader reads: link targets, anchors, table rules and lone symbols left out."""
    markdown = re.sub(r'<a id="[^"]*"></a>', " ", markdown)
    markdown = re.sub(r"\]\([^)]*\)", "]", markdown)
    markdown = re.sub(r"^\|[:\- |]+\|$", " ", markdown, flags=re.M)
    return sum(bool(re.search(r"\w", token)) for token in markdown.split())


STUDENT_WORDS = 1600  # the student's page before its way on: "about 1,500", ten minutes' read


def test_reading_words_counts_what_a_reader_reads() -> None:
    assert reading_words("| a | [`b`](x.md#b) |\n|:--|:--|\n| → | c d |") == 4


def test_each_trap_is_on_one_page_and_the_students_page_is_short(fresh: Run) -> None:
    pages = read_pages(fresh.out)
    for pid in registry.ids():
        on = [name for name, text in pages.items() if f'<a id="{pid}"></a>' in text]
        assert len(on) == 1, (pid, on)
        named = registry.load(pid).card.section != NOT_NAMED
        assert not named or on == [report.CLAIMS_PAGE], pid  # the tutorial's traps: its page
    student = pages[report.REPORT]
    assert "<a id=" not in student.replace('<a id="tutorial-code">', "")  # no trap's section
    before, way_on, _ = student.partition("## Read on")
    assert way_on and reading_words(before) <= STUDENT_WORDS


# The words the student's page uses, each to be defined (in bold) before its first use.
TERMS = ("rounding noise", "ulp", "output error", "SILENT", "LOUD", "CONDITIONAL", "NUMERIC",
         "BENIGN", "entropy", "SDPA", "pair")  # fmt: skip


def first_use_is_the_definition(text: str, term: str) -> bool:
    """``term``'s first appearance in ``text`` (as a word, in any case) is its bold definition."""
    found = re.search(rf"(?i)(\*\*)?\b{re.escape(term)}s?\b", text)
    return found is not None and found.group(1) == "**"


def test_every_term_of_the_students_page_is_defined_before_it_is_used(fresh: Run) -> None:
    student = read_pages(fresh.out)[report.REPORT]
    assert [t for t in TERMS if not first_use_is_the_definition(student, t)] == []


def test_a_term_used_before_its_definition_is_caught() -> None:
    assert first_use_is_the_definition("the **ulp**: a step; 2 ulp apart", "ulp")
    assert not first_use_is_the_definition("2 ulp apart; the **ulp**: a step", "ulp")
    assert not first_use_is_the_definition("no such word here", "ulp")


def test_every_link_lands(fresh: Run) -> None:
    pages = read_pages(fresh.out)
    anchors = {
        name: set(re.findall(r'<a id="([\w-]+)"></a>', text)) for name, text in pages.items()
    }
    for name, text in pages.items():
        for target in re.findall(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)", text):
            page, _, where = target.partition("#")
            if page.startswith(("http", "img/")) or page == "zoo.md":
                continue
            if page == report.TIMINGS:  # written beside the pages by every run
                assert (fresh.out / page).is_file()
                continue
            page = page or name
            assert page in pages, (name, target)
            assert not where or where in anchors[page], (name, target)
