"""Trigger search: the smallest shape on which a bug that usually raises runs silently.

Hypothesis draws small shapes and, once one triggers, shrinks it to the smallest it can find.
The search is derandomized and keeps no database, so the same call finds the same shape.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from harness.catalogue.card import Pair
from harness.catalogue.compare import runs_silently
from harness.catalogue.strategies import small_shapes
from harness.shapes import Shape

SEARCH_SETTINGS = settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
)


def find_trigger(
    pair: Pair, device: torch.device, dtype: torch.dtype, max_size: int = 4
) -> Shape | None:
    """The smallest shape (sizes up to ``max_size``) where the bug runs and diverges, or None."""
    try:
        return find(
            small_shapes(pair.card.has_heads, max_size),
            lambda shape: runs_silently(pair, device, dtype, shape),
            settings=SEARCH_SETTINGS,
        )
    except NoSuchExample:
        return None
