"""The doctor's reading of one recorded forward: what ran, at which line, and the trap it names
first. Each module here is read for what it computes, whatever its names say."""

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from harness import cli
from harness.catalogue import registry
from harness.doctor import Config, diagnose
from harness.doctor.causes import read_causes
from harness.doctor.findings import FAIL, PASS, SKIP, Finding
from harness.doctor.model.diagnosis import first_trap
from harness.doctor.reading import checks
from harness.doctor.reading.attention import sites
from harness.doctor.reading.axes import axis_at, indexed_axis, span
from harness.doctor.reading.checks import read_failures
from harness.doctor.reading.groups import grouping, shared_heads
from harness.doctor.reading.known import Named, Reading
from harness.doctor.reading.record import record
from harness.doctor.reading.split import axis_before
from harness.validation import build, config_for
from tests import doctor_modules as dm
from tests import fix_modules as fm
from tests.helpers import TUTORIAL_EDITS

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "pitfalls" / "tutorial.py"


class Transposed(nn.Module):
    """Correct attention written the other way round: scores (B, S, T) with keys on axis 1,
    the softmax over axis 1, the weights transposed before the product with V."""

    def __init__(self, d_model):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)  # (B, T, d)
        scores = k @ q.transpose(1, 2) / math.sqrt(q.size(-1))  # (B, S, T): keys first
        weights = scores.softmax(dim=1)  # over the keys
        return weights.transpose(1, 2) @ v


class ValuesFirst(Transposed):
    """Correct again: scores (B, T, S) as usual, but the product with V written V-first, so the
    weights are its second operand and the keys their last axis by the product, not by place."""

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)  # (B, T, d)
        scores = k @ q.transpose(1, 2) / math.sqrt(q.size(-1))  # (B, S, T): keys first
        weights = scores.softmax(dim=1)  # over the keys
        return (v.transpose(1, 2) @ weights).transpose(1, 2)  # (B, d, T) -> (B, T, d)


class RotaryScaledFirst(nn.Module):
    """q scaled before rotary (half-split pairing), then the plain product: the scale is read
    through the rotation, back to the projection."""

    def __init__(self, d_model, factor=1.0):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))
        self.factor = factor  # 1.0: correct; another: a second scale after the rotation

    def rotate(self, x):
        T, half = x.size(1), x.size(-1) // 2
        angle = torch.arange(T)[:, None] * 0.1 * torch.arange(1, half + 1)  # (T, d/2)
        cos, sin = angle.cos(), angle.sin()
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(self, x):
        q = self.q(x) / math.sqrt(x.size(-1))  # scaled first
        q, k = self.rotate(q) * self.factor, self.rotate(self.k(x))
        weights = (q @ k.transpose(1, 2)).softmax(-1)
        return weights @ self.v(x)


class Heads(nn.Module):
    """Multi-head einsum attention; ``axis`` is the softmax's (-1 is right: the keys)."""

    def __init__(self, d_model, axis=-1):
        super().__init__()
        self.qkv, self.axis = nn.Linear(d_model, 3 * d_model), axis

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 4, C // 4).unbind(2)  # (B, T, h, d)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * (C // 4) ** -0.5  # (B, h, T, S)
        weights = F.softmax(scores, dim=self.axis)
        return torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(B, T, C)


class TalkingHeads(nn.Module):
    """Heads mixed by learned matrices before and after the softmax (CaiT): the mixing products
    are followed by their letters, not taken for q k^T or for the product with V."""

    def __init__(self, d_model, heads=4):
        super().__init__()
        self.qkv, self.heads = nn.Linear(d_model, 3 * d_model), heads
        self.pre = nn.Parameter(torch.randn(heads, heads))
        self.post = nn.Parameter(torch.randn(heads, heads))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # (B, h, T, d)
        dots = torch.einsum("bhid,bhjd->bhij", q, k) * q.size(-1) ** -0.5
        dots = torch.einsum("bhij,hg->bgij", dots, self.pre)
        attn = torch.einsum("bhij,hg->bgij", dots.softmax(dim=-1), self.post)
        return torch.einsum("bhij,bhjd->bhid", attn, v).transpose(1, 2).reshape(B, T, C)


class NormedInside(nn.Module):
    """A LayerNorm inside the module (vit-pytorch's), where SDPA's comparison cannot run;
    ``scale`` is what it puts on the scores."""

    def __init__(self, d_model, scale=None):
        super().__init__()
        self.norm, self.qkv = nn.LayerNorm(d_model), nn.Linear(d_model, 3 * d_model)
        self.scale = scale

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.norm(x)).view(B, T, 3, 4, -1).permute(2, 0, 3, 1, 4)
        scale = q.size(-1) ** -0.5 if self.scale is None else self.scale
        weights = (q @ k.transpose(-1, -2) * scale).softmax(-1)
        return (weights @ v).transpose(1, 2).reshape(B, T, C)


class WhereCausal(nn.Module):
    """GPT-Neo's mask: torch.where(causal, scores, min) keeps where the triangle is True."""

    def __init__(self, d_model, diagonal=0):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.register_buffer("bias", torch.ones(16, 16, dtype=torch.bool).tril(diagonal))

    def forward(self, x):
        T, C = x.shape[1:]
        q, k, v = self.qkv(x).split(C, dim=-1)
        scores = q @ k.transpose(1, 2) / math.sqrt(C)
        scores = torch.where(self.bias[:T, :T], scores, torch.finfo(scores.dtype).min)
        return scores.softmax(-1) @ v


def test_talking_heads_mixing_is_followed_not_taken_for_the_product():
    module = TalkingHeads(16)
    x = torch.randn(2, 5, 16)
    [site] = sites(record(module, lambda: module(x), {"x": x}))
    assert (site.key_axis, site.softmax_axis, site.width) == (3, 3, 4)
    assert site.complete and site.scale == pytest.approx(0.5)
    assert not [c for c in diagnose(TalkingHeads(16), Config(), "TalkingHeads").causes if c.read]


@pytest.mark.parametrize(("scale", "trap"), [(None, None), (1.0, "missing_scale"),
                                             (16**-0.5, "scale_d_model")])  # fmt: skip
def test_a_wrong_scale_fails_as_read_where_sdpa_cannot_be_compared(scale, trap):
    d = diagnose(NormedInside(16, scale), Config(), "NormedInside")
    sdpa = next(f for f in d.findings if f.probe == "agrees with SDPA")
    assert sdpa.status == "skip", d.text()
    assert d.healthy == (trap is None), d.text()
    if trap:
        assert d.causes[0].trap == trap and "read from the forward" in d.causes[0].probes


