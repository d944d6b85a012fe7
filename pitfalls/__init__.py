"""The catalogue: one folder per trap, each a card plus a buggy/fixed pair of modules.

A folder ``pitfalls/<id>/`` holds ``__init__.py`` (its ``CARD``), ``buggy.py``, ``fixed.py`` and
``test_<id>.py``. The registry below discovers the folders; nothing is listed by hand.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType

import pandas as pd
import torch
from torch import Tensor, nn

from harness.inputs import Inputs, make_inputs
from harness.shapes import DEFAULT_SHAPE, Shape
from harness.verdicts import Verdict

StateDict = Mapping[str, Tensor]

CATEGORIES = ("scale", "masks", "layout", "numerics", "initialisation", "performance")
MASK_KINDS = ("none", "causal", "padding", "both")
# keep: 1/True = attend; drop: True = blocked (nn.MultiheadAttention); additive: float added to
# the scores; internal: the module builds its own mask and is called without one.
CONVENTIONS = ("keep", "keep_float", "drop", "additive", "key_padding", "internal")
# Edge inputs a trap may need beyond the ordinary draw: none; a sequence that is all padding
# (queries with no key at all); or activations scaled by the card's input_scale.
EDGES = ("none", "empty_row", "large")


def single_head(module: ModuleType, shape: Shape) -> nn.Module:
    """Build the tutorial's ``ScaledDotProductAttention(d_model, d_k, d_v)`` from ``module``."""
    return module.ScaledDotProductAttention(shape.d_model, shape.d_k, shape.d_v)


def multi_head(module: ModuleType, shape: Shape) -> nn.Module:
    """Build ``MultiHeadAttention(d_model, n_heads)`` from ``module``."""
    return module.MultiHeadAttention(shape.d_model, shape.heads)


@dataclass(frozen=True)
class Card:
    """Everything the harness and the report need to know about one trap."""

    id: str
    title: str
    section: str  # the tutorial's section, e.g. "§4.2"
    category: str  # one of CATEGORIES
    claim: str  # what the tutorial says
    trap: str  # the bug, in one sentence
    truth: str  # what measurement shows
    why: str  # why it matters
    avoid: str  # how to avoid it
    expected: Verdict
    build: Callable[[ModuleType, Shape], nn.Module] = single_head
    has_heads: bool = False
    mask: str = "none"  # which mask the module needs: one of MASK_KINDS
    convention: str = "keep"  # how the mask is passed: one of CONVENTIONS
    edge: str = "none"  # one of EDGES: the edge inputs measured after the ordinary ones
    input_scale: float = 1.0  # standard deviation of x for the "large" edge inputs
    shared_weights: bool = True  # False: compared over many seeds (the bug is the weights)
    shape: Shape = DEFAULT_SHAPE  # the measurement shape
    # Where the bug changes the parameters: map fixed weights onto the buggy module, and the buggy
    # module's gradients back onto the fixed names (names it cannot map are kept as they are).
    to_buggy: Callable[[StateDict, Shape], dict[str, Tensor]] | None = None
    to_fixed: Callable[[StateDict, Shape], dict[str, Tensor]] | None = None
    # Trap-specific numbers for the report (a table), e.g. the scale values or a time ratio.
    extra: Callable[[Pair, torch.device, torch.dtype], pd.DataFrame] | None = None
    sources: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"{self.id}: category {self.category!r} not in {CATEGORIES}")
        if self.mask not in MASK_KINDS:
            raise ValueError(f"{self.id}: mask {self.mask!r} not in {MASK_KINDS}")
        if self.convention not in CONVENTIONS:
            raise ValueError(f"{self.id}: convention {self.convention!r} not in {CONVENTIONS}")
        if self.edge not in EDGES:
            raise ValueError(f"{self.id}: edge {self.edge!r} not in {EDGES}")

    def inputs(self, shape: Shape, seed: int, edge: bool = False) -> Inputs:
        """The seeded inputs this trap is measured on: ordinary, or (``edge``) its edge case."""
        large = edge and self.edge == "large"
        empty = edge and self.edge == "empty_row"
        return make_inputs(shape, seed, self.mask, self.input_scale if large else 1.0, empty)


@dataclass(frozen=True)
class Pair:
    """A card with its two modules."""

    card: Card
    buggy: ModuleType
    fixed: ModuleType

    @property
    def folder(self) -> Path:
        return Path(__file__).parent / self.card.id


class UnknownPitfall(LookupError):
    """Raised for an id that has no folder; the message lists the known ids."""

    def __init__(self, pitfall_id: str, known: list[str]):
        super().__init__(f"unknown pitfall {pitfall_id!r}; known: {', '.join(known)}")
        self.pitfall_id = pitfall_id
        self.known = known


@cache
def ids() -> tuple[str, ...]:
    """The ids of every trap folder, sorted."""
    root = Path(__file__).parent
    return tuple(sorted(m.name for m in pkgutil.iter_modules([str(root)]) if m.ispkg))


def load(pitfall_id: str) -> Pair:
    """The card and both modules of one trap; ``UnknownPitfall`` for an unknown id."""
    if pitfall_id not in ids():
        raise UnknownPitfall(pitfall_id, list(ids()))
    package = importlib.import_module(f"{__name__}.{pitfall_id}")
    card = package.CARD
    if card.id != pitfall_id:
        raise ValueError(f"folder {pitfall_id!r} holds a card with id {card.id!r}")
    buggy = importlib.import_module(f"{__name__}.{pitfall_id}.buggy")
    fixed = importlib.import_module(f"{__name__}.{pitfall_id}.fixed")
    return Pair(card, buggy, fixed)


def load_all() -> list[Pair]:
    """Every trap, in id order."""
    return [load(i) for i in ids()]
