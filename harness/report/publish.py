"""Replace a report folder's files as one unit.

A report is ``report.md``, its companion pages (``harness.files.PAGES``) and the pictures they
link under ``img/``. A new one is rendered into a staging folder inside the destination. Then,
holding an exclusive lock on the destination (so two runs into one folder take turns): the
pictures move in under names that carry a hash of their bytes, so a new picture never takes the
name of one an old page shows; the companion pages, then ``report.md``, each replace the old one
in one ``os.replace``; and only then are the pictures the old pages linked and the new ones do
not removed. A reader sees each page old or new, never half-written, and every picture a page
links is there; an interrupted run leaves the old report whole; nothing the report did not link
is ever removed. A staging folder left by a run that was killed outright (SIGKILL cannot be
caught) is removed by the next run; so are the pictures an install killed halfway had moved in
or was removing (it lists them first in ``.installing``), unless a page links them.
Nothing is written through a link inside the destination: ``os.replace`` replaces a link, and
the callers refuse an ``img`` that is one (``files.ensure_writable``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness.files import PAGES
from harness.report.format import HASH_DIGITS

STAGING = ".staging-"
JOURNAL = ".installing"  # the pictures an install is moving in and removing, one per line
IMAGE_PATH = r"img/[\w.-]+\.png"  # never outside img/
LINKED_IMAGE = re.compile(rf"!\[[^\]]*\]\(({IMAGE_PATH})\)")
LINKED_IMAGE_PATH = re.compile(rf"^{IMAGE_PATH}$")


def linked_images(text: str) -> set[str]:
    """The ``img/...png`` paths a report's markdown shows."""
    return set(LINKED_IMAGE.findall(text))


def hashed_name(path: Path) -> str:
    """``img/mask_bool.png`` -> ``img/mask_bool-1a2b3c4d5e.png``: the name carries the bytes."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:HASH_DIGITS]
    return f"{path.parent.name}/{path.stem}-{digest}{path.suffix}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_abandoned(out: Path) -> None:
    """Remove staging folders whose run no longer exists."""
    for folder in out.glob(f"{STAGING}*"):
        pid = folder.name.removeprefix(STAGING).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def staging(out: Path) -> Iterator[Path]:
    """A fresh staging folder inside ``out``, removed when the block ends, however it ends."""
    remove_abandoned(out)
    folder = Path(tempfile.mkdtemp(dir=out, prefix=f"{STAGING}{os.getpid()}-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on the folder ``out`` (released when the process ends, too)."""
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def install(
    staged: Path,
    out: Path,
    report: str,
    pictures: list[str],
    others: list[str],
    linked_before: set[str],
) -> None:
    """Move a staged report into ``out`` as one unit (call it holding ``locked(out)``).

    ``pictures`` are already under their hashed names; ``others`` (files apart from the report,
    such as wall-clock timings) are replaced before ``report`` and never removed;
    ``linked_before``, the pictures the report being replaced links (``linked_images``), are
    removed once it is replaced, but for those the new one links too. Pictures that a killed
    install left (``JOURNAL``) are removed first, but for those ``report`` links.
    """
    finish_abandoned(out, report)
    new = [name for name in pictures if not os.path.lexists(out / name)]
    dropped = sorted(linked_before - set(pictures))
    (staged / JOURNAL).write_text("".join(f"{name}\n" for name in [*new, *dropped]))
    os.replace(staged / JOURNAL, out / JOURNAL)
    if pictures:
        (out / Path(pictures[0]).parent).mkdir(exist_ok=True)
    for name in [*pictures, *others, report]:
        os.replace(staged / name, out / name)
    for name in dropped:
        (out / name).unlink(missing_ok=True)
    (out / JOURNAL).unlink()


def finish_abandoned(out: Path, report: str) -> None:
    """Finish an install that was killed halfway: remove the pictures its journal lists that
    ``out/report`` (or another of its pages) does not link, then the journal (call it holding
    ``locked(out)``)."""
    journal = out / JOURNAL
    if not os.path.lexists(journal):
        return
    listed = set()
    if journal.is_file() and not journal.is_symlink():
        listed = {name for name in journal.read_text().split("\n") if LINKED_IMAGE_PATH.match(name)}
    shown = [out / name for name in {report, *PAGES}]
    linked = {name for page in shown if page.is_file() for name in linked_images(page.read_text())}
    for name in listed - linked:
        (out / name).unlink(missing_ok=True)
    journal.unlink()
