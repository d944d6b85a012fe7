"""Buggy attention modules in the styles of other codebases, each one line away from right,
for the fixes that need more than the line itself: a count in scope, a tensor made beside the
one rotated, a product with a bias term, a mask made from two, a window's bound.

The line each test expects rewritten is marked ``# BUG``.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class SplitScale(nn.Module):
    """Whisper's way of scaling: q and k each by the head width's fourth root; written with
    the model's width, and no name holds the head width (scale_d_model)."""

    def __init__(self, n_state, n_head):
        super().__init__()
        self.n_head = n_head
        self.query, self.key = nn.Linear(n_state, n_state), nn.Linear(n_state, n_state)
        self.value, self.out = nn.Linear(n_state, n_state), nn.Linear(n_state, n_state)

    def forward(self, x):
        n_batch, n_ctx, n_state = x.shape
        scale = n_state**-0.25  # BUG
        q = self.query(x).view(n_batch, n_ctx, self.n_head, -1).permute(0, 2, 1, 3) * scale
        k = self.key(x).view(n_batch, n_ctx, self.n_head, -1).permute(0, 2, 3, 1) * scale
        v = self.value(x).view(n_batch, n_ctx, self.n_head, -1).permute(0, 2, 1, 3)
        w = F.softmax(q @ k, dim=-1)  # (B, h, T, T)
        return self.out((w @ v).permute(0, 2, 1, 3).flatten(start_dim=2))


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q, k, cos, sin):
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


class RotatesValues(nn.Module):
    """A rotary helper that turns a pair, handed the values where the keys belong
    (rope_on_value)."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        inv = 1.0 / (10000 ** (torch.arange(0, self.d_head, 2).float() / self.d_head))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.n_heads, self.d_head).transpose(1, 2) for t in (q, k, v))
        angles = torch.outer(torch.arange(T, dtype=torch.float32), self.inv_freq)
        angles = torch.cat((angles, angles), dim=-1)  # (T, d_head)
        q, v = apply_rotary(q, v, angles.cos(), angles.sin())  # BUG
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


def _slopes(n_heads):
    return torch.tensor([2 ** (-8 * (i + 1) / n_heads) for i in range(n_heads)])


class BiasedProduct(nn.Module):
    """BLOOM's way: heads folded into the batch, an ALiBi bias added by ``baddbmm``, whose
    ``alpha`` carries the scale."""

    def __init__(self, hidden_size, n_head):
        super().__init__()
        self.num_heads, self.head_dim = n_head, hidden_size // n_head
        self.inv_norm_factor = 1.0 / math.sqrt(self.head_dim)
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)

    def scores(self, alibi, q, k):
        return alibi.baddbmm(batch1=q, batch2=k, alpha=self.inv_norm_factor)

    def forward(self, x):
        B, T, _ = x.shape
        fused = self.query_key_value(x).view(B, T, self.num_heads, 3, self.head_dim)
        q, k, v = fused.unbind(3)
        q = q.transpose(1, 2).reshape(B * self.num_heads, T, self.head_dim)
        k = k.permute(0, 2, 3, 1).reshape(B * self.num_heads, self.head_dim, T)
        v = v.transpose(1, 2).reshape(B * self.num_heads, T, self.head_dim)
        alibi = _slopes(self.num_heads)[:, None] * torch.arange(T, dtype=torch.float32)
        alibi = alibi.repeat(B, 1)[:, None, :]  # (B * h, 1, T)
        scores = self.scores(alibi, q, k).view(B, self.num_heads, T, T)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        probs = F.softmax(scores.masked_fill(future, torch.finfo(scores.dtype).min), dim=-1)
        ctx = torch.bmm(probs.view(B * self.num_heads, T, T), v)
        ctx = ctx.view(B, self.num_heads, T, self.head_dim).permute(0, 2, 1, 3)
        return self.dense(ctx.reshape(B, T, -1))


class UnscaledProduct(BiasedProduct):
    """BiasedProduct with the scale left out of ``baddbmm`` (missing_scale)."""

    def scores(self, alibi, q, k):
        return alibi.baddbmm(batch1=q, batch2=k)  # BUG


class CausalAndPadding(nn.Module):
    """CLIP's text encoder's way: its own causal triangle and the caller's padding (1 = a
    token), made into one keep-mask; the padding compared the wrong way (mask_bool)."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads, self.scale = num_heads, (embed_dim // num_heads) ** -0.5
        self.q_proj, self.k_proj = nn.Linear(embed_dim, embed_dim), nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, hidden_states, attention_mask=None):
        B, T, C = hidden_states.shape
        q, k, v = (
            p(hidden_states).view(B, T, self.num_heads, -1).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        keep = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
        if attention_mask is not None:
            keep = keep & (attention_mask[:, None, None, :] == 0)  # BUG
        scores = (q @ k.transpose(-1, -2) * self.scale).masked_fill(~keep, float("-inf"))
        return self.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))


class WideBand(nn.Module):
    """A local causal window written as a bound on the distance, one key too wide
    (sliding_window_off_by_one): ``>`` where ``>=`` keeps ``window`` keys."""

    def __init__(self, d_model, n_heads, window=4):
        super().__init__()
        self.h, self.window = n_heads, window
        self.qkv, self.o = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        att = q @ k.transpose(-2, -1) / math.sqrt(C // self.h)  # (B, h, T, T)
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        blocked = (j > i) | (i - j > self.window)  # BUG
        att = att.masked_fill(blocked, float("-inf"))
        return self.o((att.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C))


class RootForgotten(nn.Module):
    """Meta's Llama's way of scaling, written without the square root: the scores divided by
    the head width, which is the scale applied twice (double_scale); the division on the line
    after the product, one statement over two lines."""

    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wqkv, self.wo = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        xq, xk, xv = self.wqkv(x).view(B, T, 3, self.n_heads, self.head_dim).unbind(2)
        xq, xk, xv = (t.transpose(1, 2) for t in (xq, xk, xv))  # (B, h, T, d)
        # fmt: off
        scores = torch.matmul(
            xq, xk.transpose(2, 3)
        ) / self.head_dim  # BUG
        # fmt: on
        out = torch.matmul(F.softmax(scores.float(), dim=-1).type_as(xq), xv)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))


class FillByName(nn.Module):
    """GPT-J's way of masking: the future filled by ``torch.where`` with a value made on a line
    of its own, too small (fill_too_small): fixed where it is used."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.qkv, self.out_proj = (
            nn.Linear(embed_dim, 3 * embed_dim),
            nn.Linear(embed_dim, embed_dim),
        )

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q, k, v = self.qkv(hidden_states).view(B, T, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        attn_weights = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        causal_mask = torch.ones(T, T, dtype=torch.bool).tril()
        mask_value = -1e4
        attn_weights = torch.where(causal_mask, attn_weights, mask_value)  # BUG
        out = attn_weights.softmax(dim=-1) @ v
        return self.out_proj(out.transpose(1, 2).reshape(B, T, C))


class SequenceFirstMerge(nn.Module):
    """DETR's way: (T, B, E) in and out, heads folded into the batch, (B * h, T, d); merged
    back by a view without turning the sequence first (head_merge_no_transpose)."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        tgt_len, bsz, embed_dim = x.shape
        q, k, v = self.in_proj(x).chunk(3, dim=-1)
        q, k, v = (
            t.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
            for t in (q, k, v)
        )  # (B * h, T, d)
        weights = torch.bmm(q * self.head_dim**-0.5, k.transpose(1, 2)).softmax(dim=-1)
        attn_output = torch.bmm(weights, v)
        attn_output = attn_output.contiguous().view(tgt_len, bsz, embed_dim)  # BUG
        return self.out_proj(attn_output)


