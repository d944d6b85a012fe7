"""An independent reference: a module's own projections through F.scaled_dot_product_attention.

Projections are recognized by common attribute names (separate q/k/v, fused qkv, an output
projection), and only when they are all of the module's parameters.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness import metrics
from harness.runner import as_dtype, exact_float32, split_output

Kernel = Callable[..., Tensor]


def math_attention(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, scale_first: bool = False
) -> Tensor:
    """Textbook attention in the inputs' dtype: softmax(q k^T / sqrt(d)) v. ``scale_first``
    computes (q / sqrt(d)) k^T instead, as nn.MultiheadAttention does: in float16 its scores
    overflow only at sqrt(d) times larger products."""
    root_d = math.sqrt(q.size(-1))
    k_t = k.transpose(-2, -1)
    scores = (q / root_d) @ k_t if scale_first else q @ k_t / root_d  # (..., T, T)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return scores.softmax(dim=-1) @ v  # (..., T, d_v)


def softcapped(cap: float, after_mask: bool = False) -> Kernel:
    """Attention whose scores are capped as ``cap * tanh(scores / cap)`` before the mask, as
    Gemma2's: a kernel for ``attend``. ``after_mask``: the known bug of capping after a finite
    mask, which squashes the mask's fill to -cap, so masked keys get weight."""

    def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., T, T)
        if attn_mask is not None and after_mask:
            scores = scores.masked_fill(~attn_mask, torch.finfo(scores.dtype).min)
        scores = cap * torch.tanh(scores / cap)
        if attn_mask is not None and not after_mask:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        return scores.softmax(dim=-1) @ v

    return attention


def scaled_first_attention(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None
) -> Tensor:
    """``math_attention`` with the scale on q first."""
    return math_attention(q, k, v, attn_mask, scale_first=True)


# Projection names in common code: separate q/k/v, fused qkv, and the output projection.
SEPARATE = (
    ("W_q", "W_k", "W_v"),
    ("q_proj", "k_proj", "v_proj"),
    ("query", "key", "value"),
    ("to_q", "to_k", "to_v"),
    ("wq", "wk", "wv"),
    ("q", "k", "v"),
    ("Wq", "Wk", "Wv"),
    ("w_q", "w_k", "w_v"),
    ("q_lin", "k_lin", "v_lin"),
    ("linear_q", "linear_k", "linear_v"),
    ("query_proj", "key_proj", "value_proj"),
)
QUERY_AND_KV = (
    ("to_q", "to_kv"), ("q_proj", "kv_proj"), ("q", "kv"), ("query", "key_value"), ("wq", "wkv"),
    ("W_q", "W_kv"), ("q_lin", "kv_lin"), ("q_linear", "kv_linear"),
)  # fmt: skip
FUSED = (
    "c_attn",
    "qkv",
    "to_qkv",
    "W_qkv",
    "Wqkv",
    "wqkv",
    "w_qkv",
    "qkv_proj",
    "in_proj",
    "qkv_linear",
    "in_proj_qkv",
    "query_key_value",
    "Wqkv_proj",
    "attn",
)
OUTPUT = ("W_o", "w_o", "Wo", "wo", "o_proj", "out_proj", "c_proj", "to_out", "proj", "o", "out",
          "dense", "output", "fc_out", "linear_out", "out_linear")  # fmt: skip
HEAD_ATTRS = (
    "n_heads", "num_heads", "heads", "n_head", "nhead", "h", "num_attention_heads", "head_count",
    "n_heads_q", "num_head", "attention_heads", "n_local_heads",
)  # fmt: skip
HEAD_DIM_ATTRS = ("head_dim", "d_head", "dim_head", "head_size", "attention_head_size", "d_k")


_ABSENT = object()


def _read(owner: object, name: str) -> object:
    """``owner.name``, or _ABSENT where reading it raises (not only an AttributeError: a
    transformers config with per-layer values refuses a global ``head_dim``)."""
    try:
        return getattr(owner, name)
    except Exception:
        return _ABSENT


