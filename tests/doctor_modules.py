"""Attention modules the catalogue has never seen, correct and buggy, for testing the doctor.

Written in other styles on purpose: einsum, a fused qkv projection with a causal buffer, and a
batch_first=False wrapper around nn.MultiheadAttention.
"""

import math

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

    def __init__(self, n_embd, n_head, block_size=128, diagonal=0):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        bias = torch.tril(torch.ones(block_size, block_size), diagonal=diagonal)
        self.register_buffer("bias", bias.view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


def gpt_ok(n_embd, n_head):
    return CausalSelfAttention(n_embd, n_head)


def gpt_leaky(n_embd, n_head):
    return CausalSelfAttention(n_embd, n_head, diagonal=1)


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

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
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
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + bias
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(out)


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