class AdditiveNaN(nn.Module):
    """A Keras-like additive mask, ``(1 - keep) * -inf``: NaN on every kept cell
    (mask_to_additive_nan)."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.h = n_heads
        self.qkv, self.o = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(C // self.h)
        if mask is not None:
            adder = (1.0 - mask[:, None].to(x.dtype)) * float("-inf")  # BUG
            scores = scores + adder
        return self.o((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))


class AdditiveNaNToSDPA(AdditiveNaN):
    """The same additive mask, ``(1 - keep) * -inf``, handed to SDPA as its ``attn_mask``: NaN
    on every kept cell, read where SDPA adds it (mask_to_additive_nan)."""

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        adder = None
        if mask is not None:
            adder = (1.0 - mask[:, None].to(x.dtype)) * float("-inf")  # BUG
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=adder)  # (B, h, T, d)
        return self.o(y.transpose(1, 2).reshape(B, T, C))


class PaddingTurned(nn.Module):
    """BERT's extended additive mask, (B, 1, 1, T), turned onto the queries' axis before it is
    added (padding_on_queries)."""

    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.h, self.d = num_attention_heads, hidden_size // num_attention_heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states, attention_mask=None):
        B, T, C = hidden_states.shape
        q, k, v = (
            p(hidden_states).view(B, T, self.h, self.d).permute(0, 2, 1, 3)
            for p in (self.query, self.key, self.value)
        )
        attention_scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d)
        if attention_mask is not None:
            attention_scores = attention_scores + attention_mask.transpose(-1, -2)  # BUG
        context = torch.matmul(attention_scores.softmax(dim=-1), v)
        return context.permute(0, 2, 1, 3).reshape(B, T, C)


def repeat_kv(hidden_states, n_rep):
    """(B, kv, T, d) -> (B, kv * n_rep, T, d): K/V head i serves query heads i * n_rep ..."""
    b, kv, t, d = hidden_states.shape
    hidden_states = hidden_states[:, :, None, :, :].expand(b, kv, n_rep, t, d)
    return hidden_states.reshape(b, kv * n_rep, t, d)


def repeat_kv_strided(hidden_states, n_rep):
    """repeat_kv written with the copies' axis before the heads': K/V head i serves query
    heads i, i + kv, ... (gqa_kv_grouping)."""
    b, kv, t, d = hidden_states.shape
    hidden_states = hidden_states[:, None, :, :, :].expand(b, n_rep, kv, t, d)  # BUG
    return hidden_states.reshape(b, kv * n_rep, t, d)


def _tables(positions, width):
    half = width // 2
    inv_freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    angles = positions[:, None].float() * inv_freq  # (T, d / 2)
    angles = torch.cat((angles, angles), -1)  # (T, d)
    return angles.cos(), angles.sin()


class GroupedRotary(nn.Module):
    """transformers' Llama-family way: q, k and v projected one by one, rotary applied to a
    pair, grouped K/V heads copied by ``repeat_kv``, SDPA told it is causal; ``rotate_values``
    hands the rotary pair the values where the keys belong (rope_on_value)."""

    def __init__(self, hidden_size, num_heads, num_key_value_heads=2):
        super().__init__()
        self.num_heads, self.num_key_value_heads = num_heads, num_key_value_heads
        self.head_dim = hidden_size // num_heads
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def copies(self, hidden_states, n_rep):
        return repeat_kv(hidden_states, n_rep)

    def forward(self, hidden_states):
        bsz, q_len, _ = hidden_states.shape
        query_states = self.q_proj(hidden_states).view(bsz, q_len, -1, self.head_dim)
        key_states = self.k_proj(hidden_states).view(bsz, q_len, -1, self.head_dim)
        value_states = self.v_proj(hidden_states).view(bsz, q_len, -1, self.head_dim)
        query_states = query_states.transpose(1, 2)
        key_states = key_states.transpose(1, 2)
        value_states = value_states.transpose(1, 2)
        cos, sin = _tables(torch.arange(q_len), self.head_dim)
        if type(self) is ValuesRotatedApart:
            query_states, value_states = apply_rotary(query_states, value_states, cos, sin)  # BUG
        else:
            query_states, key_states = apply_rotary(query_states, key_states, cos, sin)
        n_rep = self.num_heads // self.num_key_value_heads
        key_states = self.copies(key_states, n_rep)
        value_states = self.copies(value_states, n_rep)
        out = F.scaled_dot_product_attention(query_states, key_states, value_states, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, q_len, -1))


class StridedCopies(GroupedRotary):
    def copies(self, hidden_states, n_rep):
        return repeat_kv_strided(hidden_states, n_rep)


class ValuesRotatedApart(GroupedRotary):
    """GroupedRotary whose forward rotates the values (the branch marked ``# BUG``)."""


class AlibiPadding(nn.Module):
    """Baichuan's way: a float mask given to SDPA, a causal ALiBi bias plus the padding as
    large negatives. Its subclass lays the padding along the queries (padding_on_queries), in
    the branch marked ``# BUG``."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.W_pack = nn.Linear(hidden_size, 3 * hidden_size, bias=False)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask=None):
        bsz, q_len, C = hidden_states.shape
        q, k, v = (
            t.view(bsz, q_len, self.num_heads, -1).transpose(1, 2)
            for t in self.W_pack(hidden_states).split(C, dim=-1)
        )
        slopes = _slopes(self.num_heads)[:, None, None]  # (h, 1, 1)
        distance = torch.arange(q_len)[None, :] - torch.arange(q_len)[:, None]  # key - query
        alibi_mask = (slopes * distance).masked_fill(distance > 0, float("-inf"))  # (h, T, T)
        attn_mask = alibi_mask.unsqueeze(0)
        if attention_mask is not None:
            padding = torch.zeros(bsz, q_len).masked_fill(~attention_mask.bool(), -1e9)
            if type(self) is AlibiPaddingTurned:
                attn_mask = attn_mask + padding[:, None, :, None]  # BUG
            else:
                attn_mask = attn_mask + padding[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, q_len, C))


class AlibiPaddingTurned(AlibiPadding):
    pass


class FunctionalMHA(nn.Module):
    """nn.MultiheadAttention written out as its functional form does: (T, B, E) in and out,
    heads folded into the batch, a key padding mask made additive and added by ``baddbmm``,
    the heads merged back by turning the sequence first and flattening it with the batch for
    the output projection. Correct."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, query, key_padding_mask=None):
        tgt_len, bsz, embed_dim = query.shape
        q, k, v = self.in_proj(query).chunk(3, dim=-1)
        q, k, v = (
            t.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
            for t in (q, k, v)
        )  # (B * h, T, d)
        bias = torch.zeros(bsz * self.num_heads, 1, tgt_len)
        if key_padding_mask is not None:
            blocked = key_padding_mask.repeat_interleave(self.num_heads, dim=0)[:, None, :]
            bias = bias.masked_fill(blocked, float("-inf"))
        scores = torch.baddbmm(bias, q * self.head_dim**-0.5, k.transpose(-2, -1))
        attn_output = torch.bmm(F.softmax(scores, dim=-1), v)  # (B * h, T, d)
        attn_output = attn_output.transpose(0, 1).contiguous().view(tgt_len * bsz, embed_dim)
        return self.out_proj(attn_output).view(tgt_len, bsz, embed_dim)


class WidthRootBelow(nn.Module):
    """Phi's way of writing the scores, the product on one line and its scale on the next, the
    square root taken of the model's width (scale_d_model): the op runs on the first line of
    the statement, the root is on its last."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.head_dim = hidden_size // num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q, k, v = self.qkv(hidden_states).view(B, T, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        attn_weights = torch.matmul(
            q.to(torch.float32), k.to(torch.float32).transpose(2, 3)
        ) / math.sqrt(self.hidden_size)  # BUG
        attn_weights = attn_weights.softmax(dim=-1).to(v.dtype)
        return self.dense((attn_weights @ v).transpose(1, 2).reshape(B, T, C))


class TwoMasksOneInverted(nn.Module):
    """nn.MultiheadAttention's functional way with two masks, a key padding mask and an
    optional attention mask, merged in a branch the key padding alone never takes; the merged
    bool mask filled where it keeps (mask_bool), in place, so no line assigns it."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x, key_padding_mask=None, attn_mask=None):
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.num_heads, -1).transpose(1, 2).reshape(B * self.num_heads, T, -1)
            for t in self.in_proj(x).chunk(3, dim=-1)
        )
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.repeat_interleave(self.num_heads, 0)[:, None]
            if attn_mask is None:
                attn_mask = key_padding_mask
            else:
                attn_mask = attn_mask.masked_fill(key_padding_mask, True)
        if attn_mask is not None:
            bias = torch.zeros_like(attn_mask, dtype=q.dtype)
            bias.masked_fill_(~attn_mask, float("-inf"))  # BUG
            attn_mask = bias
        else:
            attn_mask = torch.zeros(B * self.num_heads, 1, T)
        scores = torch.baddbmm(attn_mask, q * self.head_dim**-0.5, k.transpose(1, 2))
        out = torch.bmm(scores.softmax(dim=-1), v).view(B, self.num_heads, T, -1)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, C))


