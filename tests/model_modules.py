"""Whole models for the doctor's model tests: a small GPT in nanoGPT's style (token and position
embeddings, pre-norm blocks, causal self-attention, a tied head), and the same with one bug."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 256
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64


class SelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        causal = torch.tril(torch.ones(config.block_size, config.block_size, dtype=torch.bool))
        self.register_buffer("causal", causal, persistent=False)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        return tuple(t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, T, T)

    def merge(self, y: torch.Tensor) -> torch.Tensor:
        B, h, T, d = y.shape
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, h * d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        q, k, v = self.heads(x)  # (B, h, T, d)
        att = self.scores(q, k).masked_fill(~self.causal[:T, :T], float("-inf"))
        return self.merge(F.softmax(att, dim=-1) @ v)


class Block(nn.Module):
    def __init__(self, config: GPTConfig, attention: type[nn.Module]):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(),
                                 nn.Linear(4 * config.n_embd, config.n_embd))  # fmt: skip

    def forward(self, x: torch.Tensor, *extra: object) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), *extra)  # extra: what the model hands its attention
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    attention: type[nn.Module] = SelfAttention

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleList([Block(config, self.attention) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)  # (T,)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, vocab)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, steps: int) -> torch.Tensor:
        for _ in range(steps):
            logits = self(idx[:, -self.config.block_size :])[:, -1]
            idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], dim=1)
        return idx


class UnmaskedAttention(SelfAttention):
    """The causal mask dropped (a refactor that moved it out and forgot to pass it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.heads(x)
        return self.merge(F.softmax(self.scores(q, k), dim=-1) @ v)


class LeakyGPT(GPT):
    attention = UnmaskedAttention


class TwiceScaledAttention(SelfAttention):
    """The scale applied twice (once on q, once on the scores)."""

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return super().scores(q / math.sqrt(q.size(-1)), k)


class TwiceScaledGPT(GPT):
    attention = TwiceScaledAttention


class BatchMixingAttention(SelfAttention):
    """Heads merged with a view on the wrong axis order: sequences of a batch mix."""

    def merge(self, y: torch.Tensor) -> torch.Tensor:
        B, h, T, d = y.shape
        return self.c_proj(y.transpose(0, 2).reshape(B, T, h * d))


class BatchMixingGPT(GPT):
    attention = BatchMixingAttention


class Recurrence(nn.Module):
    """A running mean over positions: it mixes positions, with no softmax."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        counts = torch.arange(1, x.shape[1] + 1, device=x.device)[:, None]  # (T, 1)
        return x.cumsum(dim=1) / counts


class Router(nn.Module):
    """A mixture of two experts weighted by a softmax per token: a softmax, no mixing."""

    def __init__(self, d: int):
        super().__init__()
        self.gate = nn.Linear(d, 2)
        self.experts = nn.ModuleList([nn.Linear(d, d), nn.Linear(d, d)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = F.softmax(self.gate(x), dim=-1)  # (B, T, 2)
        return sum(weights[..., i : i + 1] * e(x) for i, e in enumerate(self.experts))


class RecurrentBlock(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.mix = Recurrence()
        self.route = Router(config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.route(self.mix(x))


class HybridGPT(GPT):
    """Attention blocks and a recurrent block whose softmax is a router's (as Jamba's)."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        self.h.append(RecurrentBlock(config))


class ImageModel(GPT):
    """A forward that needs more than token ids."""

    def forward(self, idx: torch.Tensor, pixel_values: torch.Tensor) -> torch.Tensor:
        return super().forward(idx)


