"""The doctor on real libraries' attention modules, as published (DESIGN.md, "The doctor").

Each module is built the way its users build it (from the library's own config object, or the
class handed to the doctor's builder) and diagnosed with no wrapper. A correct module must be
healthy; each misuse, made through the module's own options or a small subclass the way bug
reports describe it, must fail for the right reason: the probe named, with its own evidence, not
because the module could not be called at all. ``tests/test_real_modules.py`` asserts it; the
report shows the table. transformers and x-transformers come with the ``real`` extra;
``nn.MultiheadAttention`` always runs.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.doctor import FAIL, WARN, Config, Diagnosis, adapters, diagnose
from harness.doctor.target import Sizes, build


class LibraryMissing(Exception):
    """A library a case needs is not installed."""


def _require(library: str) -> None:
    if importlib.util.find_spec(library) is None:
        raise LibraryMissing(library)


D, H = 64, 4  # d_model and heads of every module here
SHOWN = 3  # a row names this many probes that fired, then counts the rest
SIZES = Sizes(D, H)


class AlwaysTraining:
    """The misuse: ``train`` ignores its argument, so ``.eval()`` leaves the module's own dropout
    on, as code that overrides ``train`` or flips ``self.training`` in forward does."""

    def train(self, mode: bool = True):
        return super().train(True)


def always_training(cls: type[nn.Module]) -> type[nn.Module]:
    return type(f"AlwaysTraining{cls.__name__}", (AlwaysTraining, cls), {})


@functools.cache
def _transformers() -> types.SimpleNamespace:
    _require("transformers")  # imported once: it takes seconds
    from transformers.utils import logging

    logging.set_verbosity_error()  # its notes on standalone attention modules are not findings
    from transformers import AttentionInterface, BertConfig, GPT2Config, LlamaConfig
    from transformers.models.bert.modeling_bert import BertSelfAttention
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention
    from transformers.models.llama.modeling_llama import LlamaAttention
    from transformers.models.mistral.modeling_mistral import MistralAttention, MistralConfig

    def bert(impl: str, **options: object) -> BertConfig:
        return BertConfig(hidden_size=D, num_attention_heads=H, intermediate_size=4 * D,
                          attn_implementation=impl, **options)  # fmt: skip

    def gpt2(impl: str, **options: object) -> GPT2Config:
        return GPT2Config(n_embd=D, n_head=H, n_positions=256, attn_implementation=impl,
                          **options)  # fmt: skip

    def llama(impl: str, **options: object) -> LlamaConfig:
        options.setdefault("num_key_value_heads", H)
        return LlamaConfig(hidden_size=D, num_attention_heads=H, intermediate_size=4 * D,
                           attn_implementation=impl, **options)  # fmt: skip

    def mistral(impl: str, **options: object) -> MistralConfig:
        return MistralConfig(hidden_size=D, num_attention_heads=H, num_key_value_heads=2,
                             intermediate_size=4 * D, attn_implementation=impl,
                             **options)  # fmt: skip

    def model_class(path: str) -> type[nn.Module]:
        """``transformers.models.<path>``: one attention class, imported where it lives."""
        module, _, name = path.rpartition(".")
        return getattr(importlib.import_module(f"transformers.models.{module}"), name)

    AttentionInterface.register("tiled_gqa", tiled_gqa_attention)
    AttentionInterface.register("double_scale", double_scale_attention)
    return types.SimpleNamespace(
        Bert=BertSelfAttention, GPT2=GPT2Attention, Llama=LlamaAttention,
        Mistral=MistralAttention, bert=bert, gpt2=gpt2, llama=llama, mistral=mistral,
        model_class=model_class,
    )  # fmt: skip


def sdpa_output(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None,
          scale: float | None) -> tuple[Tensor, None]:  # fmt: skip
    """SDPA as transformers' attention functions return it: (B, T, h, d), no weights."""
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).contiguous(), None


