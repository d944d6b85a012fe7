"""Numerics: determinism in eval mode, and float16 / bfloat16 under torch.autocast.

Low precision is judged by the 2x rule of ``harness.metrics``: the module's own error in the
dtype (against itself in float64) may be at most twice the larger error of two sound
implementations on the same projections in that dtype (SDPA and textbook attention), plus atol.
At large activations float16 overflows somewhere for everyone; the module fails only where
textbook attention (Q K^T, then the scale) stays finite, and passes where attention that
scales Q first overflows too: float16's range, not the module. Overflowing like textbook code
while scaling Q first stays finite (the catalogue's ``qk_overflow_half``) fails a module
declared to run in float16 (--dtype float16) and is a note otherwise: all textbook code does it.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness import metrics
from harness.devices import dtype_name
from harness.doctor.findings import Outcome, failed, named, passed, skipped, warned
from harness.doctor.probes.registry import probe
from harness.doctor.subject import Subject
from harness.masks import live_queries
from harness.metrics import first_nonfinite
from harness.reference import Recognized, attend, math_attention, scaled_first_attention
from harness.runner import describe

HALF_LARGE = 200.0  # activation scale for the float16 overflow check
# Logits of this size are ordinary in trained models (12-60), and float16's exp overflows past
# about 11: softmax that does not subtract the row max breaks here, sound attention does not.
MODERATE_LOGIT = 30.0


@probe("eval determinism")
def probe_determinism(subject: Subject) -> Outcome:
    """Two identical calls in eval mode give identical outputs, and neither changes its input."""
    moved = subject.input_change
    if moved > 0:
        return failed(
            f"forward changes its input tensor in place (by up to {moved:.3g}): the caller's "
            "tensor is overwritten, and the next call sees another input"
        )
    diff = subject.repeat_difference
    if math.isnan(diff):
        return failed("outputs are NaN or infinite on ordinary inputs: nothing to compare")
    if diff > 0:
        return failed(
            f"two identical calls in eval mode differ by up to {diff:.3g}: dropout left on "
            "(dropout_in_eval), or state an earlier call left",
            "dropout_in_eval",
        )
    return passed("identical")


def _autocast(subject: Subject, dtype: torch.dtype) -> torch.autocast:
    return torch.autocast(device_type=subject.device.type, dtype=dtype)


def _reading(
    subject: Subject, module: nn.Module, x: Tensor, allowed: Tensor | None, out: Tensor
) -> int | None:
    """The index of the projection reading nearest the module's float64 output, or None."""
    best, best_err = None, math.inf
    for index, reading in enumerate(subject.readings(module)):
        try:
            with torch.no_grad():
                err = (attend(reading, x, allowed) - out).abs().max().item()
        except RuntimeError:
            continue
        if err < best_err:
            best, best_err = index, err
    return best


def _sound(reading: Recognized, x: Tensor, allowed: Tensor | None, autocast) -> list[Tensor]:
    """SDPA and textbook attention on ``reading``'s projections, under ``autocast``."""
    with torch.no_grad(), autocast:
        return [
            attend(reading, x, allowed, k).double()
            for k in (F.scaled_dot_product_attention, math_attention)
        ]


# torch's words for a Python number that does not fit the tensor's dtype (masked_fill(-1e9))
HALF_FILL = re.compile(r"cannot be converted to type \S*(Half|BFloat16) without overflow")
HALF_FILL_NAMED = named(
    ": a mask fill such as -1e9 past the dtype's range (fill_overflow_half: fill with "
    "torch.finfo(scores.dtype).min)",
    "fill_overflow_half",
)


