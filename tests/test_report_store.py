"""The report's use of its store: a second run reuses each trap's results, a changed pair file
changes that trap's key alone, and reused results render the same report."""

from __future__ import annotations

import types

import torch

from harness.catalogue import registry
from harness.report.build import Kept, collect, trap_key
from harness.report.store import Store
from harness.report.summary_table import summary

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
