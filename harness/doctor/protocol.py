"""What a ``--call`` adapter is, and what it may say of the calls it makes: one typed reading.

An adapter is a function ``fn(module, x, *, positions, mask, cache)`` that calls the module the
way the user's model does (``harness.doctor.adapters`` ships two; the model doctor's recorded call,
``harness.doctor.model.replay.Replay``, is one too). What it knows about those calls it says as
attributes of itself, each optional: ``Adapter`` reads them, here and nowhere else, each with the
default that holds for a plain function. They are read when first asked, not when the adapter is
wrapped: the model doctor's recorded call measures some of them by running its model.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Protocol

from torch import Tensor, nn


class CallAdapter(Protocol):
    """``fn(module, x, *, positions, mask, cache)``: the module's output, or (output, weights)."""

    def __call__(
        self, module: nn.Module, x: Tensor, *, positions: Tensor, mask: Tensor | None,
        cache: object,
    ) -> object: ...  # fmt: skip


class Adapter:
    """An adapter (or none: every answer its default) and what it says of its calls."""

    def __init__(self, call: CallAdapter | None) -> None:
        self.call = call

    def _said(self, name: str, default: object) -> object:
        return getattr(self.call, name, default) if self.call is not None else default

    @property
    def kv_grouping(self) -> str:
        """How its library lays out grouped K/V heads: blocks, strided, or auto (not said)."""
        return str(self._said("kv_grouping", "auto"))

    @property
    def from_model(self) -> bool:
        """What it hands the layer is its model's own (its mask, its positions)."""
        return bool(self._said("from_model", False))

    @property
    def hands_rotary_tables(self) -> bool:
        """Its model hands the layer rotary tables it makes (litgpt's attn(x, cos, sin))."""
        return bool(self._said("hands_rotary_tables", False))

    @property
    def ignores_positions(self) -> bool:
        """The positions a probe asks cannot reach the layer (its caller has none to give)."""
        return bool(self._said("ignores_positions", False))

    @property
    def context(self) -> int | None:
        """The longest sequence its caller makes, when it says."""
        value = self._said("context", None)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def unused_by_model(self) -> frozenset[str] | None:
        """The layer's parameters its model never reaches, when it says (None: not known)."""
        value = self._said("unused_by_model", None)
        return frozenset(value) if value is not None else None

    def make_cache(self) -> Callable[[], object] | None:
        """How to make an empty cache: its own ``make_cache``, else the one its file defines."""
        if self.call is None:
            return None
        make = getattr(self.call, "make_cache", None)
        home = sys.modules.get(getattr(self.call, "__module__", "") or "")
        make = make or getattr(home, "make_cache", None)
        return make if callable(make) else None
