"""The report's use of its store: a second run reuses each trap's results, a changed pair file
changes that trap's key alone, reused results render the same report, and pages and timing
pictures made from the same inputs are reused."""

from __future__ import annotations

import fcntl
import os
import types

import pandas as pd
import pytest
import torch

from harness.catalogue import registry
from harness.errors import UsageError, shorten
from harness.report import build, pictures, write
from harness.report.build import Kept, collect, doctor_keys, doctor_pieces, pages_key, trap_key
from harness.report.store import Store
from harness.report.summary_table import summary
from harness.report.timings import draw_timings
from harness.report.workers import here
from harness.report.write import write_report

GRID = [(torch.device("cpu"), torch.float32)]


def test_a_second_run_reuses_every_trap_and_renders_the_same(tmp_path):
    pairs = [registry.load("mask_bool"), registry.load("missing_scale")]
    kept = Store(tmp_path)
    first, _ = collect(pairs, GRID, kept=kept)
    assert (kept.hits, kept.misses) == (0, 2)
    again = Store(tmp_path)
    second, _ = collect(pairs, GRID, kept=again)
    assert (again.hits, again.misses) == (2, 0)
    assert [r.key for r in second] == [r.key for r in first] and all(r.key for r in first)
    assert summary(second) == summary(first)
    modules = [row["module"] for r in first for row in r.detection]  # the doctor, with the trap
    assert modules == [f"{p.card.id}/{side}.py" for p in pairs for side in ("buggy", "fixed")]
    assert [r.detection for r in second] == [r.detection for r in first]


def test_a_trap_learns_in_a_piece_of_its_own_and_keeps_what_it_learned(tmp_path, monkeypatch):
    pair = registry.load("missing_scale")

    def learned(pids, device):
        return [(f"{pid} trained on {device}", {}) for pid in pids]

    monkeypatch.setattr(build, "learned", learned)
    made, _ = collect([pair], GRID, learn=True, kept=Store(tmp_path))
    again, _ = collect([pair], GRID, learn=True, kept=Store(tmp_path))
    assert made[0].learning == again[0].learning == "missing_scale trained on cpu"
    assert made[0].cells and not collect([pair], GRID, learn=False)[0][0].learning


def test_traps_whose_fixed_py_trains_alike_learn_in_one_piece_and_each_gets_its_own(monkeypatch):
    """causal_leak's and mask_rank's fixed.py differ only in comments and docstrings: one
    piece trains it once for both; each trap gets its own learning back."""
    pairs = [registry.load(pid) for pid in ("causal_leak", "mask_rank", "missing_scale")]
    pieces = []

    def learned(pids, device):
        pieces.append(pids)
        return [(f"{pid} trained", {}) for pid in pids]

    monkeypatch.setattr(build, "learned", learned)
    monkeypatch.setattr(build, "measured", lambda pid, grid: (build.Kept(), {}))
    results, _ = collect(pairs, GRID, learn=True)
    assert sorted(pieces) == [("causal_leak", "mask_rank"), ("missing_scale",)]
    assert [r.learning for r in results] == [f"{p.card.id} trained" for p in pairs]


def test_a_changed_pair_file_changes_its_key_and_no_other(tmp_path):
    folders = {}
    for name in ("one", "two"):
        folder = tmp_path / name
        folder.mkdir()
        for file in ("buggy.py", "fixed.py", "__init__.py"):
            (folder / file).write_text(f"# {name} {file}\n")
        folders[name] = types.SimpleNamespace(buggy=types.SimpleNamespace(
            __file__=str(folder / "buggy.py")))  # fmt: skip
    before = {n: trap_key(p, GRID, True) for n, p in folders.items()}
    assert before["one"] != before["two"]
    (tmp_path / "one" / "fixed.py").write_text("# changed\n")
    after = {n: trap_key(p, GRID, True) for n, p in folders.items()}
    assert after["one"] != before["one"] and after["two"] == before["two"]
    assert trap_key(folders["two"], GRID, False) != before["two"]  # learning or not
    (tmp_path / "shared.py").write_text("# the catalogue's shared code\n")
    assert trap_key(folders["two"], GRID, True) != before["two"]


