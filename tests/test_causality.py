"""A module that says it is causal is probed as causal without --causal, unless its caller can
hand it a causal mask and it does not mask the future by itself; one that says nothing is left
to the probes, and one that says it is not causal but masks the future is told so."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from harness.doctor import FAIL, PASS, SKIP, Config, diagnose
from harness.doctor.causality import NAME, declared
from tests import doctor_modules as dm


def found(module: nn.Module, config: Config | None = None) -> tuple[dict[str, object], str]:
    d = diagnose(module, config or Config())
    return {f.probe: f for f in d.findings}, d.text()


class Attention(dm.CausalSelfAttention):
    """nanoGPT's layer under a plain name, with transformers' flag."""

    is_causal = True


class NeedsItsMask(nn.Module):
    """Says it is causal, but masks only through the mask its caller passes (it cannot run
    without one), as transformers' eager layers do."""

    is_causal = True

    def __init__(self, d_model: int = 32) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = x @ x.transpose(-2, -1) / x.size(-1) ** 0.5 + mask  # (B, T, T) additive
        return self.proj(F.softmax(scores, dim=-1) @ x)


def test_nanogpt_layer_is_healthy_without_causal_and_says_why():
    findings, text = found(dm.CausalSelfAttention(32, 4))
    said = findings[NAME]
    assert said.status == PASS and "it masks the future itself at " in said.message, text
    assert "doctor_modules.py:" in said.message and "masked_fill" in said.message  # its line
    assert "probed as causal, as with --causal" in said.message
    assert findings["permutation equivariance"].status == SKIP, text
    assert findings["causal no-leak"].status == PASS, text
    assert "1 problem" not in text and text.rstrip().endswith("healthy"), text


def test_a_causal_flag_on_the_module_is_its_word():
    findings, text = found(Attention(32, 4))
    assert "it sets is_causal = True" in findings[NAME].message, text
    assert findings["causal no-leak"].status == PASS, text


class KeyPaddingOnly(nn.Module):
    """Says it is causal, takes a key padding mask (B, T), True = real token, and forgot to
    combine it with a causal one."""

    is_causal = True

    def __init__(self, d_model: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        keys = None if attention_mask is None else attention_mask[:, None, None, :].bool()
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keys)  # (B, h, T, d_k)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


def test_an_encoder_that_masks_the_future_fails_permutation_and_is_told_so():
    findings, text = found(dm.EncoderSelfAttention(32, 4))  # is_causal = False
    assert NAME not in findings, text
    permutation = findings["permutation equivariance"]
    assert permutation.status == FAIL, text
    assert "though it sets is_causal = False" in permutation.message
    assert "drop its causal mask" in permutation.message
    sdpa = findings["agrees with SDPA"].message  # compared as what it computes, and said
    assert "masks the future by itself, though it sets is_causal = False" in sdpa, text


def test_a_causal_name_does_not_excuse_a_future_leak():
    findings, text = found(dm.CausalSelfAttention(32, 4, diagonal=1))  # sees the next token
    assert findings[NAME].status == PASS, text
    leak = findings["causal no-leak"]
    assert leak.status == FAIL and "causal_leak" in leak.message, text


def test_a_class_name_alone_says_nothing_so_a_dropped_mask_needs_causal():
    """nanoGPT's class with its triangle opened up (no key masked): neither a flag, its
    forward nor a buffer says causal, and the name is no evidence; declared, it fails."""
    findings, text = found(dm.CausalSelfAttention(32, 4, diagonal=128))
    assert NAME not in findings and findings["causal no-leak"].status == SKIP, text
    declared_causal = diagnose(dm.CausalSelfAttention(32, 4, diagonal=128), Config(causal=True))
    leak = {f.probe: f for f in declared_causal.findings}["causal no-leak"]
    assert leak.status == FAIL and leak.traps == ("causal_leak",), declared_causal.text()


def test_a_mask_one_diagonal_off_shows_causal_intent_and_leaks():
    findings, text = found(dm.SelfAttention(32, 4, diagonal=1))  # tril(1): keeps key t + 1
    assert "it masks the future itself at " in findings[NAME].message, text
    leak = findings["causal no-leak"]
    assert leak.status == FAIL and "causal_leak" in leak.traps, text


def test_a_registered_causal_mask_the_forward_never_applies_still_says_causal():
    """The mask line deleted, the buffer kept: what the module registers says causal."""
    module = dm.SelfAttention(32, 4, diagonal=128)  # its own `bias` opened up, used
    module.register_buffer("causal_mask", torch.ones(32, 32).tril())  # kept, never applied
    findings, text = found(module)
    assert "it registers a causal mask, `causal_mask`" in findings[NAME].message, text
    assert findings["causal no-leak"].status == FAIL, text


def test_a_padding_mask_cannot_make_it_causal_so_it_is_probed_as_causal():
    findings, text = found(KeyPaddingOnly())  # its convention detected: keep, (B, T)
    assert "it sets is_causal = True" in findings[NAME].message, text
    leak = findings["causal no-leak"]
    assert leak.status == FAIL and "the future is not masked" in leak.message, text
    assert "passes with --mask" not in leak.message  # a reading hiding every key is no hint


def test_a_module_that_cannot_run_without_its_mask_is_masked_by_its_caller():
    findings, text = found(NeedsItsMask(), Config(mask="additive"))
    assert NAME not in findings and "calling the module" not in findings, text
    assert findings["agrees with SDPA"].status != FAIL, text


class MaskByKeyword(nn.Module):
    """Says it is causal; its model hands it the mask by keyword (``**kwargs``)."""

    is_causal = True

    def __init__(self, d_model: int = 32) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        scores = x @ x.transpose(-2, -1) / x.size(-1) ** 0.5  # (B, T, T)
        if "attention_mask" in kwargs:
            scores = scores + kwargs["attention_mask"]
        return self.proj(F.softmax(scores, dim=-1) @ x)


def test_a_module_that_may_be_handed_its_mask_by_keyword_is_left_to_its_caller():
    findings, text = found(MaskByKeyword())
    assert NAME not in findings, text
    assert findings["permutation equivariance"].status == PASS, text


def test_what_counts_as_saying_causal():
    assert declared(nn.Linear(2, 2)) is None
    assert declared(type("CausalSelfAttention", (nn.Module,), {})()) is None  # a name is not
    said = declared(type("Attention", (nn.Module,), {"is_causal": False})())
    assert said[:2] == (False, "it sets is_causal = False")
    buffer = type("Attention", (nn.Module,), {})()
    buffer.register_buffer("causal", torch.ones(2, 2).tril())  # a mask, not a word
    assert declared(buffer)[:2] == (True, "it registers a causal mask, `causal`")
    additive = type("Attention", (nn.Module,), {})()  # Whisper's: -inf above the diagonal
    additive.register_buffer("mask", torch.full((4, 4), float("-inf")).triu(1))
    assert declared(additive)[:2] == (True, "it registers a causal mask, `mask`")
    window = type("Attention", (nn.Module,), {})()  # both sides banded: no causal table
    window.register_buffer("band", torch.ones(4, 4).tril(1).triu(-1))
    assert declared(window) is None
    flagged = type("Attention", (nn.Module,), {"causal": True})()
    assert declared(flagged)[:2] == (True, "it sets causal = True")