def grouped_kv(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    """K/V heads repeated in blocks for the query heads, as transformers' repeat_kv does."""
    groups = query.shape[1] // key.shape[1]
    return key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)


def tiled_gqa_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                        attention_mask: Tensor | None, scaling: float, dropout: float = 0.0,
                        **kwargs: object) -> tuple[Tensor, None]:  # fmt: skip
    """An attention function with the bug of transformers PR 37533 and vLLM PR 24701: grouped
    K/V heads tiled (``repeat``) instead of each serving its own block of query heads."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat(1, groups, 1, 1), value.repeat(1, groups, 1, 1)
    return sdpa_output(query, key, value, attention_mask, scaling)


def double_scale_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                           attention_mask: Tensor | None, scaling: float, dropout: float = 0.0,
                           **kwargs: object) -> tuple[Tensor, None]:  # fmt: skip
    """An attention function with the bug of transformers PRs 38290 and 44397: q scaled by
    ``scaling`` and then SDPA's own default scale on top."""
    key, value = grouped_kv(query, key, value)
    return sdpa_output(query * scaling, key, value, attention_mask, None)


@functools.cache
def _timm() -> types.SimpleNamespace:
    _require("timm")
    try:  # timm imports torchvision, which must be built for this very torch
        with warnings.catch_warnings():  # what it says while it loads is not a finding
            warnings.simplefilter("ignore")
            from timm.models.vision_transformer import Attention
    except Exception as exc:
        raise LibraryMissing(f"timm (it does not import here: {type(exc).__name__})") from None
    return types.SimpleNamespace(ViT=Attention)


def load(library: str) -> types.SimpleNamespace:
    """The library's classes; LibraryMissing when it is not installed."""
    if library == "torch":
        return types.SimpleNamespace(MHA=nn.MultiheadAttention)
    if library == "transformers":
        return _transformers()
    if library == "timm":
        return _timm()
    _require("x_transformers")
    import x_transformers.x_transformers as xt

    return types.SimpleNamespace(Attention=xt.Attention)


def GQA(h: types.SimpleNamespace, impl: str) -> object:
    """A Llama config with two K/V heads shared by the four query heads."""
    return h.llama(impl, num_key_value_heads=2)


def maskless(module: nn.Module, x: Tensor, *, positions: Tensor, mask: Tensor | None,
             cache: object) -> object:  # fmt: skip
    """The caller's bug of pytorch/pytorch#108108: no mask under a cache, trusting the layer's
    ``is_causal``, which SDPA anchors at the top-left (transformers then crops the keys)."""
    return adapters.transformers(module, x, positions=positions, mask=None, cache=cache)


maskless.make_cache = adapters.make_cache  # type: ignore[attr-defined]