def test_what_the_store_holds_is_not_taken_for_a_trap_when_it_is_something_else(tmp_path):
    pair = registry.load("missing_scale")
    kept = Store(tmp_path)
    kept.put(trap_key(pair, GRID, False), {"not": "a Kept"})  # another version's shape
    results, _ = collect([pair], GRID, kept=kept)
    assert results[0].cells and isinstance(Store(tmp_path).get(results[0].key), Kept)


def test_the_pages_key_follows_every_trap_and_the_doctor_tables():
    pairs = [registry.load("mask_bool"), registry.load("missing_scale")]
    results = [Kept().result(p, key=f"key-{p.card.id}") for p in pairs]
    key = pages_key(results, "doctor", GRID, [], {})
    assert key == pages_key(results, "doctor", GRID, [], {})
    changed = [results[0], Kept().result(pairs[1], key="another")]
    others = [
        pages_key(changed, "doctor", GRID, [], {}),
        pages_key(results, "other tables", GRID, [], {}),
        pages_key(results, "doctor", [(torch.device("cpu"), torch.float16)], [], {}),
        pages_key(results, "doctor", GRID, ["cuda"], {}),
        pages_key(results, "doctor", GRID, [], {"mask_bool": pd.DataFrame()}),
    ]
    assert key not in others and len(set(others)) == len(others)
    assert pages_key([*results, Kept().result(pairs[0])], "doctor", GRID, [], {}) == ""


def test_pages_kept_under_their_key_are_written_without_rendering(tmp_path, monkeypatch):
    pairs = [registry.load("mask_bool")]
    results, timed = collect(pairs, GRID)
    kept = Store(tmp_path / "store")
    first, _ = write_report(results, GRID, tmp_path / "one", [], timed, kept=kept, pages_key="k")
    monkeypatch.setattr(write, "render", lambda *args: pytest.fail("rendered again"))
    second, _ = write_report(results, GRID, tmp_path / "two", [], timed, kept=kept, pages_key="k")
    assert second.read_text() == first.read_text()
    with pytest.raises(pytest.fail.Exception, match="rendered again"):
        write_report(results, GRID, tmp_path / "three", [], timed, kept=kept, pages_key="new")


def test_a_timing_table_kept_reuses_its_pictures_and_a_new_one_is_drawn(tmp_path, monkeypatch):
    table = pd.DataFrame({"heads": [1, 2], "ms": [1.0, 2.0]})
    table.attrs["plots"] = [{"x": "heads", "y": ["ms"], "title": "time"}]
    kept = Store(tmp_path / "store")
    (tmp_path / "one").mkdir(), (tmp_path / "two").mkdir(), (tmp_path / "three").mkdir()
    names = draw_timings({"head_loop": table}, tmp_path / "one", kept)
    monkeypatch.setattr(pictures, "plot", lambda *args: pytest.fail("drawn again"))
    assert draw_timings({"head_loop": table}, tmp_path / "two", kept) == names
    assert (tmp_path / "two" / names[0]).read_bytes() == (tmp_path / "one" / names[0]).read_bytes()
    slower = table.assign(ms=[1.0, 3.0])
    with pytest.raises(pytest.fail.Exception, match="drawn again"):
        draw_timings({"head_loop": slower}, tmp_path / "three", kept)


def test_a_changed_pair_file_keeps_every_doctor_piece_and_the_tutorial_remakes_its_own(
    tmp_path, monkeypatch
):
    (tmp_path / "one").mkdir()
    for file in ("buggy.py", "fixed.py", "tutorial.py"):
        (tmp_path / ("one" if file != "tutorial.py" else "") / file).write_text(f"# {file}\n")
    monkeypatch.setattr(registry, "HOME", tmp_path)
    monkeypatch.setattr(build, "TUTORIAL", tmp_path / "tutorial.py")
    before = doctor_keys()
    (tmp_path / "one" / "fixed.py").write_text("# changed\n")  # its trap's key alone changes
    assert doctor_keys() == before
    (tmp_path / "tutorial.py").write_text("# changed\n")
    after = doctor_keys()
    assert after["tutorial"] != before["tutorial"]
    assert {k: v for k, v in after.items() if k != "tutorial"} == {
        k: v for k, v in before.items() if k != "tutorial"
    }