class SinkAttention(SelfAttention):
    """Attention sinks, as gpt-oss: one more logit per head in each softmax, dropped after."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        self.sinks = nn.Parameter(torch.full((config.n_head,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        q, k, v = self.heads(x)
        att = self.scores(q, k).masked_fill(~self.causal[:T, :T], float("-inf"))
        sink = self.sinks[None, :, None, None].expand(*att.shape[:-1], 1)  # (B, h, T, 1)
        weights = F.softmax(torch.cat([att, sink], dim=-1), dim=-1)[..., :T]
        return self.merge(weights @ v)


class SinkGPT(GPT):
    attention = SinkAttention


class UnscaledAttention(SelfAttention):
    """Scores left unscaled, and saying so (``scaling``, as Granite's attention_multiplier)."""

    scaling = 1.0

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return q @ k.transpose(-2, -1) * self.scaling


class DeclaredUnscaledGPT(GPT):
    attention = UnscaledAttention


class ModelWidthScaledAttention(SelfAttention):
    """Scores scaled by 1/sqrt(n_embd), the model's width, and saying so (``scaling``): the
    catalogue's scale_d_model, written down where Granite writes its multiplier."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        self.scaling = config.n_embd**-0.5

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return q @ k.transpose(-2, -1) * self.scaling


class ModelWidthScaledGPT(GPT):
    attention = ModelWidthScaledAttention


class SilentUnscaledAttention(SelfAttention):
    """The same scores, with nothing that says so: the scale is missing."""

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return q @ k.transpose(-2, -1)


class SilentUnscaledGPT(GPT):
    attention = SilentUnscaledAttention


class Float32Mlp(nn.Module):
    """An expert kernel that takes float32 only (a grouped matmul of experts)."""

    def __init__(self, d: int):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise RuntimeError(f"Expected mat_a to be Float32, got {x.dtype}")
        return self.proj(x)


class Float32OnlyGPT(GPT):
    """Its first block's MLP runs in float32 only: a later layer is recorded in float32."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        self.h[0].mlp = Float32Mlp(config.n_embd)


class NeedsLanguage(GPT):
    """A forward that raises on plain ids until told something (X-MOD's language)."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        raise ValueError("Input language unknown. Please call set_default_language()")


class ApartBiasAttention(SelfAttention):
    """The output bias returned apart, for the block to add (GPT-NeoX Japanese's dense_bias)."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.dense_bias = nn.Parameter(torch.zeros(config.n_embd))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(x), self.dense_bias


class ApartBiasBlock(Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, bias = self.attn(self.ln_1(x))
        x = x + out + bias
        return x + self.mlp(self.ln_2(x))


class ApartBiasGPT(GPT):
    attention = ApartBiasAttention

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        self.h = nn.ModuleList([ApartBiasBlock(config, self.attention) for _ in self.h])


class IdleWeightAttention(SelfAttention):
    """A projection its model never uses as called (LUKE's entity queries without entities)."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        self.entity_query = nn.Linear(config.n_embd, config.n_embd)


class IdleWeightGPT(GPT):
    attention = IdleWeightAttention


class FixedLengthLM(GPT):
    """Logits for every position its decoder holds, the input's first (Perceiver's MLM)."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits = super().forward(idx)  # (B, T, V)
        B, T, V = logits.shape
        return torch.cat([logits, logits.new_zeros(B, self.config.block_size - T, V)], dim=1)


class CachedAttention(SelfAttention):
    """Keys and values kept inside, written at the positions given (Meta's Llama keeps plain
    tensors ``cache_k``; gpt-fast buffers made by ``setup_caches``)."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        self.cache_k = self.cache_v = None

    def make_cache(self, batch: int, length: int) -> None:
        d = self.c_proj.in_features // self.n_head
        self.cache_k = torch.zeros(batch, self.n_head, length, d)
        self.cache_v = torch.zeros(batch, self.n_head, length, d)

    def slots(self, start: int, T: int) -> slice:
        return slice(start, start + T)

    def update(self, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[torch.Tensor, ...]:
        """This chunk's keys and values written; all of them so far read back."""
        B, _, T, _ = k.shape
        self.cache_k = self.cache_k.to(k.dtype)
        self.cache_v = self.cache_v.to(v.dtype)
        self.cache_k[:B, :, self.slots(start, T)] = k
        self.cache_v[:B, :, self.slots(start, T)] = v
        return self.cache_k[:B, :, : start + T], self.cache_v[:B, :, : start + T]

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        T = x.shape[1]
        q, k, v = self.heads(x)  # (B, h, T, d)
        keys, values = self.update(k, v, start)  # (B, h, start + T, d)
        allowed = self.causal[start : start + T, : start + T]  # (T, start + T)
        att = self.scores(q, keys).masked_fill(~allowed, float("-inf"))
        return self.merge(F.softmax(att, dim=-1) @ values)


class StartPosGPT(GPT):
    """Meta's Llama's interface: ``forward(tokens, start_pos)`` under inference mode, its cache
    made with the model for up to 4 sequences."""

    attention = CachedAttention

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        for block in self.h:
            block.attn.make_cache(4, config.block_size)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start_pos: int) -> torch.Tensor:
        T = tokens.shape[1]
        pos = torch.arange(start_pos, start_pos + T, device=tokens.device)  # (T,)
        x = self.wte(tokens) + self.wpe(pos)  # (B, T, C)
        for block in self.h:
            x = block(x, start_pos)
        return self.lm_head(self.ln_f(x)).float()  # (B, T, vocab)


class FrontSlotsAttention(CachedAttention):
    """Every chunk written to the cache's first slots (the start position forgotten)."""

    def slots(self, start: int, T: int) -> slice:
        return slice(0, T)


class FrontSlotsStartPosGPT(StartPosGPT):
    attention = FrontSlotsAttention


class InputPosGPT(StartPosGPT):
    """gpt-fast's interface: ``setup_caches(max_batch_size, max_seq_length)`` first, then
    ``forward(idx, input_pos)`` with the positions of the tokens fed."""

    def __init__(self, config: GPTConfig):
        GPT.__init__(self, config)
        self.max_batch_size = self.max_seq_length = -1

    def setup_caches(self, max_batch_size: int, max_seq_length: int) -> None:
        if self.max_batch_size >= max_batch_size and self.max_seq_length >= max_seq_length:
            return  # as gpt-fast: a cache as large is kept
        self.max_batch_size, self.max_seq_length = max_batch_size, max_seq_length
        for block in self.h:
            block.attn.make_cache(max_batch_size, max_seq_length)

    def forward(self, idx: torch.Tensor, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        assert input_pos is not None, "input_pos: the positions of the tokens fed"
        assert idx.shape[0] == self.max_batch_size, "a cache made for another batch"  # as gpt-fast
        return StartPosGPT.forward.__wrapped__(self, idx, int(input_pos[0]))


class FrontSlotsInputPosGPT(InputPosGPT):
    attention = FrontSlotsAttention


class NoGenerateGPT(GPT):
    """nanoGPT without generate(): causal only by its attention's name and mask buffer."""

    generate = None


class CausalSelfAttention(UnmaskedAttention):
    """nanoGPT's class and its ``bias`` mask buffer, the mask never applied."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        causal = torch.tril(torch.ones(config.block_size, config.block_size))
        self.register_buffer("bias", causal.view(1, 1, *causal.shape))


class LeakyNoGenerateGPT(NoGenerateGPT):
    attention = CausalSelfAttention


class OffByOneMaskAttention(SelfAttention):
    """A mask buffer built with tril(diagonal=1), in a class whose name says nothing: each
    token sees the next one (causal_leak)."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        self.causal = torch.ones_like(self.causal).tril(1)  # BUG: the next token kept


class OffByOneNoGenerateGPT(NoGenerateGPT):
    attention = OffByOneMaskAttention


class StaleReadAttention(CachedAttention):
    """Keys and values read from the cache before this chunk's are written into it."""

    def update(self, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[torch.Tensor, ...]:
        B, _, T, _ = k.shape
        read = [c[:B, :, : start + T].to(k.dtype).clone() for c in (self.cache_k, self.cache_v)]
        super().update(k, v, start)
        return tuple(read)


class StaleReadStartPosGPT(StartPosGPT):
    attention = StaleReadAttention


class RollingAttention(CachedAttention):
    """A sliding window of ``sliding_window`` keys whose cache is a rolling buffer of that many
    slots, position p in slot p % sliding_window, read back by that rule (Mistral's reference
    ``RotatingBufferCache``)."""

    sliding_window = 4

    def make_cache(self, batch: int, length: int) -> None:
        super().make_cache(batch, self.sliding_window)

    def slots(self, positions: torch.Tensor) -> torch.Tensor:
        return positions % self.sliding_window

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        B, T = x.shape[:2]
        W = self.sliding_window
        q, k, v = self.heads(x)  # (B, h, T, d)
        held = start - 1 - (start - 1 - torch.arange(W)) % W  # (W,) the position slot j holds
        keys = torch.cat([self.cache_k[:B].to(k.dtype), k], dim=2)  # (B, h, W + T, d)
        values = torch.cat([self.cache_v[:B].to(v.dtype), v], dim=2)
        positions = torch.arange(start, start + T)  # (T,)
        ago = positions[:, None] - torch.cat([held, positions])[None, :]  # (T, W + T)
        blocked = (ago < 0) | (ago >= W) | (torch.cat([held, positions]) < 0)[None, :]
        att = self.scores(q, keys).masked_fill(blocked, float("-inf"))
        last = positions[-W:]  # the chunk's last window of tokens stays
        self.cache_k = self.cache_k.to(k.dtype)
        self.cache_v = self.cache_v.to(v.dtype)
        self.cache_k[:B, :, self.slots(last)] = k[:, :, -len(last) :]
        self.cache_v[:B, :, self.slots(last)] = v[:, :, -len(last) :]
        return self.merge(F.softmax(att, dim=-1) @ values)


class RollingStartPosGPT(StartPosGPT):
    attention = RollingAttention


class InOrderRollingAttention(RollingAttention):
    """A prefill longer than the window written to slots 0, 1, ... in order, not at p % window:
    the next token overwrites a key still in its window (the wrap-around bug of rolling caches,
    mistralai/mistral-inference#135's kind)."""

    def slots(self, positions: torch.Tensor) -> torch.Tensor:
        if len(positions) == 1:
            return positions % self.sliding_window
        return torch.arange(len(positions))


class InOrderRollingStartPosGPT(StartPosGPT):
    attention = InOrderRollingAttention


class RotaryRollingAttention(RollingAttention):
    """The rolling cache with rotary positions, keys cached rotated (Mistral's reference)."""

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        self.start = start
        return super().forward(x, start)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v = super().heads(x)  # (B, h, T, d)
        d = q.shape[-1]
        positions = torch.arange(self.start, self.start + x.shape[1]).double()  # (T,)
        angles = positions[:, None] * 10000.0 ** -(torch.arange(0, d, 2).double() / d)
        cos, sin = (torch.cat([f(angles)] * 2, dim=-1).to(q.dtype) for f in (torch.cos, torch.sin))
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v


class RollingPositionsGPT(StartPosGPT):
    """Mistral's reference interface: ``forward(input_ids, positions)``, the rolling cache
    written and read at the positions given, rotary positions."""

    attention = RotaryRollingAttention

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return StartPosGPT.forward.__wrapped__(self, input_ids, int(positions.flatten()[0]))


class PropertyLengthInputPosGPT(InputPosGPT):
    """litgpt's ``max_seq_length``: a property whose setter rebuilds the rope cache, so a
    negative length raises (``torch.arange(-1)``)."""

    def __init__(self, config: GPTConfig):
        GPT.__init__(self, config)
        self.max_batch_size, self._max_seq_length = -1, 0

    @property
    def max_seq_length(self) -> int:
        return self._max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        torch.arange(value)  # the rope cache rebuilt: raises for a negative length
        self._max_seq_length = value


class SharedBucketAttention(SelfAttention):
    """T5's design across layers: only the first holds ``relative_attention_bias``; it hands
    the bias it computed to the later ones, all unscaled."""

    def __init__(self, config: GPTConfig, first: bool = True):
        super().__init__(config)
        if first:
            self.relative_attention_bias = nn.Embedding(2 * config.block_size, config.n_head)

    def forward(self, x: torch.Tensor, position_bias: torch.Tensor | None = None):
        T = x.shape[1]
        if position_bias is None:
            distance = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # (T, T)
            position_bias = self.relative_attention_bias(distance + T).permute(2, 0, 1)
        q, k, v = self.heads(x)  # (B, h, T, d)
        att = (q @ k.transpose(-2, -1) + position_bias).masked_fill(~self.causal[:T, :T], -math.inf)
        return self.merge(F.softmax(att, dim=-1) @ v), position_bias


class SharedBucketGPT(GPT):
    def __init__(self, config: GPTConfig):
        super().__init__(config)
        for i, block in enumerate(self.h):
            block.attn = SharedBucketAttention(config, first=i == 0)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x, bias = self.wte(idx), None  # (B, T, C): positions from the bucket bias only
        for block in self.h:
            out, bias = block.attn(block.ln_1(x), bias)
            x = x + out
            x = x + block.mlp(block.ln_2(x))
        return self.lm_head(self.ln_f(x))


class MHABlock(nn.Module):
    """A block on torch's nn.MultiheadAttention (its fused kernel in eval mode)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln = nn.LayerNorm(config.n_embd)
        self.mha = nn.MultiheadAttention(config.n_embd, config.n_head, batch_first=True)

    def blocked(self, T: int) -> torch.Tensor:
        return torch.ones(T, T, dtype=torch.bool).triu(1)  # True: may not attend (the future)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        out, _ = self.mha(h, h, h, attn_mask=self.blocked(x.shape[1]), need_weights=False)
        return x + out


class MHAGPT(GPT):
    block: type[nn.Module] = MHABlock

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        self.h = nn.ModuleList([self.block(config) for _ in self.h])


class DiagonalBlockedMHABlock(MHABlock):
    """The causal mask built with triu(diagonal=0): the diagonal blocked too, row 0 keyless."""

    def blocked(self, T: int) -> torch.Tensor:
        return torch.ones(T, T, dtype=torch.bool).triu(0)


class DiagonalBlockedMHAGPT(MHAGPT):
    block = DiagonalBlockedMHABlock


def rotate_half(t: torch.Tensor) -> torch.Tensor:
    first, second = t.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def rotary_tables(config: GPTConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (L, d) of every position of the context, halves layout."""
    d = config.n_embd // config.n_head
    inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2) / d)  # (d/2,)
    angles = torch.outer(torch.arange(config.block_size), inv_freq)  # (L, d/2)
    return angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)