def int_attribute(
    module: nn.Module, names: tuple[str, ...], include_config: bool = True
) -> int | None:
    """The first positive int attribute under ``names``, of the module or else its ``config``.

    What the module says beats its config: when the module itself has any of ``names``, its
    answer stands, ``None`` included (a Gemma3 global layer's ``sliding_window = None`` under a
    config whose ``sliding_window`` is 4 has no window). ``include_config=False``: the module's
    own attributes only.
    """
    found = positive_attribute(module, names, include_config)
    return found if isinstance(found, int) else None


def positive_attribute(
    module: nn.Module, names: tuple[str, ...], include_config: bool = True, real: bool = False
) -> int | float | None:
    """``int_attribute``'s reading, of ints, or with ``real`` of any positive number (as a
    float): the module's answer under ``names`` stands when it has one, else its config's."""
    kinds = (int, float) if real else (int,)
    config = getattr(module, "config", None) if include_config else None
    for owner in (module, config):
        said = {name: _read(owner, name) for name in names if owner is not None}
        present = [name for name, value in said.items() if value is not _ABSENT]
        if owner is module and not present:
            continue  # the module says nothing: ask its config
        for name in present:
            value = said[name]
            if isinstance(value, kinds) and not isinstance(value, bool) and value > 0:
                return float(value) if real else value
        return None
    return None


def head_count(module: nn.Module) -> int:
    """The module's head count: an attribute under a common name, or its ``config``'s; else its
    first Linear's width over a head width it states; else 1."""
    heads = int_attribute(module, HEAD_ATTRS)
    if heads is not None:
        return heads
    head_dim = int_attribute(module, HEAD_DIM_ATTRS)
    linear = next((m for m in module.modules() if isinstance(m, nn.Linear)), None)
    if head_dim and linear is not None and linear.out_features % head_dim == 0:
        return linear.out_features // head_dim
    return 1


def is_mask(buffer: Tensor) -> bool:
    """A bool, 0/1 or 0/-inf buffer: a mask, which SDPA given the same mask reproduces."""
    if buffer.dtype == torch.bool or not buffer.is_floating_point():
        return True
    finite = buffer[torch.isfinite(buffer)]
    return bool(((finite == 0) | (finite == 1)).all()) and not bool((buffer == math.inf).any())


# The buffers of a rotary embedding (GPT-NeoX's cos_cached and sin_cached, inv_freq, Meta's
# freqs_cis): tables the reference reproduces with its own RoPE, not weights it would miss.
ROTARY_TABLE = re.compile(r"(?:^|\.)_?(?:cos|sin)(?:_cached)?$|inv_freq|freqs")
# Buffers that hold cached keys or values (Meta's cache_k, gpt-fast's and torchtune's k_cache),
# not a rotary table's "cache": keys written by the call itself, which SDPA on the same keys
# reproduces.
KV_BUFFER = re.compile(r"(cache_?(k|v|keys?|values?)|(k|v|kv|keys?|values?)_?cache)", re.I)
# Projections by what their names say, beyond the pairs above: an optional prefix (w_, fc_, to,
# linear_), the role in any of its spellings (q, qs, query, queries), an optional suffix (_proj,
# _linear, _net, _dense): bentrevett's fc_q, jadore's w_qs, Bloem's toqueries, Decision
# Transformer's q_net, a Keras port's query_dense, a ModuleList of heads' output_linear; the
# output also as fc, unifyheads, dense or proj_net when it is the one left.
_AFFIX = (
    r"^(?:w_?|fc_?|to_?|linear_?|lin_?|proj_?)?(?:{})(?:_?(?:proj|linear|lin|layer|fc|net|dense))?$"
)
ROLES = {
    role: re.compile(_AFFIX.format(words))
    for role, words in (("q", "q|qs|query|queries"), ("k", "k|ks|key|keys"),
                        ("v", "v|vs|value|values"))
}  # fmt: skip
OUT_ROLE = re.compile(
    _AFFIX.format("o|os|out|output|outputs|proj") + r"|^(?:fc|unifyheads|unify_heads|dense)$"
)


def output_name(names: Iterable[str]) -> str | None:
    """The output projection among ``names``: the first under a common name (``OUTPUT``), else
    the first whose name says output (``OUT_ROLE``); None when none does."""
    names = list(names)
    common = next((n for n in OUTPUT if n in names), None)
    return common or next((n for n in names if OUT_ROLE.match(n.lower())), None)