class QueriesSplitByView(nn.Module):
    """Separate projections, the queries' viewed as (B, h, T, d) straight from (B, T, C):
    positions cut up and mixed with the heads (head_split_view), on one line."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.q_proj, self.k_proj, self.v_proj, self.c_proj = (
            nn.Linear(n_embd, n_embd) for _ in range(4)
        )

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(B, self.n_head, T, C // self.n_head)  # BUG
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, h, T, d)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, h, T, d)
        y = F.scaled_dot_product_attention(q, k, v)  # (B, h, T, d)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class FusedSplitCut(nn.Module):
    """A ViT's fused split read as (B, 3, h, N, d) straight from (B, N, 3 C): every one of q, k
    and v mixes positions with heads and features (head_split_view)."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, 3, self.num_heads, N, self.head_dim).transpose(0, 1)  # BUG
        q, k, v = qkv.unbind(0)  # each (B, h, N, d)
        attn = (q @ k.transpose(-2, -1)) * self.head_dim**-0.5
        x = (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class OwnKeyBlocked(nn.Module):
    """A causal mask of -inf made with ``triu(diagonal=0)``: each query's own key blocked too,
    the first query left none (causal_leak, a diagonal off the other way)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.qkv, self.o_proj = (
            nn.Linear(hidden_size, 3 * hidden_size),
            nn.Linear(hidden_size, hidden_size),
        )

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        qkv = self.qkv(hidden_states).view(B, T, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, h, T, d)
        causal_mask = torch.full((T, T), float("-inf")).triu(diagonal=0)  # BUG
        scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim) + causal_mask
        return self.o_proj((scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C))


class UnscaledByDesignScaled(nn.Module):
    """T5's attention, unscaled by design (its init folds the scale into W_q), given a
    ``/ sqrt(d)`` anyway: the scale applied on top of the declared one (double_scale)."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.d_kv = n_heads, d_model // n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False) for _ in "qkvo")

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape

        def shape(t):
            return t.view(B, T, self.n_heads, self.d_kv).transpose(1, 2)  # (B, h, T, d)

        q, k, v = (
            shape(self.q(hidden_states)),
            shape(self.k(hidden_states)),
            shape(self.v(hidden_states)),
        )
        scores = torch.matmul(q, k.transpose(3, 2)) / math.sqrt(self.d_kv)  # BUG
        weights = scores.float().softmax(dim=-1).type_as(scores)
        return self.o(torch.matmul(weights, v).transpose(1, 2).reshape(B, T, C))


class QueriesOnlyScaled(nn.Module):
    """Whisper's split scale, d ** -0.25 on the queries and on the keys, with the keys' factor
    left off: the scores scaled by d ** -0.25 only (wrong_scale)."""

    def __init__(self, n_state, n_head):
        super().__init__()
        self.n_head = n_head
        self.query, self.key, self.value, self.out = (nn.Linear(n_state, n_state) for _ in range(4))

    def forward(self, x):
        n_batch, n_ctx, n_state = x.shape
        scale = (n_state // self.n_head) ** -0.25
        q = self.query(x).view(n_batch, n_ctx, self.n_head, -1).permute(0, 2, 1, 3) * scale
        k = self.key(x).view(n_batch, n_ctx, self.n_head, -1).permute(0, 2, 3, 1)  # BUG
        v = self.value(x).view(n_batch, n_ctx, self.n_head, -1).permute(0, 2, 1, 3)
        w = (q @ k).float().softmax(dim=-1).to(q.dtype)  # (B, h, T, T)
        return self.out((w @ v).permute(0, 2, 1, 3).flatten(start_dim=2))


class CombinedMaskPaddingTurned(nn.Module):
    """BLOOM's combined mask, the future or padding, with the padding read the wrong way round
    (a keep-mask taken as blocked): inverting the whole mask where it is filled turns the
    padding right and the causal part wrong, a change no proof may show as a fix."""

    def __init__(self, hidden_size, n_head):
        super().__init__()
        self.n_head, self.head_dim = n_head, hidden_size // n_head
        self.qkv, self.dense = (
            nn.Linear(hidden_size, 3 * hidden_size),
            nn.Linear(hidden_size, hidden_size),
        )

    def forward(self, hidden_states, attention_mask=None):
        B, T, C = hidden_states.shape
        if attention_mask is None:
            attention_mask = torch.ones(B, T)
        distance = (attention_mask.cumsum(dim=-1) - 1) * attention_mask  # (B, T): ALiBi's
        slopes = 2.0 ** -torch.arange(1, self.n_head + 1.0)  # (h,)
        qkv = self.qkv(hidden_states).view(B, T, 3, self.n_head, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, h, T, d)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # (B, h, T, T)
        scores = scores + slopes[None, :, None, None] * distance[:, None, None, :]
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        blocked = future | attention_mask[:, None, None, :].bool()  # BUG
        weights = scores.masked_fill(blocked, torch.finfo(scores.dtype).min).softmax(dim=-1)
        return self.dense((weights @ v).transpose(1, 2).reshape(B, T, C))


class RateReadTwice(nn.Module):
    """Falcon's two SDPA calls, with and without a mask, both given one dropout rate made
    once and never turned off in eval (dropout_in_eval): fixed where the rate is made, which
    covers the call without a mask too, that the probes (always given a mask) never run."""

    def __init__(self, hidden_size, num_heads, attention_dropout=0.1):
        super().__init__()
        self.num_heads, self.attention_dropout = num_heads, attention_dropout
        self.qkv, self.dense = (
            nn.Linear(hidden_size, 3 * hidden_size),
            nn.Linear(hidden_size, hidden_size),
        )

    def forward(self, hidden_states, attention_mask=None):
        B, T, C = hidden_states.shape
        qkv = self.qkv(hidden_states).view(B, T, 3, self.num_heads, C // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, h, T, d)
        dropout_p = self.attention_dropout  # BUG
        if attention_mask is None:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        else:
            keep = attention_mask[:, None, None, :].bool()  # (B, 1, 1, T)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p)
        return self.dense(out.transpose(1, 2).reshape(B, T, C))


def separate(width):
    """Separate q, k, v and output projections, each (B, T, C) -> (B, T, C)."""
    return tuple(nn.Linear(width, width) for _ in range(4))


def fused(width):
    """A fused q, k, v projection and the output's, as (B, T, 3 C) and (B, T, C)."""
    return nn.Linear(width, 3 * width), nn.Linear(width, width)


def heads_of(qkv, heads):
    """(B, T, 3 C) -> q, k, v, each (B, h, T, d)."""
    B, T, three_c = qkv.shape
    return qkv.view(B, T, 3, heads, three_c // (3 * heads)).permute(2, 0, 3, 1, 4)


class WindowJoinedToPadding(nn.Module):
    """Mistral's eager way: a causal window of ``window`` keys made from two comparisons of
    positions and joined to the caller's padding (1 = real) in one mask, filled with the
    dtype's ``finfo.min``, the softmax taken in float32 (which turns float64's ``finfo.min``
    into -inf); the window's lower bound written one key too wide (``>=``)."""

    def __init__(self, hidden_size, num_heads, window=4):
        super().__init__()
        self.num_heads, self.window = num_heads, window
        self.qkv, self.o_proj = fused(hidden_size)

    def allowed(self, i, j):
        return (j <= i) & (j >= i - self.window)  # BUG

    def forward(self, hidden_states, attention_mask=None):
        B, T, C = hidden_states.shape
        q, k, v = heads_of(self.qkv(hidden_states), self.num_heads)  # each (B, h, T, d)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))  # (B, h, T, T)
        allowed = self.allowed(torch.arange(T)[:, None], torch.arange(T)[None, :])  # (T, T)
        if attention_mask is not None:
            allowed = allowed & attention_mask[:, None, None, :].bool()  # (B, 1, T, T)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        weights = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
        return self.o_proj((weights @ v).transpose(1, 2).reshape(B, T, C))


class WindowJoinedToPaddingRight(WindowJoinedToPadding):
    """The same window with its bound right (``j > i - window``): healthy, though its float64
    copy gives NaN where a padded query's window holds only padding."""

    def allowed(self, i, j):
        return (j <= i) & (j > i - self.window)


class TriangleInPlaceBeforeFold(nn.Module):
    """CLIP's text encoder's way: an additive causal mask made in place by ``triu_`` and added
    to (B, h, T, T) scores that are then folded to (B * h, T, T) for the softmax; the triangle
    starting on the diagonal (``triu_(0)``), so each query's own key is blocked too."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = separate(embed_dim)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        h, d = self.num_heads, self.head_dim
        q = self.q_proj(hidden_states).view(B, T, h, d).transpose(1, 2).reshape(B * h, T, d)
        k = self.k_proj(hidden_states).view(B, T, h, d).transpose(1, 2).reshape(B * h, T, d)
        v = self.v_proj(hidden_states).view(B, T, h, d).transpose(1, 2).reshape(B * h, T, d)
        scores = torch.bmm(q * d**-0.5, k.transpose(1, 2))  # (B h, T, T)
        future = torch.full((T, T), torch.finfo(scores.dtype).min).triu_(0)  # BUG
        scores = (scores.view(B, h, T, T) + future).view(B * h, T, T)
        weights = scores.softmax(dim=-1)
        out = torch.bmm(weights, v).view(B, h, T, d).transpose(1, 2).reshape(B, T, C)
        return self.out_proj(out)


class CapAroundMask(nn.Module):
    """Gemma 2's soft-cap, ``cap * tanh(scores / cap)``, written with the causal mask inside
    the tanh, which squashes the mask's fill to -cap (softcap_after_mask)."""

    def __init__(self, hidden_size, num_heads, softcap=50.0):
        super().__init__()
        self.num_heads, self.softcap = num_heads, softcap
        self.qkv, self.o_proj = fused(hidden_size)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q, k, v = heads_of(self.qkv(hidden_states), self.num_heads)  # each (B, h, T, d)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))  # (B, h, T, T)
        future = torch.full((T, T), float("-inf")).triu(1)  # (T, T)
        scores = self.softcap * torch.tanh((scores + future) / self.softcap)  # BUG
        weights = scores.softmax(dim=-1)
        return self.o_proj((weights @ v).transpose(1, 2).reshape(B, T, C))


class ScaleOfAnotherSize(nn.Module):
    """Gemma 2's scale, ``query_pre_attn_scalar ** -0.5``, written with the head width in its
    place (wrong_scale, against the declared scale): the parameter is then read nowhere. At
    the doctor's width, 64, ``hidden_size`` is worth the same, and is no fix. Its soft-cap
    divides by the cap and multiplies by it again: no scale."""

    def __init__(self, hidden_size, num_heads, query_pre_attn_scalar=64, softcap=50.0):
        super().__init__()
        self.num_heads, self.head_dim, self.softcap = num_heads, hidden_size // num_heads, softcap
        self.scaling = self.head_dim**-0.5  # BUG
        self.qkv, self.o_proj = fused(hidden_size)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q, k, v = heads_of(self.qkv(hidden_states), self.num_heads)  # each (B, h, T, d)
        scores = q @ k.transpose(-1, -2) * self.scaling  # (B, h, T, T)
        scores = self.softcap * torch.tanh(scores / self.softcap)
        return self.o_proj((scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C))


class KeysSwappedWithHeads(nn.Module):
    """4-D keys transposed on (0, 1), batch with heads, where their last two were meant: with
    as many sequences as heads the product does not refuse the shapes' first axes, and
    raises on the last two."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(0, 1)) / math.sqrt(q.size(-1))  # BUG
        weights = scores.softmax(dim=-1)  # (B, h, T, T)
        return self.out((weights @ v).transpose(1, 2).reshape(B, T, C))


class ShapeWrittenAlongQueries(nn.Module):
    """DistilBERT's way: the mask's shape written out once as a tuple, (B, 1, 1, T), and the
    (B, T) keep-mask viewed as it where it is filled; written (B, 1, T, 1), along the queries
    (padding_on_queries), two lines from the fill."""

    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv, self.out_lin = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x, mask):
        bs, k_length, dim = x.shape
        mask_shape = (bs, 1, k_length, 1)  # BUG
        qkv = self.qkv(x).view(bs, k_length, 3, self.n_heads, dim // self.n_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, h, T, d)
        scores = q @ k.transpose(2, 3) / math.sqrt(q.size(-1))  # (B, h, T, T)
        blocked = (mask == 0).view(mask_shape).expand_as(scores)
        weights = scores.masked_fill(blocked, torch.finfo(scores.dtype).min).softmax(dim=-1)
        return self.out_lin((weights @ v).transpose(1, 2).reshape(bs, k_length, dim))


class QueriesRowPerHead(nn.Module):
    """GPTBigCode's multi-query way: one K/V head, the queries laid out (B, T * h, d), a row
    for each position's head, and one bmm; the scores viewed (B, T, h, S) and the (B, T) keep
    padding laid along the queries (``[:, :, None, None]``: padding_on_queries)."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.c_attn = nn.Linear(embed_dim, embed_dim + 2 * self.head_dim)
        self.c_proj = nn.Linear(embed_dim, embed_dim)

    def padded(self, attention_mask):
        return ~attention_mask.bool()[:, :, None, None]  # BUG

    def forward(self, hidden_states, attention_mask=None):
        B, T, C = hidden_states.shape
        query, key, value = self.c_attn(hidden_states).split((C, self.head_dim, self.head_dim), -1)
        rows = query.reshape(B, T * self.num_heads, self.head_dim)  # (B, T h, d)
        scores = torch.bmm(rows, key.transpose(1, 2)) / math.sqrt(self.head_dim)  # (B, T h, S)
        scores = scores.view(B, T, self.num_heads, T)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)  # (T, S)
        scores = scores.masked_fill(future[None, :, None, :], torch.finfo(scores.dtype).min)
        if attention_mask is not None:
            scores = scores.masked_fill(self.padded(attention_mask), torch.finfo(scores.dtype).min)
        weights = scores.softmax(dim=-1).view(B, T * self.num_heads, T)
        return self.c_proj(torch.bmm(weights, value).view(B, T, C))


class QueriesRowPerHeadRight(QueriesRowPerHead):
    """The same layout with the padding along the keys: healthy (its queries' reshape to
    (B, T * h, d) keeps each position whole, the heads merged in behind it)."""

    def padded(self, attention_mask):
        return ~attention_mask.bool()[:, None, None, :]


class WeightsCastThenScaled(nn.Module):
    """Gemma 3's way of taking the softmax in float32 and casting back, the scale applied to
    the weights after the cast (scale_after_softmax)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads, self.scaling = num_heads, (hidden_size // num_heads) ** -0.5
        self.qkv, self.o_proj = fused(hidden_size)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q, k, v = heads_of(self.qkv(hidden_states), self.num_heads)  # each (B, h, T, d)
        scores = q @ k.transpose(-1, -2)  # (B, h, T, T)
        weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) * self.scaling  # BUG
        return self.o_proj((weights @ v).transpose(1, 2).reshape(B, T, C))


class FoldedMergedStraight(nn.Module):
    """Stable Diffusion's way: heads folded into the batch, (B h, T, d), attended by einsum,
    then merged by ``reshape(B, T, -1)`` with the heads still in the batch
    (head_merge_no_transpose)."""

    def __init__(self, query_dim, heads):
        super().__init__()
        self.heads, self.scale = heads, (query_dim // heads) ** -0.5
        self.to_q, self.to_k, self.to_v, self.to_out = separate(query_dim)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (
            t.reshape(b, n, self.heads, -1).transpose(1, 2).reshape(b * self.heads, n, -1)
            for t in (self.to_q(x), self.to_k(x), self.to_v(x))
        )  # each (B h, T, d)
        attn = (torch.einsum("b i d, b j d -> b i j", q, k) * self.scale).softmax(dim=-1)
        out = torch.einsum("b i j, b j d -> b i d", attn, v)  # (B h, T, d)
        out = out.reshape(b, n, -1)  # BUG
        return self.to_out(out)


class TableForOtherPairs(nn.Module):
    """Phi's partial rotary: ``rotate_half`` (halves (i, i + d/2)) on the first half of each
    head's dimensions, with a cos/sin table whose angles are repeated for pairs (2i, 2i + 1)
    (rope_pairing_mismatch): no rotation at all."""

    def __init__(self, hidden_size, num_heads, rope_theta=10000.0):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.rotary_dim = self.head_dim // 2
        self.qkv, self.dense = fused(hidden_size)
        steps = torch.arange(0, self.rotary_dim, 2).float() / self.rotary_dim
        self.register_buffer("inv_freq", 1.0 / rope_theta**steps, persistent=False)

    def rotated(self, x, cos, sin):
        turned, kept = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        return torch.cat((turned * cos + _rotate_half(turned) * sin, kept), dim=-1)

    def forward(self, hidden_states, position_ids=None):
        B, T, C = hidden_states.shape
        if position_ids is None:
            position_ids = torch.arange(T)[None].expand(B, T)
        q, k, v = heads_of(self.qkv(hidden_states), self.num_heads)  # each (B, h, T, d)
        freqs = position_ids[..., None].float() * self.inv_freq  # (B, T, r/2)
        emb = torch.repeat_interleave(freqs, 2, dim=-1)  # BUG
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # (B, 1, T, r)
        q, k = self.rotated(q, cos, sin), self.rotated(k, cos, sin)
        weights = (q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)).softmax(dim=-1)
        return self.dense((weights @ v).transpose(1, 2).reshape(B, T, C))


class NormedQueriesScaledTwice(nn.Module):
    """OLMo 2's way: RMS-normed q and k (a data-dependent factor the scale's reading stops
    at), q scaled first, and SDPA told the scale again (double_scale)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads, self.scaling = num_heads, (hidden_size // num_heads) ** -0.5
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = separate(hidden_size)
        self.q_norm, self.k_norm = nn.RMSNorm(hidden_size), nn.RMSNorm(hidden_size)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q = self.q_norm(self.q_proj(hidden_states)).view(B, T, self.num_heads, -1).transpose(1, 2)
        k = self.k_norm(self.k_proj(hidden_states)).view(B, T, self.num_heads, -1).transpose(1, 2)
        v = self.v_proj(hidden_states).view(B, T, self.num_heads, -1).transpose(1, 2)
        q = q * self.scaling  # BUG
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, C))


class DrawnWithUnitSpread(nn.Module):
    """MPT's own init: each projection drawn from normal(0, init_std), the fused one with
    std=1.0 instead (init_unit_variance): every score saturates at initialisation."""

    def __init__(self, d_model, n_heads, init_std=0.02):
        super().__init__()
        self.n_heads, self.init_std = n_heads, init_std
        self.Wqkv, self.out_proj = fused(d_model)
        nn.init.normal_(self.Wqkv.weight, mean=0.0, std=1.0)  # BUG
        nn.init.normal_(self.out_proj.weight, mean=0.0, std=self.init_std)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = heads_of(self.Wqkv(x), self.n_heads)  # each (B, h, T, d)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, C))


class DrawnWithUnitSpreadLikeTimm(nn.Module):
    """timm's own init: ``trunc_normal_(w, std=.02)`` for each projection, the fused one
    drawn with ``normal_(std=1.0)`` instead (init_unit_variance)."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads, self.scale = num_heads, (dim // num_heads) ** -0.5
        self.qkv, self.proj = fused(dim)
        nn.init.normal_(self.qkv.weight, std=1.0)  # BUG
        nn.init.trunc_normal_(self.proj.weight, std=0.02)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = heads_of(self.qkv(x), self.num_heads)  # each (B, h, N, d)
        attn = (q * self.scale @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class DrawnWithUnitSpreadGated(nn.Module):
    """OpenFold's way: projections drawn by a glorot helper, the softmax written out and the
    output gated by a sigmoid of the input, so no weights are returned and none can be read
    off the projections alone; the helper draws from normal(0, 1) instead (init_unit_variance)."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.linear_q, self.linear_k, self.linear_v = (
            nn.Linear(d_model, d_model, bias=False) for _ in range(3)
        )
        self.linear_g, self.linear_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        for linear in (self.linear_q, self.linear_k, self.linear_v):
            self.glorot_uniform_init_(linear.weight)
        nn.init.zeros_(self.linear_g.weight)

    @staticmethod
    def glorot_uniform_init_(weights):
        nn.init.normal_(weights, std=1.0)  # BUG

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.n_heads, -1).transpose(1, 2)
                   for p in (self.linear_q, self.linear_k, self.linear_v))  # fmt: skip
        q = q / math.sqrt(q.shape[-1])
        o = ((q @ k.transpose(-2, -1)).softmax(-1) @ v).transpose(1, 2)  # (B, T, h, d)
        g = torch.sigmoid(self.linear_g(x)).view(B, T, self.n_heads, -1)
        return self.linear_o((o * g).reshape(B, T, C))


