"""The doctor: black-box probes on anyone's self-attention module.

Every probe runs on a private float64 copy in eval mode (low-precision probes on a copy in that
dtype), so a gradient that should be zero is exactly zero and the user's module is never touched:
its weights, training mode and the global RNG state are the same afterwards.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace

import pandas as pd
import torch
from torch import Tensor, nn

from harness.devices import UsageError
from harness.inputs import causal_keep, generator, keep_mask
from harness.metrics import first_nonfinite
from harness.reference import HEAD_ATTRS, attend, recognize
from harness.runner import describe, seeded, split_output
from harness.shapes import Shape
from harness.target import as_self_attention

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"
MASKS = ("keep", "drop", "additive", "none")
MASK_SHAPES = ("bqk", "b1qk", "bk")  # (B, T, T), (B, 1, T, T), key padding (B, T)
LARGE = 300.0  # activation scale for the large-logit leak checks (float64: no overflow)
HALF_LARGE = 200.0  # activation scale for the float16 overflow check
EXACT = 1e-9  # float64: differences below this are rounding


@dataclass(frozen=True)
class Config:
    """How to call the module and what it promises."""

    mask: str = "none"  # its mask convention: keep | drop | additive | none
    causal: bool = False  # it masks the future by itself
    mask_shape: str = "bqk"
    mask_dtype: str = "bool"  # keep/drop masks as bool, or as float 0/1
    positional: bool = False  # it uses positions: no permutation equivariance expected
    strict: bool = False  # warnings fail too
    batch: int = 4
    seq_len: int = 8
    d_model: int | None = None  # input width when it cannot be read off the module
    device: str = "cpu"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mask not in MASKS:
            raise UsageError(f"--mask must be one of {', '.join(MASKS)}, not {self.mask!r}")
        if self.mask_shape not in MASK_SHAPES:
            raise UsageError(f"--mask-shape must be one of {', '.join(MASK_SHAPES)}")
        if self.mask_dtype not in ("bool", "float"):
            raise UsageError("--mask-dtype must be bool or float")
        if self.batch < 2 or self.seq_len < 3:
            raise UsageError("the doctor needs --batch >= 2 and --seq-len >= 3")


@dataclass(frozen=True)
class Finding:
    """One probe's result: pass, fail, warn or skip, with evidence or the reason."""

    probe: str
    status: str
    message: str = ""


