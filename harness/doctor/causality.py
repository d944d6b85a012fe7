"""Whether a module is causal on purpose: in its own words, or as its recorded forward shows.

Measured alone, a module that never lets an output depend on a later input is a decoder's layer,
or an encoder's with a wrong causal mask: both break permutation equivariance, and only the
module's intent tells them apart. Libraries state it: transformers' attention classes set
``is_causal``, x-transformers' and many others keep ``causal``. Where no flag says, the recorded
forward shows it (a triangle of its own that blocks keys after their query and none before, or
SDPA told ``is_causal=True``), else a causal mask it registers (nanoGPT's ``bias``); a class's
name says nothing. When ``--causal`` is not given, a module that shows it is causal is
probed as causal (as with ``--causal``, so that a causal layer that leaks the future fails its
causal probe), and the doctor says why, unless it can be handed a causal mask (a ``(B, T, T)``
mask argument, a call adapter, ``**kwargs``) and does not mask the future by itself: then its
caller masks it, as transformers' eager layers rely on, and the doctor passes the masks. A
module that says it is not causal (``is_causal = False``) and masks the future fails
permutation equivariance, and is told so.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import NamedTuple

from torch import Tensor, nn

from harness.doctor.config import Config
from harness.doctor.findings import PASS, Finding
from harness.doctor.reading.known import Reading
from harness.doctor.subject import Subject
from harness.errors import UsageError
from harness.masks import KEY_LAYOUTS

NAME = "causality"
FLAGS = ("is_causal", "causal")  # attributes that say whether a module masks the future


def causal_table(t: Tensor) -> bool:
    """A square lower-triangular mask: 1/True (or 0 in an additive one) on and below the
    diagonal, 0/False (a large negative fill) above; or one diagonal off, as a causal mask
    built wrong is (``tril(diagonal=1)``: causal_leak, still a causal module's intent)."""
    if t.dim() < 2 or t.shape[-1] != t.shape[-2] or t.shape[-1] < 2 or t.is_complex():
        return False
    t = t.reshape(-1, *t.shape[-2:])[0]
    allowed = t > -1 if t.is_floating_point() and bool((t < 0).any()) else t != 0
    return any(_is_tril(allowed, k) for k in (0, 1, -1))


def _is_tril(allowed: Tensor, diagonal: int) -> bool:
    return bool((allowed == allowed.new_ones(allowed.shape).tril(diagonal)).all())


def registered_mask(module: nn.Module) -> str | None:
    """The name of a causal mask ``module`` (or a submodule) registers, if one does."""
    return next((name for name, b in module.named_buffers() if causal_table(b)), None)


class Intent(NamedTuple):
    """Whether a module is causal on purpose, how that is known, and whether its recorded
    forward showed it (``computed``) or the module states it."""

    causal: bool
    why: str
    computed: bool = False


def stated(module: nn.Module) -> Intent | None:
    """What ``module``'s own flag says (``is_causal``, ``causal``), None when none does."""
    for flag in FLAGS:
        value = getattr(module, flag, None)
        if isinstance(value, bool):  # a tensor named causal is a mask, not a word
            return Intent(value, f"it sets {flag} = {value}")
    return None


def declared(module: nn.Module, reading: Reading | None = None) -> Intent | None:
    """Whether ``module`` is causal on purpose, and how that is known: its flag (``it sets
    is_causal = True``), else its recorded forward (``it masks the future itself at
    attn.py:41``), else a causal mask it registers; None when nothing shows. A flag outranks
    the forward: an encoder's layer that says ``is_causal = False`` and masks the future is
    told so."""
    flagged = stated(module)
    if flagged is not None:
        return flagged
    if reading is not None and reading.masks_future:
        return Intent(True, f"it masks the future itself at {reading.masks_future}", True)
    buffer = registered_mask(module)
    return Intent(True, f"it registers a causal mask, `{buffer}`") if buffer else None


def _masks_future_by_itself(subject: Subject) -> bool:
    """Called with no mask, no output depends on a later input (False: it cannot even be
    called without one)."""
    try:
        return subject.leak_by_itself is None
    except UsageError:
        raise
    except Exception:
        return False


def may_be_handed_a_causal_mask(subject: Subject) -> bool:
    """Whether a caller can hand the module a causal mask: a ``(B, T, T)`` mask argument (not
    key padding alone), a call adapter (--call), or a forward that takes ``**kwargs``."""
    config = subject.config
    if (subject.takes_mask and config.mask_shape not in KEY_LAYOUTS) or config.call is not None:
        return True
    try:
        parameters = inspect.signature(subject.module.forward).parameters.values()
    except (TypeError, ValueError):  # no signature to read: assume it may
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def causal_as_said(
    subject: Subject, reading: Reading | None = None
) -> tuple[Config, Finding] | None:
    """The config to probe with, as ``--causal``, and the finding that says why, when the
    module is causal on purpose (``declared``) and is not a layer whose caller masks it; else
    None."""
    config = subject.config
    said = None if config.causal else declared(subject.original, reading)
    if said is None or not said.causal:
        return None
    # a module seen masking the future itself is causal; one that only says so may be a layer
    # whose caller masks it: the doctor then passes its masks, as its model does
    handed = not said.computed and may_be_handed_a_causal_mask(subject)
    if handed and not _masks_future_by_itself(subject):
        return None
    message = f"{said.why}: probed as causal, as with --causal"
    return replace(config, causal=True), Finding(NAME, PASS, message)
