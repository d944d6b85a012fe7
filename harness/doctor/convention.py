"""The mask convention of a forward that takes a mask the user did not describe, from behaviour.

A module whose forward has a mask parameter is always probed with masks. When ``--mask`` is not
given, each reading of a mask (keep, drop or additive; ``(B, T, T)``, ``(B, 1, T, T)`` or key
padding ``(B, T)``) is tried in turn: the first under which a causal mask stops every future leak
and a padding mask every leak from padding is the module's convention, and the doctor says so.
When none does, the mask is ignored or broken, and that is a failure, never a silent skip.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from harness.doctor.calling import mask_parameters
from harness.doctor.config import Config, quietly_seeded
from harness.doctor.findings import FAIL, PASS, Finding
from harness.doctor.options import BY_NAME
from harness.doctor.probes.leaks import _future_leak, _padding_leak, _responds
from harness.doctor.subject import Subject
from harness.errors import UsageError
from harness.masks import KEY_LAYOUTS, LAYOUTS, MEANINGS, MaskSpec
from harness.runner import describe

NAME = "mask convention"
CANDIDATES = tuple(MaskSpec(meaning, layout) for layout in LAYOUTS for meaning in MEANINGS)
WORDS = {
    "keep": "keep (True = attend)",
    "drop": "drop (True = blocked, as nn.MultiheadAttention)",
    "additive": "additive (0 or -inf added to the scores)",
    "bqk": "(B, T, T)",
    "b1qk": "(B, 1, T, T)",
    "bk": "key padding (B, T)",
    "b11k": "key padding (B, 1, 1, T)",
    "qk": "(T, T)",
}


def respects(module: nn.Module, config: Config) -> bool:
    """The module, called with masks read as ``config`` says, leaks neither future nor padding,
    and its real outputs still respond to the real inputs. Raises when it does not run."""
    subject = Subject(module, config)
    with quietly_seeded(config.seed):
        # at ordinary activations: what large logits do to a mask is the leak probes' to say
        if _padding_leak(subject, (1.0,)) is not None or not _responds(subject):
            return False
        return config.mask_shape in KEY_LAYOUTS or _future_leak(subject, 1.0) is None


def runs(module: nn.Module, config: Config) -> bool:
    """The module can be called with masks read as ``config`` says (raises when it cannot)."""
    subject = Subject(module, config)
    keep = subject.keep("padding", config.batch, config.seq_len, 4, left=True)
    with quietly_seeded(config.seed), torch.no_grad():
        subject.call(subject.copy(), subject.x(config.batch, config.seq_len, 4), keep)
    return True


def ignored(module: nn.Module, config: Config) -> bool:
    """The module's output is the same, bit for bit, with a padding mask read as ``config`` says
    as with no mask at all: whatever it is handed, the mask never reaches the scores."""
    subject = Subject(module, config)
    keep = subject.keep("padding", config.batch, config.seq_len, 4, left=True)
    x = subject.x(config.batch, config.seq_len, 4)
    with quietly_seeded(config.seed), torch.no_grad():
        masked = subject.call(subject.copy(), x, keep)[0]
        try:
            bare = subject.call(subject.copy(), x, None)[0]
        except Exception:  # it needs its mask: then the mask is read
            return False
    return torch.equal(masked, bare)


# A mask that changes nothing, in the words the catalogue has for it.
IGNORED = (
    "forward takes {names}, but its output is the same, bit for bit, with a mask as without "
    "one: the mask never reaches the scores, as if dropped: causal_leak (the future leaks where "
    "it is the causal mask; padding leaks where it is a padding mask)"
)


def readings(
    parameters: list[str], given: str | None, layout: str | None = None
) -> list[tuple[str, MaskSpec]]:
    """(parameter, convention) pairs to try, in order: a parameter named for key padding is read
    only as (B, T); the others every way; only in ``layout`` when one is declared."""
    pairs = []
    for name in [given] if given else parameters:
        keys_only = "padding" in name and layout is None
        specs = [s for s in CANDIDATES if s.layout in KEY_LAYOUTS] if keys_only else CANDIDATES
        pairs += [(name, spec) for spec in specs if layout is None or spec.layout == layout]
    return pairs


def detect(module: nn.Module, config: Config) -> tuple[Config, Finding | None]:
    """The config to probe with, and a finding saying what was detected (None: nothing to do)."""
    parameters = mask_parameters(module)
    if config.mask != "auto" or not parameters:  # declared, or none is ever passed
        return config, None
    # a --mask-shape other than the default is a declaration: only its readings are tried
    declared = config.mask_shape if config.mask_shape != BY_NAME["mask_shape"].default else None
    tried = readings(parameters, config.mask_arg, declared)
    errors: list[str] = []
    ran: Config | None = None  # the first reading that runs
    for parameter, spec in tried:
        arg = None if len(parameters) == 1 and config.mask_arg is None else parameter
        candidate = replace(config, mask=spec.meaning, mask_shape=spec.layout, mask_arg=arg)
        small = replace(candidate, batch=min(config.batch, 4), seq_len=min(config.seq_len, 8))
        # and it must still run with more sequences than tokens: a reading that runs only while
        # B <= T (Whisper's mask[:T, :T] of a (B, 1, T, T) mask keeps it whole) is a coincidence
        wide = replace(small, batch=small.seq_len + 1)
        try:  # a convention shows on short sequences: cheap to try every one
            works = respects(module, small) and runs(module, wide)
        except UsageError:
            raise
        except Exception as exc:  # this reading does not even run
            errors.append(describe(exc))
            continue
        ran = ran or small
        if works:
            words = f"{WORDS[spec.meaning]} {WORDS[spec.layout]}"
            flags = f"--mask {spec.meaning} --mask-shape {spec.layout}"
            flags += f" --mask-arg {parameter}" if arg else ""
            return candidate, Finding(
                NAME, PASS, f"forward takes `{parameter}`: detected {words}; declare it: {flags}"
            )
    names = ", ".join(f"`{p}`" for p in parameters)
    if len(errors) == len(tried):  # the call itself is broken: say how, not "the mask"
        return config, Finding(NAME, FAIL, f"forward takes {names}, but every call raises: "
                                           f"{errors[0]}")  # fmt: skip
    if ran is not None and ignored(module, ran):
        return config, Finding(NAME, FAIL, IGNORED.format(names=names), ("causal_leak",))
    return config, Finding(
        NAME,
        FAIL,
        f"forward takes {names}, but no reading of it (keep, drop or additive; (B, T, T), "
        "(B, 1, T, T), (B, T), (B, 1, 1, T) or (T, T)) stops a causal mask leaking the future "
        "and a padding mask "
        "leaking padding: the mask is ignored or broken (or in a form the doctor does not "
        "try: declare it with --mask and --mask-shape)",
    )