@pytest.mark.parametrize("d_model", [16, 32])  # at 16, 1/sqrt(d_model) is also 1/width
def test_queries_scaled_by_a_hook_on_their_projection_and_again_are_double_scale(d_model):
    """A hook on q_proj that folds 1/sqrt(d_k) into the queries, which the forward scales
    again: the hooked layer is no bare projection, so the scale read from the forward decides."""
    module = dm.NamedLayers(d_model, 4, ("q_proj", "k_proj", "v_proj", "o_proj"))
    module.q_proj.register_forward_hook(lambda layer, inputs, out: out * (d_model // 4) ** -0.5)
    d = diagnose(module, Config(), "NamedLayers")
    assert next(f for f in d.findings if f.probe == "agrees with SDPA").status == "skip"
    assert d.causes[0].trap == "double_scale", d.text()


@pytest.mark.parametrize("split_by_view", [False, True])
def test_the_heads_are_as_many_as_the_forward_contracts_whatever_their_count_is_called(
    split_by_view,
):
    """Heads counted under a name no table lists are read from the forward (the queries' width
    over the width the product contracts): SDPA is compared in 4 heads, not 1."""
    d = diagnose(dm.FoldedHeads(32, 4, split_by_view), Config(), "FoldedHeads")
    sdpa = next(f for f in d.findings if f.probe == "agrees with SDPA")
    assert "with 4 head(s)" in sdpa.message, sdpa
    assert sdpa.status == ("fail" if split_by_view else "pass"), sdpa
    if split_by_view:
        assert sdpa.traps == ("head_split_view",), sdpa


@pytest.mark.parametrize("scaled", [True, False])
def test_a_one_by_one_convolution_is_a_projection_and_the_scale_is_read_through_it(scaled):
    d = diagnose(dm.ConvProjections(32, 4, scaled), Config(d_model=32), "ConvProjections")
    facts = {f.name: f.value for f in d.facts}
    assert facts["scale"] == ("0.353553 (on the queries)" if scaled else "1 (none applied)")
    assert d.healthy == scaled and (scaled or d.causes[0].trap == "missing_scale"), d.text()


class PatchedSoftmax(nn.Module):
    """Attention whose forward runs with ``torch.Tensor.softmax`` replaced by a Python wrapper
    (as a test's injected bug, or a library's patch, sets it), here over the queries' axis."""

    def __init__(self, dim):
        super().__init__()
        self.inner = dm.EinsumAttention(dim, 4)

    def forward(self, x, mask=None):
        original = torch.Tensor.softmax
        torch.Tensor.softmax = lambda t, dim=None, **kw: original(t, dim=-2)
        try:
            return self.inner(x, mask)
        finally:
            torch.Tensor.softmax = original


def test_a_torch_method_replaced_by_a_python_function_is_read_by_the_name_it_is_called_by():
    d = diagnose(PatchedSoftmax(32), Config(), "PatchedSoftmax")
    assert d.causes and d.causes[0].trap == "softmax_dim", d.text()


@pytest.mark.parametrize(("diagonal", "said"), [(0, "blocked"), (1, "open: key t + 1")])
def test_a_mask_chosen_with_where_blocks_where_its_condition_is_false(diagonal, said):
    d = diagnose(WhereCausal(16, diagonal), Config(causal=True), "WhereCausal")
    future = next(f.value for f in d.facts if f.name == "future")
    assert future.startswith(said), d.text()
    assert d.healthy == (diagonal == 0), d.text()


def test_the_record_keeps_each_op_its_arguments_and_the_line_that_ran_it():
    module = Transposed(8)
    x = torch.randn(2, 3, 8)
    found = record(module, lambda: module(x), {"x": x})
    names = [op.name for op in found.ops]
    assert names[:3] == ["linear"] * 3 and "softmax" in names
    first = found.ops[0]
    assert [(v.kind, v.ref) for v in first.args[:2]] == [("input", "x"), ("parameter", "q.weight")]
    assert first.line == f"tests/test_reading.py:{Transposed.forward.__code__.co_firstlineno + 1}"
    softmax = found.ops[names.index("softmax")]
    assert softmax.const(1, "dim") == 1 and softmax.code.startswith("weights = scores.softmax")


def test_an_ops_ancestors_are_every_op_its_result_is_computed_from():
    """The output's ancestors hold every op of an attention (its product with the values
    takes the weights first, the values second), and an op none of it reads is not one."""
    module = Transposed(8)
    x = torch.randn(2, 3, 8)
    found = record(module, lambda: module(x), {"x": x})
    names = [op.name for op in found.ops]
    last = max(i for i, name in enumerate(names) if name != "softmax")
    reached = found.ancestors(last)
    assert {0, 1, 2} <= reached, names  # q, k and v's projections: second operands too
    assert names.index("softmax") in reached and found.ancestors(0) == {0}, names


def test_keys_are_the_axis_the_product_with_v_sums_over_not_the_last_one():
    module = Transposed(8)
    x = torch.randn(2, 3, 8)
    [site] = sites(record(module, lambda: module(x), {"x": x}))
    assert (site.key_axis, site.softmax_axis) == (1, 1)
    assert site.complete and site.scale == pytest.approx(8**-0.5)
    d = diagnose(Transposed(16), Config(), "Transposed")
    assert d.healthy and not d.causes, d.text()


def test_the_keys_are_read_from_the_product_with_v_whichever_operand_the_weights_are():
    module = ValuesFirst(8)
    x = torch.randn(2, 3, 8)
    [site] = sites(record(module, lambda: module(x), {"x": x}))
    assert (site.key_axis, site.softmax_axis) == (1, 1)
    assert diagnose(ValuesFirst(16), Config(), "ValuesFirst").healthy


@pytest.mark.parametrize(("factor", "scale"), [(1.0, 16**-0.5), (0.25, 16**-0.5 / 4)])
def test_a_scale_before_rotary_is_read_through_the_rotation(factor, scale):
    module = RotaryScaledFirst(16, factor)
    x = torch.randn(2, 5, 16)
    [site] = sites(record(module, lambda: module(x), {"x": x}))
    assert site.complete and site.scale == pytest.approx(scale)


@pytest.mark.parametrize(("axis", "named"), [(-1, None), (2, "softmax_dim"), (1, "softmax_dim")])
def test_an_einsum_softmax_over_another_axis_is_named_at_its_line(axis, named):
    d = diagnose(Heads(16, axis), Config(), "Heads")
    first = next((c for c in d.causes if c.read), None)
    assert (first and first.trap) == named, d.text()
    if named:
        assert "weights = F.softmax(scores, dim=self.axis)" in first.at


@pytest.mark.parametrize(
    ("trap", "written", "edit"), TUTORIAL_EDITS, ids=[e[0] for e in TUTORIAL_EDITS]
)
def test_a_students_one_line_edit_is_the_first_cause_at_the_edited_line(
    tmp_path, capsys, trap, written, edit
):
    source = TUTORIAL.read_text()
    assert source.count(written) == 1
    edited = tmp_path / "attention.py"
    edited.write_text(source.replace(written, edit))
    line = source[: source.index(written)].count("\n") + 1
    code = cli.main(["doctor", f"{edited}:MultiHeadAttention", "--mask", "keep"])
    out = capsys.readouterr().out
    first = next(row for row in out.splitlines() if row.startswith("FAIL"))
    block = out[out.index(first) :].split("\n- ")[0]  # the cause and what it says under it
    assert code == 1 and trap in first, out
    assert re.search(rf"attention\.py:{line}\b", block), block


# The traps a buggy.py's forward shows by what it computes: each is named first, at the line
# its buggy.py marks BUG, or where there is no op on that line (a Python float, a mask passed on
# unconverted) at the line that applies it.
READ_TRAPS = ["softmax_dim", "mask_bool", "missing_scale", "scale_d_model", "double_scale",
              "scale_after_softmax", "causal_leak", "sdpa_float_mask",
              "sdpa_mask_inverted", "mask_rank", "head_merge_no_transpose",
              "padding_on_queries", "rope_on_value"]  # fmt: skip
APPLIED_AT = {
    "double_scale": "scores = q @ k.transpose(-2, -1) * scale",
    "sdpa_float_mask": "F.scaled_dot_product_attention(Q, K, V, attn_mask=attn_mask)",
    "sdpa_mask_inverted": "F.scaled_dot_product_attention(Q, K, V, attn_mask=attn_mask)",
}


@pytest.mark.parametrize("trap", READ_TRAPS)
def test_a_catalogue_trap_the_forward_shows_is_named_first_at_its_bug_line(trap):
    pair = registry.load(trap)
    d = diagnose(build(pair, "buggy"), config_for(pair.card), f"{trap}/buggy.py")
    first = d.causes[0]
    assert first.read and first.trap == trap, d.text()
    number = int(first.at.split(" ")[0].rsplit(":", 1)[1])
    marked = Path(pair.buggy.__file__).read_text().splitlines()[number - 1]
    assert APPLIED_AT.get(trap, "# BUG") in marked, (first.at, marked)


@pytest.mark.parametrize("trap", READ_TRAPS)
def test_its_fixed_py_reads_as_attention_over_the_keys_and_names_nothing(trap):
    pair = registry.load(trap)
    d = diagnose(build(pair, "fixed"), config_for(pair.card), f"{trap}/fixed.py")
    assert d.healthy and not d.causes, d.text()
    facts = {f.name: f.value for f in d.facts}
    assert facts["attention"].startswith(("softmax", "SDPA"))
    if "softmax axis" in facts:
        assert "the keys' axis" in facts["softmax axis"]


def test_the_facts_are_printed_with_their_sources(capsys):
    cli.main(["doctor", "pitfalls/tutorial.py:MultiHeadAttention", "--mask", "keep"])
    out = capsys.readouterr().out
    assert "read from one recorded forward:" in out
    assert "softmax axis: 2: the keys' axis (computed at pitfalls/tutorial.py:" in out
    assert "scale: 0.25 (on the scores) (computed at pitfalls/tutorial.py:" in out


def test_a_buffer_the_doctor_watched_being_built_says_where_its_triangle_was_made(capsys):
    code = cli.main(["doctor", "tests/doctor_modules.py:gpt_leaky", "--causal"])
    out = capsys.readouterr().out
    source = (ROOT / "tests" / "doctor_modules.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "bias = torch.tril(" in text)
    assert (
        code == 1
        and f"self.bias is made at tests/doctor_modules.py:{line} `bias = torch.tril(" in out
    )


def test_a_named_trap_without_a_failure_is_no_cause():
    reading = Reading(named=[Named("softmax_dim", "read", "m.py:3")])
    passing = [Finding("causal no-leak", PASS), Finding("agrees with SDPA", PASS)]
    assert read_causes(passing, reading) == []
    failing = [Finding("causal no-leak", FAIL, "leaks"), Finding("agrees with SDPA", PASS)]
    [cause] = read_causes(failing, reading)
    assert (cause.trap, cause.probes, cause.at) == ("softmax_dim", ("causal no-leak",), "m.py:3")


def test_a_failure_that_names_a_located_trap_is_that_traps_before_a_broad_ones():
    """A mask read the wrong way explains whatever fails, but not a failure that names a trap
    the forward locates (imprecise rotary angles): that one is the located trap's, and the
    causes are still printed in the order the forward named them."""
    reading = Reading(named=[
        Named("sdpa_mask_inverted", "read", "m.py:9"),
        Named("rope_low_precision", "located", "m.py:3", located=True),
    ])  # fmt: skip
    failing = [
        Finding("causal no-leak", FAIL, "leaks"),
        Finding("position shift", FAIL, "far angles", ("rope_low_precision",)),
    ]
    mask, angles = read_causes(failing, reading)
    assert (mask.trap, mask.probes) == ("sdpa_mask_inverted", ("causal no-leak",))
    assert (angles.trap, angles.probes) == ("rope_low_precision", ("position shift",))


def test_heads_that_share_copies_of_the_values_are_read_as_blocks_or_strided():
    """K/V heads copied for grouped queries: equal cell for cell across the heads' axis, in
    blocks (repeat_interleave) or strided (repeat); heads of their own share nothing."""
    kv = torch.randn(2, 2, 5, 3)  # (B, kv heads, S, d)
    blocks = shared_heads(kv.repeat_interleave(2, dim=1))
    strided = shared_heads(kv.repeat(1, 2, 1, 1))
    assert blocks == [frozenset({0, 1}), frozenset({2, 3})] and grouping(blocks) == "blocks"
    assert strided == [frozenset({0, 2}), frozenset({1, 3})] and grouping(strided) == "strided"
    assert shared_heads(torch.randn(2, 4, 5, 3)) is None


def test_a_fact_alone_fails_nothing():
    """A module that scales by 1 on purpose (declared) is healthy; the fact is still read."""
    d = diagnose(Heads(16), Config(scale=0.5), "Heads")
    assert not d.causes and any(f.name == "scale" and f.source == "declared" for f in d.facts)


# Catalogue bugs the doctor flags without naming them first: a failure that names no trap comes
# first (a shape error in chunked decoding; V's layout, which raises), and a later name may be a
# consequence, so none is given.
UNNAMED = {"rope_wrong_axis", "v_layout"}


@pytest.mark.parametrize("pair", registry.load_all(), ids=lambda p: p.card.id)
def test_a_flagged_catalogue_bug_is_named_as_its_own_trap_and_the_words_say_it(pair):
    """The trap comes from the findings' values (a cause read from the forward, else the
    leading failure's traps), and every value a finding carries is in its words."""
    d = diagnose(build(pair, "buggy"), config_for(pair.card))
    for finding in d.findings:
        assert all(trap in finding.message for trap in finding.traps), finding
    if d.healthy:
        return
    named = first_trap(d).split(" or ")
    if pair.card.id in UNNAMED:
        assert named == [""], d.text()
    else:
        assert pair.card.id in named, d.text()


class MaskMadeLikeTheInput(nn.Module):
    """Meta's Llama's way: a causal mask built from constants, then ``.type_as(x)``."""

    def __init__(self, d_model):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x):
        T = x.shape[1]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        mask = torch.full((T, T), float("-inf")).triu(1).type_as(x)  # no data: x's dtype only
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + mask
        return F.softmax(scores, dim=-1) @ v


def test_a_mask_made_like_the_input_is_a_mask_not_data():
    d = diagnose(MaskMadeLikeTheInput(32), Config())
    future = [f for f in d.facts if f.name == "future"]
    assert future and future[0].value.startswith("blocked"), d.text()
    assert d.healthy and d.config.causal, d.text()


class SharedKeys(nn.Module):
    """PaLM's multi-query einsum attention: a query per head, one key and value for all (so
    both heads and queries are letters of q alone), its own causal triangle. ``merge``:
    "transpose" (right) or "reshape" (the heads merged without moving them)."""

    def __init__(self, d_model=32, heads=4, merge="transpose"):
        super().__init__()
        self.heads, self.d_head, self.merge = heads, d_model // heads, merge
        self.to_q = nn.Linear(d_model, d_model, bias=False)
        self.to_kv = nn.Linear(d_model, 2 * self.d_head, bias=False)
        self.to_out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.to_q(x).view(B, T, self.heads, self.d_head).transpose(1, 2)  # (B, h, T, d)
        k, v = self.to_kv(x).chunk(2, dim=-1)  # (B, T, d): one head, shared
        sim = torch.einsum("b h i d, b j d -> b h i j", q * self.d_head**-0.5, k)
        sim = sim.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        out = torch.einsum("b h i j, b j d -> b h i d", sim.softmax(dim=-1), v)
        if self.merge == "reshape":
            return self.to_out(out.reshape(B, T, -1))
        return self.to_out(out.transpose(1, 2).reshape(B, T, -1))


def test_queries_are_told_from_heads_where_the_keys_are_shared_by_every_head():
    healthy = diagnose(SharedKeys(), Config(causal=True))
    facts = {f.name: f.value for f in healthy.facts}
    assert healthy.healthy and facts["future"].startswith("blocked"), healthy.text()
    merged = diagnose(SharedKeys(merge="reshape"), Config(causal=True))
    first = merged.causes[0]
    assert first.trap == "head_merge_no_transpose" and "out.reshape(B, T, -1)" in first.at, (
        merged.text()
    )


class TriangleToSDPA(nn.Module):
    """A module that builds its causal triangle and hands it to SDPA: as a 0/1 float (MEGABYTE's
    flash path, rewritten so), which SDPA adds, blocking nothing whoever calls it; or as a bool,
    ``diagonal`` 1 one off (each query sees the next key)."""

    def __init__(self, d_model=32, heads=4, as_bool=False, diagonal=0):
        super().__init__()
        self.heads, self.as_bool, self.diagonal = heads, as_bool, diagonal
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        causal = torch.ones(T, T).tril(self.diagonal)
        causal = causal.bool() if self.as_bool else causal
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


def test_a_float_triangle_a_module_gives_sdpa_itself_is_named_without_a_declared_mask():
    assert diagnose(TriangleToSDPA(as_bool=True), Config(causal=True)).healthy
    d = diagnose(TriangleToSDPA(), Config(causal=True))
    assert d.causes[0].trap == "sdpa_float_mask", d.text()
    assert "causal no-leak" in d.causes[0].probes, d.text()


class PaddingAddedToCausalBias(nn.Module):
    """OLMo's caller's mistake: a causal bias (-inf above the diagonal) plus the padding mask
    as 0/1 floats, handed to SDPA, which adds it: padding gets 0 where it needs -inf."""

    def __init__(self, d_model=32, heads=4, as_blocking=False):
        super().__init__()
        self.heads, self.as_blocking = heads, as_blocking
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        bias = torch.full((T, T), float("-inf")).triu(1)
        padding = mask.float() if not self.as_blocking else (~mask).float() * -1e9  # (B, T)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias + padding[:, None, None, :])
        return self.out(y.transpose(1, 2).reshape(B, T, C))


def test_a_0_1_float_mask_added_to_a_causal_bias_for_sdpa_is_sdpa_float_mask():
    config = Config(causal=True, mask="keep", mask_shape="bk")
    assert diagnose(PaddingAddedToCausalBias(as_blocking=True), config).healthy
    d = diagnose(PaddingAddedToCausalBias(), config)
    assert d.causes and d.causes[0].trap == "sdpa_float_mask", d.text()


class FloatPadding(nn.MultiheadAttention):
    """gluonts' TFT's slip: the key padding mask handed on as floats, which
    nn.MultiheadAttention adds to the scores (1 on padding: nothing blocked)."""

    def forward(self, query, key, value, key_padding_mask=None, **kwargs):
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.float()  # the slip
        return super().forward(query, key, value, key_padding_mask, **kwargs)


def test_a_float_0_1_mask_inside_nn_multihead_attention_is_named_where_it_was_made():
    config = Config(mask="drop", mask_shape="bk")
    d = diagnose(FloatPadding(32, 4, batch_first=True), config, "FloatPadding")
    first = d.causes[0] if d.causes else None
    assert first is not None and first.trap == "sdpa_float_mask", d.text()
    assert "key_padding_mask = key_padding_mask.float()  # the slip" in first.at
    assert diagnose(nn.MultiheadAttention(32, 4, batch_first=True), config).healthy


class HalvesSwapped(nn.Module):
    """The values' two halves put back in the other order (a layout, no table): both parts
    come from one projection, as rotary's do, but nothing turns them by position."""

    def __init__(self, d_model=32):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))

    def forward(self, x):
        v1, v2 = self.v(x).chunk(2, dim=-1)
        v = torch.cat([v2, v1], dim=-1)
        scores = self.q(x) @ self.k(x).transpose(1, 2) / math.sqrt(x.shape[-1])
        return scores.softmax(dim=-1) @ v


def test_values_laid_out_again_from_their_halves_are_not_rotary():
    d = diagnose(HalvesSwapped(), Config())
    assert not any(f.name == "rotary on the values" for f in d.facts), d.text()
    assert not any(c.trap == "rope_on_value" for c in d.causes), d.text()


class ComplexRotary(nn.Module):
    """Meta's Llama's rotary: each pair of a head's features a complex number, turned by a
    complex table (``view_as_complex(x) * freqs_cis``). ``values``: the values turned too."""

    def __init__(self, d_model=32, heads=4, values=False):
        super().__init__()
        self.heads, self.values = heads, values
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d_model, d_model) for _ in range(4))

    def turn(self, t):  # (B, T, h, d)
        T, d = t.shape[1], t.shape[-1]
        angles = torch.outer(torch.arange(T), 10000.0 ** -(torch.arange(0, d, 2) / d))
        freqs = torch.polar(torch.ones_like(angles), angles)[None, :, None]  # (1, T, 1, d/2)
        pairs = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * freqs).view_as(t).type_as(t)  # audiocraft's view_as

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (w(x).view(B, T, self.heads, -1) for w in (self.wq, self.wk, self.wv))
        q, k = self.turn(q), self.turn(k)
        if self.values:
            v = self.turn(v)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, h, T, d)
        scores = q @ k.transpose(2, 3) / math.sqrt(q.shape[-1])
        return self.wo((scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C))