def by_role(found: dict[str, object]) -> tuple[str, ...]:
    """(q, k, v) names of ``found`` by what the names say, when each role has exactly one;
    else ()."""
    names = []
    for pattern in ROLES.values():
        matching = [n for n in found if pattern.match(n.lower())]
        if len(matching) != 1:
            return ()
        names.append(matching[0])
    return tuple(names)


Project = Callable[[Tensor], Tensor]
Recognized = tuple[Callable[[Tensor], tuple[Tensor, Tensor, Tensor]], Project | None, int, str]
PASSIVE = (nn.Dropout, nn.Identity)  # layers that do nothing in eval mode


def _is_projection(child: nn.Module) -> bool:
    """An nn.Linear that, called, computes its own ``F.linear`` (a forward hook that rescales
    or rotates its output makes it more than a projection); a layer seen computing ``x W^T + b``
    or ``x W + b`` with its own weight and bias alone (transformers' Conv1D, fairscale's
    ColumnParallelLinear on one device); or an nn.Sequential of one of those and layers that
    do nothing in eval mode (Dropout)."""
    if isinstance(child, nn.Linear):
        return _behaves(child, child.weight, child.bias)
    if isinstance(child, nn.Sequential | nn.ModuleList):  # diffusers: ModuleList([Linear, Dropout])
        active = [m for m in child if not isinstance(m, PASSIVE)]
        return len(active) == 1 and _is_projection(active[0])
    return _computes_linear(child)


def _computes_linear(child: nn.Module) -> bool:
    """Whether ``child``, whose parameters are one 2-D weight and at most one bias, computes an
    affine map of its input by that weight (read either way round): called once on a seeded
    input and compared with ``F.linear``; or, with more matrices than one (a low-rank adapter
    beside its frozen weight, as peft's LoRA layers), an affine map of its input all the same.
    What it is called says nothing."""
    params = list(child.parameters())
    weights = [p for p in params if p.dim() == 2]
    biases = [p for p in params if p.dim() == 1]
    if len(params) != len(weights) + len(biases) or not weights:
        return False
    if len(weights) > 1:
        return any(_affine(child, width) for width in dict.fromkeys(w.shape[1] for w in weights))
    if len(biases) > 1:
        return False
    (weight,) = weights
    bias = biases[0] if biases else None
    # (out, in) as nn.Linear stores it, else (in, out)
    return any(_behaves(child, matrix, bias) for matrix in (weight, weight.T))


def _affine(child: nn.Module, width: int) -> bool:
    """Whether ``child`` maps inputs ``width`` wide to outputs token by token and affinely:
    f(a + b) + f(0) = f(a) + f(b), f(2a) + f(0) = 2 f(a), each token's output its own."""
    generator = torch.Generator().manual_seed(0)
    dtype = next(child.parameters()).dtype
    a, b = (torch.randn(2, 3, width, generator=generator).to(dtype) for _ in range(2))
    zero = torch.zeros_like(a)
    try:
        with torch.no_grad():
            fa, fb, f0, fab, f2a = (child(t) for t in (a, b, zero, a + b, 2 * a))
            alone = child(a[:, :1])
    except Exception:
        return False
    if not all(isinstance(t, Tensor) and t.shape[:2] == a.shape[:2] for t in (fa, fb, f0)):
        return False
    scale = fa.abs().max().item() + fb.abs().max().item() + 1e-12
    close = [(fab + f0, fa + fb), (f2a + f0, 2 * fa), (alone, fa[:, :1])]
    return all(torch.allclose(x, y, rtol=0, atol=1e-4 * scale) for x, y in close)


def _behaves(child: nn.Module, matrix: Tensor, bias: Tensor | None) -> bool:
    """Whether ``child`` called on a seeded input gives ``F.linear`` by ``matrix`` (out, in)
    and ``bias``, within rounding."""
    if bias is not None and bias.shape[0] != matrix.shape[0]:
        return False
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, matrix.shape[1], generator=generator).to(matrix)
    try:
        with torch.no_grad():
            got = child(x)
            expected = F.linear(x, matrix, bias)
    except Exception:
        return False
    return (
        isinstance(got, Tensor)
        and got.shape == expected.shape
        and torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
    )


