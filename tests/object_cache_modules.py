"""A module with a cache object in its own file (the doctor finds ``...Cache`` classes in the
module's file, so it lives apart from generation_modules' other conventions)."""

from __future__ import annotations

import torch
from torch import Tensor

from tests.generation_modules import Projections


class TwiceCountedCache:
    """A cache whose keys and values are right but whose length counts each update twice: the
    bookkeeping of an append done twice (a length or position read off it is then wrong)."""

    def __init__(self) -> None:
        self.k = self.v = None
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def reset(self) -> None:
        self.k = self.v = None
        self.count = 0

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        self.count += 2 * k.shape[2]  # the bug
        return self.k, self.v


class ObjectCache(Projections):
    """``forward(x, cache=None)`` with a cache object from this file, updated in place."""

    def forward(self, x: Tensor, cache: TwiceCountedCache | None = None):
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        if cache is not None:
            k, v = cache.update(k, v)
        return self.attend(q, k, v)