def on_grid(module, x, *, positions, mask, cache):
    """SAM's image encoder's call: the tokens laid out as a (B, H, W, C) grid, two rows of
    them where they split evenly."""
    B, T, C = x.shape
    rows = 2 if T % 2 == 0 else 1
    return module(x.view(B, rows, T // rows, C)).reshape(B, T, C)


class GridMergedStraight(nn.Module):
    """SAM's image encoder's way: a (B, H, W, C) grid, heads folded into the batch, a bias
    for each pair of rows and each pair of columns added to the scores viewed as
    (B h, H, W, H, W) and viewed back; the heads merged by a view to (B, H, W, C) straight
    from (B h, H W, d) (head_merge_no_transpose)."""

    def __init__(self, dim, num_heads, most=128):
        super().__init__()
        self.num_heads, self.scale = num_heads, (dim // num_heads) ** -0.5
        self.qkv, self.proj = fused(dim)
        self.rel_h = nn.Parameter(torch.randn(most, most) * 0.5)
        self.rel_w = nn.Parameter(torch.randn(most, most) * 0.5)

    def forward(self, x):
        B, H, W, _ = x.shape
        qkv = self.qkv(x).reshape(B, H * W, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.reshape(3, B * self.num_heads, H * W, -1).unbind(0)  # each (B h, H W, d)
        attn = (q * self.scale) @ k.transpose(-2, -1)  # (B h, H W, H W)
        rel_h, rel_w = self.rel_h[:H, :H][:, None, :, None], self.rel_w[:W, :W][:, None, :]
        attn = attn.view(-1, H, W, H, W) + rel_h + rel_w
        attn = attn.view(-1, H * W, H * W).softmax(dim=-1)
        x = (attn @ v).view(B, H, W, -1)  # BUG
        return self.proj(x)


class CosineSplitStraight(nn.Module):
    """Swin V2's way: q and k normalized (cosine attention) and scaled by a learned
    temperature per head, q, k and v picked out of the fused projection by index; the heads
    split by a reshape to (B, 3, h, T, d) straight from (B, T, 3 C), the positions cut up with
    the features (head_split_view)."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.qkv, self.proj = fused(dim)
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones((num_heads, 1, 1))))

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x)
        qkv = qkv.reshape(B, 3, self.num_heads, N, -1).transpose(0, 1)  # BUG
        q, k, v = qkv[0], qkv[1], qkv[2]  # each (B, h, N, d)
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        attn = (attn * self.logit_scale.clamp(max=math.log(100.0)).exp()).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class DrawnWithUnitSpreadScaledOut(nn.Module):
    """llama2.c's init: every projection drawn from normal(0, 0.02), the output's then drawn
    again with 0.02 / sqrt(2 n_layers); the first drawn with std=1.0 instead
    (init_unit_variance)."""

    def __init__(self, dim, n_heads, n_layers=2):
        super().__init__()
        self.n_heads = n_heads
        self.wq, self.wk, self.wv, self.wo = separate(dim)
        self._init_weights(n_layers)

    def _init_weights(self, n_layers):
        for linear in (self.wq, self.wk, self.wv, self.wo):
            nn.init.normal_(linear.weight, mean=0.0, std=1.0)  # BUG
        nn.init.normal_(self.wo.weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layers))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.n_heads, -1).transpose(1, 2)
                   for p in (self.wq, self.wk, self.wv))  # fmt: skip
        out = F.scaled_dot_product_attention(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(B, T, C))


class DrawnWithUnitSpreadLikeT5(nn.Module):
    """T5's and Pix2Struct's init: the queries drawn with ``factor * (d * d_head) ** -0.5``
    (the scale folded in), the values and output with ``factor * d ** -0.5``; the keys
    drawn with std=1.0 instead (init_unit_variance). The 0.5 of an exponent is no spread."""

    def __init__(self, dim, n_heads, factor=2.0):
        super().__init__()
        self.n_heads, self.d_head = n_heads, dim // n_heads
        self.q, self.k, self.v, self.o = separate(dim)
        self._init_weights(dim, factor)

    def _init_weights(self, dim, factor):
        nn.init.normal_(self.q.weight, mean=0.0, std=factor * ((dim * self.d_head) ** -0.5))
        nn.init.normal_(self.k.weight, mean=0.0, std=1.0)  # BUG
        nn.init.normal_(self.v.weight, mean=0.0, std=factor * (dim**-0.5))
        nn.init.normal_(
            self.o.weight, mean=0.0, std=factor * ((self.n_heads * self.d_head) ** -0.5)
        )

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.n_heads, -1).transpose(1, 2)
                   for p in (self.q, self.k, self.v))  # fmt: skip
        weights = F.softmax(q @ k.transpose(-1, -2), dim=-1)  # unscaled: T5's scale is in q
        return self.o((weights @ v).transpose(1, 2).reshape(B, T, C))


def trunc_normal_(tensor, mean=0.0, std=1.0):
    return nn.init.trunc_normal_(tensor, mean=mean, std=std)


class DrawnByHelperWithUnitSpread(nn.Module):
    """BEiT's way: every weight drawn by a helper that hands its ``std`` on, the fused
    projection with std=1.0 (init_unit_variance) and a temperature per head with 0.02: the
    spread is the caller's, so the fix is at the call, not in the helper."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.qkv, self.proj = fused(dim)
        self.table = nn.Parameter(torch.zeros(num_heads, 1))
        trunc_normal_(self.qkv.weight, std=1.0)  # BUG
        trunc_normal_(self.table, std=0.02)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = heads_of(self.qkv(x), self.num_heads)  # each (B, h, N, d)
        scores = q @ k.transpose(-2, -1) * (1 + self.table[:, :, None])  # a temperature per head
        attn = (scores / math.sqrt(q.shape[-1])).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class NormedScaledByWidth(nn.Module):
    """Persimmon's way: q and k layer-normed per head, so SDPA's comparison cannot read the
    scale, and the scores divided by the root of the model's width (scale_d_model); the
    batch's size is in scope, and is no fix."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.head_dim = hidden_size // num_heads
        self.qkv, self.dense = fused(hidden_size)
        self.q_layernorm, self.k_layernorm = (
            nn.LayerNorm(self.head_dim),
            nn.LayerNorm(self.head_dim),
        )

    def forward(self, hidden_states):
        bsz, q_len, _ = hidden_states.size()
        q, k, v = heads_of(self.qkv(hidden_states), self.num_heads)  # each (B, h, T, d)
        q, k = self.q_layernorm(q), self.k_layernorm(k)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.hidden_size)  # BUG
        weights = scores.softmax(dim=-1)
        return self.dense((weights @ v).transpose(1, 2).reshape(bsz, q_len, -1))


class WeightsKeptAside(nn.Module):
    """wav2vec2's way: heads folded into the batch, the weights viewed (B, h, T, S) to be
    returned aside before they reach the values; the softmax over the queries (``dim=1``:
    softmax_dim)."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = separate(embed_dim)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q, k, v = (
            p(hidden_states)
            .view(B, T, self.num_heads, -1)
            .transpose(1, 2)
            .reshape(B * self.num_heads, T, -1)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )  # each (B h, T, d)
        scores = torch.bmm(q * self.head_dim**-0.5, k.transpose(1, 2))  # (B h, T, S)
        weights = F.softmax(scores, dim=1)  # BUG
        returned = weights.view(B, self.num_heads, T, T)
        out = torch.bmm(weights, v).view(B, self.num_heads, T, -1).transpose(1, 2)
        return self.out_proj(out.reshape(B, T, C)), returned


def _rotate_every_two(x, cos, sin):
    """RoFormer's turn of pairs (2i, 2i + 1): x cos + (-x1, x0, -x3, x2, ...) sin."""
    turned = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).reshape_as(x)
    return x * cos + turned * sin


class RotatesThreeByHelper(nn.Module):
    """RoFormer's helper that rotates the values too when handed them
    (``q, k, v = rotate(pos, q, k, v)``: rope_on_value)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.qkv, self.dense = fused(hidden_size)
        steps = torch.arange(0, self.head_dim, 2).float() / self.head_dim
        self.register_buffer("inv_freq", 1.0 / 10000.0**steps, persistent=False)

    def rotate(self, positions, *tensors):
        angles = positions[:, None, :, None].float() * self.inv_freq  # (B, 1, T, d / 2)
        cos = torch.stack([angles.cos(), angles.cos()], dim=-1).flatten(-2)  # (B, 1, T, d)
        sin = torch.stack([angles.sin(), angles.sin()], dim=-1).flatten(-2)
        return tuple(_rotate_every_two(t, cos, sin) for t in tensors)

    def forward(self, hidden_states, position_ids=None):
        B, T, C = hidden_states.shape
        if position_ids is None:
            position_ids = torch.arange(T)[None].expand(B, T)
        q, k, v = heads_of(self.qkv(hidden_states), self.num_heads)  # each (B, h, T, d)
        q, k, v = self.rotate(position_ids, q, k, v)  # BUG
        weights = (q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)).softmax(dim=-1)
        return self.dense((weights @ v).transpose(1, 2).reshape(B, T, C))


class ChosenInsideCap(nn.Module):
    """Grok-1's soft-cap with the mask chosen by ``torch.where`` inside the tanh, which
    squashes its fill to -cap (softcap_after_mask)."""

    def __init__(self, hidden_size, num_heads, max_attn_value=30.0):
        super().__init__()
        self.num_heads, self.max_attn_value = num_heads, max_attn_value
        self.qkv, self.o_proj = fused(hidden_size)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q, k, v = heads_of(self.qkv(hidden_states), self.num_heads)  # each (B, h, T, d)
        logits = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))  # (B, h, T, T)
        keep, cap = torch.ones(T, T, dtype=torch.bool).tril(), self.max_attn_value
        logits = cap * torch.tanh(torch.where(keep, logits, -1e30) / cap)  # BUG
        return self.o_proj((logits.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C))


class MultiplierDropped(nn.Module):
    """Granite's way: the scores scaled by a configured multiplier, not 1/sqrt(d)
    (``--scale 0.0625``), the multiplication left out (missing_scale against the declared
    scale)."""

    def __init__(self, hidden_size, num_heads, attention_multiplier=0.0625):
        super().__init__()
        self.num_heads, self.scaling = num_heads, attention_multiplier
        self.qkv, self.o_proj = fused(hidden_size)
        for weight in (self.qkv.weight, self.o_proj.weight):
            nn.init.normal_(weight, std=0.02)  # Granite's initializer_range

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q, k, v = heads_of(self.qkv(hidden_states), self.num_heads)  # each (B, h, T, d)
        scores = torch.matmul(q, k.transpose(2, 3))  # BUG
        return self.o_proj((scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C))


class SmallAddedFillToSDPA(nn.Module):
    """Baichuan's way: an additive causal mask made with ``torch.full`` and handed to SDPA,
    its fill -1e4, which large logits outgrow (fill_too_small)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.W_pack, self.o_proj = fused(hidden_size)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q, k, v = heads_of(self.W_pack(hidden_states), self.num_heads)  # each (B, h, T, d)
        attn_mask = torch.full((T, T), -1e4, dtype=q.dtype).triu(1)  # BUG
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, C))