def test_a_complex_rotation_is_rotary_and_the_scale_is_read_through_it():
    d = diagnose(ComplexRotary(), Config(positions="relative"))
    facts = {f.name: f for f in d.facts}
    assert facts["scale"].value.startswith("0.353553"), d.text()
    assert "view_as_real(pairs * freqs)" in facts["rotary"].line, d.text()
    assert "rotary on the values" not in facts, d.text()
    turned = diagnose(ComplexRotary(values=True), Config(positions="relative"))
    assert turned.causes and turned.causes[0].trap == "rope_on_value", turned.text()
    assert "v = self.turn(v)" in turned.causes[0].at, turned.text()


def swap_pairs(x):
    """speechbrain's way to turn pairs: the features of each pair swapped by an index, then
    (with a sign in the sines' table) x cos + swapped sin."""
    swap = torch.arange(x.shape[-1]).view(-1, 2).flip(-1).reshape(-1)
    return torch.index_select(x, dim=-1, index=swap)


class PartialRotary(nn.Module):
    """rotary-embedding-torch's partial rotary: the first ``rotated`` features of each head
    turned (each branch times ``scale``, 1), the rest passed on by ``cat``; the pairs turned by
    an index. ``values``: the values turned too. ``twice``: q also scaled before SDPA."""

    def __init__(self, d_model=32, heads=2, rotated=8, values=False, twice=False):
        super().__init__()
        self.heads, self.rotated, self.values, self.twice = heads, rotated, values, twice
        self.to_qkv, self.to_out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def turn(self, t, scale=1.0):  # (B, h, T, d)
        T, r = t.shape[-2], self.rotated
        angles = torch.arange(T)[:, None] * 10000.0 ** -(torch.arange(r) // 2 * 2 / r)
        sign = torch.tensor([-1.0, 1.0]).repeat(r // 2)
        middle = t[..., :r]
        turned = (middle * angles.cos() * scale) + (
            swap_pairs(middle) * sign * angles.sin() * scale
        )
        return torch.cat((t[..., :0], turned, t[..., r:]), dim=-1)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.to_qkv(x).chunk(3, -1)
        )
        q, k = self.turn(q), self.turn(k)
        if self.values:
            v = self.turn(v)
        if self.twice:
            q = q * q.shape[-1] ** -0.5
        y = F.scaled_dot_product_attention(q, k, v)
        return self.to_out(y.transpose(1, 2).reshape(B, T, C))


def test_partial_rotary_by_an_index_is_read_through_its_cat_and_its_unit_factors():
    d = diagnose(PartialRotary(), Config())
    facts = {f.name: f for f in d.facts}
    assert d.healthy and "rotary" in facts, d.text()
    assert facts["scale"].value.startswith("0.25 "), d.text()
    twice = diagnose(PartialRotary(twice=True), Config())
    assert twice.causes and twice.causes[0].trap == "double_scale", twice.text()
    turned = diagnose(PartialRotary(values=True), Config())
    assert turned.causes and turned.causes[0].trap == "rope_on_value", turned.text()
    assert "v = self.turn(v)" in turned.causes[0].at, turned.text()


class NoAutocast(nn.Module):
    """A rotary submodule whose forward is decorated (rotary-embedding-torch's
    ``@autocast(..., enabled=False)``)."""

    @torch.autocast("cpu", enabled=False)
    def forward(self, t):  # (B, T, d)
        angles = torch.arange(t.shape[1])[:, None] * 0.1 * torch.arange(1, t.shape[-1] // 2 + 1)
        t1, t2 = t.chunk(2, dim=-1)
        return torch.cat([t1 * angles.cos() - t2 * angles.sin(),
                          t1 * angles.sin() + t2 * angles.cos()], dim=-1)  # fmt: skip


class TurnsValuesThroughASubmodule(nn.Module):
    def __init__(self, d_model=32):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))
        self.rotary = NoAutocast()

    @torch.autocast("cpu", enabled=False)  # its own forward decorated too: the code it wraps
    def forward(self, x):
        q, k = self.rotary(self.q(x)), self.rotary(self.k(x))
        v = self.rotary(self.v(x))  # the values turned too
        return F.softmax(q @ k.transpose(1, 2) / math.sqrt(x.shape[-1]), dim=-1) @ v


