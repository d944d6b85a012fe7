"""A module whose cache object (from this file: the doctor finds ``...Cache`` classes in the
module's file) keeps buffers for the longest sequence and a counter of the slots the next keys
go to, as torchtune's ``KVCache`` does with ``cache_pos``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tests.generation_modules import Projections


class Slots(nn.Module):
    """Keys and values in buffers of 64 slots, and ``pos``: the slots the next keys go to."""

    def __init__(self, k: Tensor) -> None:
        super().__init__()
        B, h, _, d = k.shape
        self.register_buffer("k", k.new_zeros(B, h, 64, d))
        self.register_buffer("v", k.new_zeros(B, h, 64, d))
        self.register_buffer("pos", torch.arange(64))


class SlotCache:
    """Its ``Slots`` made on first use; ``pos`` moved on after each update by the tokens
    written (by the prompt's own path first, then by each later update's, as real caches
    take one path to prefill and another to decode). The bugs, set by the module that uses
    it: ``moved``, how far an update after the first moves ``pos`` (None: by the tokens
    written); ``shift``, keys written that many slots past ``pos``; ``forgets``, a reset that
    leaves the count of tokens seen."""

    def __init__(self) -> None:
        self.slots: Slots | None = None
        self.seen = 0
        self.forgets = False

    def __len__(self) -> int:
        return self.seen

    def reset(self) -> None:
        self.slots = None
        if not self.forgets:
            self.seen = 0

    def update(self, k: Tensor, v: Tensor, moved: int | None, shift: int) -> tuple[Tensor, Tensor]:
        T = k.shape[2]
        first = self.slots is None
        if first:
            self.slots = Slots(k)
        slots = self.slots.pos[:T]
        self.slots.k[:, :, slots + shift] = k
        self.slots.v[:, :, slots] = v
        if first:
            self.slots.pos.add_(T)
        else:
            self.slots.pos.add_(T if moved is None else moved)
        self.seen += T
        return self.slots.k[:, :, : self.seen], self.slots.v[:, :, : self.seen]


class SlotCached(Projections):
    """``forward(x, cache=None)`` through a ``SlotCache``; ``moved``, ``shift`` and ``forgets``
    are the cache's bugs, as above."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, moved: int | None = None,
                 shift: int = 0, forgets: bool = False):  # fmt: skip
        super().__init__(d_model, n_heads)
        self.moved, self.shift, self.forgets = moved, shift, forgets

    def forward(self, x: Tensor, cache: SlotCache | None = None):
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        if cache is not None:
            cache.forgets = self.forgets
            k, v = cache.update(k, v, self.moved, self.shift)
        return self.attend(q, k, v)