class SmallInitSmallFill(nn.Module):
    """Megatron's way: q, k, v drawn with std 0.02 (so ordinary and even 300x activations give
    small logits), the blocked-is-True (B, 1, T, T) mask filled with -1e4, which logits the
    doctor scales up to outgrow it reach (fill_too_small)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.query_key_value, self.dense = fused(hidden_size)
        nn.init.normal_(self.query_key_value.weight, mean=0.0, std=0.02)

    def forward(self, hidden_states, attention_mask):
        B, T, C = hidden_states.shape
        q, k, v = heads_of(self.query_key_value(hidden_states), self.num_heads)  # (B, h, T, d)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, T, T)
        scores = scores.masked_fill(attention_mask, -10000.0)  # BUG
        out = torch.softmax(scores, dim=-1) @ v  # (B, h, T, d)
        return self.dense(out.transpose(1, 2).reshape(B, T, C))


class TriangleJoinedToCallersMask(nn.Module):
    """Megatron's causal layer: its own future triangle (True = blocked), alone when the caller
    passes no mask and OR'd into the caller's blocked-is-True mask when it does, so a caller's
    causal mask hides a triangle built a diagonal off (causal_leak)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.query_key_value, self.dense = fused(hidden_size)

    def forward(self, hidden_states, attention_mask=None):
        B, T, C = hidden_states.shape
        q, k, v = heads_of(self.query_key_value(hidden_states), self.num_heads)  # (B, h, T, d)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, T, T)
        future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=2)  # BUG
        blocked = future if attention_mask is None else attention_mask | future
        scores = scores.masked_fill(blocked, torch.finfo(scores.dtype).min)
        out = torch.softmax(scores, dim=-1) @ v  # (B, h, T, d)
        return self.dense(out.transpose(1, 2).reshape(B, T, C))


