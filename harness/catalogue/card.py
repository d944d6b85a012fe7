"""A trap's card and its pair of modules: the contract every ``pitfalls/<id>/`` folder keeps.

A folder holds ``__init__.py`` (its ``CARD``, and any experiment particular to the trap),
``buggy.py``, ``fixed.py`` and ``test_<id>.py``. Cards import this module and the core only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pandas as pd
import torch
from torch import Tensor, nn

from harness.catalogue.verdicts import Verdict
from harness.inputs import Inputs, make_inputs
from harness.masks import CONVENTIONS, KINDS, MaskSpec
from harness.shapes import DEFAULT_SHAPE, Shape

__all__ = [
    "CATEGORIES",
    "EDGES",
    "NOT_NAMED",
    "Card",
    "Pair",
    "Verdict",
    "multi_head",
    "single_head",
]

StateDict = Mapping[str, Tensor]

NOT_NAMED = "—"  # the section of a trap the tutorial does not name
CATEGORIES = ("scale", "masks", "layout", "numerics", "initialisation", "performance")
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
    section: str  # the tutorial's section that names the trap, e.g. "§4.2"; "—" when none does
    category: str  # one of CATEGORIES
    claim: str  # what the tutorial says
    trap: str  # the bug, in one sentence
    truth: str  # what measurement shows
    why: str  # why it matters
    avoid: str  # how to avoid it
    expected: Verdict
    build: Callable[[ModuleType, Shape], nn.Module] = single_head
    has_heads: bool = False
    mask: str = "none"  # which keys the module must block: one of harness.masks.KINDS
    convention: str = "keep"  # how the mask is passed: a name in harness.masks.CONVENTIONS
    edge: str = "none"  # one of EDGES: the edge inputs measured after the ordinary ones
    input_scale: float = 1.0  # standard deviation of x for the "large" edge inputs
    shared_weights: bool = True  # False: compared over n_seeds seeds (the bug is the weights)
    n_seeds: int = 16
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
        if self.mask not in KINDS:
            raise ValueError(f"{self.id}: mask {self.mask!r} not in {KINDS}")
        if self.convention not in CONVENTIONS:
            raise ValueError(
                f"{self.id}: convention {self.convention!r} not in {tuple(CONVENTIONS)}"
            )
        if self.edge not in EDGES:
            raise ValueError(f"{self.id}: edge {self.edge!r} not in {EDGES}")

    @property
    def spec(self) -> MaskSpec | None:
        """How the modules take their mask; None when they take none or mask by themselves."""
        return None if self.mask == "none" else CONVENTIONS[self.convention]

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
        """The trap's folder, where ``buggy.py`` and ``fixed.py`` live."""
        return Path(self.fixed.__file__).parent
