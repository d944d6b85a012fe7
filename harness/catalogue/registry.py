"""Discovery of the catalogue: every folder of the ``pitfalls`` package is one trap.

The traps are data, found by name at run time, so the harness never imports ``pitfalls``
statically and nothing is listed by hand. The catalogue is the one installed with the harness
(its folder beside ``harness/``), never another package of that name that the working directory
or ``sys.path`` happens to hold: ``python -m harness`` run from a folder with a ``pitfalls/`` of
its own still measures this one.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

from harness.catalogue import HOME, PACKAGE
from harness.catalogue.card import Pair
from harness.errors import UsageError, did_you_mean, shorten


class UnknownPitfall(LookupError):
    """Raised for an id that has no folder; the message lists the known ids, ``suggestion`` the
    close ones (``did you mean 'mask_bool'?``, or ``""``)."""

    def __init__(self, pitfall_id: str, known: list[str]):
        super().__init__(
            f"unknown pitfall {shorten(pitfall_id, quote=True)}; known: {', '.join(known)}"
        )
        self.pitfall_id = pitfall_id
        self.known = known
        self.suggestion = did_you_mean(pitfall_id, known)


def package() -> ModuleType:
    """The catalogue package installed with the harness, imported from its own folder.

    A ``pitfalls`` already imported from elsewhere (another project's package of that name) is a
    UsageError: its traps would be taken for these.
    """
    loaded = sys.modules.get(PACKAGE)
    if loaded is not None:
        if _folder(loaded) != HOME:
            raise UsageError(
                f"a different package named {PACKAGE!r} is already imported (from "
                f"{shorten(_folder(loaded))}); the catalogue is {shorten(HOME)}"
            )
        return loaded
    init = HOME / "__init__.py"
    if not init.is_file():
        raise RuntimeError(f"the catalogue is missing: no {init}")
    spec = importlib.util.spec_from_file_location(
        PACKAGE, init, submodule_search_locations=[str(HOME)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module  # its submodules (pitfalls.<id>) import through it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[PACKAGE]
        raise
    return module


def _folder(module: ModuleType) -> Path | None:
    """The folder a package was imported from (None: a namespace or built-in module)."""
    locations = list(getattr(module, "__path__", []) or [])
    return Path(locations[0]).resolve() if len(locations) == 1 else None


@cache
def ids() -> tuple[str, ...]:
    """The ids of every trap folder, sorted."""
    folders = pkgutil.iter_modules(list(package().__path__))
    return tuple(sorted(m.name for m in folders if m.ispkg))


def load(pitfall_id: str) -> Pair:
    """The card and both modules of one trap; ``UnknownPitfall`` for an unknown id."""
    if pitfall_id not in ids():
        raise UnknownPitfall(pitfall_id, list(ids()))
    package = importlib.import_module(f"{PACKAGE}.{pitfall_id}")
    card = package.CARD
    if card.id != pitfall_id:
        raise ValueError(f"folder {pitfall_id!r} holds a card with id {card.id!r}")
    buggy = importlib.import_module(f"{PACKAGE}.{pitfall_id}.buggy")
    fixed = importlib.import_module(f"{PACKAGE}.{pitfall_id}.fixed")
    return Pair(card, buggy, fixed)


def load_all() -> list[Pair]:
    """Every trap, in id order."""
    return [load(i) for i in ids()]
