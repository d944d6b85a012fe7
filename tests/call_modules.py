"""Forwards written the ways real code writes them, for the doctor's calling tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Heads(nn.Module):
    """Separate q/k/v/out projections and SDPA with a keep-mask; subclasses vary the forward."""

    def __init__(self, d_model: int = 32, heads: int = 4):
        super().__init__()
        self.n_head = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(d_model, d_model) for _ in range(4)
        )

    def attend(self, q_in: Tensor, kv_in: Tensor, keep: Tensor | None, rotate=None) -> Tensor:
        """SDPA on the projections; ``rotate`` turns q and k (B, h, T, d) by their positions."""
        B, T, C = q_in.shape
        q, k, v = (
            p(t).view(B, -1, self.n_head, C // self.n_head).transpose(1, 2)
            for p, t in ((self.q_proj, q_in), (self.k_proj, kv_in), (self.v_proj, kv_in))
        )  # (B, h, T, d)
        if rotate is not None:
            q, k = rotate(q), rotate(k)
        mask = None if keep is None else keep[:, None]  # (B, 1, T, T)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class CrossInputFirst(Heads):
    """Whisper's order: the cross-attention input comes before the mask."""

    def forward(self, x, xa=None, mask=None, kv_cache=None):
        return self.attend(x, x if xa is None else xa, mask)


class QueryKeyValue(Heads):
    """forward(query, key, value, attn_mask): self-attention gets x three times."""

    def forward(self, query, key, value, attn_mask=None):
        assert query is key is value, "self-attention: one input"
        return self.attend(query, key, attn_mask)


class KeywordOnly(Heads):
    """Every argument keyword-only, hidden_states first."""

    def forward(self, *, hidden_states, attention_mask=None):
        return self.attend(hidden_states, hidden_states, attention_mask)


class NeedsCache(Heads):
    """A required argument the doctor cannot make."""

    def forward(self, x, kv_cache, mask=None):
        return self.attend(x, x, mask)


class MetaRotary(Heads):
    """Meta's Llama order: forward(x, start_pos, freqs_cis, mask) with complex tables."""

    def forward(self, x, freqs_cis, mask=None, start_pos=0):
        _, T, C = x.shape
        assert freqs_cis.is_complex() and freqs_cis.shape == (T, C // self.n_head // 2)

        def rotate(t: Tensor) -> Tensor:  # pairs 2i, 2i + 1 as complex numbers
            pairs = torch.view_as_complex(t.reshape(*t.shape[:-1], -1, 2).contiguous())
            return torch.view_as_real(pairs * freqs_cis).flatten(-2)

        return self.attend(x, x, mask, rotate)


class TransformersRotary(Heads):
    """transformers' order: forward(hidden_states, position_embeddings, attention_mask)."""

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None):
        cos, sin = position_embeddings
        B, T, C = hidden_states.shape
        assert cos.shape == sin.shape == (B, T, C // self.n_head)
        cos, sin, half = cos[:, None], sin[:, None], C // self.n_head // 2  # (B, 1, T, d)

        def rotate(t: Tensor) -> Tensor:  # rotate_half: i with i + d/2
            return t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin

        return self.attend(hidden_states, hidden_states, attention_mask, rotate)


class InterleavedOnHalfTables(Heads):
    """Buggy: transformers' call, with (cos, sin) laid out for rotate_half, but its rotation pairs
    dimensions 2i with 2i + 1 (Meta's code on a converted checkpoint): no rotation at all."""

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None):
        cos, sin = (t[:, None] for t in position_embeddings)  # (B, 1, T, d)

        def rotate(t: Tensor) -> Tensor:
            turned = torch.stack([-t[..., 1::2], t[..., 0::2]], dim=-1).flatten(-2)
            return t * cos + turned * sin

        return self.attend(hidden_states, hidden_states, attention_mask, rotate)


class NoMaskParameter(Heads):
    """Takes no mask at all."""

    def forward(self, x):
        return self.attend(x, x, None)