def _as_projection(child: nn.Module) -> Project:
    """A projection layer as a function of x (a ModuleList is applied in order)."""
    if isinstance(child, nn.ModuleList):
        return lambda x: functools.reduce(lambda y, layer: layer(y), child, x)
    return child


def _per_head(project: Project) -> Project:
    """``project``, or where it is a head wide, applied to each head of x alike (Aladdin
    Persson's ``nn.Linear(head_dim, head_dim)`` shared by the heads)."""
    width = getattr(project, "in_features", None)

    def apply(x: Tensor) -> Tensor:
        if width is None or x.shape[-1] == width:
            return project(x)
        return project(x.unflatten(-1, (-1, width))).flatten(-2)  # (..., h, d) -> (..., h d)

    return apply


def _bare(weight: Tensor, transpose: bool, bias: Tensor | None = None) -> Project:
    """A projection by a bare weight: ``x @ W.T`` as nn.Linear stores it, or ``x @ W``."""
    return lambda x: F.linear(x, weight if transpose else weight.T, bias)


def _projections(module: nn.Module, transpose: bool) -> dict[str, tuple[Project, list[Tensor]]]:
    """Every projection of ``module`` by name, with the parameters it uses: projection layers
    among its children, bare 2-D weights (read as (out, in) when ``transpose``, else (in, out)),
    and ``in_proj_weight`` with its bias, stored (out, in) as nn.MultiheadAttention does."""
    found: dict[str, tuple[Project, list[Tensor]]] = {}
    for name, child in module.named_children():
        if _is_projection(child):
            found[name] = (_as_projection(child), list(child.parameters()))
    params = dict(module.named_parameters(recurse=False))
    for name, weight in params.items():
        if weight.dim() == 2 and name != "in_proj_weight":
            found[name] = (_bare(weight, transpose), [weight])
    if "in_proj_weight" in params:
        bias = params.get("in_proj_bias")
        used = [params["in_proj_weight"], *([bias] if bias is not None else [])]
        found["in_proj"] = (_bare(params["in_proj_weight"], True, bias), used)
    return found


