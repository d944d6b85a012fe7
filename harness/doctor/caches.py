"""A module's cache, as the doctor makes and passes it: one it returns and is given back
(``Returned``), one it keeps itself (``Internal``), or a cache class of its own file
(``cache_class``); which one a forward takes is ``harness.doctor.calling.cache_convention``'s to
say."""

from __future__ import annotations

import sys

from torch import Tensor, nn


def _is_cache(value: object) -> bool:
    """A returned cache: keys and values as a tuple of tensors, or stacked in one (2, B, h, T, d)
    tensor (old GPT-2 code's ``torch.stack((key, value))``), or an object with ``update``."""
    if isinstance(value, tuple | list):
        return len(value) >= 2 and all(isinstance(t, Tensor) for t in value)
    if isinstance(value, Tensor):  # attention weights are 4-D: (B, h, T, T)
        return value.dim() == 5 and value.shape[0] == 2
    return callable(getattr(value, "update", None))


def cache_class(module: nn.Module) -> type | None:
    """A cache class the module's own file defines or imports: a class named ``...Cache`` with
    an ``update`` method that can be built without arguments (the catalogue's ``KVCache``,
    transformers' ``DynamicCache``)."""
    source = sys.modules.get(type(module).__module__)
    found = sorted(vars(source).items()) if source else []
    found.sort(key=lambda item: item[0] == "Cache")  # an abstract base last
    for name, value in found:
        if not (isinstance(value, type) and name.endswith("Cache")):
            continue
        if not callable(getattr(value, "update", None)):
            continue
        try:
            value()
        except Exception:
            continue
        return value
    return None


class Returned:
    """A cache that the module returns and is given back on the next call (``layer_past``,
    ``past_key_value`` tuples): the doctor keeps the last one here."""

    def __init__(self) -> None:
        self.value: object = None

    def reset(self) -> None:
        self.value = None

    def __len__(self) -> int:
        held = isinstance(self.value, tuple | list | Tensor) and len(self.value) > 0
        keys = self.value[0] if held else None  # a stacked (2, B, h, T, d) one: keys first
        return 0 if not isinstance(keys, Tensor) else keys.shape[-2]


class Internal:
    """The module keeps its own cache, addressed by ``start_pos`` / ``input_pos``: nothing to
    pass, nothing to reset (a new prompt overwrites it from position 0)."""

    def reset(self) -> None:
        return None