class MultiQueryGroupsTiled(nn.Module):
    """ChatGLM's way: one fused projection for the queries and ``groups`` K/V heads, each K/V
    head copied for its queries by a new axis expanded and viewed into the heads; the new axis
    put before the groups', so the copies are tiled (gqa_kv_grouping)."""

    def __init__(self, hidden_size, num_heads, groups=2):
        super().__init__()
        self.num_heads, self.groups = num_heads, groups
        self.head_dim = hidden_size // num_heads
        kv_width = groups * self.head_dim
        self.query_key_value = nn.Linear(hidden_size, hidden_size + 2 * kv_width)
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        kv_width = self.groups * self.head_dim
        q, k, v = self.query_key_value(hidden_states).split([C, kv_width, kv_width], dim=-1)
        q = q.view(B, T, self.num_heads, self.head_dim)  # (B, T, h, d)
        k, v = (t.view(B, T, self.groups, self.head_dim) for t in (k, v))  # (B, T, g, d)
        n_rep = self.num_heads // self.groups
        k, v = (t.unsqueeze(-3).expand(-1, -1, n_rep, -1, -1) for t in (k, v))  # BUG
        k, v = (t.reshape(B, T, self.num_heads, self.head_dim) for t in (k, v))  # (B, T, h, d)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, h, T, d)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.dense(out.transpose(1, 2).reshape(B, T, C))


class BlockedMaskToSDPA(nn.Module):
    """A causal layer that builds its own triangle, joins the caller's padding (1 = keep) to it
    in a mask True where blocked, and hands that to SDPA, which attends where True: the mask
    given the wrong way round (sdpa_mask_inverted)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.query_key_value, self.dense = fused(hidden_size)

    def forward(self, hidden_states, attention_mask):
        B, T, C = hidden_states.shape
        q, k, v = heads_of(self.query_key_value(hidden_states), self.num_heads)  # (B, h, T, d)
        keep = torch.ones(T, T).tril() * attention_mask[:, None, None, :]  # (B, 1, T, T)
        blocked = keep < 0.5
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=blocked)  # BUG
        return self.dense(out.transpose(1, 2).reshape(B, T, C))


class GroupedQueriesPaddedAlongQueries(nn.Module):
    """Grok-1's way: query heads grouped per K/V head in a 5-D einsum (no K/V copies), the key
    padding (1 = keep) laid on the 5-D scores (B, g, h/g, T, S) along the queries' axis
    (padding_on_queries)."""

    def __init__(self, hidden_size, num_heads, kv_heads=2):
        super().__init__()
        self.num_heads, self.kv_heads = num_heads, kv_heads
        self.head_dim = hidden_size // num_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size)
        self.k_proj = nn.Linear(hidden_size, kv_heads * self.head_dim)
        self.v_proj = nn.Linear(hidden_size, kv_heads * self.head_dim)
        self.o_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states, mask):
        b, t, _ = hidden_states.shape
        g, r, d = self.kv_heads, self.num_heads // self.kv_heads, self.head_dim
        q = self.q_proj(hidden_states).view(b, t, g, r, d)  # (B, T, g, r, d)
        k = self.k_proj(hidden_states).view(b, t, g, d)  # (B, S, g, d)
        v = self.v_proj(hidden_states).view(b, t, g, d)  # (B, S, g, d)
        logits = torch.einsum("btgrd,bsgd->bgrts", q, k) / math.sqrt(d)  # (B, g, r, T, S)
        keep = mask[:, None, None, :, None].bool()  # BUG
        logits = torch.where(keep, logits, torch.finfo(logits.dtype).min)
        weights = torch.softmax(logits, dim=-1)
        out = torch.einsum("bgrts,bsgd->btgrd", weights, v)  # (B, T, g, r, d)
        return self.o_proj(out.reshape(b, t, -1))


def rotated(x, cos, sin, interleaved=False):
    """flash-attn's apply_rotary_emb: x (B, T, h, d) turned in halves (i, i + d/2), or with
    ``interleaved`` in pairs (2i, 2i + 1); cos, sin (B, T, d/2)."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # (B, T, 1, d/2)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class RotaryFlagDiffers(nn.Module):
    """Grok-1's port: q and k rotated by one helper whose flag picks the pairing, the keys'
    call given the other flag (rope_pairing_mismatch)."""

    def __init__(self, hidden_size, num_heads, base=10000.0):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = separate(hidden_size)
        d = hidden_size // num_heads
        self.register_buffer("inv_freq", base ** (-torch.arange(0, d, 2).double() / d))

    def forward(self, hidden_states, position_ids=None):
        B, T, C = hidden_states.shape
        q, k, v = (p(hidden_states).view(B, T, self.num_heads, -1)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # fmt: skip
        if position_ids is None:
            position_ids = torch.arange(T).expand(B, T)
        angles = position_ids[..., None].to(self.inv_freq.dtype) * self.inv_freq  # (B, T, d/2)
        cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
        q = rotated(q, cos, sin, interleaved=False)
        k = rotated(k, cos, sin, interleaved=True)  # BUG
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, h, T, d)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, C))


class DrawnThroughData(nn.Module):
    """Granite's way: projections built by nn.Linear, then redrawn by ``self.apply`` through
    ``weight.data``, with std=1.0 (init_unit_variance): the last write is the one to name."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = separate(hidden_size)
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(mean=0.0, std=1.0)  # BUG
            module.bias.data.zero_()

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q, k, v = (p(hidden_states).view(B, T, self.num_heads, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # fmt: skip
        out = F.scaled_dot_product_attention(q, k, v)  # (B, h, T, d)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, C))


class HeadsPermutedIntoPositions(nn.Module):
    """timm's ViT attention: the fused projection reshaped (B, N, 3, h, d) and permuted, the
    permute putting the heads where the tokens belong (head_split_view): each token attends
    across heads."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv, self.proj = fused(dim)

    def forward(self, x):
        B, N, C = x.shape
        h, d = self.num_heads, self.head_dim
        qkv = self.qkv(x).reshape(B, N, 3, h, d).permute(2, 0, 1, 3, 4)  # BUG
        q, k, v = qkv.unbind(0)  # each (B, h, N, d)
        attn = (q @ k.transpose(-2, -1)) * self.head_dim**-0.5
        out = attn.softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(B, N, C))


