"""The SDPA reference and the pair checks built on it (harness.reference, harness.testing)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from harness import metrics
from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.catalogue.verdicts import Verdict
from harness.masks import causal_keep
from harness.reference import agreement, attend, math_attention, recognize, rotate
from harness.runner import split_output
from harness.shapes import Shape
from harness.testing import (
    assert_diff_is_small_and_marked,
    assert_fixed_matches_sdpa,
    assert_verdict_matches_card,
)
from tests.helpers import correct_class, make_pair, offset_class

CPU = torch.device("cpu")
SHAPE = Shape()  # B=2 T=5 d_model=16 d_k=8 d_v=6


def test_math_attention_matches_sdpa_with_a_mask():
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 5, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64)
    keep = causal_keep(2, 5)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert torch.allclose(math_attention(q, k, v, keep), want, rtol=0, atol=1e-12)
    assert torch.allclose(math_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))


def kernel_errors(module: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> list[float]:
    """Max abs errors of SDPA and of textbook math, both in ``dtype``, against SDPA in float64,
    on the module's own projections (computed here, without harness.reference)."""

    def projections(d):
        return [
            F.linear(x.to(d), getattr(module, n).weight.detach().to(d))[:, None]  # (B, 1, T, ·)
            for n in ("W_q", "W_k", "W_v")
        ]

    with torch.no_grad():
        ref = F.scaled_dot_product_attention(*projections(torch.float64))
        q, k, v = projections(dtype)
        sdpa = F.scaled_dot_product_attention(q, k, v)
        textbook = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1) @ v
    return [(out.double() - ref).abs().max().item() for out in (sdpa, textbook)]


def test_agreement_takes_the_larger_kernel_error_as_the_floor():
    pair = make_pair(correct_class(), correct_class())
    fixed, _ = build_pair(pair, SHAPE, 0)
    x = pair.card.inputs(SHAPE, 0).x
    spread = []
    for dtype in (torch.bfloat16, torch.float16):
        err, floor, tol = agreement(fixed, None, x, None, CPU, dtype)
        errors = kernel_errors(fixed, x, dtype)
        assert floor.max_abs == pytest.approx(max(errors), rel=1e-3), dtype
        spread.append(min(errors) / max(errors))
        eps = torch.finfo(dtype).eps
        assert eps / 4 <= tol <= 8 * eps  # atol taken in the dtype (outputs are of order 1)
        ref = split_output(fixed.double()(x))[0]
        assert tol == pytest.approx(max(metrics.atol(ref, dtype), eps * ref.abs().max().item()))
        assert err.max_abs <= metrics.threshold(floor, tol, metrics.OUTPUT_FACTOR)
    assert min(spread) < 0.95  # the two kernels disagree here, so the choice is tested


def test_agreement_allows_one_unit_in_the_last_place_where_atol_finds_no_noise():
    # eight outputs that all come through atol's round trip exact (a floor of 0 from atol alone),
    # where fixed.py's float32 result was found more than 2x SDPA's error off: rounding
    pair = registry.load("qk_overflow_half")
    shape = Shape(batch=2, seq_len=4, d_model=1, d_k=5, d_v=1, heads=1)
    fixed, _ = build_pair(pair, shape, 357)
    x = pair.card.inputs(shape, 357).x
    err, floor, tol = agreement(fixed, None, x, None, CPU, torch.float32)
    ref = split_output(fixed.double()(x))[0]
    assert metrics.atol(ref, torch.float32) == 0
    assert tol == pytest.approx(torch.finfo(torch.float32).eps * ref.abs().max().item())
    assert err.max_abs <= metrics.threshold(floor, tol, metrics.OUTPUT_FACTOR)