def probe_half(subject: Subject, dtype: torch.dtype) -> Outcome:
    """The module under torch.autocast in ``dtype``, against its own float64 output, by the
    2x rule; in float16 also at large activations. A module whose two identical calls differ
    (dropout left on) cannot be held to its own float64 output: eval determinism says so."""
    if not subject.deterministic:
        return skipped("not deterministic in eval mode (see eval determinism): nothing to compare")
    cfg, name = subject.config, dtype_name(dtype)
    keep = subject.ordinary_keep(cfg.batch, cfg.seq_len)
    allowed = subject.effective_keep(keep, cfg.batch, cfg.seq_len)
    exact_module, module = subject.copy(), subject.copy(torch.float32)
    x = subject.x(cfg.batch, cfg.seq_len, 9)
    try:
        with torch.no_grad(), _autocast(subject, dtype):
            low = subject.call(module, x.float(), keep)[0].double()
    except NotImplementedError:  # its caller says it takes no autocast: the probe is skipped
        raise
    except Exception as exc:
        raised = f"raises under torch.autocast({name}): {describe(exc)}"
        if not HALF_FILL.search(str(exc)):
            return failed(raised)
        if subject.config.dtype == "float16":  # declared to run so: it crashes there
            return failed(raised + HALF_FILL_NAMED)
        return warned(
            raised + HALF_FILL_NAMED + "; right in float32, as the Annotated Transformer's -1e9 "
            "is: declare --dtype float16 if it runs in float16, to hold it to that"
        )
    with torch.no_grad():
        exact = subject.call(exact_module, x, keep)[0]
    if torch.isfinite(exact).all() and not torch.isfinite(low).all():
        said = f"non-finite output{first_nonfinite(low)} under autocast({name})"
        if _only_where_no_key(low, allowed):
            return failed(
                f"{said}, only at queries every key of which is blocked (padding inside a "
                "window): their fill is -inf in this dtype (float32's finfo.min cast down, or "
                "added in place), and a row of -inf is NaN, which the next layer spreads "
                "(fully_masked_row)",
                "fully_masked_row",
            )
        return failed(said)
    index = _reading(subject, exact_module, x, allowed, exact)
    if index is None:
        verdict = passed(
            f"finite under autocast({name}) (no reading of its projections that SDPA runs on as "
            "they are, other parameters or non-mask buffers beside them: no floor)"
        )
    else:
        verdict = _two_x(subject, index, x, allowed, low, exact, dtype)
    if verdict.status == "pass" and dtype is torch.float16:
        moderate = _moderate(subject, module, index, keep, allowed)
        return moderate or _large(subject, module, index, keep, allowed, verdict) or verdict
    return verdict


