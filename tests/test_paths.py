"""Where the command line reads and writes: destinations checked before any work, files written
whole with the usual mode, imports from the working directory, and nothing left in it."""

import errno
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import types
from pathlib import Path

import pytest
from hypothesis import configuration, settings

from harness import cli, files
from harness.catalogue import search
from harness.cli import doctor as doctor_commands
from harness.doctor import target
from harness.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
MODULES = ROOT / "tests" / "doctor_modules.py"
PROG = "python -m harness"


def one_error_line(capsys, *argv):
    """The one stderr line of a command that must fail with a usage error, prefix removed."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1 and err.startswith(f"{PROG}: error: "), err
    return err[len(f"{PROG}: error: ") : -1]


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A fresh working directory, so that messages name short relative paths."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def no_probe(monkeypatch):
    """The doctor fails the test if it gets as far as importing the module."""

    def load_object(name):
        raise AssertionError("the --report check came after the doctor started")

    monkeypatch.setattr(doctor_commands, "load_object", load_object)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".tmp-*"))


# --report PATH: each refusal one line naming --report, before the doctor imports anything.
def make_fifo(folder):
    os.mkfifo(folder / "fifo.md")
    return "fifo.md"


def make_folder(folder):
    (folder / "out").mkdir()
    return "out"


def make_file_in_the_way(folder):
    (folder / "a-file").write_text("not a folder")
    return "a-file/sub/report.md"


REPORT_REFUSALS = {
    "empty name": (lambda f: "", "--report needs a file name, not an empty one"),
    "a folder": (make_folder, "--report 'out' is a folder, not a file"),
    "trailing slash": (lambda f: "new/", "--report 'new/' names a folder; give it a file name"),
    "dot": (lambda f: ".", "--report '.' names a folder; give it a file name"),
    "a fifo": (
        make_fifo,
        "--report 'fifo.md' is not a regular file (a device, FIFO or socket): it is never replaced",
    ),
    "a file on the way": (
        make_file_in_the_way,
        "cannot write --report 'a-file/sub/report.md': a-file is not a folder",
    ),
    "name too long": (
        lambda f: "x" * 300 + ".md",
        f"cannot write --report '{'x' * 60}'… (303 characters): the name '{'x' * 60}'… (303 "
        "characters) is longer than its file system allows (255 bytes)",
    ),
    "folder name too long": (
        lambda f: "y" * 256 + "/r.md",
        f"cannot write --report '{'y' * 60}'… (261 characters): the name '{'y' * 60}'… (256 "
        "characters) is longer than its file system allows (255 bytes)",
    ),
}


@pytest.mark.parametrize("case", REPORT_REFUSALS)
def test_doctor_report_destination_is_refused_before_any_probe(capsys, here, no_probe, case):
    make, message = REPORT_REFUSALS[case]
    path = make(here)
    before = sorted(p.name for p in here.iterdir())
    assert one_error_line(capsys, "doctor", f"{MODULES}:einsum_ok", "--report", path) == message
    assert sorted(p.name for p in here.iterdir()) == before  # nothing created, nothing left


def test_a_socket_or_device_is_never_a_report(here):
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("report.sock")
        with pytest.raises(UsageError, match=r"^--report 'report.sock' is not a regular file"):
            files.check_file_destination("report.sock", "--report")
    if Path(os.devnull).exists():
        with pytest.raises(UsageError, match=r"is not a regular file .* never replaced$"):
            files.check_file_destination(os.devnull, "--report")


@pytest.fixture
def access_denied(monkeypatch):
    """``os.access`` says no for the paths added to the set it returns (root may write anything,
    so a chmod alone does not show it)."""
    denied = set()
    real = os.access

    def access(path, mode, *args, **kwargs):
        if Path(path).resolve() in denied and mode & os.W_OK:
            return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(files.os, "access", access)
    return denied


def test_an_unwritable_report_file_is_refused(here, access_denied):
    (here / "r.md").write_text("old")
    (here / "r.md").chmod(0o444)
    access_denied.add((here / "r.md").resolve())
    with pytest.raises(UsageError, match=r"^--report 'r.md' is not writable$"):
        files.check_file_destination("r.md", "--report")


def test_an_unwritable_folder_is_refused_at_its_nearest_existing_ancestor(here, access_denied):
    (here / "locked").mkdir()
    access_denied.add((here / "locked").resolve())
    message = "cannot write --report 'locked/new/r.md': folder locked is not writable"
    with pytest.raises(UsageError, match=f"^{message}$"):
        files.check_file_destination("locked/new/r.md", "--report")


def test_a_folder_that_takes_no_new_file_is_refused(here, monkeypatch):
    def full(*args, **kwargs):  # what root meets in /proc, anyone on a full disk
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.tempfile, "TemporaryFile", full)
    message = "cannot write --report 'r.md': folder . takes no new file (No space left on device)"
    with pytest.raises(UsageError, match=f"^{re.escape(message)}$"):
        files.check_file_destination("r.md", "--report")


def test_a_report_that_cannot_be_written_after_all_is_one_line(capsys, here, monkeypatch):
    def full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(doctor_commands, "write_atomically", full)
    argv = ["doctor", f"{MODULES}:einsum_ok", "--mask", "keep", "--report", "r.md"]
    assert one_error_line(capsys, *argv) == "cannot write --report 'r.md': No space left on device"


def test_the_check_creates_no_folder_and_the_write_does(here):
    files.check_file_destination("new/sub/r.md", "--out")
    assert not (here / "new").exists()
    files.write_atomically(here / "new" / "sub" / "r.md", "text\n")
    assert (here / "new" / "sub" / "r.md").read_text() == "text\n"


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_a_new_file_gets_the_mode_open_gives_it(here, umask_022):
    files.write_atomically(here / "new.md", "new\n")
    with open(here / "plain.md", "w") as plain:  # what open() gives, for comparison
        plain.write("plain\n")
    assert stat.S_IMODE((here / "new.md").stat().st_mode) == 0o644
    assert stat.S_IMODE((here / "plain.md").stat().st_mode) == 0o644


def test_a_replaced_file_keeps_its_mode(here, umask_022):
    (here / "kept.md").write_text("old\n")
    (here / "kept.md").chmod(0o640)
    files.write_atomically(here / "kept.md", "new\n")
    assert (here / "kept.md").read_text() == "new\n"
    assert stat.S_IMODE((here / "kept.md").stat().st_mode) == 0o640


@pytest.mark.parametrize("exception", [KeyboardInterrupt, OSError])
def test_an_interrupted_write_leaves_no_temporary_file(here, monkeypatch, exception):
    (here / "r.md").write_text("previous\n")

    def replace(source, destination):
        raise exception("stopped just before the file was replaced")

    monkeypatch.setattr(files.os, "replace", replace)
    with pytest.raises(exception):
        files.write_atomically(here / "r.md", "new\n")
    assert leftovers(here) == [] and (here / "r.md").read_text() == "previous\n"


def test_doctor_report_is_written_with_the_usual_mode_and_nothing_left(capsys, here, umask_022):
    code = cli.main(
        ["doctor", f"{MODULES}:einsum_ok", "--mask", "keep", "--report", "new/doctor.md"]
    )
    capsys.readouterr()
    report = here / "new" / "doctor.md"
    assert code == 0 and report.read_text().startswith("# Attention doctor:")
    assert stat.S_IMODE(report.stat().st_mode) == 0o644 and leftovers(here) == []


# --out FOLDER (the report): what would break the write after a long run is refused up front.
def test_out_that_is_a_file_is_refused(here):
    (here / "out").write_text("a file")
    with pytest.raises(UsageError, match=r"^--out 'out' is a file, not a folder$"):
        files.ensure_writable(Path("out"))


def test_report_md_that_is_a_folder_is_refused(capsys, here):
    (here / "out" / "report.md").mkdir(parents=True)
    argv = ["report", "--device", "cpu", "--dtype", "float32", "--out", "out"]
    assert (
        one_error_line(capsys, *argv)
        == "cannot write to --out 'out': report.md in it is not a file"
    )


def test_img_that_is_a_file_is_refused(here):
    (here / "out").mkdir()
    (here / "out" / "img").write_text("a file")
    message = "cannot write to --out 'out': img in it is not a folder"
    with pytest.raises(UsageError, match=f"^{message}$"):
        files.ensure_writable(Path("out"))


def test_a_folder_made_for_a_failed_check_is_removed(here, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files.tempfile, "NamedTemporaryFile", refuse)
    with pytest.raises(UsageError, match=r"^cannot write to --out 'new/sub': Permission denied$"):
        files.ensure_writable(Path("new/sub"))
    assert list(here.iterdir()) == []


# package.module:name targets import from the working directory, whatever started the command.
@pytest.fixture
def mylib(here, monkeypatch):
    """A package ``mylib_cwd_test`` in the working directory, and a sys.path without it (as the
    console script's, which starts with the script's folder)."""
    package = here / "mylib_cwd_test"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "attn.py").write_text(
        "from torch import nn\n\n\nclass X(nn.MultiheadAttention):\n    pass\n"
    )
    cwd = os.getcwd()
    monkeypatch.setattr(
        sys, "path", [p for p in sys.path if os.path.abspath(p or os.curdir) != cwd]
    )
    yield "mylib_cwd_test.attn:X"
    for name in [m for m in sys.modules if m.split(".")[0] == "mylib_cwd_test"]:
        del sys.modules[name]


def test_a_package_module_target_imports_from_the_working_directory(mylib):
    before = list(sys.path)
    assert target.load_object(mylib).__name__ == "X"
    assert sys.path == before  # the working directory was there for the import only


def test_a_missing_package_module_leaves_sys_path_as_it_was(mylib):
    before = list(sys.path)
    with pytest.raises(
        UsageError,
        match=r"^cannot import nope_x.attn: ModuleNotFoundError: No module named 'nope_x'$",
    ):
        target.load_object("nope_x.attn:X")
    assert sys.path == before


CONSOLE_SCRIPT = Path(sys.executable).with_name("attention-pitfalls")


@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="attention-pitfalls is not installed")
def test_console_script_imports_from_the_working_directory(mylib):
    result = subprocess.run(
        [CONSOLE_SCRIPT, "doctor", mylib, "--mask", "drop", "--d-model", "16", "--json"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert result.returncode == 0, result.stderr
    assert '"healthy": true' in result.stdout


# Hypothesis (the trigger search) writes nothing where the command runs.
def test_run_leaves_no_hypothesis_folder_in_the_working_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPOTHESIS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = ["run", "transpose", "--device", "cpu", "--dtype", "float32", "--format", "csv"]
    result = subprocess.run(
        [sys.executable, "-m", "harness", *command],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "transpose,cpu,float32,CONDITIONAL" in result.stdout  # the search found its trigger
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_search_puts_hypothesis_storage_and_settings_back():
    profile = settings.default
    home = configuration.storage_directory()
    home = getattr(home, "home_directory", home)
    with search.scratch_storage() as scratch:
        inside = configuration.storage_directory()
        assert getattr(inside, "home_directory", inside) == scratch
    after = configuration.storage_directory()
    assert getattr(after, "home_directory", after) == home and not scratch.exists()
    assert settings.default is profile and search.SEARCH_SETTINGS.database is None


def test_no_temporary_folder_outlives_a_search(tmp_path, monkeypatch):
    monkeypatch.setattr(search.tempfile, "tempdir", str(tmp_path))
    with search.scratch_storage() as scratch:
        (scratch / "constants").mkdir()
    assert list(tmp_path.iterdir()) == []
    shutil.rmtree(tmp_path, ignore_errors=True)


# Links and dangling names the user did not mean as destinations.
def test_a_dangling_out_says_what_it_points_to(here):
    (here / "out").symlink_to("gone")
    with pytest.raises(
        UsageError, match=r"^--out 'out' is a link to 'gone', which does not exist$"
    ):
        files.ensure_writable(Path("out"))
    assert not (here / "gone").exists()


def test_a_report_never_writes_through_an_img_link(here):
    (here / "out").mkdir()
    (here / "elsewhere").mkdir()
    (here / "out" / "img").symlink_to(here / "elsewhere")
    message = (
        "cannot write to --out 'out': img in it is a link, not a folder (nothing is written "
        "through a link)"
    )
    with pytest.raises(UsageError, match=f"^{re.escape(message)}$"):
        files.ensure_writable(Path("out"))


@pytest.mark.parametrize("target", ["models:Attention", "models/:Attention", "./models:Attention"])
def test_a_folder_target_is_called_a_folder(capsys, here, target):
    (here / "models").mkdir()
    where = target.rpartition(":")[0]
    message = one_error_line(capsys, "doctor", target)
    assert message == f"{where} is a folder; name a .py file in it (file.py:name)"


def test_the_catalogue_is_the_harness_own_whatever_the_working_directory_holds(here):
    """A ``pitfalls`` package of another project in the working directory (first on
    ``python -m``'s path) is not taken for the catalogue."""
    (here / "pitfalls").mkdir()
    (here / "pitfalls" / "__init__.py").write_text("")
    (here / "pitfalls" / "mine").mkdir()
    (here / "pitfalls" / "mine" / "__init__.py").write_text("")
    command = [sys.executable, "-m", "harness", "list"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, cwd=here, env=env, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines()[1:]]
    assert "mask_bool" in listed and "mine" not in listed


def test_another_package_named_pitfalls_already_imported_is_a_usage_error(here, monkeypatch):
    from harness.catalogue import registry

    other = types.ModuleType("pitfalls")
    other.__path__ = [str(here)]
    monkeypatch.setitem(sys.modules, "pitfalls", other)
    with pytest.raises(UsageError, match="a different package named 'pitfalls' is already"):
        registry.package()