def test_the_doctor_pieces_the_store_keeps_are_not_made_again(tmp_path):
    kept, keys = Store(tmp_path), doctor_keys()
    kept.put(keys["references"], [{"module": "a reference"}])
    kept.put(keys["tutorial"], pd.DataFrame({"module": ["tutorial"]}))
    kept.put(keys["libraries"], ["not", "a", "table"])  # another version's shape: made again
    made = []
    submit = lambda fn, *args: made.append(fn.__name__) or here(str, "new")  # noqa: E731
    found, pending = doctor_pieces(kept, submit, keys)
    assert set(found) == {"references", "tutorial"}
    assert found["references"] == [{"module": "a reference"}]
    assert made == ["on_libraries"] and pending["libraries"].get() == "new"


def test_a_run_keeps_the_doctor_pieces_it_made_and_rewrites_none_it_found(tmp_path, monkeypatch):
    results, timed = collect([registry.load("mask_bool")], GRID)
    monkeypatch.setattr(build, "collect", lambda *args, **kwargs: (results, timed))
    monkeypatch.setattr(build, "DOCTOR_PIECES", {
        **build.DOCTOR_PIECES,  # the tutorial's, as made
        "libraries": (lambda: "## libraries", str, "libraries"),
        "references": (lambda: [], list, "references"),
    })  # fmt: skip
    kept, keys = Store(tmp_path / "store"), doctor_keys()
    build.build_report(GRID, tmp_path / "one", learn=False, kept=kept)
    assert kept.get(keys["libraries"]) == "## libraries" and kept.get(keys["references"]) == []
    assert isinstance(kept.get(keys["tutorial"]), pd.DataFrame)
    written = []
    monkeypatch.setattr(Store, "put", lambda self, key, value: written.append(key))
    build.build_report(GRID, tmp_path / "two", learn=False, kept=kept)
    assert not set(written) & set(keys.values())
    doctor = (tmp_path / "two" / "doctor.md").read_text()
    assert "## libraries" in doctor and "| mask_bool/buggy.py " in doctor  # the trap's rows


def test_a_full_disk_while_staging_is_one_line_and_the_old_report_stays(tmp_path, monkeypatch):
    out = tmp_path / "reports"
    out.mkdir()
    (out / "report.md").write_text("# the old report\n")
    before = sorted(p.name for p in out.rglob("*"))

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(write, "staged_report", full)
    with pytest.raises(UsageError) as refused:
        write_report([], GRID, out, [], {})
    assert str(refused.value) == (
        f"cannot write the report into {shorten(out, quote=True)}: No space left on device (the "
        "folder holds what "
        "it held before this run)"
    )
    assert sorted(p.name for p in out.rglob("*")) == before
    assert (out / "report.md").read_text() == "# the old report\n"


def test_published_runs_holding_the_folders_lock_with_no_staging_left(tmp_path, monkeypatch):
    """What runs on publishing (the receipt) sees the folder as this run leaves it, and no
    other run's report can come between."""
    out = tmp_path / "reports"
    seen = []

    def staged(*args):
        folder = args[-1]
        (folder / "img").mkdir()
        (folder / "report.md").write_text("# a report\n")
        (folder / "timings.md").write_text("timings\n")
        return [], {"report.md": "# a report\n"}, []

    def published():
        fd = os.open(out, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append("unlocked")
        except BlockingIOError:
            seen.append("locked")
        finally:
            os.close(fd)
        seen.append(sorted(p.name for p in out.iterdir()))

    monkeypatch.setattr(write, "staged_report", staged)
    write_report([], GRID, out, [], {}, published=published)
    assert seen == ["locked", ["report.md", "timings.md"]]  # no .staging-* of its own
