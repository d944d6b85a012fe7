"""The shape of one measurement: batch, sequence length, widths and heads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class Shape:
    """Sizes for building a pair and drawing its inputs.

    Single-head modules use ``d_k`` and ``d_v``; multi-head modules use ``heads`` and take
    ``d_k = d_v = d_model // heads``.
    """

    batch: int = 2
    seq_len: int = 5
    d_model: int = 16
    d_k: int = 8
    d_v: int = 6
    heads: int = 1

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Shape.{name} must be a positive int, got {value!r}")
        if self.d_model % self.heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by heads={self.heads}")

    def with_(self, **changes: int) -> Shape:
        """A copy with some sizes changed."""
        return replace(self, **changes)

    def label(self) -> str:
        """Compact text form, e.g. ``B=2 T=5 d_model=16 d_k=8 d_v=6 h=1``."""
        return (
            f"B={self.batch} T={self.seq_len} d_model={self.d_model} "
            f"d_k={self.d_k} d_v={self.d_v} h={self.heads}"
        )


# The default measurement shape is deliberately *not* a trigger shape: batch, seq_len, d_k and d_v
# all differ, so layout bugs that only run when two sizes coincide raise here.
DEFAULT_SHAPE = Shape()

# Modern pairs (rotary, grouped-query heads, caches): four heads of even width 8, two K/V heads,
# and eight tokens, so a cache holds a prefill of four and four decode steps.
MODERN_SHAPE = Shape(batch=2, seq_len=8, d_model=32, d_k=8, d_v=8, heads=4)