def test_a_trap_in_a_submodule_is_shown_at_the_line_of_the_forward_that_called_it():
    d = diagnose(TurnsValuesThroughASubmodule(), Config())
    assert d.causes and d.causes[0].trap == "rope_on_value", d.text()
    assert "v = self.rotary(self.v(x))" in d.causes[0].at, d.text()


def test_a_triangle_a_module_hands_sdpa_is_read_as_its_own_mask():
    healthy = diagnose(TriangleToSDPA(as_bool=True), Config())
    assert healthy.healthy and healthy.config.causal, healthy.text()
    leaky = diagnose(TriangleToSDPA(as_bool=True, diagonal=1), Config(causal=True))
    first = leaky.causes[0]
    assert first.trap == "causal_leak" and ".tril(self.diagonal)" in first.at, leaky.text()


class Unnamed(nn.Module):
    """Correct attention whose projections' names say nothing (``a``, ``b``, ``c``, ``d``) and
    whose scores are written keys first (``k q^T``, softmax over axis 1): which projection is
    which is read from what the forward does with it."""

    def __init__(self, d_model=32, heads=4):
        super().__init__()
        self.heads = heads
        self.a, self.b, self.c, self.d = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x):
        B, T, C = x.shape
        k, q, v = (
            p(x).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.a, self.b, self.c)
        )
        scores = k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, h, S, T): keys first
        weights = scores.softmax(dim=2).transpose(2, 3)  # over the keys, then (B, h, T, S)
        return self.d((weights @ v).transpose(1, 2).reshape(B, T, C))