class QwenNorm(nn.Module):
    """Qwen3's RMSNorm: x * rsqrt(mean(x^2) + eps), then a learned weight."""

    def __init__(self, width, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class HeadNormedScaledTwice(nn.Module):
    """Qwen3's way: each head's q and k RMS-normed by a norm written out, and the scale put on
    q inside the product and on the product again (double_scale): the norm undoes what comes
    before it, so the factors after it are the whole scale."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.scaling = self.head_dim**-0.5
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = separate(hidden_size)
        self.q_norm, self.k_norm = QwenNorm(self.head_dim), QwenNorm(self.head_dim)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q = self.q_norm(self.q_proj(hidden_states).view(B, T, self.num_heads, -1)).transpose(1, 2)
        k = self.k_norm(self.k_proj(hidden_states).view(B, T, self.num_heads, -1)).transpose(1, 2)
        v = self.v_proj(hidden_states).view(B, T, self.num_heads, -1).transpose(1, 2)
        scores = torch.matmul(q * self.scaling, k.transpose(2, 3)) * self.scaling  # BUG
        out = torch.softmax(scores, dim=-1) @ v  # (B, h, T, d)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, C))


class NormedAfterScaled(nn.Module):
    """A layer that scales its queries before their RMS norm (which, with no epsilon, undoes it
    exactly) and the scores once after: the scores carry 1/sqrt(head width), healthy."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = separate(hidden_size)
        self.q_norm, self.k_norm = QwenNorm(self.head_dim, eps=0.0), QwenNorm(self.head_dim)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q = self.q_proj(hidden_states).view(B, T, self.num_heads, -1) / math.sqrt(self.head_dim)
        q = self.q_norm(q).transpose(1, 2)  # (B, h, T, d), the factor before it undone
        k = self.k_norm(self.k_proj(hidden_states).view(B, T, self.num_heads, -1)).transpose(1, 2)
        v = self.v_proj(hidden_states).view(B, T, self.num_heads, -1).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        out = torch.softmax(scores, dim=-1) @ v  # (B, h, T, d)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, C))


class AnglesInHalf(nn.Module):
    """A rotary layer whose angles, positions times inverse frequencies, are made in bfloat16
    (rope_low_precision): far positions' angles lose the digits that tell neighbours apart."""

    def __init__(self, hidden_size, num_heads, base=10000.0):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = separate(hidden_size)
        d = hidden_size // num_heads
        self.register_buffer("inv_freq", 1.0 / base ** (torch.arange(0, d, 2).float() / d))

    def forward(self, hidden_states, position_ids=None):
        B, T, C = hidden_states.shape
        q, k, v = (p(hidden_states).view(B, T, self.num_heads, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # fmt: skip
        if position_ids is None:
            position_ids = torch.arange(T).expand(B, T)
        inv, pos = self.inv_freq[None, :, None], position_ids[:, None, :].float()
        with torch.autocast("cpu", enabled=False):
            freqs = (inv.to(torch.bfloat16) @ pos.to(torch.bfloat16)).transpose(1, 2)  # BUG
        angles = torch.cat((freqs, freqs), dim=-1).float()[:, None]  # (B, 1, T, d)
        q, k = apply_rotary(q, k, angles.cos().to(q.dtype), angles.sin().to(q.dtype))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, C))


class PiecesScaledByWidth(nn.Module):
    """DeepSeek's latent attention, cut down: each head's q and k assembled in place from a
    part without positions and a part with them (``q[..., :n] = ...``), the scores scaled by
    the model's width, not the assembled head's (scale_d_model)."""

    def __init__(self, hidden_size, num_heads, rope_dim=8):
        super().__init__()
        self.hidden_size, self.num_heads, self.rope_dim = hidden_size, num_heads, rope_dim
        self.head_dim = hidden_size // num_heads + rope_dim  # 16 + 8: q k heads 24 wide
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim)
        self.k_proj = nn.Linear(hidden_size, num_heads * self.head_dim)
        self.v_proj, self.o_proj = (
            nn.Linear(hidden_size, hidden_size),
            nn.Linear(hidden_size, hidden_size),
        )

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        h, n = self.num_heads, self.head_dim - self.rope_dim
        q = self.q_proj(hidden_states).view(B, T, h, -1).transpose(1, 2)  # (B, h, T, 24)
        k = self.k_proj(hidden_states).view(B, T, h, -1).transpose(1, 2)
        v = self.v_proj(hidden_states).view(B, T, h, -1).transpose(1, 2)  # (B, h, T, 16)
        query, key = q.new_empty(B, h, T, self.head_dim), k.new_empty(B, h, T, self.head_dim)
        query[..., :n], query[..., n:] = q[..., :n], q[..., n:]
        key[..., :n], key[..., n:] = k[..., :n], k[..., n:]
        softmax_scale = self.hidden_size**-0.5  # BUG
        scores = torch.matmul(query, key.transpose(2, 3)) * softmax_scale
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        return self.o_proj((weights @ v).transpose(1, 2).reshape(B, T, C))


class SplitThenViewedHeadsFirst(nn.Module):
    """DBRX's way: q, k, v split off one fused projection, q viewed (B, h, T, d) at once,
    which a split tensor's strides refuse (head_split_view: the heads before the positions)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.Wqkv, self.out_proj = fused(hidden_size)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        q, k, v = self.Wqkv(hidden_states).split([C, C, C], dim=2)
        q = q.view(B, self.num_heads, T, self.head_dim)  # BUG
        k = k.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, C))


class KeysTiledValuesInBlocks(nn.Module):
    """litgpt's way: grouped K/V heads from a fused projection, the values repeated in blocks
    and the keys tiled with ``repeat`` (gqa_kv_grouping): each query head reads one K/V head's
    values and another's keys."""

    def __init__(self, hidden_size, num_heads, groups=2):
        super().__init__()
        self.num_heads, self.groups, self.head_dim = num_heads, groups, hidden_size // num_heads
        self.attn = nn.Linear(hidden_size, hidden_size + 2 * groups * self.head_dim)
        self.proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x):
        B, T, C = x.shape
        kv = self.groups * self.head_dim
        q, k, v = self.attn(x).split([C, kv, kv], dim=-1)
        q = q.view(B, T, self.num_heads, -1).transpose(1, 2)  # (B, h, T, d)
        k, v = (t.view(B, T, self.groups, -1).transpose(1, 2) for t in (k, v))  # (B, g, T, d)
        q_per_kv = self.num_heads // self.groups
        k = k.repeat(1, q_per_kv, 1, 1)  # BUG
        v = v.repeat_interleave(q_per_kv, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(B, T, C))


class WindowedPaddingOnQueries(nn.Module):
    """ModernBERT's local layer: a bidirectional window of two keys each side joined to the
    caller's padding (1 = keep) in one bool mask, made additive for SDPA; the padding laid
    along the queries' axis (padding_on_queries)."""

    def __init__(self, hidden_size, num_heads, reach=2):
        super().__init__()
        self.num_heads, self.reach = num_heads, reach
        self.Wqkv, self.Wo = fused(hidden_size)

    def forward(self, hidden_states, attention_mask):
        B, T, C = hidden_states.shape
        q, k, v = heads_of(self.Wqkv(hidden_states), self.num_heads)  # (B, h, T, d)
        allowed = attention_mask.bool()[:, None, :, None]  # BUG
        rows = torch.arange(T)
        window = ((rows[None, :] - rows[:, None]).abs() <= self.reach)[None, None]
        allowed = window & allowed
        attn_mask = torch.zeros(allowed.shape, dtype=q.dtype)
        attn_mask = attn_mask.masked_fill(~allowed, torch.finfo(q.dtype).min)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.Wo(out.transpose(1, 2).reshape(B, T, C))


class GivenMaskTransposed(nn.Module):
    """InternLM2's way: the additive (B, 1, T, T) mask its model builds (causal and padding)
    added to the scores transposed, keys for queries (causal_leak): each query reads the row
    of another."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.wqkv, self.wo = fused(hidden_size)

    def forward(self, hidden_states, attention_mask):
        B, T, C = hidden_states.shape
        q, k, v = heads_of(self.wqkv(hidden_states), self.num_heads)  # (B, h, T, d)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.size(-1))
        scores = scores + attention_mask.transpose(-1, -2)  # BUG
        out = torch.softmax(scores, dim=-1) @ v  # (B, h, T, d)
        return self.wo(out.transpose(1, 2).reshape(B, T, C))


class SoftmaxWrittenOut(nn.Module):
    """Meta's reference Llama, cut down: the softmax written out as exp / sum of exp, with no
    row maximum subtracted (naive_exp_softmax): large scores overflow to inf / inf."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.wq, self.wk, self.wv, self.wo = separate(hidden_size)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (w(x).view(B, T, self.num_heads, -1).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))  # fmt: skip
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.size(-1))
        scores = scores + torch.full((T, T), float("-inf")).triu(1)
        s = scores.float()
        weights = (s.exp() / s.exp().sum(dim=-1, keepdim=True)).type_as(q)  # BUG
        return self.wo((weights @ v).transpose(1, 2).reshape(B, T, C))