def test_agreement_refuses_a_module_with_parameters_it_cannot_place():
    class WithNorm(correct_class()):
        def __init__(self, d_model, d_k, d_v):
            super().__init__(d_model, d_k, d_v)
            self.norm = nn.LayerNorm(d_model)

        def forward(self, x, mask=None):
            return super().forward(self.norm(x), mask)

    module = WithNorm(SHAPE.d_model, SHAPE.d_k, SHAPE.d_v)
    x = torch.randn(2, 5, SHAPE.d_model, dtype=torch.float64)
    with pytest.raises(ValueError, match="not recognized"):
        agreement(module, None, x, None, CPU, torch.float32)


@pytest.mark.parametrize("mask", ["none", "causal", "padding"])
def test_a_correct_fixed_module_matches_sdpa(mask):
    pair = make_pair(correct_class(), correct_class(), mask=mask)
    for dtype in (torch.float32, torch.bfloat16):
        assert_fixed_matches_sdpa(pair, CPU, dtype, SHAPE, seed=1)


@pytest.mark.parametrize("wrong", [offset_class(1e-3), offset_class(-1e-3)])
def test_a_wrong_fixed_module_fails_the_sdpa_check(wrong):
    pair = make_pair(wrong, correct_class())
    with pytest.raises(AssertionError, match=r"synthetic/fixed\.py vs SDPA"):
        assert_fixed_matches_sdpa(pair, CPU, torch.float32, SHAPE, seed=1)


def test_a_fixed_module_ignoring_its_mask_fails_the_sdpa_check():
    class Unmasked(correct_class()):
        def forward(self, x, mask=None):
            return super().forward(x)

    pair = make_pair(Unmasked, correct_class(), mask="causal")
    with pytest.raises(AssertionError, match="max abs error"):
        assert_fixed_matches_sdpa(pair, CPU, torch.float32, SHAPE, seed=1)


def test_verdict_check_compares_the_measurement_with_the_card():
    silent = (correct_class(), offset_class(1e-1))
    assert_verdict_matches_card(make_pair(*silent, expected=Verdict.SILENT), CPU)
    with pytest.raises(AssertionError, match="synthetic: float32: SILENT"):
        assert_verdict_matches_card(make_pair(*silent, expected=Verdict.BENIGN), CPU)


def pair_in(folder, buggy: str, fixed: str):
    """A pair whose buggy.py and fixed.py are the given texts, written to ``folder``."""
    (folder / "buggy.py").write_text(buggy)
    (folder / "fixed.py").write_text(fixed)
    pair = make_pair(correct_class(), correct_class())
    pair.fixed.__file__ = str(folder / "fixed.py")
    return pair


def test_diff_check_wants_a_small_marked_difference(tmp_path):
    body = "import torch\n\n\ndef f(x):\n    return x\n"
    marked = pair_in(
        tmp_path, body.replace("x\n", "-x  # BUG: sign\n"), body.replace("x\n", "x  # FIX\n")
    )
    assert_diff_is_small_and_marked(marked)
    for buggy, fixed in [
        (body, body),  # no difference: nothing to learn
        (body.replace("x\n", "-x\n"), body),  # unmarked
        (body + "".join(f"y{i} = {i}  # BUG\n" for i in range(9)), body),  # too big
    ]:
        with pytest.raises(AssertionError):
            assert_diff_is_small_and_marked(pair_in(tmp_path, buggy, fixed))


# --- recognizing the projection layouts of real code -------------------------------------------


class Conv1D(nn.Module):
    """transformers' GPT-2 projection: weight stored (in, out), y = x @ W + b."""

    def __init__(self, n_out: int, n_in: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.1)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class ShardedLinear(nn.Module):
    """fairscale's ColumnParallelLinear on one device, as Meta's Llama uses it: no
    nn.Linear, a weight (out, in) and ``F.linear`` in its forward. ``factor``: what it
    multiplies by after (anything but 1: not a projection by its weight alone)."""

    def __init__(self, n_in: int, n_out: int, factor: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * 0.2)
        self.factor = factor

    def forward(self, x):
        return F.linear(x, self.weight) * self.factor