def test_projections_are_told_apart_by_what_the_forward_does_with_them():
    d = diagnose(Unnamed(), Config())
    sdpa = {f.probe: f for f in d.findings}["agrees with SDPA"]
    assert sdpa.status == PASS and "b, a, c" in sdpa.message, d.text()
    facts = {f.name: f.value for f in d.facts}
    assert facts["projections"] == ("queries by `b.weight`, keys by `a.weight`, values by "
                                    "`c.weight`, output by `d.weight`"), facts  # fmt: skip


class SequenceIds(nn.Module):
    """ESM's mask from sequence ids: a token attends to tokens of its own sequence, so padding
    attends to padding; handed to SDPA as a bool (True: attend), or ``inverted``."""

    def __init__(self, d_model=32, heads=4, inverted=False):
        super().__init__()
        self.heads, self.inverted = heads, inverted
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x, mask):  # mask: (B, T), True for a real token
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        same = mask[:, None, :, None] == mask[:, None, None, :]  # (B, 1, T, T)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=~same if self.inverted else same)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


def test_an_inverted_sequence_id_mask_is_named_on_the_real_tokens_rows():
    config = Config(mask="keep", mask_shape="bk")
    assert diagnose(SequenceIds(), config).healthy
    d = diagnose(SequenceIds(inverted=True), config)
    assert d.causes and d.causes[0].trap == "sdpa_mask_inverted", d.text()


