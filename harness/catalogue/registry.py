"""Discovery of the catalogue: every folder of the ``pitfalls`` package is one trap.

The traps are data, found by name at run time, so the harness never imports ``pitfalls``
statically and nothing is listed by hand.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from functools import cache

from harness.catalogue.card import Pair
from harness.errors import did_you_mean, shorten

PACKAGE = "pitfalls"


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


@cache
def ids() -> tuple[str, ...]:
    """The ids of every trap folder, sorted."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the catalogue package {PACKAGE!r} is not installed")
    folders = pkgutil.iter_modules(list(spec.submodule_search_locations))
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
