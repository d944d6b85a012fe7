"""How a module is called on one draw: the whole sequence at once, or as generation calls it.

Modern pairs follow the extended contract ``forward(x, mask=None, *, positions=None,
cache=None)``: positions ``(B, T)`` integers (the module's default is the cached length plus
``arange(T)``), and a cache object the module updates in place (``reset()``, ``len(cache)`` is
the cached length). A scenario says how the harness feeds one draw through that contract:

- ``full``: the whole sequence in one call;
- ``decode``: prefill the first half, then one token per call through a fresh cache;
- ``chunked``: prefill in chunks of ``CHUNK`` tokens through a fresh cache;
- ``reuse``: decode another prompt first, ``reset()`` the cache, then decode this one;
- ``long``: one call with positions starting at ``LONG_OFFSET`` instead of 0;
- ``packed``: one call on two documents packed in each row, positions restarting at each.

A stepwise call returns the steps' outputs concatenated along the sequence, so every scenario
gives one ``(B, T, d)`` output that the full forward of the fixed module should reproduce.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from harness.masks import MaskSpec, encode
from harness.runner import split_output

CHUNK = 3  # tokens per call in chunked prefill
LONG_OFFSET = 100_000  # first position of the "long" scenario


@dataclass(frozen=True)
class Scenario:
    """One way of calling a module on a draw."""

    name: str
    description: str  # for the report: "prefill 4 tokens, then one token per call"
    steps: str = "full"  # "full" (one call), "decode" or "chunked" (through a cache)
    reuse: bool = False  # decode another prompt first and reset the cache
    positions: str = "default"  # "default" (the module's own), "long" or "packed"

    @property
    def cached(self) -> bool:
        """Whether the module is called through a cache."""
        return self.steps != "full"


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("full", "the whole sequence in one call"),
        Scenario("decode", "prefill the first half, then one token per call", steps="decode"),
        Scenario("chunked", f"prefill in chunks of {CHUNK} tokens", steps="chunked"),
        Scenario(
            "reuse",
            "decode another prompt, reset the cache, then decode this one",
            steps="decode",
            reuse=True,
        ),
        Scenario("long", f"positions start at {LONG_OFFSET:,} instead of 0", positions="long"),
        Scenario(
            "packed",
            "two documents packed in each row, positions restarting at the second",
            positions="packed",
        ),
    )
}


def bounds(steps: str, seq_len: int) -> list[tuple[int, int]]:
    """The ``[t0, t1)`` slices fed per call: one for ``full``; for ``decode`` the first half
    (at least one token) then one token each; for ``chunked`` ``CHUNK`` tokens each."""
    if steps == "full":
        return [(0, seq_len)]
    if steps == "decode":
        prefill = max(1, seq_len // 2)
        return [(0, prefill)] + [(t, t + 1) for t in range(prefill, seq_len)]
    if steps == "chunked":
        return [(t, min(t + CHUNK, seq_len)) for t in range(0, seq_len, CHUNK)]
    raise ValueError(f"unknown steps {steps!r}")


def document_starts(batch: int, seq_len: int, gen: torch.Generator) -> Tensor:
    """(B,) where the second packed document of each row starts, drawn from 2..T-2."""
    if seq_len < 4:
        return torch.full((batch,), seq_len)  # too short to pack two documents
    return torch.randint(2, seq_len - 1, (batch,), generator=gen)


def positions_for(
    scenario: Scenario, batch: int, seq_len: int, gen: torch.Generator
) -> Tensor | None:
    """(B, T) positions the scenario passes, or None where the module picks its own."""
    if scenario.positions == "default":
        return None
    arange = torch.arange(seq_len).expand(batch, seq_len)  # (B, T)
    if scenario.positions == "long":
        return arange + LONG_OFFSET
    if scenario.positions == "packed":
        starts = document_starts(batch, seq_len, gen)[:, None]  # (B, 1)
        return torch.where(arange >= starts, arange - starts, arange)  # restart at the second
    raise ValueError(f"unknown positions {scenario.positions!r}")


def other_prompt(x: Tensor) -> Tensor:
    """The prompt a reused cache held before: the same tokens in reverse order."""
    return x.flip(1)


Call = Callable[[nn.Module, Tensor], object]
# How one call reaches a module: (module, x, mask, positions, cache, start) -> what forward
# returns. ``start`` is the number of tokens already cached (the first position of x).
Invoke = Callable[[nn.Module, Tensor, Tensor | None, Tensor | None, object, int], object]


def contract_invoke(
    module: nn.Module,
    x: Tensor,
    mask: Tensor | None,
    positions: Tensor | None,
    cache: object,
    start: int,
) -> object:
    """The extended contract: ``module(x, mask, positions=..., cache=...)``, each keyword passed
    only when there is something to pass."""
    kwargs: dict[str, object] = {} if cache is None else {"cache": cache}
    if positions is not None:
        kwargs["positions"] = positions
    return module(x, mask, **kwargs)


def make_call(
    scenario: Scenario,
    keep: Tensor | None,
    spec: MaskSpec | None,
    positions: Tensor | None,
    new_cache: Callable[[], object] | None,
    invoke: Invoke = contract_invoke,
) -> Call:
    """``(module, x) -> (output, weights)`` feeding ``x`` as ``scenario`` says.

    ``keep`` is the (B, T, T) keep-mask of the whole sequence (each call gets its rows and the
    keys seen so far, encoded as ``spec`` says); ``new_cache`` makes an empty cache for a cached
    scenario; ``invoke`` makes each call (default: the extended contract). Stepwise weights are
    laid out in one (..., T, T) tensor, or None when a step's keys are not the tokens seen so far.
    """
    if scenario.cached and new_cache is None:
        raise ValueError(f"scenario {scenario.name!r} needs a cache and the module has none")

    def one_call(module: nn.Module, x: Tensor, t0: int, t1: int, cache: object) -> object:
        mask = None if keep is None else encode(keep[:, t0:t1, :t1], spec, x.device, x.dtype)
        step_positions = None if positions is None else positions[:, t0:t1].to(x.device)
        step = x[:, t0:t1].contiguous()  # as a caller's new tokens are
        return invoke(module, step, mask, step_positions, cache, t0)

    def steps(module: nn.Module, x: Tensor, cache: object) -> tuple[Tensor, Tensor | None]:
        outputs, weights = [], []
        for t0, t1 in bounds(scenario.steps, x.size(1)):
            out, w = split_output(one_call(module, x, t0, t1, cache))
            outputs.append(out)
            weights.append((t0, t1, w))
        return torch.cat(outputs, dim=1), lay_out(weights, x.size(1))

    def call(module: nn.Module, x: Tensor) -> tuple[Tensor, Tensor | None]:
        if not scenario.cached:
            return split_output(one_call(module, x, 0, x.size(1), None))
        cache = new_cache()
        if scenario.reuse:
            with torch.no_grad():
                steps(module, other_prompt(x), cache)
            cache.reset()
        return steps(module, x, cache)

    return call


def lay_out(steps: list[tuple[int, int, Tensor | None]], seq_len: int) -> Tensor | None:
    """Each step's (..., t1 - t0, t1) weights in their rows of one (..., T, T) tensor; None when
    a step has no weights or its keys are not exactly the t1 tokens seen so far."""
    if any(w is None or w.size(-1) != t1 for _, t1, w in steps):
        return None
    first = steps[0][2]
    full = first.new_zeros(*first.shape[:-2], seq_len, seq_len)  # (..., T, T)
    with torch.no_grad():
        for t0, t1, w in steps:
            full[..., t0:t1, :t1] = w.detach()
    return full
