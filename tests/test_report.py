"""The diagnosis report: fresh against the committed one, deterministic, written atomically."""

import re
from pathlib import Path

import pytest

from harness import cli, report
from harness.catalogue import registry

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "reports" / report.REPORT
CANONICAL = ["report", "--device", "cpu"]
# The only lines allowed to differ from machine to machine: library and interpreter versions.
ENVIRONMENT = re.compile(r"^- Versions: .*$", re.MULTILINE)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """The canonical CPU report, regenerated into a temporary folder."""
    out = tmp_path_factory.mktemp("report")
    assert cli.main([*CANONICAL, "--out", str(out)]) == 0
    return out


def test_committed_report_is_not_stale(fresh):
    assert COMMITTED.exists(), "run: python -m harness report --device cpu"
    committed = ENVIRONMENT.sub("", COMMITTED.read_text())
    regenerated = ENVIRONMENT.sub("", (fresh / report.REPORT).read_text())
    assert committed == regenerated, "stale report: run python -m harness report --device cpu"


def test_report_has_every_trap_and_its_picture(fresh):
    text = (fresh / report.REPORT).read_text()
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (fresh / image).read_bytes().startswith(b"\x89PNG"), image
    for pid in registry.ids():
        assert f'<a id="{pid}"></a>' in text
        section = text.split(f'<a id="{pid}"></a>')[1].split("<a id=")[0]
        assert f"img/{pid}.png" in section or "No heatmap: neither module" in section, pid
    assert "**The claimed trap does not hold.**" in text  # BENIGN traps say so
    assert "Not available here: cuda" in text or "cuda" in text.split("## Summary")[0]


def test_same_command_same_bytes(fresh, tmp_path):
    assert cli.main([*CANONICAL, "--out", str(tmp_path)]) == 0
    for path in sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()):
        if path.name != report.TIMINGS:
            assert (tmp_path / path).read_bytes() == (fresh / path).read_bytes(), path


def test_interrupted_run_leaves_the_previous_report(fresh, tmp_path, monkeypatch):
    assert cli.main(["report", "--dtype", "float32", "--out", str(tmp_path)]) == 0
    before = (tmp_path / report.REPORT).read_bytes()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "heatmap", crash)
    assert cli.main(["report", "--dtype", "float16", "--out", str(tmp_path)]) == 130
    assert (tmp_path / report.REPORT).read_bytes() == before
    assert not list(tmp_path.glob(".staging-*"))


def test_pictures_a_run_no_longer_draws_are_removed_and_others_kept(tmp_path):
    img = tmp_path / "img"
    img.mkdir()
    (img / "mask_bool-7.png").write_bytes(b"stale")  # named after a trap: ours
    (img / "holiday.png").write_bytes(b"yours")  # not ours: left alone
    assert cli.main(["report", "--dtype", "float32", "--out", str(tmp_path)]) == 0
    assert not (img / "mask_bool-7.png").exists()
    assert (img / "holiday.png").read_bytes() == b"yours"
    assert (img / "mask_bool.png").exists()
