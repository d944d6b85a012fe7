"""Writing files safely: check a destination before any work, replace a file in one step."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from harness.errors import UsageError, shorten

# What a report folder holds (harness.report writes them): refused up front when in the way.
REPORT = "report.md"  # the student's page: the tutorial's claims, its code, symptoms, a way on
CLAIMS_PAGE = "tutorial.md"  # the tutorial's traps in full, and how its claims were measured
MORE_TRAPS = "traps.md"  # the traps the tutorial does not name, by category
MODERN = "modern.md"  # modern attention's traps
DOCTOR = "doctor.md"  # the doctor's tables
TABLES_PAGE = "tables.md"  # the full tables behind each verdict
PAGES = (REPORT, CLAIMS_PAGE, MORE_TRAPS, MODERN, DOCTOR, TABLES_PAGE)  # a report, in reading order
TIMINGS = "timings.md"  # wall-clock numbers, kept apart from the report
IMAGES = "img"  # the report's pictures
REPORT_FILES = (*PAGES, TIMINGS)
REPORT_FOLDERS = (IMAGES,)
# What os.stat raises for a path that is not there (a name too long is not there either; the
# name check says why it cannot be).
MISSING = (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG)


def check_file_destination(path: str | os.PathLike[str], option: str) -> None:
    """UsageError (one line, naming ``option``) unless ``path`` can be written as a file.

    Refused: an empty name or one that names a folder (``out/``, ``.``), an existing folder, an
    existing file that is not a regular one (a device, a FIFO, a socket: never replaced), an
    existing file we may not write, a name longer than its file system allows, and a path
    whose nearest existing folder is not one we can write into (tried with a file that has no
    name, or one removed at once). Creates nothing: missing folders are created when the file
    is written (``write_atomically``).
    """
    text = os.fspath(path)
    if not text:
        raise UsageError(f"{option} needs a file name, not an empty one")
    shown = shorten(text, quote=True)
    target = Path(text)
    if text.endswith(("/", os.sep)) or target.name in ("", ".", ".."):
        raise UsageError(f"{option} {shown} names a folder; give it a file name")
    try:
        where, info = _nearest_existing(target)
        if where == target and target.is_symlink():  # written through, as open() would
            target = Path(os.path.realpath(target))
            where, info = _nearest_existing(target)
        if where == target:
            if stat.S_ISDIR(info.st_mode):
                raise UsageError(f"{option} {shown} is a folder, not a file")
            if not stat.S_ISREG(info.st_mode):
                raise UsageError(
                    f"{option} {shown} is not a regular file (a device, FIFO or socket): "
                    "it is never replaced"
                )
            if not os.access(target, os.W_OK):
                raise UsageError(f"{option} {shown} is not writable")
            where = target.parent
        elif not stat.S_ISDIR(info.st_mode):
            raise UsageError(f"cannot write {option} {shown}: {shorten(where)} is not a folder")
        _check_names(target, where, option, shown)
        if not os.access(where, os.W_OK | os.X_OK):
            raise UsageError(
                f"cannot write {option} {shown}: folder {shorten(where)} is not writable"
            )
        try:  # what access() cannot tell (root, /proc, a full disk): a file that has no name
            with tempfile.TemporaryFile(dir=where, prefix=".probe-"):
                pass
        except OSError as exc:
            raise UsageError(
                f"cannot write {option} {shown}: folder {shorten(where)} takes no new file "
                f"({exc.strerror or exc})"
            ) from None
    except UsageError:
        raise
    except OSError as exc:  # a name too long for the path as a whole, a loop of links, ...
        raise UsageError(f"cannot write {option} {shown}: {exc.strerror or exc}") from None
    except ValueError as exc:  # an embedded NUL
        raise UsageError(f"cannot write {option} {shown}: {exc}") from None


def _nearest_existing(path: Path) -> tuple[Path, os.stat_result]:
    """``path`` or its nearest existing ancestor, with its ``os.stat``."""
    for candidate in (path, *path.parents):
        try:
            return candidate, candidate.stat()
        except OSError as exc:
            if exc.errno not in MISSING:
                raise
    return Path("."), Path(".").stat()  # not reached: "." or "/" exists


def _check_names(path: Path, folder: Path, option: str, shown: str) -> None:
    """UsageError when a name still to be created under ``folder`` is too long for its file
    system (``PC_NAME_MAX``: 255 bytes where the system does not say), or the whole path is
    (``PC_PATH_MAX``: 4096)."""
    name_max, path_max = _limit(folder, "PC_NAME_MAX", 255), _limit(folder, "PC_PATH_MAX", 4096)
    if len(os.fsencode(path)) >= path_max:
        raise UsageError(
            f"cannot write {option} {shown}: the path is longer than its file system allows "
            f"({path_max - 1} bytes)"
        )
    inside = path.parts[: len(folder.parts)] == folder.parts
    missing = path.parts[len(folder.parts) :] if inside else (path.name,)
    for name in missing:
        if len(os.fsencode(name)) > name_max:
            raise UsageError(
                f"cannot write {option} {shown}: the name {shorten(name, quote=True)} is longer "
                f"than its file system allows ({name_max} bytes)"
            )


def _limit(folder: Path, name: str, default: int) -> int:
    """``os.pathconf(folder, name)``, or ``default`` where the system does not say."""
    try:
        value = os.pathconf(folder, name)
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows), or no answer
        return default
    return value if value and value > 0 else default


def ensure_writable(
    out: Path,
    option: str = "--out",
    files: Iterable[str] = REPORT_FILES,
    folders: Iterable[str] = REPORT_FOLDERS,
) -> list[Path]:
    """UsageError unless ``out`` is (or can be made) a folder that a run can write ``files``
    and ``folders`` into; returns the folders it created (``created_by``), deepest first.

    ``out`` is the user's: a link there is followed to its folder. What is inside it is the
    run's, and nothing is written through a link the run did not make: a file the run writes
    may be a link (it is replaced, never followed), a folder may not. Refused in one line:
    ``out`` an existing file or a link to nothing, one of ``files`` a folder or not a regular
    file, one of ``folders`` a file or a link. A folder it creates is removed again when it
    then fails.
    """
    shown = shorten(out, quote=True)
    if out.resolve() == Path(out.resolve().anchor):
        raise UsageError(f"{option} {shown} is the file system's root: name a folder of its own")
    try:
        if out.is_symlink() and not out.exists():
            raise UsageError(
                f"{option} {shown} is a link to {shorten(os.readlink(out), quote=True)}, "
                "which does not exist"
            )
        if out.exists() and not out.is_dir():
            raise UsageError(f"{option} {shown} is a file, not a folder")
        for name in files:
            if _kind(out / name) not in (None, "file", "link"):
                raise UsageError(f"cannot write to {option} {shown}: {name} in it is not a file")
        for name in folders:
            kind = _kind(out / name)
            if kind == "link":
                raise UsageError(
                    f"cannot write to {option} {shown}: {name} in it is a link, not a folder "
                    "(nothing is written through a link)"
                )
            if kind not in (None, "folder"):
                raise UsageError(f"cannot write to {option} {shown}: {name} in it is not a folder")
    except UsageError:
        raise
    except OSError as exc:
        raise UsageError(f"cannot write to {option} {shown}: {exc.strerror or exc}") from None
    except ValueError as exc:  # an embedded NUL
        raise UsageError(f"cannot write to {option} {shown}: {exc}") from None
    created = [p for p in (out, *out.parents) if not _exists(p)]
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".probe-"):
            pass
    except OSError as exc:
        _remove_folders(created)
        raise UsageError(f"cannot write to {option} {shown}: {exc.strerror or exc}") from None
    except BaseException:
        _remove_folders(created)
        raise
    return created


def _kind(path: Path) -> str | None:
    """What is at ``path``, links not followed: None (nothing), "file", "folder", "link" or
    "other" (a device, a FIFO, a socket)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        if exc.errno in MISSING:
            return None
        raise
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "folder"
    return "file" if stat.S_ISREG(mode) else "other"


@contextlib.contextmanager
def created_by(folders: list[Path]) -> Iterator[None]:
    """Remove ``folders`` (``ensure_writable`` made them) when the block fails, however it
    fails, if they are still empty: a run that stops writes nothing, not even its folder."""
    try:
        yield
    except BaseException:
        _remove_folders(folders)
        raise


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _remove_folders(folders: list[Path]) -> None:
    """Remove the (empty) folders we created, deepest first; leave any that is not empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, then replace
    ``path`` with it in one step.

    Missing folders are created. The file gets the mode ``open()`` would give it (that of the
    file it replaces, else 0o666 less the umask), and no temporary file is left behind, however
    the write ends (an error, Ctrl-C).
    """
    path = Path(path)
    if path.is_symlink():  # write the file it points to, as open() would
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    """The process's umask, read without changing it where the system allows (Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: read by setting it, and set it straight back
    os.umask(mask)
    return mask
