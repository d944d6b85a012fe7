"""A mask's cells against the declared keep-mask: what a fill or a mask handed to SDPA blocks,
laid out as the scores are, and where a mask the caller gave was turned or given its axes on
the way to them. Each names a trap where the cells say one (a mask read the wrong way round,
laid along the queries, a float 0/1 mask that SDPA adds), or none.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from harness.doctor.reading.attention import Site
from harness.doctor.reading.known import COMPUTED, Fact, Named
from harness.doctor.reading.masks import BLOCKING, Fill
from harness.doctor.reading.ops import FILL
from harness.doctor.reading.record import Op, Record


def unread_mask(site: Site) -> list[Fact]:
    """A mask the module is given that no op of this attention reads: an SDPA call with no
    ``attn_mask`` (only ``is_causal``, as Whisper's decoder layer makes it whenever a mask is
    passed), or scores with no fill at all."""
    if site.sdpa_mask is not None or site.fills:
        return []
    how = "the SDPA call gets no attn_mask" if site.sdpa else "nothing is filled or added"
    causal = ", only is_causal=True" if site.is_causal else ""
    said = f"given, but its values are never read: {how}{causal}"
    return [Fact("mask", said, COMPUTED, site.softmax.where)]


def zero_one(mask: torch.Tensor | None) -> bool:
    """A float tensor of 0s and 1s (where it does not block: a causal triangle may sit beside
    them): a keep-mask as floats, which a kernel that adds float masks adds."""
    if mask is None or not mask.is_floating_point():
        return False
    values = set(mask[mask > BLOCKING].unique().tolist())
    return values == {0.0, 1.0}


def sdpa_mask(
    site: Site, keep: torch.Tensor | None, causal: bool = False, found: Record | None = None
) -> Named | None:
    """What the mask given to SDPA does against the declared keep-mask (or, for a causal
    module given none, the causal one): a float 0/1 mask is added (nothing blocked), a bool
    one read the wrong way blocks what it should keep."""
    mask = site.sdpa_mask
    if mask is None:
        return None
    line = site.softmax.where
    if mask.is_floating_point():  # whatever the caller meant: a 0/1 float mask blocks nothing
        if zero_one(mask):
            fill = next((f for f in site.fills if f.op is site.softmax), None)
            cast = made_float(found, fill) if found is not None and fill is not None else None
            also = (cast.where,) if cast is not None and cast.where != line else ()
            return Named("sdpa_float_mask", "a float 0/1 mask is given to SDPA, which adds a "
                         "float mask to the scores: it blocks nothing", line, also)  # fmt: skip
        return None
    if mask.dtype != torch.bool:
        return None
    if keep is None and causal and mask.dim() >= 2 and mask.shape[-1] == mask.shape[-2] > 1:
        T = mask.shape[-1]
        future = torch.ones(T, T, dtype=torch.bool, device=mask.device).triu(1)
        if bool((mask == future).all()):  # True exactly where a causal mask blocks
            return Named("sdpa_mask_inverted", "the bool mask SDPA is given is True exactly on "
                         "the future (the keys a causal mask blocks): SDPA attends where True",
                         line)  # fmt: skip
    if keep is None or keep.all():
        return None
    for kept in keep_layouts(keep, mask):
        cells = mask.expand(kept.shape)
        past = _up_to_each_query(cells) if causal else None  # where its own triangle keeps
        if agrees_where_real(cells, ~kept, kept) or (
            past is not None and agrees_where_real(cells & past, ~kept & past, kept)
        ):
            return Named("sdpa_mask_inverted", "the bool mask SDPA is given is True where the "
                         "keep-mask blocks: SDPA attends where True", line)  # fmt: skip
    return None


def agrees_where_real(cells: torch.Tensor, expected: torch.Tensor, kept: torch.Tensor) -> bool:
    """``cells`` equal ``expected`` on every query row of a real token (one the keep-mask lets
    attend to itself); a padded query's row is the module's own business (ESM's mask from
    sequence ids lets padding attend to padding)."""
    if kept.shape[-1] != kept.shape[-2]:
        return torch.equal(cells, expected)
    real = kept.diagonal(dim1=-2, dim2=-1)[..., None].expand(kept.shape)
    return bool(real.any()) and torch.equal(cells[real], expected[real])


def keep_layouts(keep: torch.Tensor, cells: torch.Tensor) -> list[torch.Tensor]:
    """The declared (B, T, T) keep-mask laid out as ``cells`` (head axes added after the
    batch for 4-D scores, or 5-D ones of grouped heads), each way it may be (3-D scores that
    fold the heads into the batch, (B * h, T, T), hold a sequence's heads together, ``(b h)``,
    or each head's sequences, ``(h b)``); none when it does not broadcast to them."""
    kept = keep.to(cells.device)
    if cells.dim() > kept.dim() == 3:  # (B, 1, ..., T, T)
        kept = kept.reshape(kept.shape[0], *[1] * (cells.dim() - 3), *kept.shape[1:])
    layouts = [kept]
    batch, folded = kept.shape[0], cells.shape[0]
    if cells.dim() == kept.dim() and folded > batch > 0 and folded % batch == 0:
        heads = folded // batch
        layouts = [
            kept.repeat_interleave(heads, dim=0),
            kept.repeat(heads, *[1] * (kept.dim() - 1)),
        ]
    found = []
    for layout in layouts:
        try:  # the shape both broadcast to: a (B, 1, 1, T) mask meets the (B, 1, T, T) keep-mask
            found.append(layout.expand(torch.broadcast_shapes(layout.shape, cells.shape)))
        except RuntimeError:
            continue
    return found


def _left_open(cells: torch.Tensor, keep: torch.Tensor) -> torch.Tensor | None:
    """The cells a fill leaves open in the first sequence, which the caller's mask does not
    pad: where the module's own part of a joined mask (a window) keeps, laid as ``cells``, for
    the caller's part to decide (None: the first sequence is padded, or all of it blocked)."""
    if not bool(keep[0].all()) or cells.shape[0] != keep.shape[0]:
        return None
    room = ~cells[:1].expand(cells.shape)
    return room if bool(room.any()) and not bool(room.all()) else None


def _up_to_each_query(cells: torch.Tensor) -> torch.Tensor | None:
    """The cells of each query's own and earlier keys, laid as ``cells`` (None: not square)."""
    if cells.shape[-1] != cells.shape[-2]:
        return None
    T = cells.shape[-1]
    return torch.ones(T, T, dtype=torch.bool, device=cells.device).tril().expand(cells.shape)


PLACES = frozenset({"view", "reshape", "unsqueeze", "__getitem__", "permute", "transpose"})


def _mask_ops(found: Record, fill: Fill) -> Iterator[Op]:
    """The ops of the module's own code that made a fill's mask, nearest the fill first, each
    once."""
    todo, seen = [fill.mask], set()
    while todo:
        op = found.producer(todo.pop(0))
        if op is None or not op.line or op.index in seen:
            continue
        seen.add(op.index)
        yield op
        todo += [v for v in op.tensors if v.kind == "op"]


def made_float(found: Record, fill: Fill) -> Op | None:
    """Where the module made the mask a fill reads floats, from a bool or integer one
    (``mask.to(q.dtype)``, ``mask.float()``): nearest the fill, None where it never was."""
    for op in _mask_ops(found, fill):
        made = found.results[op.index]
        given = [found.result(v) for v in op.tensors if v.kind != "parameter"]
        if (
            made
            and made[0].is_floating_point()
            and any(t is not None and not t.is_floating_point() for t in given)
        ):
            return op
    return None


def _laid_out(found: Record | None, fill: Fill) -> tuple[str, ...]:
    """Where the mask a fill reads got the axes it has (the last view, index or unsqueeze
    before the fill, by the line that called it): where a mask laid along the wrong axis is
    fixed, when it is not the fill's own line."""
    for op in _mask_ops(found, fill) if found is not None else ():
        if op.name in PLACES and _from_caller(found, op):  # along the caller's mask
            return (op.where,) if op.where != fill.op.where else ()
    return ()


def turned_given(found: Record, fill: Fill) -> Op | None:
    """A transpose of the last two axes on the way from the caller's mask to a fill: the
    mask it was given, laid (queries, keys), turned to (keys, queries) before it is applied."""
    for op in _mask_ops(found, fill):
        if op.name in {"transpose", "swapaxes"} and op.args and op.args[0].shape:
            rank = len(op.args[0].shape)
            axes = {op.const(1, "dim0"), op.const(2, "dim1")}
            if all(isinstance(a, int) for a in axes) and {a % rank for a in axes} == {
                rank - 2, rank - 1,
            } and _from_caller(found, op):  # fmt: skip
                return op
    return None


def _from_caller(found: Record, op: Op) -> bool:
    """``op`` reads, at some remove, a tensor the caller handed in (the mask it was given)."""
    todo, seen = list(op.tensors), set()
    while todo:
        value = todo.pop()
        made = found.producer(value)
        if made is None:
            if value.kind == "tensor":  # handed in by the caller (the input data is "input")
                return True
            continue
        if made.index in seen:
            continue
        seen.add(made.index)
        if not made.line:  # made by the harness for the call
            return True
        todo += made.tensors
    return False


def fills_kept_cells(
    site: Site, keep: torch.Tensor | None, causal: bool = False, found: Record | None = None
) -> Named | None:
    """A fill that blocks exactly the cells the declared keep-mask keeps (and keeps the
    blocked ones): the mask read the wrong way round (in a causal module, on the cells up to
    each query, where its own triangle leaves the keep-mask to decide); or exactly the ones it
    blocks, with queries and keys swapped: a padding mask applied along the queries."""
    if keep is None or keep.all():
        return None
    for fill in site.fills:
        if site.sdpa and fill.value is not None:
            continue  # a bool mask SDPA is given, misread: sdpa_mask's to say
        cells = fill.cells
        if cells is None or cells.dim() < 2 or (fill.value is not None and fill.value > -1e3):
            continue  # a small fill is fill_too_small's; an added mask's cells are its large ones
        axes = site.fill_axes(cells)
        if axes is not None:  # queries and keys last, as the keep-mask lays them
            cells = cells.movedim(axes, (-2, -1))
        how = f"with {fill.value:g}" if fill.value is not None else "adding large negatives"
        for kept in keep_layouts(keep, cells):
            if kept.shape != cells.shape:
                continue
            past = _up_to_each_query(cells) if causal else _left_open(cells, keep)
            if agrees_where_real(cells, kept, kept) or (
                past is not None and agrees_where_real(cells & past, kept & past, kept)
            ):
                return Named("mask_bool", "the mask fills exactly the cells the keep-mask "
                             f"keeps ({how}): it is read the wrong way round",
                             *_where_filled(found, fill))  # fmt: skip
            turned = ~kept.transpose(-1, -2)
            if not torch.equal(kept, kept.transpose(-1, -2)) and (
                torch.equal(cells, turned)
                or (past is not None and torch.equal(cells & past, turned & past))
            ):
                return Named("padding_on_queries", "the mask blocks the padded queries' rows, "
                             "not the padded keys' columns: it is applied along the queries' "
                             "axis", fill.op.where, _laid_out(found, fill))  # fmt: skip
    return None


def _where_filled(found: Record | None, fill: Fill) -> tuple[str, tuple[str, ...]]:
    """Where a mask's cells were chosen: an added mask the module filled itself
    (``bias.masked_fill(bias == 1, lowest)``, then ``scores += bias``) at that fill, the add
    beside it; else where it meets the scores."""
    made = found.producer(fill.mask) if found is not None and fill.value is None else None
    if made is not None and made.line and made.name in FILL | {"where"}:
        return made.where, (fill.op.where,)
    return fill.op.where, ()
