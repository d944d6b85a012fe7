"""Modules in the cache conventions of real code, correct and with bugs from real reports, for
the doctor's generation and position probes."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Projections(nn.Module):
    """q/k/v/o projections and causal attention over (possibly cached) keys, anchored at the
    bottom-right (query t of T new ones is token S - T + t)."""

    def __init__(self, d_model: int = 32, n_heads: int = 4):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(d_model, d_model, bias=False) for _ in range(4)
        )

    def heads(self, t: Tensor) -> Tensor:
        B, T, _ = t.shape
        return t.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, h, T, d)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, top_left: bool = False) -> Tensor:
        T, S = q.shape[2], k.shape[2]
        allowed = torch.ones(T, S, dtype=torch.bool).tril(0 if top_left else S - T)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        out = F.softmax(scores.masked_fill(~allowed, -math.inf), -1) @ v  # (B, h, T, d)
        B = q.shape[0]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class LayerPast(Projections):
    """GPT-2's old convention: ``forward(x, layer_past=None, use_cache=False)`` returns
    ``(output, present)``, present = (k, v) to give back next time. ``stale``: the bug of
    returning the past without this call's keys and values (the current token missing from its
    own cache). ``stacked``: keys and values returned stacked in one tensor."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, stale: bool = False,
                 stacked: bool = False):  # fmt: skip
        super().__init__(d_model, n_heads)
        self.stale, self.stacked = stale, stacked

    def forward(self, x: Tensor, layer_past=None, use_cache: bool = False):
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        if layer_past is not None:
            k_all = torch.cat([layer_past[0], k], dim=2)
            v_all = torch.cat([layer_past[1], v], dim=2)
        else:
            k_all, v_all = k, v
        present = (k_all, v_all) if not self.stale or layer_past is None else layer_past
        if self.stacked:  # old GPT-2 code: one (2, B, h, T, d) tensor
            present = torch.stack(present)
        out = self.attend(q, k_all, v_all)
        return (out, present) if use_cache else (out, None)


class ScaledWhenCached(LayerPast):
    """GPT-2's convention with a branch for cached calls that drifted from the full forward's:
    its new keys scaled by 1.5 when it is handed a past, before they join it."""

    def forward(self, x: Tensor, layer_past=None, use_cache: bool = False):
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        if layer_past is not None:
            k = k * 1.5
            k = torch.cat([layer_past[0], k], dim=2)
            v = torch.cat([layer_past[1], v], dim=2)
        out = self.attend(q, k, v)
        return (out, (k, v)) if use_cache else (out, None)