class SplitRotaryAttention(SelfAttention):
    """Rotary positions from tables its model passes as two arguments (litgpt's cos, sin)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        q, k, v = self.heads(x)  # (B, h, T, d); cos, sin: (T, d)
        q, k = (t * cos + rotate_half(t) * sin for t in (q, k))
        att = self.scores(q, k).masked_fill(~self.causal[:T, :T], float("-inf"))
        return self.merge(F.softmax(att, dim=-1) @ v)


class SplitRotaryGPT(GPT):
    attention = SplitRotaryAttention

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        cos, sin = rotary_tables(config)  # (L, d) each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.wte(idx)  # (B, T, C): positions come from the rotary tables only
        for block in self.h:
            x = block(x, self.cos[:T], self.sin[:T])
        return self.lm_head(self.ln_f(x))


class KVCache:
    """Keys and values per layer, grown by update(); reset() empties it. A model that takes it
    makes none itself: ``forward(idx, cache=None)`` runs without."""

    def __init__(self):
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> tuple[torch.Tensor, ...]:
        if layer in self.keys:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def reset(self) -> None:
        self.keys, self.values = {}, {}


class PassedCacheAttention(SelfAttention):
    def forward(self, x: torch.Tensor, cache: KVCache | None, layer: int) -> torch.Tensor:
        T = x.shape[1]
        q, k, v = self.heads(x)  # (B, h, T, d)
        if cache is not None:
            k, v = cache.update(k, v, layer)  # (B, h, S, d)
        S = k.shape[2]
        att = self.scores(q, k).masked_fill(~self.causal[S - T : S, :S], float("-inf"))
        return self.merge(F.softmax(att, dim=-1) @ v)


class PassedCacheGPT(GPT):
    """A cache the caller makes and passes (GPT-J-style code), positions from its length."""

    attention = PassedCacheAttention

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        past = 0 if cache is None or not cache.keys else cache.keys[0].shape[2]
        pos = torch.arange(past, past + idx.shape[1], device=idx.device)  # (T,)
        x = self.wte(idx) + self.wpe(pos)
        for i, block in enumerate(self.h):
            x = block(x, cache, i)
        return self.lm_head(self.ln_f(x))


class RestartingPassedCacheGPT(PassedCacheGPT):
    """Positions counted from 0 in every call, whatever the cache holds."""

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        return super().forward(idx, None if cache is None else _Fresh(cache))


class _Fresh:
    """The cache as the forward's position count sees it: empty (its keys hidden)."""

    def __init__(self, cache: KVCache):
        self.cache, self.keys = cache, {}

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> tuple[torch.Tensor, ...]:
        return self.cache.update(k, v, layer)