class Layouts(nn.Module):
    """Attention on SDPA whose projections are laid out as ``kind`` says."""

    def __init__(self, kind: str, d: int = 16, heads: int = 4, kv_heads: int = 4):
        super().__init__()
        self.kind, self.heads, self.kv = kind, heads, d // heads * kv_heads
        if kind == "sequential":
            self.q, self.k, self.v = (nn.Linear(d, d) for _ in range(3))
            self.to_out = nn.Sequential(nn.Linear(d, d), nn.Dropout(0.1))
        elif kind == "module_list_out":
            self.to_q, self.to_k, self.to_v = (nn.Linear(d, d) for _ in range(3))
            self.to_out = nn.ModuleList([nn.Linear(d, d), nn.Dropout(0.1)])
        elif kind == "conv1d":
            self.c_attn, self.c_proj = Conv1D(3 * d, d), Conv1D(d, d)
        elif kind in ("bare_in_out", "bare_out_in"):
            self.W_q, self.W_k, self.W_v = (nn.Parameter(torch.randn(d, d) * 0.2) for _ in range(3))
        elif kind == "in_proj":
            self.in_proj_weight = nn.Parameter(torch.randn(3 * d, d) * 0.2)
            self.in_proj_bias = nn.Parameter(torch.zeros(3 * d))
            self.out_proj = nn.Linear(d, d)
        elif kind == "q_and_kv":
            self.to_q, self.to_kv, self.to_out = (
                nn.Linear(d, d),
                nn.Linear(d, 2 * d),
                nn.Linear(d, d),
            )
        elif kind in ("sharded", "sharded_doubled"):
            factor = 2.0 if kind == "sharded_doubled" else 1.0
            self.wq, self.wk, self.wv, self.wo = (ShardedLinear(d, d, factor) for _ in range(4))
        elif kind == "gqa":
            self.q_proj, self.o_proj = nn.Linear(d, d), nn.Linear(d, d)
            self.k_proj, self.v_proj = nn.Linear(d, self.kv), nn.Linear(d, self.kv)

    def qkv(self, x):
        k = self.kind
        if k == "sequential":
            return self.q(x), self.k(x), self.v(x)
        if k == "module_list_out":
            return self.to_q(x), self.to_k(x), self.to_v(x)
        if k == "conv1d":
            return self.c_attn(x).chunk(3, dim=-1)
        if k == "bare_in_out":
            return x @ self.W_q, x @ self.W_k, x @ self.W_v
        if k == "bare_out_in":
            return x @ self.W_q.T, x @ self.W_k.T, x @ self.W_v.T
        if k == "in_proj":
            return F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        if k == "q_and_kv":
            return (self.to_q(x), *self.to_kv(x).chunk(2, dim=-1))
        if k.startswith("sharded"):
            return self.wq(x), self.wk(x), self.wv(x)
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def out(self, y):
        if self.kind == "module_list_out":
            return self.to_out[1](self.to_out[0](y))
        layer = {"sequential": "to_out", "conv1d": "c_proj", "in_proj": "out_proj",
                 "q_and_kv": "to_out", "gqa": "o_proj", "sharded": "wo",
                 "sharded_doubled": "wo"}.get(self.kind)  # fmt: skip
        return y if layer is None else getattr(self, layer)(y)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x)
        q = q.view(B, T, self.heads, -1).transpose(1, 2)  # (B, h, T, d)
        k, v = (t.view(B, T, -1, q.shape[-1]).transpose(1, 2) for t in (k, v))  # (B, h_kv, T, d)
        groups = self.heads // k.shape[1]
        k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(B, T, -1))


LAYOUTS = ["sequential", "module_list_out", "conv1d", "bare_in_out", "bare_out_in", "in_proj",
           "q_and_kv", "gqa", "sharded"]  # fmt: skip