class JoinsItsPast(LayerPast):
    """GPT-2's convention, the new keys and values joined after the past ones. ``new_first``:
    the keys joined before them (Kosmos-2-style slip), so the keys no longer line up with
    their values or positions."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, new_first: bool = False):
        super().__init__(d_model, n_heads)
        self.new_first = new_first

    def forward(self, x: Tensor, layer_past=None, use_cache: bool = False):
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        if layer_past is not None and self.new_first:
            k = torch.cat([k, layer_past[0]], dim=2)
        elif layer_past is not None:
            k = torch.cat([layer_past[0], k], dim=2)
        if layer_past is not None:
            v = torch.cat([layer_past[1], v], dim=2)
        out = self.attend(q, k, v)
        return (out, (k, v)) if use_cache else (out, None)


class BufferCutTopLeft(LayerPast):
    """GPT-2's causal buffer ``bias``, cut for this call's queries from its first rows
    (``bias[:T, :S]``) where the last ones are meant (``bias[S - T : S, :S]``): under a cache a
    new query sees only the first keys (cache_causal_alignment)."""

    def __init__(self, d_model: int = 32, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.register_buffer("bias", torch.ones(64, 64, dtype=torch.bool).tril(), persistent=False)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, top_left: bool = False) -> Tensor:
        T, S = q.shape[2], k.shape[2]
        causal = self.bias[:T, :S]
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        out = F.softmax(scores.masked_fill(~causal, -math.inf), -1) @ v  # (B, h, T, d)
        return self.o_proj(out.transpose(1, 2).reshape(q.shape[0], T, -1))


class Rolling(Projections):
    """A sliding window of ``sliding_window`` keys whose returned cache keeps only the last
    window (a rolling buffer, as Mistral's): a fixed length by design. ``keep_all``: the same
    window over a cache that keeps every token (also right)."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, sliding_window: int = 3):
        super().__init__(d_model, n_heads)
        self.sliding_window = sliding_window

    def forward(self, x: Tensor, layer_past=None, use_cache: bool = False):
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        if layer_past is not None:
            k, v = torch.cat([layer_past[0], k], dim=2), torch.cat([layer_past[1], v], dim=2)
        T, S, W = q.shape[2], k.shape[2], self.sliding_window
        back = (S - T + torch.arange(T))[:, None] - torch.arange(S)  # (T, S): how far back
        allowed = (back >= 0) & (back < W)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        out = F.softmax(scores.masked_fill(~allowed, -math.inf), -1) @ v  # (B, h, T, d)
        present = (k[:, :, -W:], v[:, :, -W:])  # the oldest tokens dropped
        out = self.o_proj(out.transpose(1, 2).reshape(x.shape[0], T, -1))
        return (out, present) if use_cache else (out, None)


class StartPos(Projections):
    """Meta's Llama convention: ``forward(x, start_pos)`` with the cache in buffers sized for
    the longest sequence. ``top_left``: the causal mask anchored at the top-left, as
    ``is_causal=True`` does with fewer queries than keys (pytorch/pytorch#108108)."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, top_left: bool = False):
        super().__init__(d_model, n_heads)
        self.top_left = top_left
        self.register_buffer("cache_k", torch.zeros(8, n_heads, 64, d_model // n_heads))
        self.register_buffer("cache_v", torch.zeros(8, n_heads, 64, d_model // n_heads))

    def store(self, k: Tensor, v: Tensor, first: int) -> None:
        """This call's keys and values (B, h, T, d) into the cache, from slot ``first``."""
        B, _, T, _ = k.shape
        self.cache_k = self.cache_k.to(k.dtype).detach()
        self.cache_v = self.cache_v.to(v.dtype).detach()
        self.cache_k[:B, :, first : first + T] = k.detach()
        self.cache_v[:B, :, first : first + T] = v.detach()

    def step(self, x: Tensor, start_pos: int) -> tuple[Tensor, Tensor, Tensor]:
        """q of this call's tokens, and every key and value so far, this call's stored first."""
        B = x.shape[0]
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        self.store(k, v, start_pos)
        keys = torch.cat([self.cache_k[:B, :, :start_pos], k], dim=2)
        values = torch.cat([self.cache_v[:B, :, :start_pos], v], dim=2)
        return q, keys, values

    def forward(self, x: Tensor, start_pos: int = 0):
        return self.attend(*self.step(x, start_pos), self.top_left)


class ReadsItsCache(StartPos):
    """Meta's Llama's reading: the keys are the cache's first ``start_pos + T`` slots, this
    call's written first. ``forgets_start``: written at slots 0..T-1 whatever ``start_pos``
    (a cache write that drops its offset), then read from the right slots."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, forgets_start: bool = False):
        super().__init__(d_model, n_heads)
        self.forgets_start = forgets_start

    def forward(self, x: Tensor, start_pos: int = 0):
        B, T, _ = x.shape
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        self.store(k, v, 0 if self.forgets_start else start_pos)
        keys = self.cache_k[:B, :, : start_pos + T]
        values = self.cache_v[:B, :, : start_pos + T]
        return self.attend(q, keys, values)


class SdpaIsCausal(StartPos):
    """Its cache as Meta's Llama keeps it, attention by SDPA told ``is_causal``: always (the
    bug of pytorch/pytorch#108108: with fewer queries than keys the mask is anchored at the
    top-left), or only when queries and keys are as many (``aligned``: a new query then sees
    every cached key)."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, aligned: bool = False):
        super().__init__(d_model, n_heads)
        self.aligned = aligned

    def forward(self, x: Tensor, start_pos: int = 0):
        B, T, _ = x.shape
        q, keys, values = self.step(x, start_pos)
        if self.aligned and start_pos > 0:
            allowed = torch.ones(T, start_pos + T, dtype=torch.bool).tril(start_pos)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class SdpaIsCausalForOne(StartPos):
    """StableLM's SDPA path with its decoding check dropped: a mask anchored bottom-right for
    several new tokens, and ``is_causal=True`` for one, which SDPA anchors at the top-left, so
    a token decoded alone sees only the first key."""

    def forward(self, x: Tensor, start_pos: int = 0):
        B, T, _ = x.shape
        q, keys, values = self.step(x, start_pos)
        allowed = None if T == 1 else torch.ones(T, start_pos + T, dtype=torch.bool).tril(start_pos)
        is_causal = allowed is None
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=allowed, is_causal=is_causal
        )
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class OneTokenAfterThePrompt(StartPos):
    """RecurrentGemma's cache: the prompt whole, then one token per call; several new tokens
    through a filled cache are refused with NotImplementedError, as its model never sends
    them."""

    def forward(self, x: Tensor, start_pos: int = 0):
        if start_pos > 0 and x.shape[1] > 1:
            raise NotImplementedError("one token at a time after the prompt")
        return super().forward(x, start_pos)