class MisleadingDim(Heads):
    """Stores its head width as ``dim``; takes x (B, T, d_model) like any other."""

    def __init__(self, d_model: int = 32, heads: int = 4):
        super().__init__(d_model, heads)
        self.dim = d_model // heads

    def forward(self, x):
        return self.attend(x, x, None)


class IgnoresItsMask(Heads):
    """A real bug: ``scores.masked_fill(...)`` without assigning the result, so no mask acts."""

    def forward(self, x, mask=None):
        return self.attend(x, x, None)


class KeyPaddingDrop(Heads):
    """Takes a (B, T) key padding mask, True = padding, as nn.MultiheadAttention does."""

    def forward(self, x, key_padding_mask=None):
        keep = None if key_padding_mask is None else ~key_padding_mask[:, None, :]  # (B, 1, T)
        keep = None if keep is None else keep.expand(-1, x.shape[1], -1)  # (B, T, T)
        return self.attend(x, x, keep)


class LastRowOnly(Heads):
    """Takes a (B, T, T) keep-mask but applies its last row to every query: fine for padding,
    where every row is the same; a future leak for a causal mask."""

    def forward(self, x, mask=None):
        keep = None if mask is None else mask[:, -1:, :].expand(-1, x.shape[1], -1)  # (B, T, T)
        return self.attend(x, x, keep)


class Float32Scores(Heads):
    """Upcasts the scores with .float() and multiplies by V as it is: in float64 it raises
    (float32 weights @ float64 values), so the doctor must run it in float32."""

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (
            p(x).view(B, T, self.n_head, -1).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )  # (B, h, T, d)
        scores = q.float() @ k.float().transpose(-2, -1) / (C // self.n_head) ** 0.5
        y = scores.softmax(dim=-1) @ v  # (B, h, T, d)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class ShortContext(Heads):
    """nanoGPT's registered causal buffer: sequences beyond block_size break the mask slice."""

    def __init__(self, d_model: int = 32, heads: int = 4, block_size: int = 16):
        super().__init__(d_model, heads)
        self.block_size = block_size
        self.register_buffer("bias", torch.ones(block_size, block_size, dtype=torch.bool).tril())

    def forward(self, x):
        T = x.shape[1]
        keep = self.bias[:T, :T].expand(x.shape[0], T, T)  # (B, T, T); wrong shape past the context
        return self.attend(x, x, keep)


class ReturnsLogits(Heads):
    """Returns (output, pre-softmax scores): the second output is not attention weights."""

    def forward(self, x):
        C = x.shape[-1]
        q, k = self.q_proj(x), self.k_proj(x)
        return self.attend(x, x, None), q @ k.transpose(-2, -1) / C**0.5  # (B, T, T) logits


class SequenceFirst(Heads):
    """fairseq's layout: (T, B, d) tensors, forward(query, key, value, key_padding_mask)."""

    def forward(self, query, key, value, key_padding_mask=None):
        x = query.transpose(0, 1)  # (B, T, d)
        keep = None
        if key_padding_mask is not None:  # (B, T), True = padding
            keep = (~key_padding_mask)[:, None, :].expand(-1, x.shape[1], -1)  # (B, T, T)
        return self.attend(x, x, keep).transpose(0, 1), None  # (T, B, d)


class CausalIgnoresPadding(Heads):
    """Causal by itself; takes a padding mask and never applies it."""

    def forward(self, x, attention_mask=None):
        B, T, _ = x.shape
        causal = torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T)
        return self.attend(x, x, causal)


class TwoMasks(Heads):
    """fairseq's forward: an attention mask it does not use here, and a key padding mask."""

    def forward(self, x, attn_mask=None, key_padding_mask=None):
        keep = None
        if key_padding_mask is not None:  # (B, T), True = padding
            keep = (~key_padding_mask)[:, None, :].expand(-1, x.shape[1], -1)  # (B, T, T)
        return self.attend(x, x, keep)


