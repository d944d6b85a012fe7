"""What a forward that raised shows of its cause: the op that raised, and what was made for it.
A product of queries and keys that raises because the keys were transposed on the wrong axes
(``k.transpose(0, 1)`` where ``(-2, -1)`` was meant) is read from the transpose and the shapes
it left, whatever the sizes' values (a batch as large as the heads hides it from the error)."""

from __future__ import annotations

from harness.doctor.reading.record import Op, Record

PRODUCTS = frozenset({"matmul", "bmm", "__matmul__"})
SWAPS = frozenset({"transpose", "swapaxes", "swapdims"})


def keys_transposed(found: Record, raised: Op) -> tuple[Op, tuple[int, int]] | None:
    """The transpose that made a raising product's second operand, and its two axes, when it
    left the operand's last axis in place and both operands laid out alike, (..., T, d) and
    (..., S, d): the product needed the keys' last two axes swapped."""
    if raised.name not in PRODUCTS or len(raised.args) < 2:
        return None
    queries, keys = raised.args[0], raised.args[1]
    swap = found.producer(keys)
    if swap is None or swap.name not in SWAPS or not queries.shape or not keys.shape:
        return None
    rank = len(keys.shape)
    axes = tuple(int(a) % rank for a in (swap.const(1, "dim0"), swap.const(2, "dim1")))
    if rank - 1 in axes or queries.shape[-1] != keys.shape[-1]:
        return None
    return swap, (axes[0], axes[1])


RESHAPES = frozenset({"view", "reshape"})


def _sizes(op: Op) -> list[int] | None:
    """A view's or reshape's sizes, given one by one or as one tuple (None: not all known)."""
    given = [a.constant for a in op.args[1:]]
    if len(given) == 1 and isinstance(given[0], tuple | list):
        given = list(given[0])
    return [int(s) for s in given] if all(isinstance(s, int) for s in given) else None


def heads_before_positions(raised: Op) -> bool:
    """A view (or reshape) that raised splitting a (B, T, h d) projection as (B, h, T, d): the
    heads asked for before the positions (which a split tensor's strides refuse; a contiguous
    one would have cut the positions up silently)."""
    if raised.name not in RESHAPES or not raised.args or not raised.args[0].shape:
        return False
    shape, sizes = raised.args[0].shape, _sizes(raised)
    if len(shape) != 3 or sizes is None or len(sizes) != 4:
        return False
    batch, positions, width = shape
    if sizes.count(-1) == 1:  # the one size left for the view to infer
        known = -1 * sizes[0] * sizes[1] * sizes[2] * sizes[3]
        sizes = [batch * positions * width // known if s == -1 else s for s in sizes]
    b, h, t, d = sizes
    return b == batch and t == positions and h * d == width and h != positions