@pytest.mark.parametrize("kind", LAYOUTS)
def test_each_projection_layout_of_real_code_is_recognized_and_reproduced(kind):
    torch.manual_seed(0)
    module = Layouts(kind, kv_heads=2 if kind == "gqa" else 4).double().eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    readings = recognize(module)
    assert readings, kind
    with torch.no_grad():
        errors = []
        for reading in readings:
            try:
                errors.append((attend(reading, x, None) - module(x)).abs().max().item())
            except RuntimeError:
                continue
    assert min(errors) < 1e-12, (kind, errors)


def test_a_layer_that_is_not_an_affine_map_by_its_own_weight_is_no_projection():
    """What a layer computes decides, not its parameters' shapes: a weight whose result is
    then doubled is not read as a projection, so the module is not compared."""
    assert recognize(Layouts("sharded")) and not recognize(Layouts("sharded_doubled"))


class LowRank(nn.Module):
    """A frozen weight with a low-rank adapter beside it, as peft's LoRA layers compute:
    W x + s B A x; ``bend``: a tanh on the adapter's path, no affine map any more."""

    def __init__(self, d: int, rank: int = 2, bend: bool = False):
        super().__init__()
        self.base_layer = nn.Linear(d, d)
        self.lora_A, self.lora_B = nn.Linear(d, rank, bias=False), nn.Linear(rank, d, bias=False)
        nn.init.normal_(self.lora_B.weight, std=0.1)
        self.bend = bend

    def forward(self, x):
        low = self.lora_B(self.lora_A(x))
        return self.base_layer(x) + 2.0 * (torch.tanh(low) if self.bend else low)


@pytest.mark.parametrize("bend", [False, True])
def test_a_layer_with_a_low_rank_adapter_is_a_projection_while_it_stays_affine(bend):
    torch.manual_seed(0)
    module = Layouts("gqa").double().eval()
    for name in ("q_proj", "k_proj", "v_proj"):
        setattr(module, name, LowRank(16, bend=bend).double())
    readings = recognize(module)
    assert bool(readings) is not bend
    if not bend:
        x = torch.randn(2, 5, 16, dtype=torch.float64)
        with torch.no_grad():
            assert (attend(readings[0], x, None) - module(x)).abs().max() < 1e-12


def test_an_nn_linear_whose_forward_hook_changes_its_output_is_no_projection():
    """A forward hook is part of what the layer computes: an nn.Linear whose hook rescales its
    output is not a projection by its weight, so SDPA is not run on it as if it were."""
    module = Layouts("gqa")
    assert recognize(module)
    handle = module.q_proj.register_forward_hook(lambda layer, inputs, out: out * 0.5)
    assert not recognize(module)
    handle.remove()
    module.q_proj.register_forward_hook(lambda layer, inputs, out: out)  # changes nothing
    assert recognize(module)


def test_an_output_projection_in_a_module_list_with_dropout_is_recognized():
    readings = recognize(Layouts("module_list_out"))
    assert readings and "to_out" in readings[0][3]


def test_rope_styles_match_the_half_split_and_the_complex_forms():
    t = torch.randn(2, 3, 5, 8, dtype=torch.float64)  # (B, h, T, d)
    inv = 10000.0 ** -(torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    angles = torch.arange(5, dtype=torch.float64)[:, None] * inv  # (T, d / 2)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = t * cos + torch.cat([-t[..., 4:], t[..., :4]], -1) * sin  # transformers
    assert torch.allclose(rotate(t, "half"), half)
    pairs = torch.view_as_real(
        torch.view_as_complex(t.reshape(2, 3, 5, 4, 2))
        * torch.polar(torch.ones_like(angles), angles)
    ).flatten(-2)  # Meta
    assert torch.allclose(rotate(t, "pairs"), pairs)


def test_a_module_list_that_holds_none_is_no_list_of_heads():
    """PerceiverIO keeps None in a ModuleList (layers tied away): not read, not a crash."""
    from harness.reference import recognize

    holder = nn.Module()
    holder.layers = nn.ModuleList([nn.Linear(8, 8), None])
    assert recognize(holder) == []  # it raises AttributeError on None without the guard