class RotaryGQA(nn.Module):
    """transformers-style rotary attention with grouped key/value heads; ``tile`` is the bug of
    repeating the key/value heads whole instead of each serving its own group."""

    def __init__(self, d_model: int = 32, heads: int = 4, kv_heads: int = 2, tile: bool = False):
        super().__init__()
        self.num_heads, self.head_dim, self.tile = heads, d_model // heads, tile
        self.q_proj, self.o_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, kv_heads * self.head_dim)
        self.v_proj = nn.Linear(d_model, kv_heads * self.head_dim)

    def forward(self, hidden_states, position_embeddings=None):
        cos, sin = (t[:, None] for t in position_embeddings)  # (B, 1, T, d)
        B, T, C = hidden_states.shape
        q = self.q_proj(hidden_states).view(B, T, -1, self.head_dim).transpose(1, 2)
        k, v = (p(hidden_states).view(B, T, -1, self.head_dim).transpose(1, 2)
                for p in (self.k_proj, self.v_proj))  # fmt: skip
        half = self.head_dim // 2
        q, k = (t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin for t in (q, k))
        groups = self.num_heads // k.shape[1]
        if self.tile:
            k, v = k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1)
        else:
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        y = F.scaled_dot_product_attention(q, k, v)  # (B, h, T, d)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