@dataclass
class Diagnosis:
    """All findings for one module."""

    target: str
    config: Config
    findings: list[Finding] = field(default_factory=list)

    @property
    def failures(self) -> list[Finding]:
        bad = (FAIL, WARN) if self.config.strict else (FAIL,)
        return [f for f in self.findings if f.status in bad]

    @property
    def healthy(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        return 0 if self.healthy else 1

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(
            [asdict(f) for f in self.findings], columns=["probe", "status", "message"]
        )

    def text(self) -> str:
        width = max(len(f.probe) for f in self.findings)
        lines = [
            f"{f.status.upper():<4}  {f.probe:<{width}}  {f.message}".rstrip()
            for f in self.findings
        ]
        verdict = "healthy" if self.healthy else f"{len(self.failures)} problem(s)"
        warned = sum(f.status == WARN for f in self.findings)
        tail = f" ({warned} warning(s))" if warned and self.healthy else ""
        return "\n".join([f"attention doctor: {self.target}", *lines, f"=> {verdict}{tail}"])

    def to_json(self) -> str:
        return json.dumps(
            {
                "target": self.target,
                "healthy": self.healthy,
                "config": asdict(self.config),
                "findings": [asdict(f) for f in self.findings],
            },
            indent=2,
        )

    def markdown(self) -> str:
        lines = [
            f"# Attention doctor: `{self.target}`",
            "",
            f"Verdict: **{'healthy' if self.healthy else 'problems found'}** "
            f"(mask convention `{self.config.mask}`, causal {self.config.causal}, "
            f"batch {self.config.batch}, seq_len {self.config.seq_len}, "
            f"device {self.config.device}, seed {self.config.seed}).",
            "",
            self.table().to_markdown(index=False),
        ]
        return "\n".join(lines) + "\n"


# --- calling the module ----------------------------------------------------------------------


class Subject:
    """The module under diagnosis, seen through the config: builds masks and calls it."""

    def __init__(self, module: nn.Module, config: Config):
        self.module = as_self_attention(module)
        self.config = config
        self.device = torch.device(config.device)
        self.takes_mask = config.mask != "none"
        self.d_model = _input_width(self.module, config.d_model)
        self.deterministic = True  # set by the determinism probe, which runs first

    def copy(self, dtype: torch.dtype = torch.float64) -> nn.Module:
        return copy.deepcopy(self.module).to(self.device, dtype).eval()

    def x(self, batch: int, seq_len: int, seed: int, scale: float = 1.0) -> Tensor:
        gen = generator(seed)
        x = torch.randn(batch, seq_len, self.d_model, generator=gen, dtype=torch.float64)
        return (x * scale).to(self.device)

    def keep(self, kind: str, batch: int, seq_len: int, seed: int, empty: bool = False) -> Tensor:
        """A (B, T, T) keep-mask: causal, padding (lengths drawn from ``seed``) or both."""
        return keep_mask(kind, Shape(batch=batch, seq_len=seq_len), generator(seed + 7), empty)

    def encode(self, keep: Tensor | None, dtype: torch.dtype) -> Tensor | None:
        """The keep-mask in the module's convention and shape, on the device."""
        if keep is None or not self.takes_mask:
            return None
        cfg = self.config
        if cfg.mask_shape == "bk":
            keep = keep.any(dim=1)  # (B, T): a key is real when some query may see it
        mask: Tensor = keep if cfg.mask != "drop" else ~keep
        if cfg.mask == "additive":
            mask = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, float("-inf"))
        elif cfg.mask_dtype == "float":
            mask = mask.to(dtype)
        if cfg.mask_shape == "b1qk":
            mask = mask[:, None]
        return mask.to(self.device)

    def call(
        self, module: nn.Module, x: Tensor, keep: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        mask = self.encode(keep, x.dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = module(x) if mask is None else module(x, mask)
        return split_output(result)

    def bound(self, keep: Tensor | None) -> nn.Module:
        """A float64 copy that takes only x and always applies ``keep`` in the module's convention,
        for the shared probes of ``harness.probes``."""
        subject, module = self, self.copy()

        class Bound(nn.Module):
            def forward(self, x: Tensor, _mask: Tensor | None = None):
                return subject.call(module, x, keep)

        return Bound()

    def ordinary_keep(self, batch: int, seq_len: int) -> Tensor | None:
        """The mask for ordinary calls: causal when the module takes one, padding for key masks."""
        if not self.takes_mask:
            return None
        return self.keep(
            "padding" if self.config.mask_shape == "bk" else "causal", batch, seq_len, 0
        )

    def effective_keep(self, keep: Tensor | None, batch: int, seq_len: int) -> Tensor | None:
        """What the module should allow: the mask passed, and the causal one if it is causal."""
        causal = causal_keep(batch, seq_len) if self.config.causal else None
        if keep is None or not self.takes_mask:
            return causal
        return keep if causal is None else keep & causal


def _input_width(module: nn.Module, given: int | None) -> int:
    if isinstance(getattr(module, "mha", None), nn.MultiheadAttention):
        return module.mha.embed_dim
    from harness.target import infer_d_model

    width = infer_d_model(module) or given
    if width is None:
        raise UsageError("cannot tell the module's input width: pass --d-model")
    return width


def check_signature(module: nn.Module, takes_mask: bool) -> None:
    """UsageError unless forward can take (x) or, when a mask is declared, (x, mask)."""
    forward = as_self_attention(module).forward
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(object(), object()) if takes_mask else signature.bind(object())
    except TypeError:
        form = "(x, mask)" if takes_mask else "(x)"
        raise UsageError(
            f"{type(module).__name__}.forward{signature} cannot be called as forward{form}"
            + ("" if takes_mask else "; if it takes a mask, say which with --mask")
        ) from None


# --- probes ----------------------------------------------------------------------------------

Probe = Callable[[Subject], Finding]


def named(name: str) -> Callable[[Probe], Probe]:
    """Attach a probe's display name, used when the probe itself raises."""

    def mark(probe: Probe) -> Probe:
        probe.probe_name = name  # type: ignore[attr-defined]
        return probe

    return mark


def _shape_cases(subject: Subject) -> list[tuple[str, int, int]]:
    cfg = subject.config
    heads = next((getattr(subject.module, a) for a in HEAD_ATTRS
                  if isinstance(getattr(subject.module, a, None), int)), 1)  # fmt: skip
    head_width = max(1, subject.d_model // max(1, heads))
    return [
        ("ordinary", cfg.batch, cfg.seq_len),
        ("batch == seq_len", 3, 3),
        ("seq_len == head width", 2, head_width),
        ("seq_len == d_model", 2, subject.d_model),
        ("seq_len 1", 2, 1),
        ("batch 1", 1, 5),
    ]


@named("shape contract")
def probe_shapes(subject: Subject) -> Finding:
    """Output (B, T, d) and weights (B, [h,] T, T) on awkward shapes."""
    width = None
    for label, batch, seq_len in _shape_cases(subject):
        module = subject.copy()
        try:
            with torch.no_grad():
                out, weights = subject.call(
                    module, subject.x(batch, seq_len, 1), subject.ordinary_keep(batch, seq_len)
                )
        except Exception as exc:
            return Finding(
                "shape contract",
                FAIL,
                f"raises on {label} (B={batch} T={seq_len}): {describe(exc)}",
            )
        if out.dim() != 3 or tuple(out.shape[:2]) != (batch, seq_len):
            return Finding(
                "shape contract",
                FAIL,
                f"on {label} (B={batch} T={seq_len}) output shape is "
                f"{tuple(out.shape)}, expected ({batch}, {seq_len}, d)",
            )
        if width is not None and out.shape[-1] != width:
            return Finding(
                "shape contract",
                FAIL,
                f"output width {out.shape[-1]} on {label}, {width} elsewhere",
            )
        width = out.shape[-1]
        if weights is not None and (
            weights.shape[-2:] != (seq_len, seq_len)
            or weights.shape[0] != batch
            or weights.dim() not in (3, 4)
        ):
            return Finding(
                "shape contract",
                FAIL,
                f"on {label} (B={batch} T={seq_len}) weights shape is "
                f"{tuple(weights.shape)}, expected ({batch}, [h,] {seq_len}, {seq_len})",
            )
    return Finding(
        "shape contract",
        PASS,
        "batch == seq_len, seq_len == head width / d_model, seq_len 1, batch 1",
    )


def _grad_of(
    subject: Subject, x: Tensor, keep: Tensor | None, select: Callable[[Tensor], Tensor]
) -> Tensor:
    module = subject.copy()
    x = x.detach().requires_grad_(True)
    out, _ = subject.call(module, x, keep)
    (grad,) = torch.autograd.grad(select(out).sum(), x, allow_unused=True)
    return torch.zeros_like(x) if grad is None else grad


@named("batch independence")
def probe_batch_independence(subject: Subject) -> Finding:
    """The loss on sequence 0 gives zero gradient to every other sequence (Karpathy's check)."""
    batch = seq_len = 3  # batch == seq_len: wrong-axis bugs run here instead of raising
    x = subject.x(batch, seq_len, 2)
    grad = _grad_of(subject, x, subject.ordinary_keep(batch, seq_len), lambda out: out[0])
    others = grad[1:].flatten(1).norm(dim=1)
    if others.isnan().any():
        b = int(others.isnan().nonzero()[0]) + 1
        return Finding(
            "batch independence",
            FAIL,
            f"sequence 0's loss sends a NaN gradient to sequence {b}: a NaN in the forward pass "
            "leaks backwards (no proof of mixing; see the other probes)",
        )
    if (others > 0).any():
        b = int(others.argmax()) + 1
        return Finding(
            "batch independence",
            FAIL,
            f"output of sequence 0 depends on sequence {b}: "
            f"gradient norm {others[b - 1].item():.3g}",
        )
    return Finding("batch independence", PASS, "sequence 0's loss: zero gradient to the others")


def _future_leak(subject: Subject, scale: float) -> str | None:
    from harness.probes import future_leak

    cfg = subject.config
    keep = subject.keep("causal", cfg.batch, cfg.seq_len, 0) if subject.takes_mask else None
    leak = future_leak(subject.bound(keep), subject.x(cfg.batch, cfg.seq_len, 3, scale), None)
    return str(leak) if leak else None


def _causal_leak(subject: Subject) -> str | None:
    """Evidence of a future leak (also with large logits), or None."""
    for scale in (1.0, LARGE):
        leak = _future_leak(subject, scale)
        if leak:
            return leak + ("" if scale == 1.0 else f" with activations scaled by {scale:g}")
    return None


def _padding_leak(subject: Subject) -> str | None:
    """Evidence that real outputs depend on padded inputs (also with large logits), or None."""
    cfg = subject.config
    batch, seq_len = cfg.batch, cfg.seq_len
    keep = subject.keep("padding", batch, seq_len, 4)
    real = keep.any(dim=1)  # (B, T)
    for scale in (1.0, LARGE):
        x = subject.x(batch, seq_len, 4, scale)
        for b in range(batch):
            padded = (~real[b]).nonzero().flatten()
            if not len(padded):
                continue
            length = int(real[b].sum())
            grad = _grad_of(subject, x, keep, lambda out, b=b, n=length: out[b, :n])
            norms = grad[b, padded].flatten(1).norm(dim=1)
            if not torch.isfinite(norms).all() or (norms > 0).any():
                i = int(torch.nan_to_num(norms, nan=math.inf).argmax())
                where = "" if scale == 1.0 else f" with activations scaled by {scale:g}"
                return (
                    f"real outputs of sequence {b} depend on padded input {int(padded[i])}: "
                    f"gradient norm {norms[i].item():.3g}{where}"
                )
    return None


def _convention_hint(subject: Subject, check: Callable[[Subject], str | None]) -> str:
    """A hint when the same check passes with the opposite bool convention."""
    other = {"keep": "drop", "drop": "keep"}.get(subject.config.mask)
    if other is None:
        return ""
    flipped = Subject(subject.module, replace(subject.config, mask=other))
    try:
        passes = check(flipped) is None
    except Exception:
        return ""
    return f" (it passes with --mask {other}: is that the module's convention?)" if passes else ""


@named("causal no-leak")
def probe_causal(subject: Subject) -> Finding:
    """Position t's output gives zero gradient to inputs after t, also with large logits."""
    cfg = subject.config
    if not cfg.causal and (not subject.takes_mask or cfg.mask_shape == "bk"):
        return Finding("causal no-leak", SKIP, "not causal (--causal) and takes no (B, T, T) mask")
    leak = _causal_leak(subject)
    if leak:
        return Finding("causal no-leak", FAIL, leak + _convention_hint(subject, _causal_leak))
    return Finding(
        "causal no-leak", PASS, f"no output depends on a later input (also at x {LARGE:g})"
    )


@named("padding no-leak")
def probe_padding(subject: Subject) -> Finding:
    """Real positions' outputs give zero gradient to padded inputs, also with large logits."""
    if not subject.takes_mask:
        return Finding("padding no-leak", SKIP, "takes no mask (--mask none)")
    leak = _padding_leak(subject)
    if leak:
        return Finding("padding no-leak", FAIL, leak + _convention_hint(subject, _padding_leak))
    return Finding("padding no-leak", PASS, "real outputs: zero gradient to padded inputs")


@named("permutation equivariance")
def probe_permutation(subject: Subject) -> Finding:
    """Permuting the positions permutes the output, when positions are not used."""
    cfg = subject.config
    if cfg.causal or cfg.positional:
        return Finding("permutation equivariance", SKIP, "causal or positional (--positional)")
    if not subject.deterministic:
        return Finding("permutation equivariance", SKIP, "not deterministic in eval mode (above)")
    module = subject.copy()
    x = subject.x(cfg.batch, cfg.seq_len, 5)
    perm = torch.randperm(cfg.seq_len, generator=generator(5))
    keep = subject.keep("padding", cfg.batch, cfg.seq_len, 5) if subject.takes_mask else None
    keep_perm = None if keep is None else keep[:, perm][:, :, perm]
    with torch.no_grad():
        out, _ = subject.call(module, x, keep)
        out_perm, _ = subject.call(module, x[:, perm], keep_perm)
    diff = (out[:, perm] - out_perm).abs().nan_to_num(math.inf).max().item()
    if diff > EXACT * max(1.0, out.abs().nan_to_num(0).max().item()):
        return Finding(
            "permutation equivariance",
            FAIL,
            f"permuting the positions changes more than their order: max |diff| {diff:.3g} "
            "(if the module uses positions on purpose, pass --positional)",
        )
    return Finding("permutation equivariance", PASS, "permuted input, permuted output")


@named("attention weights")
def probe_weights(subject: Subject) -> Finding:
    """Returned weights: non-negative rows summing to 1, zero where masked, not saturated."""
    cfg = subject.config
    module = subject.copy()
    keep = subject.ordinary_keep(cfg.batch, cfg.seq_len)
    with torch.no_grad():
        _, weights = subject.call(module, subject.x(cfg.batch, cfg.seq_len, 6), keep)
    if weights is None:
        return Finding("attention weights", SKIP, "forward returns no weights")
    w = weights.double().cpu()
    allowed = subject.effective_keep(keep, cfg.batch, cfg.seq_len)
    if allowed is not None and w.dim() == 4:
        allowed = allowed[:, None]
    if allowed is not None:
        allowed = allowed.expand_as(w)
        live = allowed.any(-1)
    else:
        live = torch.ones(w.shape[:-1], dtype=torch.bool)
    rows = w[live]
    if not torch.isfinite(rows).all():
        return Finding("attention weights", FAIL, "NaN or Inf in rows that have allowed keys")
    row_err = (rows.sum(-1) - 1).abs().max().item() if rows.numel() else 0.0
    if row_err > 1e-6 or (rows < 0).any():
        return Finding(
            "attention weights",
            FAIL,
            f"rows are not distributions: max |row sum - 1| = {row_err:.3g}",
        )
    if allowed is not None:
        leaked = w.masked_fill(allowed, 0).nan_to_num(0).abs().max().item()
        if leaked > EXACT:
            return Finding("attention weights", FAIL, f"weight {leaked:.3g} on a masked key")
    saturated = (rows.max(-1).values >= 0.99).double().mean().item() if rows.numel() else 0.0
    if saturated > 0.5:
        return Finding(
            "attention weights",
            FAIL,
            f"{saturated:.0%} of rows put >= 0.99 of their weight on one key at "
            "initialisation (projection init too large?)",
        )
    return Finding("attention weights", PASS, "rows sum to 1, zero where masked, not saturated")


@named("agrees with SDPA")
def probe_sdpa(subject: Subject) -> Finding:
    """Agreement with F.scaled_dot_product_attention on the module's own projections."""
    if subject.config.positional:
        return Finding("agrees with SDPA", SKIP, "uses positions (--positional): SDPA would not")
    if not subject.deterministic:
        return Finding("agrees with SDPA", SKIP, "not deterministic in eval mode (see above)")
    module = subject.copy()
    found = recognize(module)
    if found is None:
        reason = "projections not recognized (or other parameters or non-mask buffers present)"
        return Finding("agrees with SDPA", SKIP, reason)
    described = found[3]
    cfg = subject.config
    keep = subject.ordinary_keep(cfg.batch, cfg.seq_len)
    allowed = subject.effective_keep(keep, cfg.batch, cfg.seq_len)
    x = subject.x(cfg.batch, cfg.seq_len, 8)
    with torch.no_grad():
        ref = attend(found, x, allowed)
        out, _ = subject.call(module, x, keep)
    if out.shape != ref.shape:
        return Finding(
            "agrees with SDPA",
            FAIL,
            f"output {tuple(out.shape)} vs SDPA's {tuple(ref.shape)} on {described}",
        )
    diff = (out - ref).abs().nan_to_num(math.inf).max().item()
    if diff > 1e-6 * max(1.0, ref.abs().max().item()):
        return Finding(
            "agrees with SDPA",
            FAIL,
            f"max |output - SDPA| = {diff:.3g} on {described} (scale, mask or head layout?)",
        )
    return Finding("agrees with SDPA", PASS, f"within 1e-6 on {described}")


def probe_half(subject: Subject, dtype: torch.dtype) -> Finding:
    """No error and no NaN in a low-precision dtype on ordinary inputs."""
    name = str(dtype).removeprefix("torch.")
    cfg = subject.config
    try:
        module = subject.copy(dtype)
        x = subject.x(cfg.batch, cfg.seq_len, 9).to(dtype)
        with torch.no_grad():
            out, _ = subject.call(module, x, subject.ordinary_keep(cfg.batch, cfg.seq_len))
    except Exception as exc:
        return Finding(f"{name} robustness", FAIL, f"raises: {describe(exc)}")
    if not torch.isfinite(out).all():
        return Finding(f"{name} robustness", FAIL, f"non-finite output{first_nonfinite(out)}")
    if dtype is torch.float16:
        with torch.no_grad():
            big, _ = subject.call(
                module,
                (x.double() * HALF_LARGE).to(dtype),
                subject.ordinary_keep(cfg.batch, cfg.seq_len),
            )
        if not torch.isfinite(big).all():
            return _half_overflow(subject, module, x, big)
    return Finding(f"{name} robustness", PASS, "no error, no NaN")


def _half_overflow(subject: Subject, module: nn.Module, x: Tensor, big: Tensor) -> Finding:
    """float16 overflowed at large activations: a warning when SDPA on the same projections
    stays finite there (so the module's order of operations is to blame), else a pass."""
    name = "float16 robustness"
    where = f"with activations scaled by {HALF_LARGE:g}: output{first_nonfinite(big)}"
    found = recognize(module)
    if found is None:
        advice = "Q K^T overflowing float16's 65504? scale Q first, or compute it in float32"
        return Finding(name, WARN, f"{where} ({advice})")
    cfg = subject.config
    keep = subject.ordinary_keep(cfg.batch, cfg.seq_len)
    allowed = subject.effective_keep(keep, cfg.batch, cfg.seq_len)
    with torch.no_grad():
        ref = attend(found, (x.double() * HALF_LARGE).to(x.dtype), allowed)
    if not torch.isfinite(ref).all():
        reason = "but SDPA on the same projections overflows too: beyond float16's range"
        return Finding(name, PASS, f"{where}, {reason}")
    advice = "Q K^T overflows before the scale? Scale Q first, or compute it in float32"
    return Finding(
        name, WARN, f"{where}, while SDPA on the same projections stays finite: {advice}"
    )


@named("all-masked rows")
def probe_all_masked(subject: Subject) -> Finding:
    """A sequence that is all padding: NaN there is a warning, NaN elsewhere a failure."""
    cfg = subject.config
    if not subject.takes_mask:
        return Finding("all-masked rows", SKIP, "takes no mask")
    module = subject.copy()
    x = subject.x(cfg.batch, cfg.seq_len, 10).requires_grad_(True)
    with torch.no_grad():
        ordinary, _ = subject.call(module, x, subject.keep("padding", cfg.batch, cfg.seq_len, 10))
    if not torch.isfinite(ordinary).all():
        return Finding("all-masked rows", FAIL,
                       f"NaN already with ordinary padding, where every query has a key: "
                       f"output{first_nonfinite(ordinary)} (see the other probes)")  # fmt: skip
    keep = subject.keep("padding", cfg.batch, cfg.seq_len, 10, empty=True)
    out, _ = subject.call(module, x, keep)
    empty = ~keep.any(-1).any(-1)  # (B,) sequences with no key at all
    if not torch.isfinite(out[~empty.to(out.device)]).all():
        return Finding(
            "all-masked rows", FAIL, "one all-padding sequence makes other sequences' outputs NaN"
        )
    if torch.isfinite(out).all():
        return Finding("all-masked rows", PASS, "finite for a query with no allowed key")
    G = torch.randn(out.shape, generator=generator(10), dtype=out.dtype).to(out.device)
    grads = torch.autograd.grad((out * G).sum(), list(module.parameters()), allow_unused=True)
    poisoned = [
        n
        for (n, _), g in zip(module.named_parameters(), grads, strict=True)
        if g is not None and not torch.isfinite(g).all()
    ]
    extra = f"; NaN reaches the gradient of {', '.join(poisoned)}" if poisoned else ""
    return Finding(
        "all-masked rows",
        WARN,
        f"a query with no allowed key gives NaN (output{first_nonfinite(out.detach())}; "
        f"SDPA returns 0 there){extra}",
    )


@named("gradient flow")
def probe_gradients(subject: Subject) -> Finding:
    """Every parameter gets a gradient; exactly-zero ones are dead weight (a warning)."""
    cfg = subject.config
    module = subject.copy()
    x = subject.x(cfg.batch, cfg.seq_len, 11)
    out, _ = subject.call(module, x, subject.ordinary_keep(cfg.batch, cfg.seq_len))
    G = torch.randn(out.shape, generator=generator(11), dtype=out.dtype).to(out.device)
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if not named:
        return Finding("gradient flow", SKIP, "no trainable parameters")
    grads = torch.autograd.grad((out * G).sum(), [p for _, p in named], allow_unused=True)
    norms = {
        n: (math.nan if g is None else g.norm().item())
        for (n, _), g in zip(named, grads, strict=True)
    }
    unused = [n for n, g in zip(norms, grads, strict=True) if g is None]
    if unused:
        return Finding("gradient flow", FAIL, f"no gradient reaches {', '.join(unused)} (unused?)")
    typical = max(norms.values())
    dead = [n for n, v in norms.items() if v <= 1e-9 * typical]
    if dead:
        return Finding(
            "gradient flow",
            WARN,
            f"dead weight: {', '.join(dead)} gets no gradient (norm "
            f"{max(norms[n] for n in dead):.2g} against {typical:.3g}); a key bias is the usual "
            "case: softmax ignores it",
        )
    return Finding("gradient flow", PASS, f"all {len(norms)} parameters get a gradient")


@named("eval determinism")
def probe_determinism(subject: Subject) -> Finding:
    """Two identical calls in eval mode give identical outputs."""
    from harness.probes import repeat_difference

    cfg = subject.config
    keep = subject.ordinary_keep(cfg.batch, cfg.seq_len)
    diff = repeat_difference(
        subject.bound(keep), subject.x(cfg.batch, cfg.seq_len, 12), None, cfg.seed
    )
    subject.deterministic = diff == 0
    if diff > 0:
        return Finding(
            "eval determinism",
            FAIL,
            f"two identical calls in eval mode differ by up to {diff:.3g} (dropout left on?)",
        )
    return Finding("eval determinism", PASS, "identical")


@named("float16 robustness")
def probe_float16(subject: Subject) -> Finding:
    return probe_half(subject, torch.float16)


@named("bfloat16 robustness")
def probe_bfloat16(subject: Subject) -> Finding:
    return probe_half(subject, torch.bfloat16)


PROBES: list[Probe] = [
    probe_determinism,  # first: comparisons between two calls need it
    probe_shapes,
    probe_batch_independence,
    probe_causal,
    probe_padding,
    probe_permutation,
    probe_weights,
    probe_sdpa,
    probe_float16,
    probe_bfloat16,
    probe_all_masked,
    probe_gradients,
]


@contextmanager
def _isolated(seed: int) -> Iterator[None]:
    with seeded(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def diagnose(module: nn.Module, config: Config | None = None, target: str = "") -> Diagnosis:
    """Run every probe on a copy of ``module``; the module itself is left as it was."""
    config = config or Config()
    check_signature(module, config.mask != "none")
    subject = Subject(module, config)
    diagnosis = Diagnosis(target or type(module).__name__, config)
    with _isolated(config.seed):
        for probe in PROBES:
            try:
                finding = probe(subject)
            except UsageError:
                raise
            except Exception as exc:
                finding = Finding(probe.probe_name, FAIL, f"raises: {describe(exc)}")
            diagnosis.findings.append(finding)
    return diagnosis