class NanoLike(nn.Module):
    """nanoGPT's causal attention, each of its lines as written or as a bug report has it:
    ``merge`` without the transpose, the triangle filled where it ``keeps`` (== 1), a
    functional dropout left on in eval (``dropout_call``); an nn.Dropout on the weights."""

    def __init__(self, d_model, n_head, merge=True, keeps=False, dropout_call=False):
        super().__init__()
        self.n_head, self.merge, self.keeps, self.dropout_call = n_head, merge, keeps, dropout_call
        self.c_attn, self.c_proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.attn_dropout = nn.Dropout(0.1)
        self.register_buffer("bias", torch.tril(torch.ones(16, 16)))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:T, :T] == int(self.keeps), float("-inf"))
        att = F.softmax(att, dim=-1)
        att = F.dropout(att, 0.1) if self.dropout_call else self.attn_dropout(att)
        y = att @ v  # (B, h, T, d)
        y = (y.transpose(1, 2) if self.merge else y).contiguous().view(B, T, C)
        return self.c_proj(y)


def _first_cause(**bug):
    d = diagnose(NanoLike(32, 4, **bug), Config(causal=True), "NanoLike")
    return d, d.causes[0] if d.causes else None


@pytest.mark.parametrize(
    ("bug", "trap", "written"),
    [
        ({}, None, ""),
        ({"merge": False}, "head_merge_no_transpose", "y = (y.transpose(1, 2) if self.merge"),
        ({"keeps": True}, "mask_bool", "att = att.masked_fill(self.bias[:T, :T] == int(self"),
        ({"dropout_call": True}, "dropout_in_eval", "att = F.dropout(att, 0.1) if self"),
    ],
)
def test_a_bug_in_nanogpts_lines_is_named_at_its_line_through_a_dropout_on_the_weights(
    bug, trap, written
):
    """The weights pass an nn.Dropout before the product with V (off in eval): the merge is
    still followed from that product; a triangle read the wrong way round keeps the future
    and blocks the rest; a dropout called with its default training=True drops in eval."""
    d, cause = _first_cause(**bug)
    assert (cause.trap if cause else None) == trap, d.text()
    dropping = [f.value for f in d.facts if f.name == "dropout"]  # nn.Dropout is off in eval
    assert dropping == (["on in eval mode: dropout with p=0.1 and training=True"]
                        if trap == "dropout_in_eval" else []), d.text()  # fmt: skip
    if trap:
        assert cause.at.split("`")[1].startswith(written), cause.at


class FutureToSDPA(nn.Module):
    """A causal module that hands SDPA the triangle of the future (True where a causal mask
    blocks), as if True blocked: SDPA attends where True."""

    def __init__(self, d_model):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x):
        q, k, v = self.qkv(x)[:, None].chunk(3, dim=-1)  # (B, 1, T, d)
        T = x.shape[1]
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=future)[:, 0]


