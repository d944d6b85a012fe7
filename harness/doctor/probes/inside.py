"""What a module computes inside: the input of its output projection, read by a hook during
one call, which is attention's own output when the projection is called once on it."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from harness.doctor.subject import Subject


def submodule_name(module: nn.Module, child: object) -> str | None:
    """The name under which ``child`` sits in ``module``; None when it is not one of its
    submodules (a bare-weight projection, a function)."""
    return next((n for n, m in module.named_modules() if m is child and n), None)


def projection_input(
    subject: Subject, module: nn.Module, name: str, x: Tensor, keep: Tensor | None
) -> Tensor | None:
    """What enters ``module``'s submodule ``name`` during one call on ``x`` (B, T, d), as
    (B, T, ...) whatever the module's own layout; None unless it is called exactly once with
    one (B, T, ...) tensor."""
    seen: list[Tensor] = []
    hook = module.get_submodule(name).register_forward_pre_hook(
        lambda _, args: seen.append(args[0].detach()))  # fmt: skip
    try:
        with torch.no_grad():
            subject.call(module, x.to(subject.device, subject.dtype), keep)
    finally:
        hook.remove()
    if len(seen) != 1 or seen[0].dim() < 3:
        return None  # not called, called more than once, or not a sequence of tokens
    found = seen[0].transpose(0, 1) if subject.sequence_first else seen[0]
    return found if found.shape[:2] == x.shape[:2] else None
