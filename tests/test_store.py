"""The store of results kept between runs: keyed by content, never stale, never in the way."""

from __future__ import annotations

import os
from pathlib import Path

from harness.report import store
from harness.report.store import Store, key


def test_a_result_comes_back_under_its_key_and_nothing_under_another(tmp_path):
    kept = Store(tmp_path / "store")
    kept.put("a", {"value": [1, 2.5]})
    assert kept.get("a") == {"value": [1, 2.5]}
    assert kept.get("b") is None
    assert (kept.hits, kept.misses) == (1, 1)


def test_a_changed_file_or_option_gives_a_new_key_and_the_same_ones_the_same(tmp_path):
    pair = tmp_path / "pair"
    pair.mkdir()
    (pair / "buggy.py").write_text("x = 1\n")
    (pair / "fixed.py").write_text("x = 2\n")
    files = sorted(pair.iterdir())
    first = key("cpu", ("float32",), files=files, root=tmp_path)
    assert key("cpu", ("float32",), files=reversed(files), root=tmp_path) == first
    assert key("cpu", ("float16",), files=files, root=tmp_path) != first
    (pair / "buggy.py").write_text("x = 3\n")
    assert key("cpu", ("float32",), files=files, root=tmp_path) != first
    (pair / "buggy.py").rename(pair / "other.py")  # the same contents under another name
    renamed = sorted(pair.iterdir())
    assert key("cpu", ("float32",), files=renamed, root=tmp_path) != first


def test_the_environment_covers_the_harness_code_and_the_cpu_kernels(monkeypatch):
    before = store.environment()
    store.environment.cache_clear()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default-for-this-test")
    try:
        assert store.environment() != before
    finally:
        store.environment.cache_clear()
    assert any(p.name == "store.py" for p in store.source_files(store.HARNESS))


def test_an_entry_that_cannot_be_read_is_a_miss_and_is_removed(tmp_path):
    kept = Store(tmp_path)
    kept.put("a", list(range(1000)))
    path = tmp_path / f"a{store.SUFFIX}"
    path.write_bytes(path.read_bytes()[:20])  # cut short
    assert kept.get("a") is None
    assert not path.exists()


def test_no_folder_keeps_nothing_and_an_unwritable_one_is_skipped(tmp_path):
    nothing = Store(None)
    nothing.put("a", 1)
    assert nothing.get("a") is None
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    in_the_way = Store(blocked / "store")  # its parent is a file: cannot be made
    in_the_way.put("a", 1)
    assert in_the_way.get("a") is None
    unpicklable = Store(tmp_path / "store")
    unpicklable.put("a", lambda: None)
    assert unpicklable.get("a") is None
    assert not list((tmp_path / "store").glob("*.partial"))


def test_pruning_drops_the_entries_used_least_recently(tmp_path):
    kept = Store(tmp_path)
    for name in "abc":
        kept.put(name, b"x" * 1000)
    for age, name in enumerate("abc"):  # a used longest ago
        os.utime(tmp_path / f"{name}{store.SUFFIX}", (1000 + age, 1000 + age))
    kept.get("a")  # now the most recent
    size = (tmp_path / f"a{store.SUFFIX}").stat().st_size
    kept.prune(limit=2 * size)
    assert sorted(p.stem for p in tmp_path.glob(f"*{store.SUFFIX}")) == ["a", "c"]


def test_the_default_folder_is_the_users_cache_unless_told(monkeypatch, tmp_path):
    monkeypatch.delenv(store.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert store.default_folder() == tmp_path / "attention-pitfalls"
    monkeypatch.setenv(store.ENV, str(tmp_path / "elsewhere"))
    assert store.default_folder() == Path(tmp_path / "elsewhere")


def test_pruning_removes_only_its_own_writes_cut_short_and_not_another_runs_in_progress(tmp_path):
    kept = Store(tmp_path)
    old_cut = tmp_path / f"{store.PARTIAL}old.partial"
    writing = tmp_path / f"{store.PARTIAL}new.partial"  # another run, still writing
    theirs = tmp_path / "someone-else.partial"  # not this store's
    for path in (old_cut, writing, theirs):
        path.write_bytes(b"half")
    hour_ago = old_cut.stat().st_mtime - store.STALE - 1
    for path in (old_cut, theirs):
        os.utime(path, (hour_ago, hour_ago))
    kept.prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([writing.name, theirs.name])


def test_every_library_a_result_may_come_from_is_in_the_key():
    """The real-module rows come from x-transformers and timm too: a new release of either
    must not be answered from results made with the old one."""
    assert {"transformers", "x-transformers", "timm", "torch"} <= set(store.LIBRARIES)