def fused_layouts(
    fused: Project, heads: int, head_dim: int | None
) -> list[tuple[Callable[[Tensor], tuple[Tensor, Tensor, Tensor]], str]]:
    """The two ways real code lays q, k and v out in one fused projection, as functions of x:
    ``q | k | v`` (GPT-2's c_attn, gpt-fast's grouped wqkv: q's heads, then k's, then v's) and
    ``per K/V group`` (each K/V head's queries, key and value side by side: GPT-NeoX's and
    BLOOM's (h, 3, d), litgpt's query groups). The head width is ``head_dim``, else x's width
    over ``heads``; fewer K/V heads than query heads are read off the fused width."""

    def widths(x: Tensor, y: Tensor) -> tuple[int, int]:
        d = head_dim or x.shape[-1] // heads
        kv = (y.shape[-1] // d - heads) // 2
        if kv < 1 or heads % kv or y.shape[-1] != (heads + 2 * kv) * d:
            raise RuntimeError(f"a fused width of {y.shape[-1]} is not {heads} heads of {d}")
        return d, kv  # (head width, K/V heads)

    def blocks(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        y = fused(x)
        d, kv = widths(x, y)
        return y.split([heads * d, kv * d, kv * d], dim=-1)  # type: ignore[return-value]

    def per_group(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        y = fused(x)
        d, kv = widths(x, y)
        grouped = y.unflatten(-1, (kv, heads // kv + 2, d))  # (..., kv, r + 2, d)
        q = grouped[..., :-2, :].flatten(-3)  # (..., h * d): group by group
        return q, grouped[..., -2, :].flatten(-2), grouped[..., -1, :].flatten(-2)

    return [(blocks, "q | k | v"), (per_group, "per K/V group")]


QK_NORMS = (("q_norm", "k_norm"), ("query_norm", "key_norm"), ("norm_q", "norm_k"),
            ("q_layernorm", "k_layernorm"), ("q_ln", "k_ln"))  # fmt: skip


def _qk_norms(module: nn.Module) -> tuple[tuple[str, nn.Module], tuple[str, nn.Module]] | None:
    """The module's query and key norms under a common pair of names, each a ``...Norm`` layer
    (LayerNorm, RMSNorm) with a weight that says its width; None when it has none."""
    children = dict(module.named_children())
    for q_name, k_name in QK_NORMS:
        pair = children.get(q_name), children.get(k_name)
        if all(n is not None and "Norm" in type(n).__name__
               and isinstance(getattr(n, "weight", None), Tensor) for n in pair):  # fmt: skip
            return (q_name, pair[0]), (k_name, pair[1])  # type: ignore[return-value]
    return None


def _normed(qkv: Callable[[Tensor], tuple[Tensor, Tensor, Tensor]], q_norm: nn.Module,
            k_norm: nn.Module) -> Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]:  # fmt: skip
    """``qkv`` with q and k normalized as the norms' widths say: over the whole projection
    (OLMo2's q_norm of h * d) or over each head (Qwen3's of d)."""

    def apply(norm: nn.Module, t: Tensor) -> Tensor:
        width = norm.weight.numel()
        if width == t.shape[-1]:
            return norm(t)
        return norm(t.unflatten(-1, (-1, width))).flatten(-2)  # (..., h, d): each head

    def normed(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = qkv(x)
        return apply(q_norm, q), apply(k_norm, k), v

    return normed


V_NORMS = ("v_norm", "value_norm", "norm_v")


def _v_norm(module: nn.Module) -> tuple[str, nn.Module] | None:
    """The module's value norm when it has no parameters (Gemma 4's RMSNorm without a scale,
    over each head): one that has some is not a projection this reading covers."""
    children = dict(module.named_children())
    for name in V_NORMS:
        norm = children.get(name)
        if norm is not None and "Norm" in type(norm).__name__ and not any(norm.parameters()):
            return name, norm
    return None


def _v_normed(qkv: Callable[[Tensor], tuple[Tensor, Tensor, Tensor]], v_norm: nn.Module,
              heads: int) -> Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]:  # fmt: skip
    """``qkv`` with v normalized over each head (its width: q's over the heads)."""

    def normed(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = qkv(x)
        width = q.shape[-1] // heads
        return q, k, v_norm(v.unflatten(-1, (-1, width))).flatten(-2)  # (..., h_kv, d): each head

    return normed


def _projection_list(module: nn.Module) -> tuple[str, list[nn.Module]] | None:
    """A ModuleList of three or four projections of one width, in the order q, k, v (and the
    output): the Annotated Transformer's ``self.linears = clones(nn.Linear(d, d), 4)``."""
    for name, child in module.named_children():
        listed = isinstance(child, nn.ModuleList) and len(child) in (3, 4)
        if listed and all(isinstance(layer, nn.Linear) for layer in child):
            return name, list(child)
    return None


def _heads_list(module: nn.Module) -> tuple[str, list[Recognized]] | None:
    """A ModuleList of single-head attentions (each with its own q, k and v), recognized."""
    for name, child in module.named_children():
        # a ModuleList may hold None (PerceiverIO's layers with weights tied away): no heads
        if isinstance(child, nn.ModuleList) and len(child) > 0 and None not in list(child):
            each = [next(iter(_recognize_one(head, True)), None) for head in child]
            if all(r is not None and r[1] is None and r[2] == 1 for r in each):
                return name, each  # type: ignore[return-value]
    return None


Roles = Mapping[str, str | None]  # "queries", "keys", "values", "output" -> a parameter's name


def _role_name(parameter: str | None) -> str | None:
    """The projection a parameter belongs to, as ``_projections`` names it: the child that
    holds it (``to_out.0.weight``: ``to_out``), else the bare weight itself."""
    if parameter is None:
        return None
    if parameter == "in_proj_weight":
        return "in_proj"
    return parameter.split(".", 1)[0]


def _read_names(roles: Roles | None) -> tuple[list[tuple[str, ...]], list[tuple[str, str]],
                                              list[str], str | None]:  # fmt: skip
    """The projections the recorded forward shows, as the name lists the recognizer tries
    first: (q, k, v) apart, q and a fused kv, one fused qkv; and the output projection."""
    if not roles:
        return [], [], [], None
    q, k, v = (_role_name(roles.get(r)) for r in ("queries", "keys", "values"))
    out = _role_name(roles.get("output"))
    if q is None or k is None or v is None:
        return [], [], [], out
    if q == k == v:
        return [], [], [q], out
    if k == v:
        return [], [(q, k)], [], out
    return [(q, k, v)], [], [], out


def _recognize_one(module: nn.Module, transpose: bool, extra: bool = False,
                   roles: Roles | None = None) -> list[Recognized]:  # fmt: skip
    """The readings of ``module``'s projections with bare weights read one way (one per layout
    of a fused weight); empty when they are not recognized. ``extra``: other parameters and
    buffers (a position bias) may sit beside them. ``roles``: the projections its recorded
    forward shows, tried before what names say."""
    found = _projections(module, transpose)
    separate, query_and_kv, fused, read_out = _read_names(roles)
    qkv, used, heads, listed_out = None, [], None, None
    for names in (*separate, *SEPARATE, by_role(found)):
        if names and all(n in found for n in names):
            q, k, v = (_per_head(found[n][0]) for n in names)

            def qkv(x, q=q, k=k, v=v):
                return q(x), k(x), v(x)

            used = list(names)
            break
    for q_name, kv_name in (*query_and_kv, *QUERY_AND_KV) if qkv is None else ():
        if q_name in found and kv_name in found:
            q, kv = found[q_name][0], found[kv_name][0]

            def qkv(x, q=q, kv=kv):
                return (q(x), *kv(x).chunk(2, dim=-1))

            used = [q_name, kv_name]
            break
    layouts: list[tuple[Callable, str]] = []
    for name in (*fused, *FUSED) if qkv is None else ():
        if name in found:
            layouts = fused_layouts(found[name][0], head_count(module), int_attribute(
                module, HEAD_DIM_ATTRS))  # fmt: skip
            qkv, used = layouts[0][0], [name]
            break
    if qkv is None and (group := _projection_list(module)) is not None:
        name, layers = group  # the Annotated Transformer's linears: q, k, v (and the output)
        for i, layer in enumerate(layers):
            found[f"{name}.{i}"] = (_as_projection(layer), list(layer.parameters()))

        def qkv(x, q=layers[0], k=layers[1], v=layers[2]):
            return q(x), k(x), v(x)

        used = [f"{name}.{i}" for i in range(3)]
        listed_out = f"{name}.3" if len(layers) == 4 else None
    if qkv is None and (listed := _heads_list(module)) is not None:
        name, each = listed

        def qkv(x, each=each):
            parts = [r[0](x) for r in each]  # per head: (q, k, v)
            return tuple(torch.cat([p[i] for p in parts], dim=-1) for i in range(3))

        used, heads = [name], len(each)
        found[name] = (None, list(module.get_submodule(name).parameters()))  # type: ignore[assignment]
    if qkv is None:
        return []
    norms = _qk_norms(module)
    if norms is not None:  # q and k normalized before the scores (Qwen3, OLMo2, Gemma3)
        (q_name, q_norm), (k_name, k_norm) = norms
        qkv = _normed(qkv, q_norm, k_norm)
        layouts = [(_normed(fn, q_norm, k_norm), words) for fn, words in layouts]
        for name, norm in norms:
            found[name] = (norm, list(norm.parameters()))  # type: ignore[assignment]
        used += [q_name, k_name]
    read_out = read_out if read_out in found and read_out not in used else None
    out_name = read_out or listed_out or output_name(n for n in found if n not in used)
    out = None if out_name is None else found[out_name][0]
    used += [out_name] if out_name else []
    covered = {id(p) for n in used for p in found[n][1]}
    if not extra and any(id(p) not in covered for p in module.parameters()):
        return []
    if not extra and not all(
        is_mask(b) or ROTARY_TABLE.search(n) or KV_BUFFER.fullmatch(n.split(".")[-1])
        for n, b in module.named_buffers()
    ):
        return []  # slopes, position tables, ...: SDPA would not (rotary tables it rotates alike)
    heads = heads or head_count(module)
    if (v_norm := _v_norm(module)) is not None and heads:  # v normalized per head (Gemma 4)
        qkv = _v_normed(qkv, v_norm[1], heads)
        layouts = [(_v_normed(fn, v_norm[1], heads), words) for fn, words in layouts]
        found[v_norm[0]] = (v_norm[1], [])  # type: ignore[assignment]
        used += [v_norm[0]]
    rest = "".join(f", {n}" for n in used[1:])
    if layouts:  # one reading per layout of the fused weight
        return [(fn, out, heads, f"{used[0]} ({words}){rest} with {heads} head(s)")
                for fn, words in layouts]  # fmt: skip
    return [(qkv, out, heads, ", ".join(used) + f" with {heads} head(s)")]


def with_scale(found: Recognized, scale: float | None) -> Recognized:
    """``found`` for a module that means ``scale`` on its scores instead of 1/sqrt(d) (None:
    1/sqrt(d) as usual): q comes out multiplied by scale * sqrt(d), so that a kernel's own
    1/sqrt(d) leaves ``scale``. Rotary turns q linearly, so it may come after."""
    if scale is None:
        return found
    qkv, out_proj, heads, described = found

    def scaled(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = qkv(x)
        return q * (scale * math.sqrt(q.shape[-1] // heads)), k, v

    return scaled, out_proj, heads, f"{described}, scale {scale:g}"


def recognize(
    module: nn.Module, extra: bool = False, roles: Roles | None = None
) -> list[Recognized]:
    """Every reading of the module's projections: (q/k/v function, output projection, heads,
    description); empty when they are not recognized.

    Recognized only when those projections are all of the module's parameters, so a module
    with anything else (norms, rotary tables, gates) is not compared; with ``extra``, other
    parameters and buffers may sit beside them (a position bias, for a comparison that measures
    it). Square bare weights can be read (out, in) or (in, out): both readings are given, the
    (out, in) one first. ``roles``: the parameters the module's recorded forward projects q, k,
    v and its output by; they are tried before what the projections' names say.
    """
    inner = (
        module.mha if isinstance(getattr(module, "mha", None), nn.MultiheadAttention) else module
    )
    if isinstance(inner, nn.MultiheadAttention):
        if inner.bias_k is not None or inner.add_zero_attn or not inner._qkv_same_embed_dim:
            return []  # an extra key, or separate weights: not plain SDPA
        d = inner.embed_dim

        def qkv_mha(x):
            return F.linear(x, inner.in_proj_weight, inner.in_proj_bias).split(d, dim=-1)

        described = "nn.MultiheadAttention's in_proj and out_proj"
        return [(qkv_mha, inner.out_proj, inner.num_heads, described)]
    bare = any(p.dim() == 2 for p in inner.parameters(recurse=False))
    return [r for transpose in ((True, False) if bare else (True,))
            for r in _recognize_one(inner, transpose, extra, roles)]  # fmt: skip


ROTARY_STYLES = ("half", "pairs")
ROPE_BASE = 10000.0  # RoPE's base (theta) unless a module says otherwise


def rotate(t: Tensor, style: str, dims: int | None = None, base: float = ROPE_BASE) -> Tensor:
    """Standard RoPE (base 10000) at positions 0..T-1 on (..., T, d): ``half`` turns dimension i
    with i + d/2 (transformers' rotate_half), ``pairs`` turns 2i with 2i + 1 (Meta's complex
    form); ``dims``: only the first ``dims`` of each head (partial rotary, as GPT-NeoX), the
    rest passing through. The doctor passes forwards the tables of the same rotation."""
    if dims is not None and dims < t.shape[-1]:
        return torch.cat([rotate(t[..., :dims], style, base=base), t[..., dims:]], dim=-1)
    T, d = t.shape[-2], t.shape[-1]
    inv_freq = base ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq  # (T, d / 2)
    cos, sin = angles.cos().to(t), angles.sin().to(t)
    if style == "half":
        a, b = t[..., : d // 2], t[..., d // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    a, b = t[..., 0::2], t[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def attention_weights(found: Recognized, x: Tensor, keep: Tensor | None) -> Tensor:
    """(B, h, T, T) softmax weights of the recognized projections (no rotary, K/V heads in
    blocks), at SDPA's scale: what a module that returns no weights attends with."""
    q, k, _ = split_heads(found, x)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, h, T, T)
    if keep is not None:
        scores = scores.masked_fill(~keep[:, None].to(scores.device), -math.inf)
    return scores.softmax(dim=-1)


def split_heads(
    found: Recognized, x: Tensor, rotary: str | None = None, tile_kv: bool = False,
    rotary_dims: int | None = None, rotary_base: float = ROPE_BASE,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """q, k and v of the recognized projections, each (B, h, T, d): rotated as ``rotary``
    says (the first ``rotary_dims`` of each head, or all), grouped key/value heads serving their
    group of query heads (``tile_kv``: tiled instead, a known bug)."""
    qkv, _, heads, _ = found
    B, T, _ = x.shape
    q, k, v = qkv(x)
    q = q.reshape(B, T, heads, -1).transpose(1, 2)  # (B, h, T, d)
    k = k.reshape(B, T, -1, q.shape[-1]).transpose(1, 2)  # (B, h_kv, T, d): fewer with GQA
    v = v.reshape(B, T, k.shape[1], -1).transpose(1, 2)  # (B, h_kv, T, d_v)
    if rotary is not None:
        q, k = (rotate(t, rotary, rotary_dims, rotary_base) for t in (q, k))
    if k.shape[1] != heads:  # grouped-query heads: each key/value head serves a group
        groups = heads // k.shape[1]
        k, v = (t.repeat(1, groups, 1, 1) if tile_kv else t.repeat_interleave(groups, dim=1)
                for t in (k, v))  # fmt: skip
    return q, k, v


def attend(
    found: Recognized,
    x: Tensor,
    keep: Tensor | None,
    kernel: Kernel = F.scaled_dot_product_attention,
    rotary: str | None = None,
    tile_kv: bool = False,
    rotary_dims: int | None = None,
    rotary_base: float = ROPE_BASE,
) -> Tensor:
    """The recognized projections through ``kernel`` (SDPA unless told otherwise).

    ``keep`` is the bool keep-mask (B, T, T), True = attend (SDPA's convention). ``rotary``: a
    RoPE style applied to q and k (to the first ``rotary_dims`` of each head, or all; base
    ``rotary_base``).
    ``tile_kv``: grouped key/value heads tiled (``repeat``) instead of each serving its own
    group of query heads, a known bug.
    """
    out_proj = found[1]
    B, T, _ = x.shape
    q, k, v = split_heads(found, x, rotary, tile_kv, rotary_dims, rotary_base)
    mask = None if keep is None else keep[:, None].to(x.device)  # (B, 1, T, T)
    out = kernel(q, k, v, attn_mask=mask)  # (B, h, T, d)
    out = out.transpose(1, 2).reshape(B, T, -1)  # (B, T, h * d)
    return out if out_proj is None else out_proj(out)


def agreement(
    module: nn.Module,
    module_mask: Tensor | None,
    x: Tensor,
    keep: Tensor | None,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[metrics.Error, metrics.Error, float]:
    """(module error, floor, atol), all against SDPA in float64; the atol at least one unit in
    the last place of the reference's largest value in ``dtype``.

    The floor is the larger error of two independent implementations run in ``dtype``: SDPA
    (whose fused CPU kernels accumulate in float32, so it alone would be an unfairly tight floor)
    and textbook math. ``x`` and ``keep`` are float64/bool on the CPU; ``module_mask`` is the
    mask in the module's own convention (already on ``device``) or None.
    """
    with exact_float32(device), torch.no_grad():
        ref64, low = as_dtype(module, device, torch.float64), as_dtype(module, device, dtype)
        found64, found_low = recognize(ref64)[:1], recognize(low)[:1]
        if not found64 or not found_low:
            raise ValueError(f"{type(module).__name__}: its projections are not recognized")
        found64, found_low = found64[0], found_low[0]
        ref = attend(found64, x.to(device), keep)
        x_low = x.to(device, dtype)
        floor = max(
            (
                metrics.error(attend(found_low, x_low, keep, kernel).double().cpu(), ref.cpu())
                for kernel in (F.scaled_dot_product_attention, math_attention)
            ),
            key=lambda e: e.max_abs,
        )
        args = (x_low,) if module_mask is None else (x_low, module_mask)
        out, _ = split_output(low(*args))
        err = metrics.error(out.double().cpu(), ref.cpu())
    # a handful of outputs (a (2, 4, 1) one) can all come through atol's round trip exact, an
    # atol of 0 while storing a result in dtype alone costs up to half a unit in the last place
    return err, floor, max(metrics.atol(ref.cpu(), dtype), metrics.one_ulp(ref, dtype))
