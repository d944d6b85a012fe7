"""Which query heads read one K/V head: the values the attention reads, as the recorded forward
holds them, split by head, where some heads are copies of others (K/V heads repeated for
grouped queries)."""

from __future__ import annotations

from torch import Tensor

HEADS = 1  # the heads' axis of the values an attention reads, (B, h, S, d)


def shared_heads(values: Tensor | None) -> list[frozenset[int]] | None:
    """The query heads that read copies of one K/V head's values, one set per K/V head in order
    of their first query head; None where the values are not (B, h, S, d) or no head copies
    another (every head its own, or grouped queries that read the K/V heads themselves)."""
    if values is None or values.dim() != 4 or values.shape[HEADS] < 2:
        return None
    count = values.shape[HEADS]
    heads = values.detach().movedim(HEADS, 0).reshape(count, -1)
    shared: list[list[int]] = []
    for i in range(count):
        same = next((s for s in shared if heads[s[0]].equal(heads[i])), None)
        if same is None:
            shared.append([i])
        else:
            same.append(i)
    if len(shared) == count:
        return None
    return [frozenset(s) for s in shared]


def grouping(shared: list[frozenset[int]]) -> str:
    """How K/V heads are copied across the query heads: in blocks (``repeat_interleave``), strided
    (``repeat``), or neither."""
    heads, kv_heads = sum(len(s) for s in shared), len(shared)
    n_rep = heads // kv_heads
    if shared == [frozenset(range(j * n_rep, (j + 1) * n_rep)) for j in range(kv_heads)]:
        return "blocks"
    if shared == [frozenset(range(j, heads, kv_heads)) for j in range(kv_heads)]:
        return "strided"
    return "neither"