def test_a_triangle_given_to_sdpa_the_wrong_way_round_is_sdpas_mask_misread():
    """Its blocked cells are the past and the diagonal, as a fill read the wrong way round
    would block; given to SDPA, it is SDPA's mask that is read the wrong way round."""
    d = diagnose(FutureToSDPA(16), Config(causal=True), "FutureToSDPA")
    assert d.causes[0].trap == "sdpa_mask_inverted", d.text()


class FoldedHeadsMask(nn.Module):
    """Heads folded into the batch, (B * h, T, T) scores, as einops' ``(b h) n d`` lays them
    out; the (B, T, T) keep-mask repeated for each sequence's heads, then filled where it
    blocks, or (``wrong``) where it keeps."""

    def __init__(self, d_model, heads, wrong=False, heads_first=False):
        super().__init__()
        self.h, self.wrong, self.heads_first = heads, wrong, heads_first
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x, mask):  # mask: (B, T), True on real tokens
        B, T, C = x.shape
        q, k, v = (t.reshape(B, T, self.h, -1).transpose(1, 2).reshape(B * self.h, T, -1)
                   for t in self.qkv(x).chunk(3, dim=-1))  # (B * h, T, d)  # fmt: skip
        mask = mask[:, None, :].expand(B, T, T)  # each sequence its own padding
        if self.heads_first:  # (h B, T, d): each head's sequences together, Set Transformer's
            q, k, v = (t.reshape(B, self.h, T, -1).transpose(0, 1).reshape(B * self.h, T, -1)
                       for t in (q, k, v))  # fmt: skip
            mask = mask.repeat(self.h, 1, 1)  # (h B, T, T)
        else:
            mask = mask.repeat_interleave(self.h, dim=0)  # (B h, T, T)
        blocked = mask if self.wrong else ~mask
        sim = (q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])).masked_fill(blocked, -1e9)
        out = sim.softmax(dim=-1) @ v  # (B * h, T, d)
        if self.heads_first:
            out = out.reshape(self.h, B, T, -1).transpose(0, 1).reshape(B * self.h, T, -1)
        return out.reshape(B, self.h, T, -1).transpose(1, 2).reshape(B, T, C)


@pytest.mark.parametrize("heads_first", [False, True])
@pytest.mark.parametrize("wrong", [False, True])
def test_a_keep_mask_read_the_wrong_way_round_is_named_with_the_heads_folded_into_the_batch(
    wrong, heads_first
):
    module = FoldedHeadsMask(32, 4, wrong, heads_first)
    d = diagnose(module, Config(mask="keep", mask_shape="bk"), "FoldedHeadsMask")
    assert d.healthy != wrong, d.text()
    if wrong:
        assert d.causes[0].trap == "mask_bool" and "masked_fill(blocked" in d.causes[0].at


def test_heads_merged_with_the_sequence_flattened_into_the_batch_are_read_as_merged_right():
    """(T, B * h, d) -> (T * B, h * d) keeps each position whole in the rows and the heads
    with the width: no head_merge_no_transpose; the mask ``baddbmm`` adds is read as added."""
    from tests.fix_modules import FunctionalMHA

    config = Config(mask="drop", mask_shape="bk", sequence_first=True)
    d = diagnose(FunctionalMHA(64, 4), config, "FunctionalMHA")
    assert d.healthy, d.text()
    masks = [f for f in d.facts if f.name == "mask"]
    assert masks and all(f.value == "added" for f in masks), d.text()


class IgnoredTerm(nn.Module):
    """GPT-2's upcast path: the scores made by ``baddbmm`` into a tensor whose values it is
    told to ignore (``beta=0``); here that tensor holds NaN, as ``torch.empty`` may."""

    def __init__(self, d_model, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.heads, -1).transpose(1, 2).reshape(B * self.heads, T, -1)
            for t in self.qkv(x).chunk(3, dim=-1)
        )
        unused = torch.full((B * self.heads, T, T), float("nan"))
        scores = torch.baddbmm(unused, q, k.transpose(1, 2), beta=0, alpha=q.shape[-1] ** -0.5)
        out = torch.bmm(scores.softmax(dim=-1), v).view(B, self.heads, T, -1)
        return self.out(out.transpose(1, 2).reshape(B, T, C))


def test_a_term_baddbmm_is_told_to_ignore_is_no_mask():
    d = diagnose(IgnoredTerm(64), Config(), "IgnoredTerm")
    assert d.healthy, d.text()
    assert not any(f.name == "mask" for f in d.facts), d.text()


class _FusedSplit(nn.Module):
    """A ViT's fused split, (B, N, 3 C) -> (B, N, 3, h, d) -> (3, B, h, N, d), unbound."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.qkv = heads, nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, h, N, d)
        return F.scaled_dot_product_attention(q, k, v)


def test_the_positions_are_followed_back_through_unbind_and_permute_to_the_projection() -> None:
    module, x = _FusedSplit(), torch.randn(2, 6, 32)
    found = record(module, lambda: module(x), {"x": x})
    [unbind] = [op for op in found.ops if op.name == "unbind"]
    assert axis_before(unbind, 0, 2) == 3  # q's positions: axis 3 of (3, B, h, N, d)
    [permute] = [op for op in found.ops if op.name == "permute"]
    assert axis_before(permute, 0, 3) == 1  # and axis 1 of (B, N, 3, h, d)
    [site] = sites(found)
    assert site.split_without_transpose is None  # the positions come whole from the projection


@pytest.mark.parametrize(
    "probe", ["permutation equivariance", "causal no-leak", "agrees with SDPA"]
)
def test_heads_split_by_a_reshape_fail_as_read_only_where_no_probe_could_see_it(probe):
    """A reshape that cuts up the positions' axis fails the reading by itself where every probe
    that sees positions mixed with features was skipped (SegFormer's grid, positions
    declared); where one of them ran, that probe's verdict stands."""
    reading = Reading(
        named=[Named("head_split_view", "the heads are split by a reshape", "a.py:3")]
    )
    skipped = [Finding(p, SKIP, "could not run") for p in checks.SPLIT_MEASURED_BY]
    [read] = read_failures(reading, skipped)
    assert read.traps == ("head_split_view",), read
    ran = [f if f.probe != probe else Finding(probe, PASS, "fine") for f in skipped]
    assert read_failures(reading, ran) == []