class IgnoresPos(Projections):
    """x-transformers' way: an optional ``pos`` that this configuration ignores, and rotary
    named in its code for when it is configured; bidirectional. Correct as it is."""

    def __init__(self, d_model: int = 32, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.rotary_pos_emb = None  # not configured

    def forward(self, x: Tensor, mask=None, pos=None):
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        keep = None if mask is None else mask[:, None]  # (B, 1, T, T)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        B, T, _ = x.shape
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


def rope(t: Tensor, positions: Tensor, pairs: bool = False) -> Tensor:
    """Half-split rotary on (B, h, T, d) at ``positions`` (B, T), angles in float32;
    ``pairs``: dimensions paired (2i, 2i + 1), GPT-J's layout."""
    d = t.shape[-1]
    inv_freq = 10000.0 ** -(torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = positions[:, None, :, None].float() * inv_freq  # (B, 1, T, d/2)
    cos, sin = angles.cos().to(t.dtype), angles.sin().to(t.dtype)
    if pairs:
        a, b = t[..., 0::2], t[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    a, b = t[..., : d // 2], t[..., d // 2 :]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Rotary(Projections):
    """Causal rotary attention taking ``position_ids``. ``on_value``: the bug of rotating the
    values too (rope applied to V, lucidrains/x-transformers#182); ``mixed``: q rotated in
    halves and k in pairs (a port mixing NeoX's and GPT-J's layouts)."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, on_value: bool = False,
                 mixed: bool = False):  # fmt: skip
        super().__init__(d_model, n_heads)
        self.on_value, self.mixed = on_value, mixed

    def forward(self, x: Tensor, position_ids: Tensor):
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = rope(q, position_ids), rope(k, position_ids, pairs=self.mixed)
        if self.on_value:
            v = rope(v, position_ids)
        return self.attend(q, k, v)


class RotaryStartPos(StartPos):
    """Meta's Llama cache with rotary at read time: every key turned by its position, the new
    queries by the positions fed (counted on from the cache). ``first_rows``: the cache's
    offset taken away again, so a cached query is turned as position 0."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, first_rows: bool = False):
        super().__init__(d_model, n_heads)
        self.first_rows = first_rows

    def forward(self, x: Tensor, start_pos: int = 0):
        B, T, _ = x.shape
        if int(torch.arange(T).max()) + start_pos >= self.cache_k.shape[2]:  # a check aside
            raise ValueError("positions past the cache")
        q, keys, values = self.step(x, start_pos)
        fed = torch.arange(T) + start_pos  # (T,): the positions fed, after the cached ones
        rows = fed - start_pos if self.first_rows else fed  # (T,)
        positions = torch.arange(start_pos + T).expand(B, -1)  # (B, S): every key's
        return self.attend(rope(q, rows.expand(B, -1)), rope(keys, positions), values)


class BufferTablesRotary(Projections):
    """MiniCPM's rotary: cos and sin tables made once, as buffers, and indexed by position in
    the forward; q and k turned in halves (``rotate_half``). ``pairs``: the tables repeat each
    angle for pairs (``repeat_interleave(freqs, 2)``), the other pairing than the turn's."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, pairs: bool = False):
        super().__init__(d_model, n_heads)
        d = d_model // n_heads
        freqs = torch.outer(torch.arange(64.0), 10000.0 ** -(torch.arange(0, d, 2) / d))
        table = freqs.repeat_interleave(2, dim=-1) if pairs else torch.cat((freqs, freqs), -1)
        self.register_buffer("cos_cached", table.cos(), persistent=False)  # (64, d)
        self.register_buffer("sin_cached", table.sin(), persistent=False)

    def forward(self, x: Tensor, position_ids: Tensor):
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        index = position_ids.long()  # (B, T)
        cos = self.cos_cached[index][:, None].to(x.dtype)  # (B, 1, T, d)
        sin = self.sin_cached[index][:, None].to(x.dtype)
        q, k = (t * cos + _rotate_half(t) * sin for t in (q, k))
        return self.attend(q, k, v)


def _rotate_half(t: Tensor) -> Tensor:
    half = t.shape[-1] // 2
    return torch.cat((-t[..., half:], t[..., :half]), dim=-1)


class NullKeyRotary(Rotary):
    """Rotary attention with a learned key and value prepended unrotated, as CoLT5's null key
    and x-transformers' memory key-values are: the scores against it carry the query's
    absolute rotation, so a shift moves the output though v is never rotated."""

    def __init__(self, d_model: int = 32, n_heads: int = 4):
        super().__init__(d_model, n_heads)
        self.null_kv = nn.Parameter(torch.randn(2, n_heads, 1, d_model // n_heads))

    def forward(self, x: Tensor, position_ids: Tensor):
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = rope(q, position_ids), rope(k, position_ids)
        null_k, null_v = (t.expand(x.shape[0], -1, -1, -1) for t in self.null_kv)
        return self.attend(q, torch.cat([null_k, k], 2), torch.cat([null_v, v], 2))


class BandFromPositions(Projections):
    """RecurrentGemma's local attention: causal within a window of ``window`` keys (the
    query's own included), the band cut from the positions its caller hands in.
    ``one_more``: the bound compared with ``<=``, a key too many."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, window: int = 3,
                 one_more: bool = False):  # fmt: skip
        super().__init__(d_model, n_heads)
        self.window, self.one_more = window, one_more

    def forward(self, x: Tensor, position_ids: Tensor) -> Tensor:
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        ago = position_ids[:, :, None] - position_ids[:, None, :]  # (B, T, T)
        near = ago <= self.window if self.one_more else ago < self.window
        allowed = ((ago >= 0) & near)[:, None]  # (B, 1, T, T)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        out = F.softmax(scores.masked_fill(~allowed, -math.inf), -1) @ v  # (B, h, T, d)
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class BandAttention(Projections):
    """A bidirectional encoder with a local window: query t sees keys t - ``behind`` .. t +
    ``ahead`` (ModernBERT's and UltraBERT's local layers reach as far each side; uneven reach
    is the bug of a window built for a decoder and reused in an encoder)."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, sliding_window: int = 3,
                 behind: int = 3, ahead: int = 3):  # fmt: skip
        super().__init__(d_model, n_heads)
        self.sliding_window, self.behind, self.ahead = sliding_window, behind, ahead

    def forward(self, x: Tensor) -> Tensor:
        T = x.shape[1]
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        ago = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # (T, T)
        allowed = (ago <= self.behind) & (-ago <= self.ahead)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        out = F.softmax(scores.masked_fill(~allowed, -math.inf), -1) @ v  # (B, h, T, d)
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], T, -1))