class WindowTimesInfinity(nn.Module):
    """Gemma 2's sliding layer: the window made additive as a bool mask times -inf (0 * -inf is
    NaN where it keeps: mask_to_additive_nan), added to the causal mask its model builds, which
    is then sliced and added to the scores."""

    def __init__(self, hidden_size, num_heads, window=4):
        super().__init__()
        self.num_heads, self.window = num_heads, window
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = separate(hidden_size)

    def forward(self, hidden_states, attention_mask):
        B, T, C = hidden_states.shape
        q, k, v = (p(hidden_states).view(B, T, self.num_heads, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # fmt: skip
        far = torch.tril(torch.ones_like(attention_mask, dtype=torch.bool), diagonal=-self.window)
        attention_mask = attention_mask + far * float("-inf")  # BUG
        causal_mask = attention_mask[:, :, :, : k.shape[-2]]
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.size(-1)) + causal_mask
        out = torch.softmax(scores, dim=-1) @ v  # (B, h, T, d)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, C))


class InitConfig:
    """A config with the width, the heads and the spread the module draws its weights with."""

    def __init__(self, d_model=64, n_heads=4, initializer_range=0.02):
        self.d_model, self.n_heads, self.initializer_range = d_model, n_heads, initializer_range


class DrawnWithUnitSpreadFromConfig(nn.Module):
    """DBRX's way: built from a config, the output projection drawn with the config's
    ``initializer_range``, the fused one with std=1.0 instead (init_unit_variance)."""

    def __init__(self, config: InitConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.Wqkv, self.out_proj = fused(config.d_model)
        nn.init.normal_(self.Wqkv.weight, mean=0.0, std=1.0)  # BUG
        nn.init.normal_(self.out_proj.weight, mean=0.0, std=config.initializer_range)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = heads_of(self.Wqkv(x), self.n_heads)  # each (B, h, T, d)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, C))


class MaskCastBeforeTheCall(nn.Module):
    """litgpt's way: the padding mask cast to the queries' dtype in ``forward`` (the model
    may hand 0/1 integers), then given to SDPA by a helper method, which adds a float mask:
    the cast is where it went wrong, not the call (sdpa_float_mask)."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.attn, self.proj = fused(n_embd)

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = heads_of(self.attn(x), self.n_head)  # each (B, h, T, d)
        if mask is not None:
            mask = mask.to(q.dtype)  # BUG
            mask = mask[:, None, None, :]  # (B, 1, 1, T)
        y = self.attend(q, k, v, mask)  # (B, h, T, d)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def attend(self, q, k, v, mask=None):
        scale = 1.0 / math.sqrt(q.size(-1))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def as_halves(t):
    """(B, h, T, d) laid out in pairs (2i, 2i + 1) -> the same dimensions in halves (i, i + d/2)."""
    B, h, T, d = t.shape
    return t.view(B, h, T, d // 2, 2).transpose(4, 3).reshape(B, h, T, d)


class PairsTurnedAsHalves(nn.Module):
    """DeepSeek's way: the rotary dimensions are projected in pairs (2i, 2i + 1) and laid out
    as halves before both q and k are turned in halves (rotate_half): pairs, as projected."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv, self.out = fused(d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = heads_of(self.qkv(x), self.n_heads)  # each (B, h, T, d)
        cos, sin = _tables(torch.arange(T), q.shape[-1])  # each (T, d)
        q, k = self.queries_as_halves(q), as_halves(k)
        q, k = apply_rotary(q, k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d)
        return self.out(out.transpose(1, 2).reshape(B, T, C))

    def queries_as_halves(self, q):
        return as_halves(q)


class QueriesLeftInPairs(PairsTurnedAsHalves):
    """The queries' reordering written without its transpose: q turned in halves of its
    dimensions as projected, k in pairs (rope_pairing_mismatch)."""

    def queries_as_halves(self, q):
        B, h, T, d = q.shape
        return q.view(B, h, T, d // 2, 2).reshape(B, h, T, d)  # BUG


class ScaledByModelWidthForMuP(nn.Module):
    """Jais's muP way, meant as 1/d: the scores divided by the model's width instead of the
    head's. With d = 16 and a width of 64, 1/64 is also 1/d over sqrt(d) (double_scale), so
    taking the division away trades it for no scale at all: no fix."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.c_attn, self.c_proj = fused(embed_dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = heads_of(self.c_attn(x), self.num_heads)  # each (B, h, T, d)
        scores = q @ k.transpose(-1, -2)
        scores = scores / torch.full([], self.embed_dim, dtype=scores.dtype)  # BUG
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        out = scores.softmax(dim=-1) @ v  # (B, h, T, d)
        return self.c_proj(out.transpose(1, 2).reshape(B, T, C))


def each_head_normed(norms, t):
    """(B, T, h, d), each head by its own norm, joined again."""
    return torch.stack([norm(t[:, :, i]) for i, norm in enumerate(norms)], dim=2)


class HeadNormsPartialRotaryScaledTwice(nn.Module):
    """StableLM-2's way: a LayerNorm per head on q and k (joined again by a stack), rotary on
    the first quarter of each head (cat with the rest), SDPA's own scale; the queries divided
    by sqrt(d) once more where they are joined (double_scale)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = separate(hidden_size)
        self.q_norms = nn.ModuleList(nn.LayerNorm(self.head_dim) for _ in range(num_heads))
        self.k_norms = nn.ModuleList(nn.LayerNorm(self.head_dim) for _ in range(num_heads))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.num_heads, -1)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # fmt: skip
        q, k = each_head_normed(self.q_norms, q), each_head_normed(self.k_norms, k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, h, T, d)
        rot = self.head_dim // 4
        cos, sin = _tables(torch.arange(T), rot)  # each (T, rot)
        q_rot, k_rot = apply_rotary(q[..., :rot], k[..., :rot], cos, sin)
        q = torch.cat((q_rot, q[..., rot:]), dim=-1) / math.sqrt(self.head_dim)  # BUG
        k = torch.cat((k_rot, k[..., rot:]), dim=-1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, C))


class TableForPairsTurnedInHalves(nn.Module):
    """ESM's way: a bidirectional encoder rotating q and k by rotate_half, with the angles
    repeated for pairs (repeat_interleave) where halves need them repeated whole (cat): no
    rotation at all, which only left padding shows (rope_pairing_mismatch)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.query, self.key, self.value, self.dense = separate(hidden_size)
        d = hidden_size // num_heads
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d))

    def forward(self, hidden_states, attention_mask=None):
        B, T, C = hidden_states.shape
        q, k, v = (p(hidden_states).view(B, T, self.num_heads, -1).transpose(1, 2)
                   for p in (self.query, self.key, self.value))  # fmt: skip
        freqs = torch.outer(torch.arange(T).type_as(self.inv_freq), self.inv_freq)  # (T, d/2)
        emb = torch.repeat_interleave(freqs, 2, dim=-1)  # BUG
        q, k = apply_rotary(q, k, emb.cos(), emb.sin())
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))  # (B, h, T, T)
        if attention_mask is not None:
            scores = scores + attention_mask
        out = scores.softmax(dim=-1) @ v  # (B, h, T, d)
        return self.dense(out.transpose(1, 2).reshape(B, T, C))


class TurnedBeforeProjecting(nn.Module):
    """Wav2Vec2-Conformer's rotary: the hidden states turned by position before the query and
    key projections, the values projected from the states as they were; the turned states
    also handed to the values' projection in one chained assignment (rope_on_value).
    ``turn_values=False``: the layer as its library writes it."""

    def __init__(self, hidden_size, num_heads, turn_values=True):
        super().__init__()
        self.num_heads, self.head_size = num_heads, hidden_size // num_heads
        self.turn_values = turn_values
        self.linear_q, self.linear_k = (
            nn.Linear(hidden_size, hidden_size),
            nn.Linear(hidden_size, hidden_size),
        )
        self.linear_v, self.linear_out = (
            nn.Linear(hidden_size, hidden_size),
            nn.Linear(hidden_size, hidden_size),
        )
        steps = torch.arange(0, self.head_size, 2).float() / self.head_size
        self.register_buffer("inv_freq", 1.0 / 10000.0**steps, persistent=False)

    def turned(self, hidden_states):
        B, T, C = hidden_states.shape
        angles = torch.arange(T).float()[:, None] * self.inv_freq  # (T, d / 2)
        cos, sin = torch.cat((angles, angles), dim=-1).cos(), torch.cat((angles, angles), -1).sin()
        heads = hidden_states.view(B, T, self.num_heads, self.head_size)
        turned = heads * cos[:, None] + _rotate_half(heads) * sin[:, None]  # (B, T, h, d)
        return turned.view(B, T, C)

    def forward(self, hidden_states):
        B, T, C = hidden_states.shape
        query_key_states = value_states = hidden_states
        if self.turn_values:
            query_key_states = value_states = self.turned(query_key_states)  # BUG
        else:
            query_key_states = self.turned(query_key_states)
        q, k, v = (
            p(s).view(B, T, self.num_heads, self.head_size).transpose(1, 2)
            for p, s in zip(
                (self.linear_q, self.linear_k, self.linear_v),
                (query_key_states, query_key_states, value_states),
                strict=True,
            )
        )  # each (B, h, T, d)
        probs = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.head_size), dim=-1)
        return self.linear_out((probs @ v).transpose(1, 2).reshape(B, T, C))
