"""Results kept between runs, keyed by the content of what made them.

A key is a hash of everything a result depends on: the files it was computed from (a pair's
folder, the harness's own code), the versions of the libraries that computed it, the machine's
CPU kernels, and the run's options. A run whose inputs did not change finds its results here; a
change in any input gives a new key, so nothing stale is ever read. Entries are pickles (a
report run's receipt, read before anything else, is JSON, whose loading runs no code), written
atomically; one that cannot be read (cut short, or made by code whose classes moved) is a miss.
A pickle runs code when loaded: the store is the user's own folder, as trusted as their code.

The store lives in the user's cache folder (``$XDG_CACHE_HOME/attention-pitfalls``, else
``~/.cache/attention-pitfalls``), or where ``ATTENTION_PITFALLS_CACHE`` points; deleting that
folder clears it, and it is kept under ``LIMIT`` bytes by dropping the entries used least
recently.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.arithmetic import identity

ENV = "ATTENTION_PITFALLS_CACHE"
LIMIT = 512 * 2**20  # bytes the store may hold
SUFFIX = ".pickle"
JSON = ".json"
# Libraries whose arithmetic or rendering a stored result depends on.
LIBRARIES = (
    "torch", "numpy", "pandas", "matplotlib", "tabulate", "transformers", "x-transformers", "timm",
)  # fmt: skip
PARTIAL = "attention-pitfalls-"  # the prefix of this store's writes in progress (".partial")
STALE = 3600  # seconds after which a write still in progress was cut short: removed
HARNESS = Path(__file__).resolve().parents[1]  # the harness package


def default_folder() -> Path:
    """Where the store lives unless told otherwise."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attention-pitfalls"


def digest_files(paths: Iterable[Path], root: Path) -> str:
    """A hash of the files' names (relative to ``root``) and contents, in name order."""
    h = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.relative_to(root).as_posix()):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def source_files(folder: Path, pattern: str = "*.py") -> list[Path]:
    """The files under ``folder`` that match ``pattern`` (Python's by default), caches left
    out."""
    return [p for p in folder.rglob(pattern) if p.is_file() and "__pycache__" not in p.parts]


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


@cache
def environment() -> str:
    """A hash of what computes a result besides the files: the harness's code, Python and the
    libraries' versions, and what decides how this machine rounds float32 (``arithmetic``)."""
    parts = [
        digest_files(source_files(HARNESS), HARNESS),
        sys.version,
        identity(),  # the CPU and the settings that move its float32 kernels
        *(f"{name}={_version(name)}" for name in LIBRARIES),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def key(*parts: object, files: Iterable[Path] = (), root: Path | None = None) -> str:
    """The key of a result made from ``files`` (named relative to ``root``) and ``parts`` (the
    run's options, by their ``repr``), in this environment."""
    files = list(files)
    digest = digest_files(files, root or Path("/")) if files else ""
    text = "\n".join([environment(), digest, *map(repr, parts)])
    return hashlib.sha256(text.encode()).hexdigest()


# How an entry is written and read, by its suffix: results (tensors, frames) as pickles; JSON
# for plain data read before anything else (a receipt), whose loading runs no code.
FORMS: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]] = {
    SUFFIX: (lambda v: pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL), pickle.loads),
    JSON: (lambda v: json.dumps(v, sort_keys=True).encode(), json.loads),
}


class Store:
    """Results by key in one folder, pickled (or as JSON: ``form``); ``folder=None`` keeps
    nothing."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.hits = self.misses = 0

    def _path(self, key: str, form: str = SUFFIX) -> Path:
        assert self.folder is not None
        return self.folder / f"{key}{form}"

    def get(self, key: str, form: str = SUFFIX) -> Any | None:
        """The result stored under ``key``; None when there is none or it cannot be read."""
        if self.folder is None:
            return None
        path = self._path(key, form)
        try:
            value = FORMS[form][1](path.read_bytes())
        except FileNotFoundError:
            self.misses += 1
            return None
        except Exception:  # cut short, or its classes moved: a miss, and gone
            with contextlib.suppress(OSError):
                path.unlink()
            self.misses += 1
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the last to be dropped
        self.hits += 1
        return value

    def put(self, key: str, value: Any, form: str = SUFFIX) -> None:
        """Store ``value`` under ``key`` in one step; a store that cannot be written is skipped
        (the run's results do not depend on it)."""
        if self.folder is None:
            return
        try:
            data = FORMS[form][0](value)
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=self.folder, prefix=PARTIAL, suffix=".partial")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(temp, self._path(key, form))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
        except (OSError, pickle.PicklingError, TypeError, ValueError, AttributeError):
            return

    def prune(self, limit: int = LIMIT) -> None:
        """Drop the entries used least recently until the store holds at most ``limit``
        bytes, and this store's writes cut short (older than ``STALE``: a younger one may be
        another run's, still writing; a file of another name is not this store's)."""
        if self.folder is None or not self.folder.is_dir():
            return
        now = time.time()
        for partial in self.folder.glob(f"{PARTIAL}*.partial"):
            with contextlib.suppress(OSError):
                if now - partial.stat().st_mtime > STALE:
                    partial.unlink()
        entries = []
        for path in (p for form in FORMS for p in self.folder.glob(f"*{form}")):
            with contextlib.suppress(OSError):
                info = path.stat()
                entries.append((info.st_mtime, info.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= limit:
                break
            with contextlib.suppress(OSError):
                path.unlink()
                total -= size
