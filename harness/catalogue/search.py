"""Trigger search: the smallest shape on which a bug that usually raises runs silently.

Hypothesis draws small shapes and, once one triggers, shrinks it to the smallest it can find.
The search is derandomized and keeps no database, so the same call finds the same shape, and
it writes nothing where it runs: hypothesis caches the constants it reads from local source
files under ``./.hypothesis`` even without a database, so that cache goes to a temporary folder,
removed after each search.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from hypothesis import HealthCheck, Phase, configuration, find, settings
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


@contextmanager
def scratch_storage() -> Iterator[Path]:
    """Hypothesis's storage folder (its ``.hypothesis``) moved to a temporary one in the block,
    then put back: what it writes there (the constants cache) is gone afterwards."""
    home = configuration.storage_directory()  # a Path in hypothesis < 6.131
    previous = getattr(home, "home_directory", home)
    with tempfile.TemporaryDirectory(prefix="attention-pitfalls-hypothesis-") as scratch:
        configuration.set_hypothesis_home_dir(scratch)
        try:
            yield Path(scratch)
        finally:
            configuration.set_hypothesis_home_dir(previous)


def find_trigger(
    pair: Pair, device: torch.device, dtype: torch.dtype, max_size: int = 4
) -> Shape | None:
    """The smallest shape (sizes up to ``max_size``) where the bug runs and diverges, or None."""
    try:
        with scratch_storage():
            return find(
                small_shapes(pair.card.has_heads, max_size),
                lambda shape: runs_silently(pair, device, dtype, shape),
                settings=SEARCH_SETTINGS,
            )
    except NoSuchExample:
        return None
