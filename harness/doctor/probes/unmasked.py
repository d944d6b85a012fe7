"""Where a call that leaked the future attends with nothing masked: the call recorded again,
and its one attention read, an SDPA call given no mask and not told ``is_causal``, or a softmax
of scores that no mask reached. Only then is the leak located at that line: a mask built wrong
is applied, and the leak is the mask's, which the forward names where it reads it."""

from __future__ import annotations

from torch import Tensor

from harness.doctor.reading.attention import sites
from harness.doctor.reading.watch import recorded
from harness.doctor.subject import Subject


def unmasked_at(subject: Subject, x: Tensor, keep: Tensor | None) -> str:
    """The line of the one attention of ``subject`` called on ``x`` and ``keep`` where nothing
    is masked; "" where it masks something, has more than one attention, or will not say."""
    try:
        found = recorded(subject, x, keep)
    except Exception:
        return ""
    attentions = sites(found)
    if len(attentions) != 1:
        return ""
    (site,) = attentions
    if site.fills or site.is_causal or site.sdpa_mask is not None:
        return ""
    return site.softmax.where