def test_a_trap_only_located_is_a_cause_of_the_failures_that_name_it_alone():
    """Where the scale's factors were read only in part, the scale traps are located at the
    factor read, for a probe that fits one of them: never a failure of the reading itself,
    and a cause only of a failure that names that trap."""
    located = [Named(t, "the scale is applied here", "attn.py:3", located=True)
               for t in ("missing_scale", "double_scale")]  # fmt: skip
    reading = Reading(named=located)
    assert read_failures(reading, []) == []
    fitted = Finding("agrees with SDPA", FAIL, "behaves like the scale applied twice",
                     ("double_scale",))  # fmt: skip
    other = Finding("causal no-leak", FAIL, "the future is not masked", ("causal_leak",))
    causes = read_causes([fitted, other], reading)
    assert [(c.trap, c.probes, c.at) for c in causes] == [
        ("double_scale", ("agrees with SDPA",), "attn.py:3")
    ], causes


def test_a_scale_made_as_the_root_of_a_tensor_is_a_scale_not_a_normalization():
    """DeBERTa divides the keys by sqrt(tensor(d) * 3): a root of constants, not a statistic
    of the data, so it is read as the scale (1/sqrt(3 d)), not as a norm that undoes it."""
    d = diagnose(dm.ScaledBySqrtOfTensor(32, 4), Config())
    assert [c.trap for c in d.causes] == ["wrong_scale"], d.text()
    [scale] = [f for f in d.facts if f.name == "scale"]
    assert scale.value.startswith("0.204124 (on the keys)"), scale


def test_a_learned_temperature_on_the_scores_leaves_the_scale_unread():
    """Swin V2's cosine attention multiplies the scores by a learned factor per head: no one
    number is the scale, so none is named, and a module of one window is not padded."""
    config = Config(mask="additive", mask_shape="bqk", positions="relative")
    d = diagnose(dm.CosineWindow(32, 4), config)
    assert d.healthy, d.text()
    [scale] = [f for f in d.facts if f.name == "scale"]
    assert scale.value.startswith("not read") and "per head or learned" in scale.value, scale
    left = {f.probe: f for f in d.findings}["left padding"]
    assert left.status == SKIP and "tokens only" in left.message, left


def test_an_output_gated_by_the_input_is_not_compared_as_attention_alone():
    """AlphaFold multiplies the attention's output by a sigmoid gate before its projection:
    weights read off the output would carry the gate, so nothing is compared, and the reading
    says where the gate is."""
    d = diagnose(dm.GatedOutput(32, 4), Config())
    assert d.healthy, d.text()
    assert any(f.name == "output" and "gate" in f.value for f in d.facts), d.text()
    assert {f.probe: f for f in d.findings}["agrees with SDPA"].status == SKIP, d.text()


@pytest.mark.parametrize("std", [None, 1.0])
def test_a_gated_module_that_returns_no_weights_is_judged_by_its_recorded_softmax(std):
    """A gated module's weights cannot be rebuilt from its projections; the softmax it ran
    in the recorded forward shows them: drawn with std 1, most rows saturate
    (init_unit_variance); drawn as nn.Linear does, none."""
    d = diagnose(dm.GatedSoftmax(32, 4, std=std), Config())
    weights = {f.probe: f for f in d.findings}["attention weights"]
    assert "recorded forward" in weights.message, d.text()
    assert (weights.status == FAIL) == bool(std), d.text()
    assert ("init_unit_variance" in weights.message) == bool(std), d.text()


@pytest.mark.parametrize("rotate_values", [False, True])
def test_values_taken_back_out_of_a_stack_with_the_rotated_ones_are_followed_alone(
    rotate_values,
):
    """flash-attn's rotary unbinds q, k and v, turns q and k, and stacks the three again: the
    values picked back out of that stack are v as it was, not rotated (rope_on_value only
    where v is turned too)."""
    config = Config(causal=True, positions="relative", rope_pairing="half")
    d = diagnose(dm.PackedRotary(32, 4, rotate_values=rotate_values), config)
    assert [c.trap for c in d.causes] == (["rope_on_value"] if rotate_values else []), d.text()


@pytest.mark.parametrize("turn_values", [False, True])
def test_values_projected_from_states_turned_before_projecting_are_rotated(turn_values):
    """Wav2Vec2-Conformer turns the hidden states before the query and key projections: the
    turn is read as a fact there, and values projected from the turned states are rotated
    (rope_on_value) where values projected from the states as they were are not."""
    d = diagnose(fm.TurnedBeforeProjecting(32, 4, turn_values=turn_values),
                 Config(positions="absolute"))  # fmt: skip
    assert [c.trap for c in d.causes] == (["rope_on_value"] if turn_values else []), d.text()
    assert "rotary before the projections" in {f.name for f in d.facts}, d.text()


INDEX_ITEMS = st.sampled_from([0, 1, -1, slice(None), slice(1, None), None, Ellipsis])


@given(st.lists(INDEX_ITEMS, max_size=4))
def test_an_axis_of_an_indexed_tensor_is_traced_to_the_one_it_came_from(items):
    """``x[key]``: each axis of the result is the input's axis ``indexed_axis`` says (each
    input axis a size of its own, so the sizes tell), or a new one of size 1 (None)."""
    if items.count(Ellipsis) > 1 or sum(i is not None and i is not Ellipsis for i in items) > 4:
        return
    sizes = (2, 3, 4, 5)
    x = torch.zeros(sizes)
    key = tuple(items)
    shape = x[key].shape
    for axis, size in enumerate(shape):
        origin = indexed_axis(key, 4, axis)
        if origin is None:
            assert size == 1, (key, axis)
        else:
            assert size == len(range(sizes[origin])[key_slice(key, origin)]), (key, axis, origin)


def key_slice(key, origin):
    """The slice ``key`` takes of input axis ``origin`` (one it keeps)."""
    named = [k for k in key if k is not None]
    if Ellipsis in named:
        at = named.index(Ellipsis)
        skipped = 4 - (len(named) - 1)
        named = named[:at] + [slice(None)] * skipped + named[at + 1 :]
    named += [slice(None)] * (4 - len(named))
    return named[origin]


def test_an_axis_split_and_merged_back_by_reshapes_is_found_by_its_run():
    """(B h, T, S) viewed as (B h, H, W, H, W): the queries' run is found again in the
    (B h, H W, H W) it is viewed back to, and in no shape that cuts it."""
    run = span((16, 8, 8), 1)
    assert axis_at((16, 8, 8), run) == 1
    assert axis_at((16, 2, 4, 2, 4), run) is None
    assert axis_at((16, 8, 2, 4), run) == 1
