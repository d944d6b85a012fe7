"""Whether a module is causal on purpose, in its own words.

Measured alone, a module that never lets an output depend on a later input is a decoder's layer,
or an encoder's with a wrong causal mask: both break permutation equivariance, and only the
module's intent tells them apart. Libraries state it: transformers' attention classes set
``is_causal``, x-transformers' and many others keep ``causal``, nanoGPT and minGPT name the class
``CausalSelfAttention``. When ``--causal`` is not given, a module that says it is causal is
probed as causal (as with ``--causal``, so that a causal layer that leaks the future fails its
causal probe), and the doctor says why, unless it can be handed a causal mask (a ``(B, T, T)``
mask argument, a call adapter, ``**kwargs``) and does not mask the future by itself: then its
caller masks it, as transformers' eager layers rely on, and the doctor passes the masks. A
module that says it is not causal (``is_causal = False``) and masks the future fails
permutation equivariance, and is told so.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import replace

from torch import nn

from harness.doctor.config import Config
from harness.doctor.findings import PASS, Finding
from harness.doctor.subject import Subject
from harness.errors import UsageError
from harness.masks import KEY_LAYOUTS

NAME = "causality"
FLAGS = ("is_causal", "causal")  # attributes that say whether a module masks the future
CAUSAL_CLASS = re.compile(r"(?<![Nn]on)(?<![Nn]ot)Causal")  # CausalSelfAttention, not NonCausal


def declared(module: nn.Module) -> tuple[bool, str] | None:
    """Whether ``module`` says it is causal, and how (``it sets is_causal = True``, ``its class
    is named CausalSelfAttention``); None when it says nothing. A flag outranks the name."""
    for flag in FLAGS:
        value = getattr(module, flag, None)
        if isinstance(value, bool):  # a tensor named causal is a mask, not a word
            return value, f"it sets {flag} = {value}"
    name = type(module).__name__
    return (True, f"its class is named {name}") if CAUSAL_CLASS.search(name) else None


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


def causal_as_said(subject: Subject) -> tuple[Config, Finding] | None:
    """The config to probe with, as ``--causal``, and the finding that says why, when the
    module says it is causal and is not a layer whose caller masks it; else None."""
    config = subject.config
    said = None if config.causal else declared(subject.module)
    if said is None or not said[0]:
        return None
    if may_be_handed_a_causal_mask(subject) and not _masks_future_by_itself(subject):
        return None  # its caller masks it: the doctor passes its masks, as its model does
    message = f"{said[1]}: probed as causal, as with --causal"
    return replace(config, causal=True), Finding(NAME, PASS, message)
