"""The rotary table a model hands its layers: recorded at the first module that is handed one,
for tokens fed at a given position, to tell whether a model that keeps its cache inside counts
a cached token's position on from the cache or from 0 (``rope_cache_offset``)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import torch
from torch import Tensor, nn

from harness.doctor.model.call import ModelCall, positions_of, restore_state
from harness.doctor.model.replay import Recorded, _rotary_table


def _tables_in(value: Any) -> Iterator[Tensor]:
    """Every rotary table in a call's arguments, as one real tensor: a (cos, sin) pair stacked
    first, complex frequencies as (.., 2) reals."""
    if _rotary_table(value) is not None:
        if isinstance(value, tuple | list):
            yield torch.stack([t.detach().double() for t in value])
        else:
            table = value.detach()
            yield torch.view_as_real(table).double() if table.is_complex() else table.double()
        return
    if isinstance(value, tuple | list):
        for a, b in pairwise(value):
            if _cos_sin(a, b):  # passed apart (litgpt's attn(x, cos, sin, mask))
                yield torch.stack([a.detach().double(), b.detach().double()])
        for v in value:
            yield from _tables_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tables_in(v)


def _cos_sin(a: Any, b: Any) -> bool:
    """Two tensors of one shape, a cosine and a sine table: stacked last, points on the unit
    circle (``_rotary_table``'s own test)."""
    tensors = isinstance(a, Tensor) and isinstance(b, Tensor)
    if not (tensors and a.is_floating_point() and b.is_floating_point() and a.shape == b.shape):
        return False
    return _rotary_table(torch.stack([a, b], dim=-1)) is not None


def handed_table(model: nn.Module, call: ModelCall, ids: Tensor, start: int,
                 built: dict[str, Tensor]) -> Tensor | None:  # fmt: skip
    """The first rotary table the model (a copy, as built) hands a module in a forward on
    ``ids`` fed at positions ``start``..; None when no module is handed one."""
    model = copy.deepcopy(model)
    restore_state(model, built)

    def stop(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if next(_tables_in((args, kwargs)), None) is not None:
            raise Recorded(args, kwargs)

    handles = [m.register_forward_pre_hook(stop, with_kwargs=True) for m in model.modules()]
    try:
        with torch.no_grad():
            call.run(model, ids, positions=positions_of(ids, start))
    except Recorded as found:
        return next(_tables_in((found.args, found.kwargs)))
    finally:
        for handle in handles:
            handle.remove()
    return None


def row_of(full: Tensor, one: Tensor) -> list[int] | None:
    """The positions of ``full`` (a table for tokens 0..T-1) that ``one`` (the table for a
    single token) equals, along the axis where ``full`` has T rows and ``one`` has 1; None when
    no such axis matches their shapes."""
    for axis in range(full.dim()):
        rest = [n for i, n in enumerate(full.shape) if i != axis]
        if one.dim() != full.dim() or one.shape[axis] != 1:
            continue
        if rest != [n for i, n in enumerate(one.shape) if i != axis]:
            continue
        rows = full.unbind(axis)
        return [p for p, row in enumerate(rows) if torch.allclose(row, one.squeeze(axis))]
    return None