def _logit_scale(reading: Recognized, x: Tensor) -> float:
    """The largest |q . k| / sqrt(d) of ``reading``'s projections on ``x`` (B, T, d)."""
    qkv, _, heads, _ = reading
    q, k, _ = qkv(x)
    batch, seq_len = x.shape[:2]
    q = q.reshape(batch, seq_len, heads, -1).transpose(1, 2)  # (B, h, T, d)
    k = k.reshape(batch, seq_len, -1, q.shape[-1]).transpose(1, 2)  # (B, h_kv, T, d)
    k = k.repeat_interleave(heads // k.shape[1], dim=1)  # (B, h, T, d)
    return (q @ k.transpose(-2, -1)).abs().max().item() / math.sqrt(q.shape[-1])


def _moderate(subject: Subject, module: nn.Module, index: int | None, keep: Tensor | None,
              allowed: Tensor | None) -> Outcome | None:  # fmt: skip
    """float16 with logits up to MODERATE_LOGIT: a failure where the module overflows and
    textbook attention on its projections does not; None otherwise."""
    if index is None:
        return None
    cfg = subject.config
    reading = subject.readings(subject.copy())[index]
    x = subject.x(cfg.batch, cfg.seq_len, 9)
    with torch.no_grad():
        largest = _logit_scale(reading, x)
    if not largest > 0:
        return None
    x = (x * math.sqrt(MODERATE_LOGIT / largest)).float()
    autocast = _autocast(subject, torch.float16)
    with torch.no_grad(), autocast:
        out = subject.call(module, x, keep)[0]
    if torch.isfinite(out).all():
        return None  # finite: no textbook attention to compare with (it costs a forward)
    with torch.no_grad(), autocast:
        textbook = attend(subject.readings(module)[index], x, allowed, math_attention)
    if not torch.isfinite(textbook).all():
        return None
    return failed(
        f"with logits up to {MODERATE_LOGIT:g} under autocast(float16): output"
        f"{first_nonfinite(out.detach())}, where textbook attention on its projections stays "
        "finite: exp of a logit past about 11 overflows float16 (naive_exp_softmax: subtract "
        "the row max before exp, or use torch.softmax)",
        "naive_exp_softmax",
    )


def _only_where_no_key(out: Tensor, allowed: Tensor | None) -> bool:
    """Every non-finite output (B, T, d) is at a query that ``allowed`` (B, T, T) leaves no
    key."""
    if allowed is None or allowed.dim() != 3 or tuple(allowed.shape[:2]) != tuple(out.shape[:2]):
        return False
    bad = ~torch.isfinite(out).flatten(2).all(-1).cpu()  # (B, T)
    return bool(bad.any()) and not bool((bad & allowed.any(-1).cpu()).any())


def _two_x(subject: Subject, index: int, x: Tensor, allowed: Tensor | None, low: Tensor,
           exact: Tensor, dtype: torch.dtype) -> Outcome:  # fmt: skip
    """The 2x rule on ordinary inputs, over the queries that have a key: where a sliding window
    and padding leave a query none, textbook attention's NaN would make the floor infinite."""
    reading64 = subject.readings(subject.copy())[index]
    reading = subject.readings(subject.copy(torch.float32))[index]
    with torch.no_grad():
        ref = attend(reading64, x, allowed)
    sound = _sound(reading, x.float(), allowed, _autocast(subject, dtype))
    live = live_queries(allowed, *x.shape[:2])  # (B, T)
    floor = max((metrics.error(s.cpu()[live], ref.cpu()[live]) for s in sound),
                key=lambda e: e.max_abs)  # fmt: skip
    err = metrics.error(low.cpu()[live], exact.cpu()[live])
    limit = metrics.threshold(floor, metrics.atol(exact.cpu(), dtype), metrics.OUTPUT_FACTOR)
    name = dtype_name(dtype)
    if err.max_abs > limit:
        return failed(
            f"error {err.max_abs:.3g} under autocast({name}), beyond 2x the floor of SDPA and "
            f"textbook attention on its projections ({floor.max_abs:.3g}) + atol: {limit:.3g}"
        )
    return passed(f"error {err.max_abs:.2g} under autocast({name}), within {limit:.2g} (2x rule)")


def _large(subject: Subject, module: nn.Module, index: int | None, keep: Tensor | None,
           allowed: Tensor | None, ordinary: Outcome) -> Outcome | None:  # fmt: skip
    """float16 at large activations: None when the module stays finite there. Overflowing as
    textbook attention does (where scaling Q first stays finite) fails a module declared to run
    in float16 (--dtype float16); for others, which textbook code all is, it is a note on the
    ``ordinary`` pass, not a warning that would fire on correct code."""
    cfg = subject.config
    x = subject.x(cfg.batch, cfg.seq_len, 9, HALF_LARGE).float()
    autocast = _autocast(subject, torch.float16)
    with torch.no_grad(), autocast:
        big = subject.call(module, x, keep)[0]
    if torch.isfinite(big).all():
        return None
    where = f"with activations scaled by {HALF_LARGE:g} under autocast(float16): output" + str(
        first_nonfinite(big.detach())
    )
    if index is None:  # projections not recognized: no textbook attention to hold it to
        if subject.config.dtype == "float16":
            return warned(f"{where} (Q K^T passing float16's 65504? scale Q first)")
        return passed(f"{ordinary.message}; {where} (projections not recognized: not judged "
                      "unless declared --dtype float16)")  # fmt: skip
    reading = subject.readings(module)[index]
    with torch.no_grad(), autocast:
        first = attend(reading, x, allowed, scaled_first_attention)
        textbook = attend(reading, x, allowed, math_attention)
    if not torch.isfinite(first).all():
        return passed(
            f"{where}, as attention that scales Q first does on its projections: beyond "
            "float16's range (SDPA's CPU kernel gets through only by accumulating in float32)"
        )
    if torch.isfinite(textbook).all():
        return failed(f"{where}, where textbook attention on its projections stays finite")
    like = f"{where}, like textbook (Q K^T) / sqrt(d) code, while scaling Q first stays finite"
    if subject.config.dtype == "float16":
        return failed(
            f"{like}, and it is declared to run in float16 (--dtype float16): qk_overflow_half "
            "(scale Q first, or compute Q K^T in float32)",
            "qk_overflow_half",
        )
    return passed(
        f"{ordinary.message}; {like} (qk_overflow_half if it runs in float16 with large "
        "activations: declare --dtype float16 to judge that)"
    )


@probe("float16 robustness")
def probe_float16(subject: Subject) -> Outcome:
    return probe_half(subject, torch.float16)


@probe("bfloat16 robustness")
def probe_bfloat16(subject: Subject) -> Outcome:
    return probe_half(subject, torch.bfloat16)
