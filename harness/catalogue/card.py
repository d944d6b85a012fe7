"""A trap's card and its pair of modules: the contract every ``pitfalls/<id>/`` folder keeps.

A folder holds ``__init__.py`` (its ``CARD``, and any experiment particular to the trap),
``buggy.py``, ``fixed.py`` and ``test_<id>.py``. Cards import this module and the core only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

import pandas as pd
import torch
from torch import Tensor, nn

from harness.catalogue.verdicts import Verdict
from harness.inputs import Inputs, generator, make_inputs
from harness.masks import CONVENTIONS, KINDS, MaskSpec
from harness.scenarios import SCENARIOS, Scenario, positions_for
from harness.shapes import DEFAULT_SHAPE, MODERN_SHAPE, Shape

__all__ = [
    "CATEGORIES",
    "EDGES",
    "MODERN",
    "NOT_NAMED",
    "Card",
    "Pair",
    "Verdict",
    "grouped",
    "multi_head",
    "single_head",
]

StateDict = Mapping[str, Tensor]

NOT_NAMED = "—"  # the section of a trap the tutorial does not name
CATEGORIES = (
    "scale",
    "masks",
    "layout",
    "numerics",
    "initialisation",
    "performance",
    "positions",
    "caches",
    "heads",
)
# Edge inputs a trap may need beyond the ordinary draw: none; a sequence that is all padding
# (queries with no key at all); or activations scaled by the card's input_scale.
EDGES = ("none", "empty_row", "large")


def single_head(module: ModuleType, shape: Shape) -> nn.Module:
    """Build the tutorial's ``ScaledDotProductAttention(d_model, d_k, d_v)`` from ``module``."""
    return module.ScaledDotProductAttention(shape.d_model, shape.d_k, shape.d_v)


def multi_head(module: ModuleType, shape: Shape) -> nn.Module:
    """Build ``MultiHeadAttention(d_model, n_heads)`` from ``module``."""
    return module.MultiHeadAttention(shape.d_model, shape.heads)


def grouped(module: ModuleType, shape: Shape) -> nn.Module:
    """Build a modern ``Attention(d_model, n_heads, n_kv_heads)`` with half as many K/V heads
    (one when there is one head): grouped-query attention, as Llama's is."""
    return module.Attention(shape.d_model, shape.heads, max(1, shape.heads // 2))


# What every modern card shares: ``Card(..., **MODERN)``.
MODERN: dict[str, object] = dict(
    modern=True,
    build=grouped,
    has_heads=True,
    shape=MODERN_SHAPE,
    # what a user of these rotary modules knows: relative positions, paired i with i + d/2
    doctor={"positions": "relative", "rope_pairing": "half", "kv_grouping": "blocks"},
)


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
    # Modern pairs (report part "Modern attention") follow the extended contract
    # forward(x, mask=None, *, positions=None, cache=None) and are measured in a scenario of
    # harness.scenarios: "decode", "chunked", "reuse" need a KVCache class in both files.
    modern: bool = False
    scenario: str = "full"
    # The doctor options a user of these modules would declare (harness.doctor.Config fields,
    # e.g. rope_pairing="half"): what the detection table runs the doctor with.
    doctor: Mapping[str, object] = field(default_factory=dict)

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
        if self.scenario not in SCENARIOS:
            raise ValueError(f"{self.id}: scenario {self.scenario!r} not in {tuple(SCENARIOS)}")
        if self.scenario != "full" and not self.modern:
            raise ValueError(f"{self.id}: scenario {self.scenario!r} needs a modern pair")

    @property
    def how(self) -> Scenario:
        """The scenario the trap is measured in."""
        return SCENARIOS[self.scenario]

    @property
    def spec(self) -> MaskSpec | None:
        """How the modules take their mask; None when they take none or mask by themselves."""
        return None if self.mask == "none" else CONVENTIONS[self.convention]

    def inputs(self, shape: Shape, seed: int, edge: bool = False) -> Inputs:
        """The seeded inputs this trap is measured on: ordinary, or (``edge``) its edge case."""
        large = edge and self.edge == "large"
        empty = edge and self.edge == "empty_row"
        inputs = make_inputs(shape, seed, self.mask, self.input_scale if large else 1.0, empty)
        if self.how.positions == "default":
            return inputs
        gen = generator(seed + 7)
        positions = positions_for(self.how, shape.batch, shape.seq_len, gen)
        return replace(inputs, positions=positions)


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