def new_keys_only(module: nn.Module, x: Tensor, *, positions: Tensor, mask: Tensor | None,
                  cache: object) -> object:  # fmt: skip
    """A caller's bug with x-transformers' cache: rotary tables for the new tokens only, so the
    cached keys, rotated again at each call, are turned as if they sat at the new positions."""
    from x_transformers.x_transformers import RotaryEmbedding

    if cache is None:
        return adapters.x_transformers(module, x, positions=positions, mask=mask, cache=None)
    freqs, scale = RotaryEmbedding(module.to_q.out_features // module.heads)(positions[0])
    kwargs = {"rotary_pos_emb": (freqs, scale), "mask": mask}
    out, cache.value = module(x, cache=cache.value, return_intermediates=True, **kwargs)
    return out


new_keys_only.make_cache = adapters.XCache  # type: ignore[attr-defined]

# How a decoder layer is called in generation: the model's mask (additive, per head) and the
# shipped adapter (rotary from the model's own class, a DynamicCache).
GENERATION = {"mask": "additive", "mask_shape": "b1qk", "call": adapters.transformers,
              "kv_grouping": "blocks"}  # fmt: skip


def tiny(h: types.SimpleNamespace, path: str, impl: str = "eager", **init: object) -> nn.Module:
    """A transformers attention class built the way the doctor builds a target (its config
    class at d_model 64, 4 heads, layer 0), with ``init`` set on the config and the attention
    implementation ``impl``."""
    sizes = Sizes(D, H, init={"attn_implementation": impl, **init})
    return build(h.model_class(path), sizes, 0)


def encoder_call(module: nn.Module, x: Tensor, *, positions: Tensor, mask: Tensor | None,
                 cache: object) -> object:  # fmt: skip
    """``nn.MultiheadAttention`` as ``nn.TransformerEncoderLayer`` calls it: the same x as query,
    key and value, the padding as ``key_padding_mask``, no weights."""
    return module(x, x, x, key_padding_mask=mask, need_weights=False)[0]


# How a decoder layer without rotary (OPT) or an encoder layer (CLIP) is called by its model:
# the model's additive (B, 1, T, T) mask.
ADDITIVE = {"mask": "additive", "mask_shape": "b1qk"}
GEMMA3 = "gemma3.modeling_gemma3.Gemma3Attention"
T5 = "t5.modeling_t5.T5Attention"
T5_MASK = {"mask": "additive", "mask_shape": "b11k"}  # T5's extended mask, as BERT's


def with_attributes(module: nn.Module, **values: object) -> nn.Module:
    """Set attributes (``a__b`` reaches ``module.a.b``) after construction."""
    for path, value in values.items():
        *owners, name = path.split("__")
        target = module
        for owner in owners:
            target = getattr(target, owner)
        setattr(target, name, value)
    return module


@dataclass(frozen=True)
class Case:
    id: str
    library: str  # torch | transformers | x_transformers | timm
    make: Callable[[types.SimpleNamespace], nn.Module]
    options: dict[str, object] = field(default_factory=dict)  # the doctor's Config
    fails: str | None = None  # the probe that must fail; None: the module must be healthy
    evidence: str = ""  # a fragment of that probe's message (the reason)
    detects: str = ""  # healthy, mask undeclared: a fragment of the detected mask convention


def xattention(x: types.SimpleNamespace, **options: object) -> nn.Module:
    return x.Attention(dim=D, heads=H, dim_head=D // H, **options)


def vit(t: types.SimpleNamespace, fused: bool = True, **options: object) -> nn.Module:
    """timm's ViT attention; ``fused=False`` is its own eager path (``attn @ v``)."""
    module = t.ViT(D, H, qkv_bias=True, **options)
    module.fused_attn = fused
    return module


CASES = [
    # torch.nn.MultiheadAttention: attn_mask (True = blocked, or additive), key_padding_mask
    Case("mha-batch-first", "torch", lambda t: t.MHA(D, H, batch_first=True), detects="drop"),
    Case("mha-sequence-first", "torch", lambda t: t.MHA(D, H), detects="drop"),
    Case("mha-additive-attn-mask", "torch", lambda t: t.MHA(D, H, batch_first=True),
         {"mask": "additive"}),
    Case("mha-key-padding-mask", "torch", lambda t: t.MHA(D, H, batch_first=True),
         {"mask": "drop", "mask_shape": "bk"}),
    Case("mha-add-zero-attn", "torch", lambda t: t.MHA(D, H, batch_first=True, add_zero_attn=True)),
    Case("mha-add-bias-kv", "torch", lambda t: t.MHA(D, H, batch_first=True, add_bias_kv=True)),
    Case("mha-keep-mask-for-drop", "torch", lambda t: t.MHA(D, H, batch_first=True),
         {"mask": "keep"}, "padding no-leak", "padded input"),
    Case("mha-dropout-left-on", "torch",
         lambda t: always_training(t.MHA)(D, H, dropout=0.1, batch_first=True),
         fails="eval determinism", evidence="dropout"),
    # transformers BertSelfAttention (encoder; mask built by the caller)
    Case("bert-eager", "transformers", lambda h: h.Bert(h.bert("eager")), detects="additive"),
    Case("bert-sdpa", "transformers", lambda h: h.Bert(h.bert("sdpa"))),
    Case("bert-built-by-the-doctor", "transformers", lambda h: build(h.Bert, SIZES, 0)),
    Case("bert-sdpa-causal", "transformers", lambda h: h.Bert(h.bert("sdpa"), is_causal=True),
         {"causal": True}),
    Case("bert-eager-keep-mask-added", "transformers", lambda h: h.Bert(h.bert("eager")),
         {"mask": "keep", "mask_shape": "b1qk", "mask_dtype": "float"},
         "padding no-leak", "padded input"),
    Case("bert-sdpa-drop-mask-for-keep", "transformers", lambda h: h.Bert(h.bert("sdpa")),
         {"mask": "drop", "mask_shape": "b1qk"}, "padding no-leak", "padded input"),
    Case("bert-eager-dropout-left-on", "transformers",
         lambda h: always_training(h.Bert)(h.bert("eager", attention_probs_dropout_prob=0.1)),
         fails="eval determinism", evidence="dropout"),
    Case("bert-eager-unscaled", "transformers",
         lambda h: with_attributes(h.Bert(h.bert("eager")), scaling=1.0),
         fails="agrees with SDPA", evidence="SDPA"),
    Case("bert-sdpa-causal-flag-off", "transformers",
         lambda h: h.Bert(h.bert("sdpa"), is_causal=False), {"causal": True},
         "causal no-leak", "depends on"),
    # transformers GPT2Attention (Conv1D projections, fused c_attn)
    Case("gpt2-eager", "transformers", lambda h: h.GPT2(h.gpt2("eager"), layer_idx=0),
         detects="additive"),
    Case("gpt2-sdpa", "transformers", lambda h: h.GPT2(h.gpt2("sdpa"), layer_idx=0)),
    Case("gpt2-eager-upcast", "transformers",
         lambda h: h.GPT2(h.gpt2("eager", reorder_and_upcast_attn=True), layer_idx=0)),
    Case("gpt2-built-by-the-doctor", "transformers", lambda h: build(h.GPT2, SIZES, 0)),
    Case("gpt2-sdpa-causal", "transformers", lambda h: h.GPT2(h.gpt2("sdpa"), layer_idx=0),
         {"causal": True}),
    Case("gpt2-eager-unscaled", "transformers",
         lambda h: h.GPT2(h.gpt2("eager", scale_attn_weights=False), layer_idx=0),
         fails="agrees with SDPA", evidence="SDPA"),
    Case("gpt2-sdpa-unscaled", "transformers",
         lambda h: h.GPT2(h.gpt2("sdpa", scale_attn_weights=False), layer_idx=0),
         fails="agrees with SDPA", evidence="SDPA"),
    Case("gpt2-eager-keep-mask-added", "transformers",
         lambda h: h.GPT2(h.gpt2("eager"), layer_idx=0),
         {"mask": "keep", "mask_shape": "b1qk", "mask_dtype": "float"},
         "padding no-leak", "padded input"),
    Case("gpt2-sdpa-drop-mask-for-keep", "transformers",
         lambda h: h.GPT2(h.gpt2("sdpa"), layer_idx=0),
         {"mask": "drop", "mask_shape": "b1qk"}, "padding no-leak", "padded input"),
    Case("gpt2-eager-dropout-left-on", "transformers",
         lambda h: always_training(h.GPT2)(h.gpt2("eager", attn_pdrop=0.1), layer_idx=0),
         fails="eval determinism", evidence="dropout"),
    Case("gpt2-sdpa-causal-flag-off", "transformers",
         lambda h: with_attributes(h.GPT2(h.gpt2("sdpa"), layer_idx=0), is_causal=False),
         {"causal": True}, "causal no-leak", "depends on"),
    # transformers LlamaAttention: rotary (cos, sin) come from the caller's LlamaRotaryEmbedding
    Case("llama-eager", "transformers", lambda h: h.Llama(h.llama("eager"), layer_idx=0),
         {"positions": "relative"}),
    Case("llama-sdpa-causal", "transformers", lambda h: h.Llama(h.llama("sdpa"), layer_idx=0),
         {"positions": "relative", "causal": True}),
    Case("llama-sdpa-gqa", "transformers",
         lambda h: h.Llama(h.llama("sdpa", num_key_value_heads=2), layer_idx=0),
         {"positions": "relative"}),
    Case("llama-built-by-the-doctor", "transformers", lambda h: build(h.Llama, SIZES, 0),
         {"positions": "relative"}),
    Case("llama-eager-keep-mask-added", "transformers",
         lambda h: h.Llama(h.llama("eager"), layer_idx=0),
         {"positions": "relative", "mask": "keep", "mask_shape": "b1qk", "mask_dtype": "float"},
         "padding no-leak", "padded input"),
    Case("llama-eager-dropout-left-on", "transformers",
         lambda h: always_training(h.Llama)(h.llama("eager", attention_dropout=0.1), layer_idx=0),
         {"positions": "relative"}, "eval determinism", "dropout"),
    # ... called as LlamaModel calls it (the shipped adapter): the model's rotary embedding at
    # the positions, the model's additive mask, a DynamicCache; grouped K/V heads
    Case("llama-gqa-cache-eager", "transformers", lambda h: h.Llama(GQA(h, "eager"), layer_idx=0),
         GENERATION),
    Case("llama-gqa-cache-sdpa", "transformers", lambda h: h.Llama(GQA(h, "sdpa"), layer_idx=0),
         GENERATION),
    Case("llama-gqa-cache-sdpa-no-mask", "transformers",
         lambda h: h.Llama(GQA(h, "sdpa"), layer_idx=0),
         {"causal": True, "call": maskless}, "cached decoding", "cache_causal_alignment"),
    Case("llama-gqa-kv-heads-tiled", "transformers",
         lambda h: h.Llama(GQA(h, "tiled_gqa"), layer_idx=0), GENERATION, "grouped heads",
         "gqa_kv_grouping"),
    Case("mistral-sliding-window-cache", "transformers",
         lambda h: h.Mistral(h.mistral("sdpa", sliding_window=4), layer_idx=0), GENERATION),
    Case("llama-gqa-double-scale", "transformers",
         lambda h: h.Llama(GQA(h, "double_scale"), layer_idx=0), GENERATION, "agrees with SDPA",
         "double_scale"),
    # ... and every other family's layer as its model calls it, built by the doctor's builder
    # from the layer's own config class: partial rotary (GPT-NeoX's fused (h, 3, d) qkv, Phi),
    # Gemma's sliding and global layers (the rotary class's layer_type), GPT-NeoX's layer_past,
    # a decoder without rotary (OPT), an encoder (CLIP; BERT, whose cache parameter it never
    # fills as an encoder)
    Case("gpt-neox-partial-rotary-cache", "transformers",
         lambda h: tiny(h, "gpt_neox.modeling_gpt_neox.GPTNeoXAttention"), GENERATION),
    Case("phi-partial-rotary-cache", "transformers",
         lambda h: tiny(h, "phi.modeling_phi.PhiAttention"), GENERATION),
    Case("qwen2-gqa-cache", "transformers",
         lambda h: tiny(h, "qwen2.modeling_qwen2.Qwen2Attention"), GENERATION),
    Case("gemma2-sliding-cache", "transformers",
         lambda h: tiny(h, "gemma2.modeling_gemma2.Gemma2Attention", sliding_window=4),
         GENERATION),
    Case("gemma3-sliding-cache", "transformers",
         lambda h: tiny(h, GEMMA3, sliding_window=4),
         GENERATION),
    Case("gemma3-global-cache", "transformers",
         lambda h: tiny(h, GEMMA3, sliding_window=4,
                        layer_types=["full_attention"], num_hidden_layers=1), GENERATION),
    Case("opt-cache", "transformers", lambda h: tiny(h, "opt.modeling_opt.OPTAttention"),
         GENERATION),
    Case("falcon-rotary-cache", "transformers",
         lambda h: tiny(h, "falcon.modeling_falcon.FalconAttention", new_decoder_architecture=True,
                        num_kv_heads=2), GENERATION),
    Case("qwen3-qk-norm-cache", "transformers",
         lambda h: tiny(h, "qwen3.modeling_qwen3.Qwen3Attention"), GENERATION),
    Case("olmo2-qk-norm-cache", "transformers",
         lambda h: tiny(h, "olmo2.modeling_olmo2.Olmo2Attention"), GENERATION),
    Case("gemma2-softcap-cache", "transformers",
         lambda h: tiny(h, "gemma2.modeling_gemma2.Gemma2Attention", sliding_window=4,
                        attn_logit_softcapping=5.0), GENERATION),
    Case("marian-encoder", "transformers",
         lambda h: tiny(h, "marian.modeling_marian.MarianAttention"), ADDITIVE),
    Case("clip-encoder", "transformers", lambda h: tiny(h, "clip.modeling_clip.CLIPAttention"),
         ADDITIVE),
    Case("bert-encoder-cache-unused", "transformers", lambda h: h.Bert(h.bert("eager")),
         {"mask": "additive", "mask_shape": "b11k"}),
    Case("gptj-partial-rotary-cache", "transformers",
         lambda h: tiny(h, "gptj.modeling_gptj.GPTJAttention"),
         {**GENERATION, "rope_pairing": "interleaved"}),
    Case("codegen-partial-rotary-cache", "transformers",
         lambda h: tiny(h, "codegen.modeling_codegen.CodeGenAttention"), GENERATION),
    Case("esm-encoder-absolute-positions", "transformers",
         lambda h: tiny(h, "esm.modeling_esm.EsmSelfAttention"), ADDITIVE),
    Case("bitnet-sub-norm-cache", "transformers",
         lambda h: tiny(h, "bitnet.modeling_bitnet.BitNetAttention"), GENERATION),
    Case("deepseek-v3-latent-cache", "transformers",
         lambda h: tiny(h, "deepseek_v3.modeling_deepseek_v3.DeepseekV3Attention"), GENERATION),
    Case("t5-relative-bias-unscaled", "transformers",
         lambda h: tiny(h, T5, has_relative_attention_bias=True), {**T5_MASK, "scale": 1.0}),
    Case("mha-as-encoder-layer-calls-it", "torch", lambda t: t.MHA(D, H, batch_first=True),
         {"mask": "drop", "mask_shape": "bk", "call": encoder_call}),
    # ... with the bugs of the reports above through their attention functions, and a partial
    # rotary model whose layer turns the whole head (its config says a quarter)
    Case("gpt-neox-double-scale", "transformers",
         lambda h: tiny(h, "gpt_neox.modeling_gpt_neox.GPTNeoXAttention", "double_scale"),
         GENERATION, "agrees with SDPA", "double_scale"),
    Case("opt-double-scale", "transformers",
         lambda h: tiny(h, "opt.modeling_opt.OPTAttention", "double_scale"),
         GENERATION, "agrees with SDPA", "double_scale"),
    Case("qwen2-kv-heads-tiled", "transformers",
         lambda h: tiny(h, "qwen2.modeling_qwen2.Qwen2Attention", "tiled_gqa"), GENERATION,
         "grouped heads", "gqa_kv_grouping"),
    Case("bitnet-sub-norm-kv-heads-tiled", "transformers",
         lambda h: tiny(h, "bitnet.modeling_bitnet.BitNetAttention", "tiled_gqa"), GENERATION,
         "grouped heads", "gqa_kv_grouping"),
    Case("qwen3-qk-norm-double-scale", "transformers",
         lambda h: tiny(h, "qwen3.modeling_qwen3.Qwen3Attention", "double_scale"), GENERATION,
         "agrees with SDPA", "double_scale"),
    Case("clip-double-scale", "transformers",
         lambda h: tiny(h, "clip.modeling_clip.CLIPAttention", "double_scale"), ADDITIVE,
         "agrees with SDPA", "double_scale"),
    Case("t5-relative-bias-scale-undeclared", "transformers",  # its bias says T5: unscaled
         lambda h: tiny(h, T5, has_relative_attention_bias=True), T5_MASK),
    Case("gemma3-dropout-left-on", "transformers",
         lambda h: always_training(h.model_class(GEMMA3))(
             tiny(h, GEMMA3, attention_dropout=0.1).config, layer_idx=0),
         GENERATION, "eval determinism", "dropout"),
    # x_transformers.Attention: key padding mask (True = keep); softmax in float32
    Case("xt-default", "x_transformers", lambda x: xattention(x), detects="key padding"),
    Case("xt-causal", "x_transformers", lambda x: xattention(x, causal=True), {"causal": True}),
    Case("xt-flash", "x_transformers", lambda x: xattention(x, flash=True)),
    Case("xt-built-by-the-doctor", "x_transformers", lambda x: build(x.Attention, SIZES, 0)),
    Case("xt-drop-mask-for-keep", "x_transformers", lambda x: xattention(x),
         {"mask": "drop", "mask_shape": "bk"}, "padding no-leak", "do not respond"),
    Case("xt-causal-flag-off", "x_transformers", lambda x: xattention(x), {"causal": True},
         "causal no-leak", "depends on"),
    Case("xt-qk-norm-scale", "x_transformers", lambda x: xattention(x, qk_norm=True),
         fails="agrees with SDPA", evidence="SDPA"),
    Case("xt-unscaled", "x_transformers",
         lambda x: with_attributes(xattention(x), attend__scale=1.0),
         fails="agrees with SDPA", evidence="SDPA"),
    # x_transformers.Attention with rotary and grouped K/V heads, as AttentionLayers calls it
    # (the shipped adapter: its RotaryEmbedding, its intermediates as the cache)
    Case("xt-rotary-gqa-cache", "x_transformers",
         lambda x: x.Attention(dim=D, heads=H, dim_head=D // H, kv_heads=2, causal=True),
         {"causal": True, "call": adapters.x_transformers, "kv_grouping": "strided"}),
    Case("xt-rotary-new-keys-only", "x_transformers",
         lambda x: x.Attention(dim=D, heads=H, dim_head=D // H, kv_heads=2, causal=True),
         {"causal": True, "call": new_keys_only, "kv_grouping": "strided"}, "cached decoding",
         "vs full forward"),
    Case("xt-dropout-left-on", "x_transformers",
         lambda x: always_training(x.Attention)(dim=D, heads=H, dim_head=D // H, dropout=0.1),
         fails="eval determinism", evidence="dropout"),
    # timm's ViT attention: forward(x, attn_mask=None, is_causal=False); a keep mask
    Case("timm-vit-fused", "timm", lambda t: vit(t), detects="keep"),
    Case("timm-vit-eager", "timm", lambda t: vit(t, fused=False), detects="keep"),
    Case("timm-vit-eager-scale-from-dim", "timm",
         lambda t: with_attributes(vit(t, fused=False), scale=D**-0.5),
         fails="agrees with SDPA", evidence="scale_d_model"),
    Case("timm-vit-eager-dropout-left-on", "timm",
         lambda t: always_training(t.ViT)(D, H, qkv_bias=True, attn_drop=0.1),
         fails="eval determinism", evidence="dropout"),
]  # fmt: skip


def diagnosed(case: Case) -> Diagnosis:
    library = load(case.library)
    with torch.random.fork_rng():  # seeded weights, the global RNG left as it was
        torch.manual_seed(0)
        module = case.make(library)
    return diagnose(module, Config(**case.options), case.id)


def verdict_ok(case: Case, diagnosis: Diagnosis) -> tuple[bool, str]:
    """Whether the doctor said what it should of ``case``, and why not when it did not."""
    if case.fails is None:
        if not diagnosis.healthy:
            return False, "a correct module was not healthy"
        convention = next((f for f in diagnosis.findings if f.probe == "mask convention"), None)
        if case.detects and (convention is None or case.detects not in convention.message):
            return False, f"mask convention not detected as {case.detects}"
        return True, ""
    finding = next((f for f in diagnosis.findings if f.probe == case.fails), None)
    if finding is None or finding.status != FAIL:
        return False, f"{case.fails} did not fail"
    if finding.message.startswith("raises"):
        return False, f"{case.fails} fails only because the module could not be called"
    if case.evidence not in finding.message:
        return False, f"{case.fails} failed without its evidence ({case.evidence!r})"
    return True, ""


def real_table() -> pd.DataFrame:
    """One row per case: what the doctor said, and whether that is right."""
    rows = []
    for case in CASES:
        row = dict(module=case.id, library=case.library,
                   should="pass" if case.fails is None else f"fail: {case.fails}")  # fmt: skip
        try:
            diagnosis = diagnosed(case)
        except LibraryMissing:
            # the same words whether it is missing or fails to import: the report is the same
            rows.append(dict(row, doctor="not run", ok="", probes=f"{case.library} not importable"))
            continue
        ok, _ = verdict_ok(case, diagnosis)
        fired = [f"{f.probe} ({f.status})" for f in diagnosis.findings if f.status in (FAIL, WARN)]
        fired.sort(key=lambda text: not text.startswith(f"{case.fails} ("))  # the one it should
        doctor = "healthy" if diagnosis.healthy else "problems"
        more = f" +{len(fired) - SHOWN}" if len(fired) > SHOWN else ""
        rows.append(dict(row, doctor=doctor, ok=ok, probes=", ".join(fired[:SHOWN]) + more))
    return pd.DataFrame(rows)


def real_markdown(table: pd.DataFrame) -> str:
    """The report section: the doctor on real modules, correct and misused."""
    run = table[table["doctor"] != "not run"]
    right = int((run["ok"] == True).sum())  # noqa: E712 - a column of bools and blanks
    lines = [
        "## The doctor on real modules",
        "",
        "Attention modules from real libraries, built from their own config objects and "
        "diagnosed as published (no wrapper; transformers' decoder layers also as their models "
        "call them, through the shipped adapter `harness.doctor.adapters:transformers`: rotary "
        "from the model's own class, grouped K/V heads, a DynamicCache; Llama, Mistral, Qwen2, "
        "Gemma2 and Gemma3's sliding and global layers, GPT-NeoX's fused (h, 3, d) projection "
        "and partial rotary, Phi, OPT without rotary; CLIP and BERT as encoders; "
        "`nn.MultiheadAttention` as `nn.TransformerEncoderLayer` calls it): correct ones must be "
        "healthy, misused ones (dropout left on in eval, an inverted mask convention, a scale "
        "changed through the module's own options, `is_causal` off, a cache without a mask, "
        "attention functions with tiled K/V heads or a doubled scale, registered as transformers "
        "registers its own) must fail on the probe named. Cases whose library is not "
        'installed are listed as not run (`pip install -c .ci/constraints.txt -e ".[real]"`).',
        "",
        f"Right: {right}/{len(run)} cases run ({len(table) - len(run)} not run). *should*: "
        "pass, or the probe that must fail; *doctor*: healthy (exit 0) or problems; *ok*: the "
        "doctor said what *should* says; *probes*: those that failed or warned, the one that "
        "must fail first (three named, +k more).",
        "",
        table.to_markdown(index=False),
    ]
    return "\n".join(lines)
