"""A report run's receipt: a run with nothing to do is answered from it, without measuring or
importing torch; any change to what the report is made from, to the command, or to the folder
it left takes the whole path."""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.cli.report import run_key
from harness.report import build, publish, receipt
from harness.report.store import Store

ROOT = Path(__file__).resolve().parents[1]
FAST = "nothing it is made from changed since the last run"


@pytest.fixture
def catalogue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A catalogue of one file in a folder of its own, in place of the real one in the keys."""
    home = tmp_path / "pitfalls"
    home.mkdir()
    (home / "__init__.py").write_text("# the catalogue\n")
    monkeypatch.setattr(receipt, "HOME", home)
    return home


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """``build_report`` replaced by one that writes a page and a picture into ``out``; the
    folders it was called for, in order."""
    calls = []

    def build_report(grid, out, learn=True, kept=None, workers=1, published=lambda: None) -> str:
        calls.append(out)
        out.mkdir(exist_ok=True)
        (out / "img").mkdir(exist_ok=True)
        with publish.locked(out):
            (out / "report.md").write_text(f"# a report of {len(grid)} cells\n")
            (out / "img" / "mask_bool-0123456789.png").write_bytes(b"\x89PNG picture")
            published()
        return f"wrote {out / 'report.md'}"

    monkeypatch.setattr(build, "build_report", build_report)
    return calls


def report(out: Path, *options: str) -> int:
    return cli.main(["report", "--device", "cpu", "--dtype", "float32", "--out", str(out),
                     "--workers", "1", *options])  # fmt: skip


def test_the_receipt_is_kept_while_the_folders_lock_is_held(
    tmp_path, catalogue, builds, monkeypatch
):
    """Kept after the lock is let go, a receipt could describe another run's report (a run
    with --no-learn publishing in between) and answer "up to date" over it."""
    held = []
    keep = receipt.keep

    def checked(kept, key, out):
        fd = os.open(out, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)
        keep(kept, key, out)

    monkeypatch.setattr(receipt, "keep", checked)
    assert report(tmp_path / "out") == 0
    assert held == [True]


def test_a_second_run_with_nothing_changed_is_answered_from_the_receipt(
    tmp_path, catalogue, builds, capsys
):
    out = tmp_path / "out"
    assert report(out) == 0 and builds == [out]
    assert "wrote" in capsys.readouterr().out
    assert report(out) == 0 and builds == [out]  # not built again
    assert FAST in capsys.readouterr().out
    assert report(out, "--no-store") == 0 and builds == [out, out]  # --no-store: built


@pytest.mark.parametrize(
    "change",
    [
        "a page edited",
        "a picture removed",
        "a page added",
        "a run's staging folder",
        "a catalogue file changed",
        "another dtype",
        "without the learning probe",
        "another folder",
    ],
)
def test_any_change_takes_the_whole_path(tmp_path, catalogue, builds, capsys, change):
    out = tmp_path / "out"
    assert report(out) == 0
    options: list[str] = []
    if change == "a page edited":
        (out / "report.md").write_text("# edited by hand\n")
    elif change == "a picture removed":
        (out / "img" / "mask_bool-0123456789.png").unlink()
    elif change == "a page added":
        (out / "traps.md").write_text("# another page\n")
    elif change == "a run's staging folder":
        (out / ".staging-123-abc").mkdir()
    elif change == "a catalogue file changed":
        (catalogue / "__init__.py").write_text("# the catalogue, changed\n")
    elif change == "another dtype":
        options = ["--dtype", "float16"]
    elif change == "without the learning probe":
        options = ["--no-learn"]
    else:
        out = tmp_path / "elsewhere"
        out.mkdir()
        for path in (tmp_path / "out").rglob("*"):  # the same bytes in another folder
            if path.is_file():
                copy = out / path.relative_to(tmp_path / "out")
                copy.parent.mkdir(exist_ok=True)
                copy.write_bytes(path.read_bytes())
    capsys.readouterr()
    assert report(out, *options) == 0 and len(builds) == 2, change
    assert FAST not in capsys.readouterr().out
    assert report(out, *options) == 0 and len(builds) == 2  # and its own receipt is kept


def test_no_receipt_is_kept_when_an_input_changes_while_the_run_measures(
    tmp_path, catalogue, monkeypatch
):
    """A pair file changed while the report measured, then changed back: the report may hold
    either, so the next run measures."""
    original = (catalogue / "__init__.py").read_text()
    calls: list[Path] = []

    def edited_meanwhile(grid, out, learn=True, kept=None, workers=1, published=None) -> str:
        calls.append(out)
        out.mkdir(exist_ok=True)
        (out / "report.md").write_text("# a report\n")
        if len(calls) == 1:
            (catalogue / "__init__.py").write_text("# edited while the report measured\n")
        published()
        return "wrote it"

    monkeypatch.setattr(build, "build_report", edited_meanwhile)
    out = tmp_path / "out"
    assert report(out) == 0
    (catalogue / "__init__.py").write_text(original)
    assert report(out) == 0 and len(calls) == 2
    assert report(out) == 0 and len(calls) == 2  # the second run's inputs held: its receipt


def test_a_receipt_is_the_folder_own_files_and_pictures_and_its_hidden_names(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(b"a")
    (tmp_path / "report.md").write_text("r")
    (tmp_path / "learning").mkdir()  # another command's folder: not the report's
    (tmp_path / "learning" / "x.csv").write_text("x")
    (tmp_path / ".installing").write_text("img/b.png\n")
    found = receipt.receipt(tmp_path)
    assert set(found) == {"img/a.png", "report.md", ".installing"}
    assert found[".installing"] == "" and len(found["report.md"]) == 64
    assert not receipt.unchanged(Store(tmp_path / "store"), "no such key", tmp_path)


def test_the_answer_from_the_receipt_imports_no_torch(tmp_path):
    """Answered in a fresh interpreter from the receipt of a run (kept here): torch, pandas and
    the catalogue stay unimported, on a torch build that says it is CPU-only (elsewhere torch
    is asked which devices it offers)."""
    out, folder = tmp_path / "out", tmp_path / "store"
    out.mkdir()
    (out / "report.md").write_text("# a report\n")
    command = ["report", "--device", "cpu", "--out", str(out)]
    receipt.keep(Store(folder), run_key(cli.build_parser().parse_args(command)), out)
    script = (
        "import sys\n"
        "from harness.cli import main\n"
        f"code = main({command!r})\n"
        "print('imported:', [m for m in ('torch', 'pandas', 'pitfalls') if m in sys.modules])\n"
        "sys.exit(code)\n"
    )
    env = dict(os.environ, ATTENTION_PITFALLS_CACHE=str(folder))
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env=env, cwd=ROOT, timeout=120)  # fmt: skip
    assert child.returncode == 0, child.stderr
    assert FAST in child.stdout
    cpu_only = receipt.devices_without_torch() is not None
    assert "imported: []" in child.stdout if cpu_only else "'pandas'" not in child.stdout


def test_a_receipt_is_json_and_a_planted_pickle_runs_nothing(tmp_path, catalogue, builds):
    """Every run reads its receipt before anything else: as JSON, loading it runs no code."""
    out = tmp_path / "out"
    assert report(out) == 0
    store_folder = Path(os.environ["ATTENTION_PITFALLS_CACHE"])
    receipts = list(store_folder.glob("*.json"))
    assert receipts and all(isinstance(json.loads(p.read_text()), dict) for p in receipts)
    planted = tmp_path / "planted"

    class Plant:
        def __reduce__(self):
            return (planted.touch, ())

    for path in receipts:  # a pickle where the receipt was: read as JSON, it is no receipt
        path.write_bytes(pickle.dumps(Plant()))
    assert report(out) == 0 and not planted.exists() and len(builds) == 2
