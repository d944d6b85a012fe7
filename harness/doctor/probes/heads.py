"""Grouped-query heads: each K/V head serves exactly its own block of query heads.

Followed through the module's own layers: the values of one K/V head are doubled (a hook on the
value projection) and the query heads whose part of the output projection's input moves are
the ones that read it. Query head i must read K/V head i // n_rep (``repeat_interleave``, as
every grouped checkpoint is laid out); tiling (``repeat``) makes it read i % n_kv_heads.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from harness.doctor.findings import Outcome, failed, passed, skipped, warned
from harness.doctor.probes.registry import probe
from harness.doctor.subject import Subject
from harness.reference import SEPARATE, by_role, head_count, output_name

MOVED = 1e-9  # relative change that is not rounding (float64)


def _projections(module: nn.Module) -> tuple[nn.Linear, nn.Linear, nn.Linear] | None:
    """The query, value and output projections as nn.Linear layers, or None: under the common
    names, or by what their names say (``reference.by_role``, ``reference.output_name``)."""
    linears = {n: m for n, m in module.named_children() if isinstance(m, nn.Linear)}
    out = output_name(linears)
    for names in (*SEPARATE, by_role(linears)):
        if names and out is not None and names[0] in linears and names[2] in linears:
            return linears[names[0]], linears[names[2]], linears[out]
    return None


def reached(module: nn.Module, call, v_proj: nn.Linear, out_proj: nn.Module, heads: int,
            kv_head: int, d_head: int, width: int | None = None) -> set[int]:  # fmt: skip
    """The query heads whose output moves when K/V head ``kv_head``'s values are doubled, read
    at the input of ``out_proj`` (the output projection, or a norm before it, whose input must
    be ``width`` wide: all heads side by side, as the output projection takes them)."""
    seen: list[Tensor] = []

    def capture(_module: nn.Module, args: tuple) -> None:
        seen.append(args[0].detach().double())

    def double(_module: nn.Module, _args: tuple, output: Tensor) -> Tensor:
        output = output.clone()
        output[..., kv_head * d_head : (kv_head + 1) * d_head] *= 2.0
        return output

    hooks = [out_proj.register_forward_pre_hook(capture)]
    try:
        call()
        hooks.append(v_proj.register_forward_hook(double))
        call()
    finally:
        for hook in hooks:
            hook.remove()
    if len(seen) != 2 or (width is not None and seen[0].shape[-1] != width):  # a qk-norm
        return set()  # not where the heads meet
    # (B T, h, d): whatever the positions' layout (packed sequences come in as (B T, h d))
    before, after = (t.reshape(-1, heads, t.shape[-1] // heads) for t in seen)
    change = (after - before).abs().amax(dim=(0, 2))  # (h,)
    scale = max(1.0, before.abs().max().item())
    return set((change > MOVED * scale).nonzero().flatten().tolist())


def _readers(module: nn.Module, out_proj: nn.Linear, width: int) -> list[nn.Module]:
    """Where the heads can be read, first that moves: the input of a norm as wide as all heads
    together (BitNet's attn_sub_norm, which mixes them before the output projection; nGPT's
    parameterless L2 norm there, as Dory's; a norm before the projections sees no value move),
    then the output projection's."""

    def all_heads_wide(m: nn.Module) -> bool:
        weight = getattr(m, "weight", None)
        if "Norm" not in type(m).__name__:
            return False
        return weight is None or (isinstance(weight, Tensor) and weight.numel() == width)

    return [*(m for m in module.children() if all_heads_wide(m)), out_proj]


@probe("grouped heads", compares=True)
def probe_grouped(subject: Subject) -> Outcome:
    """Each K/V head reaches exactly its own block of query heads: followed through the
    module's own projections, or where they are fused, read from the values the recorded
    forward's attention reads (which query heads share one copy)."""
    shared, keys = subject.reading.shared_values, subject.reading.shared_keys
    if shared is not None and keys is not None and keys != shared:
        return failed(
            f"the keys' copies are shared by query heads {_groups(keys)}, the values' by "
            f"{_groups(shared)} (as recorded): each query head must read one K/V head's keys "
            "and values (gqa_kv_grouping: the keys and values copied differently)",
            "gqa_kv_grouping",
        )
    module = subject.copy()
    found = _projections(module)
    if found is None:
        if shared is None:
            return skipped("no separate query, value and output projections to follow heads "
                           "through, and no K/V head copied in the recorded forward")  # fmt: skip
        reach = [set(s) for s in shared]
        return _judged(reach, sum(len(s) for s in reach), subject.kv_grouping, " (as recorded)")
    q_proj, v_proj, out_proj = found
    heads = head_count(module)
    d_head = q_proj.out_features // heads
    if v_proj.out_features % max(1, d_head):  # latent attention: values of their own width
        return skipped(f"the values ({v_proj.out_features} wide) are not whole heads of the "
                       f"queries' width ({d_head}): their heads are not followed")  # fmt: skip
    kv_heads = subject.config.kv_heads or v_proj.out_features // max(1, d_head)
    if kv_heads >= heads or heads % kv_heads:
        return skipped(f"{heads} query heads, {kv_heads} K/V heads: nothing is grouped")
    cfg = subject.config
    x = subject.x(cfg.batch, cfg.seq_len, 41)
    keep = subject.ordinary_keep(cfg.batch, cfg.seq_len)

    def call() -> None:
        with torch.no_grad():
            subject.call(module, x, keep)

    reach = [
        next((r for reader in _readers(module, out_proj, out_proj.in_features)
              if (r := reached(module, call, v_proj, reader, heads, j, d_head,
                               out_proj.in_features))), set())
        for j in range(kv_heads)
    ]  # fmt: skip
    return _judged(reach, heads, subject.kv_grouping)


def _groups(shared: list[frozenset[int]]) -> str:
    return "; ".join(", ".join(map(str, sorted(s))) for s in shared)


def _judged(found: list[set[int]], heads: int, declared: str, how: str = "") -> Outcome:
    """The verdict on the query heads each K/V head reaches (``found``, one set per K/V head),
    against the grouping declared (``blocks``, ``strided`` or ``auto``)."""
    kv_heads = len(found)
    n_rep = heads // kv_heads
    blocks = [set(range(j * n_rep, (j + 1) * n_rep)) for j in range(kv_heads)]
    strided = [set(range(j, heads, kv_heads)) for j in range(kv_heads)]
    if found == blocks and declared != "strided":
        return passed(f"each of {kv_heads} K/V heads reaches its own block of {n_rep} query "
                      f"heads{how}")  # fmt: skip
    if found == strided and declared != "blocks":
        words = (
            f"K/V head j reaches query heads j, j + {kv_heads}, ... (strided: repeat, not "
            f"repeat_interleave){how}"
        )
        if declared == "strided":
            return passed(words)
        return warned(
            f"{words}: sound for weights trained so (x-transformers lays heads out this way), "
            "wrong for checkpoints laid out in blocks (Llama, Mistral, Qwen: gqa_kv_grouping); "
            "declare --kv-grouping blocks or strided",
            "gqa_kv_grouping",
        )
    expected = strided if declared == "strided" else blocks
    j = next(j for j in range(kv_heads) if found[j] != expected[j])
    want = expected[j]
    why = (
        " (gqa_kv_grouping: K/V heads tiled with repeat)" if found == strided
        else " (gqa_kv_grouping: K/V heads copied in blocks, where strided is declared)"
        if found == blocks else ""
    )  # fmt: skip
    return failed(
        f"K/V head {j} reaches query heads {sorted(found[j])} instead of {sorted(want)}{how}{why}",
        *(("gqa_kv_grouping",) if why else ()),
    )