def rope_half(t: Tensor, positions: Tensor) -> Tensor:
    """Standard RoPE (base 10000, rotate_half pairing) of t (B, h, T, d) at positions (B, T)."""
    d = t.shape[-1]
    inv_freq = 10000.0 ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions[:, None, :, None].double() * inv_freq  # (B, 1, T, d / 2): exact
    table = torch.cat([angles, angles], -1)  # (B, 1, T, d)
    cos, sin = table.cos().to(t.dtype), table.sin().to(t.dtype)
    return t * cos + torch.cat([-t[..., d // 2 :], t[..., : d // 2]], -1) * sin


class PartialRotary(Heads):
    """GPT-NeoX and Phi's partial rotary: only the first ``rotary_ndims`` of each head turn.
    ``whole`` is the bug of turning the whole head where its checkpoint turns a part."""

    def __init__(self, d_model: int = 32, heads: int = 4, whole: bool = False):
        super().__init__(d_model, heads)
        self.turned, self.whole = d_model // heads // 2, whole
        self.rotary_ndims = self.turned  # what it says it turns

    def forward(self, x, position_ids=None):
        n = self.turned

        def rotate(t: Tensor) -> Tensor:  # (B, h, T, d)
            if self.whole:
                return rope_half(t, position_ids)
            return torch.cat([rope_half(t[..., :n], position_ids), t[..., n:]], -1)

        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()  # (T, T)
        return self.attend(x, x, causal.expand(x.shape[0], -1, -1), rotate)


class FusedGrouped(nn.Module):
    """One fused projection for q, k and v with grouped K/V heads, in either real layout:
    ``q | k | v`` (gpt-fast's wqkv) or ``per K/V group`` (each group's queries, key and value
    side by side: GPT-NeoX's and BLOOM's (h, 3, d) when every head has its own K/V)."""

    def __init__(self, d_model: int = 32, heads: int = 4, kv_heads: int = 2,
                 per_group: bool = False):  # fmt: skip
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = heads, kv_heads, d_model // heads
        self.per_group = per_group
        self.wqkv = nn.Linear(d_model, (heads + 2 * kv_heads) * self.head_dim)
        self.wo = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        d, r = self.head_dim, self.n_head // self.n_kv
        fused = self.wqkv(x)  # (B, T, (h + 2 h_kv) d)
        if self.per_group:
            grouped = fused.view(B, T, self.n_kv, r + 2, d)
            q, k, v = grouped[..., :r, :].flatten(2, 3), grouped[..., r, :], grouped[..., r + 1, :]
        else:
            q, k, v = fused.split([C, self.n_kv * d, self.n_kv * d], dim=-1)
        q = q.reshape(B, T, self.n_head, d).transpose(1, 2)  # (B, h, T, d)
        k, v = (t.reshape(B, T, self.n_kv, d).transpose(1, 2) for t in (k, v))  # (B, h_kv, T, d)
        k, v = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)
        y = F.scaled_dot_product_attention(q, k, v)  # (B, h, T, d)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))


class Residual(Heads):
    """A block without a norm: ``x + attention(x)``. Its attention is SDPA's; its output is not."""

    def forward(self, x, mask=None):
        return x + self.attend(x, x, mask)


class ResidualWrongScale(Heads):
    """``x + attention(x)`` with the scale left out: the residual must not hide it."""

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.n_head, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # fmt: skip
        y = (q @ k.transpose(-2, -1)).softmax(-1) @ v  # (B, h, T, d): no 1/sqrt(d)
        return x + self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class UpcastSoftmax(Heads):
    """transformers' eager attention: an additive mask added to the scores, the softmax taken in
    float32 whatever the scores' dtype."""

    def forward(self, x, attention_mask=None):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.n_head, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # fmt: skip
        scores = q @ k.transpose(-2, -1) / (C // self.n_head) ** 0.5  # (B, h, T, T)
        if attention_mask is not None:
            scores = scores + attention_mask[:, None]  # (B, 1, T, T) additive
        weights = scores.softmax(-1, dtype=torch.float32).to(q.dtype)
        return self.o_proj((weights @ v).transpose(1, 2).reshape(B, T, C))


class QKNorm(Heads):
    """Queries and keys normalized before the scores, per head (Qwen3's q_norm of d) or over
    the whole projection (OLMo2's of h * d); ``twice`` is the bug of scaling q by 1/sqrt(d) and
    then letting SDPA scale again."""

    def __init__(self, d_model: int = 32, heads: int = 4, per_head: bool = True,
                 twice: bool = False):  # fmt: skip
        super().__init__(d_model, heads)
        width = d_model // heads if per_head else d_model
        self.q_norm, self.k_norm = nn.LayerNorm(width), nn.LayerNorm(width)
        self.per_head, self.twice = per_head, twice

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x) for p in (self.q_proj, self.k_proj, self.v_proj))  # (B, T, C)
        if not self.per_head:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        if self.per_head:
            q, k = self.q_norm(q), self.k_norm(k)  # (B, h, T, d): each head
        if self.twice:
            q = q / (C // self.n_head) ** 0.5
        y = F.scaled_dot_product_attention(q, k, v)  # (B, h, T, d)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class Softcapped(Heads):
    """Gemma2's score cap, cap * tanh(s / cap), then the mask; ``after`` is the bug of capping
    after a finite mask, which turns the fill into -cap."""

    def __init__(self, d_model: int = 32, heads: int = 4, after: bool = False, cap: float = 5.0):
        super().__init__(d_model, heads)
        self.attn_logit_softcapping, self.after = cap, after

    def forward(self, x, mask=None):
        return self.capped(x, mask)

    def capped(self, x: Tensor, mask: Tensor | None, rotate=None) -> Tensor:
        B, T, C = x.shape
        cap = self.attn_logit_softcapping
        q, k, v = (p(x).view(B, T, self.n_head, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # fmt: skip
        if rotate is not None:
            q, k = rotate(q), rotate(k)
        scores = q @ k.transpose(-2, -1) / (C // self.n_head) ** 0.5  # (B, h, T, T)
        blocked = None if mask is None else ~mask[:, None]  # (B, 1, T, T), keep-mask given
        if self.after and blocked is not None:
            scores = scores.masked_fill(blocked, -1e9)
        scores = cap * torch.tanh(scores / cap)
        if not self.after and blocked is not None:
            scores = scores.masked_fill(blocked, float("-inf"))
        self.weights = scores.softmax(-1)  # (B, h, T, T)
        y = self.weights @ v  # (B, h, T, d)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class SoftcappedWithWeights(Softcapped):
    """Softcapped, returning its attention weights beside its output, as eager layers do."""

    def forward(self, x, mask=None):
        return self.capped(x, mask), self.weights


class RotarySoftcapped(Softcapped):
    """Gemma2 as a whole: rotary tables in transformers' order, then the score cap."""

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None):
        cos, sin = position_embeddings
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d)
        half = cos.shape[-1] // 2

        def rotate(t: Tensor) -> Tensor:  # rotate_half: i with i + d/2
            return t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin

        return self.capped(hidden_states, attention_mask, rotate)


def _turn_pairs(x, angles):
    """Rotate pairs (2i, 2i + 1) of x (..., d) by angles (..., d / 2)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)  # angles kept in float32
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class SequenceFirstRotary(nn.Module):
    """Megatron's and ChatGLM's layout: (T, B, C) in and out, rotary from ``position_ids``
    that stay (B, T), as a model hands them whatever its activations' layout (required: the
    caller always passes them)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.qkv, self.dense = (
            nn.Linear(hidden_size, 3 * hidden_size),
            nn.Linear(hidden_size, hidden_size),
        )
        steps = torch.arange(0, self.head_dim, 2).float() / self.head_dim
        self.register_buffer("inv_freq", 1.0 / 10000.0**steps, persistent=False)

    def forward(self, hidden_states, position_ids):
        T, B, C = hidden_states.shape
        q, k, v = self.qkv(hidden_states).view(T, B, 3, self.num_heads, -1).permute(2, 1, 3, 0, 4)
        angles = (position_ids[..., None].float() * self.inv_freq)[:, None]  # (B, 1, T, d / 2)
        q, k = _turn_pairs(q, angles), _turn_pairs(k, angles)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d)
        return self.dense(out.permute(2, 0, 1, 3).reshape(T, B, C))


class ReturnsPositionBias(Heads):
    """T5's and Pix2Struct's layers return the position bias beside the output: a (B, h, T, T)
    tensor of 0s and 1s, shaped like weights, computed from no softmax."""

    def forward(self, x: Tensor, mask: Tensor | None = None):
        B, T, _ = x.shape
        keep = torch.ones(B, T, T, dtype=torch.bool) if mask is None else mask.bool()
        bias = 1.0 - keep[:, None].to(x.dtype).expand(B, self.n_head, T, T)  # (B, h, T, T)
        return self.attend(x, x, keep), bias


class AddsInPlace(Heads):
    """Pix2Struct's mask: a float keep-mask turned into a bias filled with the lowest value,
    added in place to the scores, then clamped by ``torch.max``. ``inverted``: the bias
    filled where the mask keeps (``== 0`` for ``== 1``)."""

    def __init__(self, d_model: int = 32, heads: int = 4, inverted: bool = False):
        super().__init__(d_model, heads)
        self.inverted = inverted

    def forward(self, x: Tensor, attention_mask: Tensor):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.n_head, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # fmt: skip
        scores = q @ k.transpose(-1, -2) / (C // self.n_head) ** 0.5  # (B, h, T, T)
        bias = 1 - attention_mask[:, None, None, :].to(scores.dtype)  # 1 at padding
        lowest = torch.finfo(scores.dtype).min
        bias = (
            bias.masked_fill(bias == 0, lowest)
            if self.inverted
            else bias.masked_fill(bias == 1, lowest)
        )
        scores += bias
        scores = torch.max(scores, torch.tensor(lowest, dtype=scores.dtype))
        weights = F.softmax(scores, dim=-1)
        return self.o_proj((weights @ v).transpose(1, 2).reshape(B, T, C))


class KeyDrawnLarge(Heads):
    """Its own init: the queries drawn small, then the keys with ``std=1.0`` (the bug), so the
    keys' draw is the one that saturates the weights."""

    def __init__(self, d_model: int = 32, heads: int = 4):
        super().__init__(d_model, heads)
        nn.init.normal_(self.q_proj.weight, std=0.5)
        nn.init.normal_(self.k_proj.weight, std=1.0)

    def forward(self, x: Tensor, mask: Tensor | None = None):
        return self.attend(x, x, mask)
