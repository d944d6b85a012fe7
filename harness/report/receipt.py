"""A report run's receipt: what it left in its folder, kept in the store under a key of what it
was made from, so that a run with nothing to do says so before it imports torch.

The key (``run_key``) holds everything a report is made from: the catalogue's files, the
harness's code and the libraries' versions (``store.environment``), the CPU, the devices torch
offers here, and the command's options as given. The receipt is the folder as the run left it:
the hash of each file at its top (``report.md``, its companion pages, ``timings.md``, and
whatever else lies there, as another command's ``zoo.md``) and in ``img/``, and the names of its
hidden entries (a run's staging folder, an install's journal); its other folders are not read.
A later run with the same key whose folder is exactly that has nothing to do: measuring again
would reuse every stored result and keep the report as it is. Any other change (a page edited
by hand, a picture removed, another run's leftovers) takes the whole path.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from harness.arithmetic import identity
from harness.catalogue import HOME
from harness.files import IMAGES
from harness.report import store
from harness.report.store import Store

Receipt = dict[str, str]  # a folder's own files by name (img/ ones as img/NAME): sha256; hidden
# entries as .NAME: ""


def devices_without_torch() -> list[str] | None:
    """The devices torch offers here when that is known without importing it: a CPU-only build
    (its version ends ``+cpu``) or one for macOS offers the CPU alone; None where only torch can
    tell."""
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None
    return ["cpu"] if version.endswith("+cpu") or sys.platform == "darwin" else None


def run_key(
    devices: Sequence[str] | None,
    dtypes: Sequence[str] | None,
    learn: bool,
    out: Path,
    available: Sequence[str],
) -> str:
    """The key of a report run with these options (as the command line gives them: None for the
    default) into ``out``, on a machine whose torch offers ``available``."""
    files = store.source_files(HOME, "*")
    options = [devices, dtypes, learn, str(out.resolve()), list(available), identity()]
    return store.key("report run", *options, files=files, root=HOME)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def receipt(out: Path) -> Receipt:
    """The folder ``out`` as it is now: its own files and those in ``img/`` by hash, the names
    of its hidden entries; its other folders are not the report's."""
    found: Receipt = {}
    for entry in os.scandir(out):
        if entry.name.startswith("."):
            found[entry.name] = ""
        elif entry.is_file(follow_symlinks=False):
            found[entry.name] = _sha256(Path(entry.path))
    images = out / IMAGES
    if images.is_dir() and not images.is_symlink():
        for entry in os.scandir(images):
            if entry.is_file(follow_symlinks=False):
                found[f"{IMAGES}/{entry.name}"] = _sha256(Path(entry.path))
    return found


def keep(kept: Store, key: str, out: Path) -> None:
    """Keep the receipt of the report run ``key``, which has just left ``out`` as it is."""
    kept.put(key, receipt(out), form=store.JSON)  # read before torch: JSON runs no code


def unchanged(kept: Store, key: str, out: Path) -> bool:
    """Whether the store holds a receipt for ``key`` and ``out`` is still as that run left it."""
    held = kept.get(key, form=store.JSON)
    if not isinstance(held, dict) or not out.is_dir():
        return False
    try:
        return receipt(out) == held
    except OSError:  # a file going as it is read: something is at work in the folder
        return False