class BucketAttention(SelfAttention):
    """T5's design: scores unscaled, plus a learned bias per head for each clipped distance."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        self.relative_attention_bias = nn.Embedding(2 * config.block_size, config.n_head)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        T = q.shape[2]
        distance = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # (T, T): key - query
        bias = self.relative_attention_bias(distance + T).permute(2, 0, 1)  # (h, T, T)
        return q @ k.transpose(-2, -1) + bias  # no 1/sqrt(d): T5 folds it into the init


class BucketGPT(GPT):
    attention = BucketAttention

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)  # (B, T, C): positions come from the bucket bias only
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class HandedBiasAttention(SelfAttention):
    """ALiBi's way: its model hands it a bias per head and distance to add to its scores."""

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        q, k, v = self.heads(x)  # (B, h, T, d); bias: (h, T, T)
        att = (self.scores(q, k) + bias).masked_fill(~self.causal[:T, :T], float("-inf"))
        return self.merge(F.softmax(att, dim=-1) @ v)


class HandedBiasGPT(GPT):
    attention = HandedBiasAttention

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        slopes = 2.0 ** -torch.arange(1, config.n_head + 1)  # (h,)
        self.register_buffer("slopes", slopes, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        distance = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # (T, T): key - query
        bias = self.slopes[:, None, None] * distance.clamp(max=0)  # (h, T, T)
        x = self.wte(idx)  # (B, T, C): positions come from the bias only
        for block in self.h:
            x = block(x, bias)
        return self.lm_head(self.ln_f(x))


class OverDAttention(HandedBiasAttention):
    """The scale 1/d instead of 1/sqrt(d)."""

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return q @ k.transpose(-2, -1) / q.size(-1)


class OverDGPT(HandedBiasGPT):
    attention = OverDAttention


class PaddingAttention(SelfAttention):
    """Causal, with a key padding mask (B, T), 1 for a real token; a query with no allowed key
    (a left padding token) gets a uniform row, not NaN."""

    def blocked(self, allowed: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        return att.masked_fill(~allowed, torch.finfo(att.dtype).min)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        q, k, v = self.heads(x)  # (B, h, T, d)
        allowed = self.causal[:T, :T] & keep[:, None, None, :].bool()  # (B, 1, T, T)
        return self.merge(F.softmax(self.blocked(allowed, self.scores(q, k)), dim=-1) @ v)


class ArangePaddedGPT(GPT):
    """OPT's interface, ``forward(input_ids, attention_mask)`` and no position ids, with its
    learned positions counted from the first token, padding included: wrong under left
    padding."""

    attention = PaddingAttention

    def positions(self, keep: torch.Tensor) -> torch.Tensor:
        return torch.arange(keep.shape[1], device=keep.device).expand_as(keep)  # (B, T)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        keep = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        x = self.wte(input_ids) + self.wpe(self.positions(keep))  # (B, T, C)
        for block in self.h:
            x = block(x, keep)
        return self.lm_head(self.ln_f(x))


class CountedPaddedGPT(ArangePaddedGPT):
    """OPT's own positions: counted from the first real token (the mask's cumulative sum)."""

    def positions(self, keep: torch.Tensor) -> torch.Tensor:
        return (keep.cumsum(-1) - 1).clamp(min=0)


class TwiceMaskedAttention(PaddingAttention):
    """An additive mask of finfo.min added twice: -inf, so a row with no allowed key is NaN."""

    def blocked(self, allowed: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        bias = (~allowed).to(att.dtype) * torch.finfo(att.dtype).min
        return att + bias + bias


class TwiceMaskedGPT(CountedPaddedGPT):
    attention = TwiceMaskedAttention


class BufferRotaryAttention(SelfAttention):
    """Rotary positions from (cos, sin) tables its model passes, (B, T, d)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        q, k, v = self.heads(x)  # (B, h, T, d)
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d)
        q, k = (t * cos + rotate_half(t) * sin for t in (q, k))
        att = self.scores(q, k).masked_fill(~self.causal[:T, :T], float("-inf"))
        return self.merge(F.softmax(att, dim=-1) @ v)


class BufferRotaryGPT(GPT):
    """transformers' rotary as many copy it: angles from position ids and an ``inv_freq``
    buffer, in that buffer's dtype (bfloat16 after ``.to(torch.bfloat16)``, float32 under
    autocast)."""

    attention = BufferRotaryAttention

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        d = config.n_embd // config.n_head
        inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)  # (d/2,)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, idx: torch.Tensor, position_ids: torch.Tensor | None = None):
        if position_ids is None:
            position_ids = torch.arange(idx.shape[1], device=idx.device)[None]  # (1, T)
        angles = position_ids[..., None].to(self.inv_freq.dtype) * self.inv_freq  # (B, T, d/2)
        angles = torch.cat([angles, angles], dim=-1)  # (B, T, d)
        x = self.wte(idx)  # (B, T, C)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for block in self.h:
            x = block(x, cos.expand(idx.shape[0], -1, -1), sin.expand(idx.shape[0], -1, -1))
        return self.lm_head(self.ln_f(x))


class ReadBeforeWriteAttention(CachedAttention):
    """A prompt attends to its own keys; a later chunk reads the cache before writing its own
    keys there, so it attends to whatever those slots held (zeros, or an earlier prompt's)."""

    def update(self, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[torch.Tensor, ...]:
        if start == 0:
            super().update(k, v, start)
            return k, v
        B, _, T, _ = k.shape
        read = [c[:B, :, : start + T].to(k.dtype).clone() for c in (self.cache_k, self.cache_v)]
        super().update(k, v, start)
        return tuple(read)


class ReadBeforeWriteStartPosGPT(StartPosGPT):
    attention = ReadBeforeWriteAttention


class RotaryCachedAttention(CachedAttention):
    """Meta's Llama's attention: rotary from the (T, d) tables its model slices for this call,
    keys and values kept inside."""

    def allowed(self, start: int, T: int) -> torch.Tensor:
        return self.causal[start : start + T, : start + T]  # (T, start + T)

    def forward(self, x: torch.Tensor, start: int, cos: torch.Tensor, sin: torch.Tensor):
        q, k, v = self.heads(x)  # (B, h, T, d)
        q, k = (t * cos + rotate_half(t) * sin for t in (q, k))
        keys, values = self.update(k, v, start)  # (B, h, start + T, d)
        att = self.scores(q, keys).masked_fill(~self.allowed(start, x.shape[1]), float("-inf"))
        return self.merge(F.softmax(att, dim=-1) @ values)


class RotaryStartPosGPT(StartPosGPT):
    """``forward(tokens, start_pos)`` handing its layers the rotary rows of this call."""

    attention = RotaryCachedAttention

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        cos, sin = rotary_tables(config)  # (L, d) each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def rows(self, start: int, T: int) -> slice:
        return slice(start, start + T)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start_pos: int) -> torch.Tensor:
        rows = self.rows(start_pos, tokens.shape[1])
        x = self.wte(tokens)  # (B, T, C)
        for block in self.h:
            x = block(x, start_pos, self.cos[rows], self.sin[rows])
        return self.lm_head(self.ln_f(x)).float()


class RestartingRotaryStartPosGPT(RotaryStartPosGPT):
    """The rotary rows of positions 0..T-1 on every call (start_pos forgotten there)."""

    def rows(self, start: int, T: int) -> slice:
        return slice(0, T)


class LeftOutAttention(RotaryCachedAttention):
    """A later chunk attends to the cache before its own keys: the current tokens left out."""

    def update(self, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[torch.Tensor, ...]:
        keys, values = super().update(k, v, start)
        return (k, v) if start == 0 else (keys[:, :, :start], values[:, :, :start])

    def allowed(self, start: int, T: int) -> torch.Tensor:
        return super().allowed(start, T)[:, : max(start, T)]


class LeftOutRotaryStartPosGPT(RotaryStartPosGPT):
    attention = LeftOutAttention


class TopLeftAttention(RotaryCachedAttention):
    """The causal mask anchored top-left: a chunk's rows start at key 0's row."""

    def allowed(self, start: int, T: int) -> torch.Tensor:
        return self.causal[:T, : start + T]


class TopLeftRotaryStartPosGPT(RotaryStartPosGPT):
    attention = TopLeftAttention


class InvertedPaddingAttention(PaddingAttention):
    """The model's keep-mask read as a blocked-is-True mask: it attends to the padding only."""

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return super().forward(x, 1 - keep)


class InvertedPaddingGPT(CountedPaddedGPT):
    attention = InvertedPaddingAttention


class SoftmaxlessAttention(SelfAttention):
    """Its mask and its softmax both dropped (the lines deleted together): no softmax runs, so
    no layer is found as attention; its class name and causal buffer still say causal."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.heads(x)  # (B, h, T, d)
        return self.merge(self.scores(q, k) @ v)


class CausalSelfAttentionWithoutSoftmax(SoftmaxlessAttention):
    pass


class SoftmaxlessNoGenerateGPT(NoGenerateGPT):
    attention = CausalSelfAttentionWithoutSoftmax


class ChunkTopLeftAttention(RotaryCachedAttention):
    """Meta's Llama's masking: none for one token; for a chunk, anchored top-left (wrong)."""

    def allowed(self, start: int, T: int) -> torch.Tensor:
        return super().allowed(start, T) if T == 1 else self.causal[:T, : start + T]


class ChunkTopLeftRotaryStartPosGPT(RotaryStartPosGPT):
    attention = ChunkTopLeftAttention


class DeviceSecondInputPosGPT(InputPosGPT):
    """litgpt's older ``set_kv_cache(batch_size, device=None, dtype=None)``: the length is the
    model's own ``max_seq_length``; a length passed second would be taken for the device."""

    setup_caches = None  # it has set_kv_cache instead

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        self.max_seq_length = config.block_size

    def set_kv_cache(self, batch_size: int, device: torch.device | None = None, dtype=None):
        torch.empty(0, device=device)  # a length here raises, as litgpt's would
        self.max_batch_size = batch_size
        for block in self.h:
            block.attn.make_cache(batch_size, self.max_seq_length)


class MaskFreeCachedAttention(PassedCacheAttention):
    """The causal mask dropped where it was built inline: no mask buffer, no causal name."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        del self.causal

    def forward(self, x: torch.Tensor, cache: KVCache | None, layer: int) -> torch.Tensor:
        q, k, v = self.heads(x)  # (B, h, T, d)
        if cache is not None:
            k, v = cache.update(k, v, layer)  # (B, h, S, d)
        return self.merge(F.softmax(self.scores(q, k), dim=-1) @ v)


class MaskFreeCachedGPT(PassedCacheGPT):
    """No generate(): only its cache argument says it is a decoder."""

    attention = MaskFreeCachedAttention
    generate = None


def turn(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Each pair (i, i + d/2) of t turned by the angles of its row (a name that says nothing)."""
    return t * cos + rotate_half(t) * sin


class SlotCache(nn.Module):
    """litgpt's KVCache: buffers written at the positions given, read back whole."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.register_buffer("k", torch.zeros(shape), persistent=False)
        self.register_buffer("v", torch.zeros(shape), persistent=False)

    def forward(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        self.k, self.v = self.k.to(k.dtype), self.v.to(v.dtype)
        return self.k.index_copy_(2, input_pos, k), self.v.index_copy_(2, input_pos, v)


class HandedTablesAttention(SelfAttention):
    """litgpt's attention: ``forward(x, cos, sin, mask, input_pos)``, the tables and the mask
    rows its model selects, a cache module inside once its model makes one; SDPA does the rest."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        del self.causal  # SDPA's is_causal, or the mask rows handed in
        self.kv_cache: SlotCache | None = None

    def attend(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)

    def forward(self, x, cos, sin, mask=None, input_pos=None):
        q, k, v = self.heads(x)  # (B, h, T, d); cos, sin: (T, d)
        q, k = turn(q, cos, sin), turn(k, cos, sin)
        if input_pos is not None:
            k, v = self.kv_cache(input_pos, k, v)  # (B, h, L, d)
        return self.merge(self.attend(q, k, v, mask))


class LitConfig:
    """A plain config class whose head size is derived, not taken (litgpt computes its own)."""

    def __init__(self, block_size=64, vocab_size=256, n_layer=2, n_head=4, n_embd=64):
        self.block_size, self.vocab_size, self.n_layer = block_size, vocab_size, n_layer
        self.n_head, self.n_embd = n_head, n_embd
        self.head_size = n_embd // n_head


class HandedTablesGPT(GPT):
    """litgpt's interface: ``set_kv_cache(batch_size)``, then ``forward(idx, input_pos)``; the
    rotary tables (made for every position, no name saying so) and the causal mask rows of the
    positions fed are selected by the model and handed to every layer."""

    attention = HandedTablesAttention

    def __init__(self, config: LitConfig):
        super().__init__(config)
        del self.wpe  # positions come from the tables only
        cos, sin = rotary_tables(config)  # (L, d) each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.max_seq_length = config.block_size
        self.mask_cache: torch.Tensor | None = None

    def set_kv_cache(self, batch_size: int, device=None, dtype=None) -> None:
        L, h = self.max_seq_length, self.config.n_head
        for block in self.h:
            shape = (batch_size, h, L, self.config.n_embd // h)
            block.attn.kv_cache = SlotCache(shape).to(device=device, dtype=dtype)
        self.mask_cache = torch.ones(L, L, dtype=torch.bool, device=device).tril()[None, None]

    def forward(self, idx: torch.Tensor, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        T = idx.shape[1]
        if input_pos is None:
            cos, sin, mask = self.cos[:T], self.sin[:T], None
        else:
            cos, sin = self.cos.index_select(0, input_pos), self.sin.index_select(0, input_pos)
            mask = self.mask_cache.index_select(2, input_pos)  # (1, 1, T, L)
        x = self.wte(idx)  # (B, T, C)
        for block in self.h:
            x = block(x, cos, sin, mask, input_pos)
        return self.lm_head(self.ln_f(x))


class TwiceScaledHandedTablesAttention(HandedTablesAttention):
    """q scaled by 1/sqrt(d) before SDPA scales it again (its default scale)."""

    def attend(self, q, k, v, mask):
        return super().attend(q / math.sqrt(q.size(-1)), k, v, mask)


class TwiceScaledHandedTablesGPT(HandedTablesGPT):
    attention = TwiceScaledHandedTablesAttention


class MaskFreeSlotAttention(CachedAttention):
    """gpt-fast's attention with its mask dropped: no mask buffer, no causal name."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        del self.causal

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        q, k, v = self.heads(x)  # (B, h, T, d)
        keys, values = self.update(k, v, start)  # (B, h, start + T, d)
        return self.merge(F.softmax(self.scores(q, keys), dim=-1) @ values)


class MaskFreeInputPosGPT(InputPosGPT):
    """No generate(): only the cache it makes (setup_caches) says it is a decoder."""

    attention = MaskFreeSlotAttention
    generate = None


class TablePositionsAttention(SelfAttention):
    """Causal by SDPA's flag: no mask buffer that would tell the context."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        del self.causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.heads(x)  # (B, h, T, d)
        return self.merge(F.scaled_dot_product_attention(q, k, v, is_causal=True))


class TablePositionsGPT(GPT):
    """Built from keyword sizes and keeping no config: its context is its position table's rows
    (32, shorter than the doctor's usual probes)."""

    attention = TablePositionsAttention
    generate = None

    def __init__(self, vocab_size=256, block_size=32, n_embd=64, n_head=4, n_layer=2):
        super().__init__(GPTConfig(block_size, vocab_size, n_layer, n_head, n_embd))
        del self.config  # its sizes live in its modules only


class OverriddenPositionsGPT(RestartingPassedCacheGPT):
    """Takes position ids and rebuilds them as 0..T-1 on every call, whatever it is given:
    under its cache, positions restart."""

    def forward(self, idx, cache=None, position_ids=None):
        return super().forward(idx, cache)


def rotate(t: torch.Tensor, speed: float) -> torch.Tensor:
    """Rotary on (N, T, d), the positions counted ``speed`` times as fast: a scaled rotary that
    SDPA with standard RoPE does not reproduce."""
    T, d = t.shape[-2:]
    angles = torch.arange(T)[:, None] * speed * 10000 ** (-torch.arange(0, d, 2) / d)  # (T, d/2)
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)  # (T, d)
    first, second = t.chunk(2, dim=-1)
    return t * cos + torch.cat([-second, first], dim=-1) * sin


class SequenceFirstAttention(nn.Module):
    """Attention on (T, B, C) hidden states, as fairseq's and ESM's layers take them, with an
    additive (T, T) mask its model hands it and ``scaling`` kept as its own attribute, as
    fair-esm's. ``scaled=False`` drops the multiplication; ``scaling=1.0`` sets the attribute
    to 1 (fair-esm's scaling set to 1); ``speed``: scaled rotary on q and k."""

    def __init__(self, config: GPTConfig, scaled: bool = True, scaling: float | None = None,
                 speed: float | None = None):  # fmt: skip
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.out = nn.Linear(config.n_embd, config.n_embd)
        self.scaling = scaling or (config.n_embd // config.n_head) ** -0.5
        self.scaled, self.speed = scaled, speed

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        T, B, C = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # (T, B, C) each
        q, k, v = (t.reshape(T, B * self.n_head, -1).transpose(0, 1) for t in (q, k, v))
        if self.speed is not None:
            q, k = rotate(q, self.speed), rotate(k, self.speed)  # (B h, T, d)
        if self.scaled:
            q = q * self.scaling
        scores = q @ k.transpose(1, 2)  # (B h, T, T)
        if mask is not None:
            scores = scores + mask
        y = F.softmax(scores, dim=-1) @ v  # (B h, T, d)
        return self.out(y.transpose(0, 1).reshape(T, B, C))


class SequenceFirstBlock(nn.Module):
    def __init__(self, config: GPTConfig, attention: nn.Module):
        super().__init__()
        self.ln = nn.LayerNorm(config.n_embd)
        self.attn = attention

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return x + self.attn(self.ln(x), mask)


class SequenceFirstLM(nn.Module):
    """A decoder whose blocks take (T, B, C), its causal mask an additive buffer it registers
    (-inf above the diagonal, as Whisper's decoder keeps it); no generate(), nothing named
    causal. ``masked=False``: its layers never get the mask (causal_leak); the rest goes to
    each layer (``SequenceFirstAttention``)."""

    def __init__(self, config: GPTConfig, masked: bool = True, **layer: object):
        super().__init__()
        self.masked = masked
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(
            SequenceFirstBlock(config, SequenceFirstAttention(config, **layer))  # type: ignore[arg-type]
            for _ in range(config.n_layer)
        )
        self.head = nn.Linear(config.n_embd, config.vocab_size)
        mask = torch.full((config.block_size, config.block_size), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        T = idx.shape[1]
        x = (self.wte(idx) + self.wpe(torch.arange(T))).transpose(0, 1)  # (T, B, C)
        mask = self.mask[:T, :T] if self.masked else None
        for block in self.blocks:
            x = block(x, mask)
        return {"logits": self.head(x.transpose(0, 1))}  # a dict, as fair-esm returns


class ShortPositionsGPT(GPT):
    """Its learned positions a bare parameter of 16 rows (open_clip's positional_embedding is
    one too), fewer than its config's block_size says: it cannot make 64 tokens for a layer."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        self.pos = nn.Parameter(torch.zeros(16, config.n_embd))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.pos[: idx.shape[1]]  # (B, T, C); T <= 16 only
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class BuiltMaskAttention(SelfAttention):
    """PaLM's way: the causal triangle built in each forward, no buffer, no flag; ``axis``:
    the softmax's (-2: over the queries, a student's slip)."""

    axis = -1

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        del self.causal  # nothing registered says it is causal: only what it computes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        q, k, v = self.heads(x)  # (B, h, T, d)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = self.scores(q, k).masked_fill(future, float("-inf"))
        return self.merge(F.softmax(att, dim=self.axis) @ v)


class BuiltMaskGPT(NoGenerateGPT):
    attention = BuiltMaskAttention


class QueriesSoftmaxAttention(BuiltMaskAttention):
    axis = -2


class QueriesSoftmaxGPT(NoGenerateGPT):
    attention = QueriesSoftmaxAttention


class HandedMaskAttention(SelfAttention):
    """A layer that takes its model's bool mask (True: attend) and hands it to SDPA;
    ``inverted``: handed over the other way round (True where blocked, speechbrain's
    ``masks_union`` left uninverted)."""

    inverted = False

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        del self.causal  # nothing registered: its model's mask is all there is

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        q, k, v = self.heads(x)  # (B, h, T, d)
        mask = ~allowed if self.inverted else allowed
        return self.merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


class HandedMaskGPT(NoGenerateGPT):
    """A decoder that says nothing of its causality but the mask it hands its layers."""

    attention = HandedMaskAttention

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))  # (B, T, C)
        allowed = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
        for block in self.h:
            x = block(x, allowed)
        return self.lm_head(self.ln_f(x))


class InvertedHandedMaskAttention(HandedMaskAttention):
    inverted = True


class InvertedHandedMaskGPT(HandedMaskGPT):
    attention = InvertedHandedMaskAttention


class OffsetPositionsGPT(GPT):
    """fairseq's learned positions, numbered from its padding index + 1 (2): a table of
    block_size entries holds two tokens fewer, and more raise IndexError in the embedding."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device) + 2  # (T,)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, vocab)
