"""Hypothesis strategies for shapes: small ones for trigger search, awkward ones for tests."""

from __future__ import annotations

from hypothesis import strategies as st

from harness.shapes import Shape

HEAD_COUNTS = (1, 2, 4)

# Shapes where layout bugs hide: two sizes that coincide let a wrong axis go unnoticed.
AWKWARD_CASES = ("any", "batch == seq_len", "d_v == seq_len", "odd d_k")


@st.composite
def small_shapes(draw: st.DrawFn, has_heads: bool = False, max_size: int = 4) -> Shape:
    """Every size drawn independently from 1..max_size (heads from 1, 2, 4)."""
    size = st.integers(1, max_size)
    batch, seq_len, d_k = draw(size), draw(size), draw(size)
    if has_heads:
        heads = draw(st.sampled_from(HEAD_COUNTS))
        return Shape(batch, seq_len, heads * d_k, d_k, d_k, heads)
    return Shape(batch, seq_len, draw(size), d_k, draw(size), 1)


@st.composite
def awkward_shapes(draw: st.DrawFn, has_heads: bool = False, max_size: int = 6) -> Shape:
    """Shapes that include batch == seq_len, d_v == seq_len and odd d_k on purpose."""
    case = draw(st.sampled_from(AWKWARD_CASES))
    shape = draw(small_shapes(has_heads, max_size))
    if case == "batch == seq_len":
        shape = shape.with_(batch=shape.seq_len)
    elif case == "d_v == seq_len" and not has_heads:
        shape = shape.with_(d_v=shape.seq_len)
    elif case == "d_v == seq_len":
        shape = shape.with_(
            d_k=shape.seq_len, d_v=shape.seq_len, d_model=shape.heads * shape.seq_len
        )
    elif case == "odd d_k":
        d_k = shape.d_k | 1
        d_model = shape.heads * d_k if has_heads else shape.d_model
        shape = shape.with_(d_k=d_k, d_v=d_k if has_heads else shape.d_v, d_model=d_model)
    return shape


@st.composite
def modern_shapes(draw: st.DrawFn, max_len: int = 9) -> Shape:
    """Shapes for modern pairs: 1, 2 or 4 heads of even width (rotary pairs dimensions), any
    batch and length, so decode and chunked prefill meet every split of the sequence."""
    heads = draw(st.sampled_from(HEAD_COUNTS))
    d_head = draw(st.sampled_from((2, 4, 6)))
    batch, seq_len = draw(st.integers(1, 3)), draw(st.integers(1, max_len))
    return Shape(batch, seq_len, heads * d_head, d_head, d_head, heads)
