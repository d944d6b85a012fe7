"""The tutorial's claims that no buggy/fixed pair measures, each measured by one small function
on the CPU in float32 from a seeded generator: what the scorecard quotes."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from harness.tutorial.own_code import tutorial_class

SEEDS = range(10)  # the seeds a seed-dependent number is given over, as a range


def _randn(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _error_of(run: Callable[[], object]) -> str:
    """The first line of what ``run()`` raises; "" when it runs."""
    try:
        run()
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return ""


@dataclass(frozen=True)
class Spread:
    """§2: the standard deviation of q · k for unit-variance q and k of width d_k."""

    d_k: int
    unscaled: float
    scaled: float  # divided by sqrt(d_k)


def dot_product_spread(widths: tuple[int, ...] = (4, 64, 1024), pairs: int = 4096) -> list[Spread]:
    """q · k over ``pairs`` random pairs per width (seed 0): its spread grows as sqrt(d_k); the
    scale holds it near 1."""
    out = []
    for d_k in widths:
        q, k = _randn(pairs, d_k, seed=0), _randn(pairs, d_k, seed=1)
        dots = (q * k).sum(-1)  # (pairs,)
        out.append(Spread(d_k, dots.std().item(), (dots / math.sqrt(d_k)).std().item()))
    return out


@dataclass(frozen=True)
class Discrimination:
    """§2: of ``keys`` random keys of width d_k, how many some query gives the most weight."""

    d_k: int
    keys: int
    favourites: int  # keys that are some sampled query's largest score


def discrimination(
    widths: tuple[int, ...] = (1, 2, 16), keys: int = 64, queries: int = 100_000
) -> list[Discrimination]:
    """The keys a query can single out are the corners of the keys' convex hull: with d_k = 1
    only the largest and the smallest key, whatever the query. Counted over ``queries`` random
    queries (seed 1) against unit-variance keys (seed 0), in float64 so no near-tie decides."""
    out = []
    for d_k in widths:
        k = _randn(keys, d_k, seed=0).double()  # (keys, d_k)
        q = _randn(queries, d_k, seed=1).double()  # (queries, d_k)
        favourite = (q @ k.T).argmax(-1)  # (queries,): each query's top-scoring key
        out.append(Discrimination(d_k, keys, favourite.unique().numel()))
    return out


@dataclass(frozen=True)
class Broadcast:
    """§3.3 and the module's docstring: a (B, 1, T, T) mask on (B, T, T) scores."""

    masked: tuple[int, ...]  # the scores' shape after masked_fill
    matmul_output: tuple[int, ...]  # (weights @ V)'s shape, where bmm would have raised
    bmm_error: str


@functools.cache
def mask_broadcast(batch: int = 2, seq_len: int = 3, d_v: int = 3) -> Broadcast:
    """Apply the documented 4-D keep-mask to 3-D scores, then finish with ``@`` and with bmm."""
    scores = _randn(batch, seq_len, seq_len, seed=0)  # (B, T, T)
    v = _randn(batch, seq_len, d_v, seed=1)  # (B, T, d_v)
    mask = torch.tril(torch.ones(batch, 1, seq_len, seq_len))  # (B, 1, T, T)
    weights = torch.softmax(scores.masked_fill(mask == 0, float("-inf")), dim=-1)
    return Broadcast(
        tuple(weights.shape), tuple((weights @ v).shape), _error_of(lambda: torch.bmm(weights, v))
    )


@dataclass(frozen=True)
class BatchContract:
    """§4.3: bmm's batch contract, as cross-attention meets it (queries and keys from two
    tensors whose batch sizes differ)."""

    bmm_error: str  # batch 2 of queries against batch 3 of keys
    matmul_shape: tuple[int, ...]  # batch 2 of queries against batch 1 of keys, with @


def batch_contract(seq_len: int = 4, d_k: int = 8) -> BatchContract:
    q = _randn(2, seq_len, d_k, seed=0)  # (2, T, d_k)
    k3, k1 = _randn(3, seq_len, d_k, seed=1), _randn(1, seq_len, d_k, seed=2)
    error = _error_of(lambda: torch.bmm(q, k3.transpose(1, 2)))
    return BatchContract(error, tuple((q @ k1.transpose(1, 2)).shape))


def head_parameters(d_model: int = 512, heads: int = 8) -> tuple[int, int]:
    """§5.1: the projection weights of ``heads`` heads of width d_model / heads (plus W_o), and
    of one head of width d_model (plus W_o): 4 d_model^2 both."""
    d_k = d_model // heads
    split = heads * 3 * d_model * d_k + d_model * d_model
    single = 3 * d_model * d_model + d_model * d_model
    return split, single


@dataclass(frozen=True)
class Unnormalised:
    """§6.3: exp(Q K^T / sqrt(d_k)) V without the softmax's division, over ``SEEDS``."""

    row_sum_min: float  # the smallest row sum of exp(scores) over the seeds (softmax's: 1)
    row_sum_max: float
    error_min: float  # the output's max abs error against softmax's, over its largest |value|
    error_max: float


def unnormalised_exp(seq_len: int = 128, d_k: int = 64) -> Unnormalised:
    """Unit-variance q, k, v of width d_k; each seed's exp-weighted output against softmax's."""
    sums, errors = [], []
    for seed in SEEDS:
        q, k, v = (_randn(seq_len, d_k, seed=3 * seed + i) for i in range(3))
        scores = q @ k.T / math.sqrt(d_k)  # (T, T)
        weights = torch.exp(scores)  # no normalisation
        reference = torch.softmax(scores, dim=-1) @ v  # (T, d_k)
        sums.append(weights.sum(-1))
        errors.append(((weights @ v - reference).abs().max() / reference.abs().max()).item())
    rows = torch.cat(sums)
    return Unnormalised(rows.min().item(), rows.max().item(), min(errors), max(errors))


@dataclass(frozen=True)
class ScaleGradients:
    """§3.1: the tutorial's head with and without its scale, the norm of W_q's gradient, over
    ``SEEDS``: the scale is said to keep gradients from vanishing."""

    d_k: int
    ratio_min: float  # W_q's gradient norm without the scale over with it, smallest seed
    ratio_max: float


def _w_q_gradient(head: nn.Module, x: Tensor, upstream: Tensor) -> float:
    head.zero_grad()
    output, _ = head(x)
    (output * upstream).sum().backward()
    return head.W_q.weight.grad.norm().item()


def scale_gradients(d_k: int = 256, batch: int = 4, seq_len: int = 32) -> ScaleGradients:
    """``ScaledDotProductAttention(d_k, d_k, d_k)`` as the tutorial writes it (its default
    init), on unit-variance x, then the same weights with ``self.scale`` set to 1."""
    head_class = tutorial_class("ScaledDotProductAttention")
    ratios = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        head = head_class(d_k, d_k, d_k)
        x = _randn(batch, seq_len, d_k, seed=seed)  # (B, T, d_model)
        upstream = _randn(batch, seq_len, d_k, seed=seed + 1000)  # (B, T, d_v)
        scaled = _w_q_gradient(head, x, upstream)
        head.scale = torch.tensor(1.0)  # no division
        ratios.append(_w_q_gradient(head, x, upstream) / scaled)
    return ScaleGradients(d_k, min(ratios), max(ratios))


@dataclass(frozen=True)
class MissingTranspose:
    """§3.2: ``bmm(Q, K)`` with K's transpose left out."""

    error: str  # what it raises when d_k != T
    silent_error: float  # its largest |difference| from bmm(Q, K^T) where d_k == T (it runs)


def missing_transpose(batch: int = 2, seq_len: int = 4, d_k: int = 8) -> MissingTranspose:
    q, k = _randn(batch, seq_len, d_k, seed=0), _randn(batch, seq_len, d_k, seed=1)
    error = _error_of(lambda: torch.bmm(q, k))
    square_q, square_k = q[..., :seq_len], k[..., :seq_len]  # d_k == T: the shapes let it run
    wrong = torch.bmm(square_q, square_k)
    right = torch.bmm(square_q, square_k.transpose(1, 2))
    return MissingTranspose(error, (wrong - right).abs().max().item())


@dataclass(frozen=True)
class FloatMasks:
    """§4.2: what torch does with a float mask and a -1e9 fill, where the tutorial says it
    "converts implicitly"."""

    float_in_masked_fill: str  # masked_fill given a 0/1 float mask: its error
    large_fill_in_half: str  # masked_fill(mask, -1e9) on float16 scores: its error


def float_masks(seq_len: int = 3) -> FloatMasks:
    scores = _randn(seq_len, seq_len, seed=0)
    keep = torch.tril(torch.ones(seq_len, seq_len))  # a 0/1 float keep-mask
    return FloatMasks(
        _error_of(lambda: scores.masked_fill(keep, float("-inf"))),
        _error_of(lambda: scores.half().masked_fill(keep == 0, -1e9)),
    )


def bmm_matches_matmul(batch: int = 4, seq_len: int = 16, d_k: int = 64) -> float:
    """§4.4: the largest |bmm(Q, K^T) - Q @ K^T| on the same 3-D tensors (0: the same
    numbers)."""
    q, k = _randn(batch, seq_len, d_k, seed=0), _randn(batch, seq_len, d_k, seed=1)
    k_t = k.transpose(1, 2)
    return (torch.bmm(q, k_t) - q @ k_t).abs().max().item()


@dataclass(frozen=True)
class XavierVariance:
    """§4.5: the variance of ``xavier_uniform_``'s weights, against the two formulas."""

    fan_in: int
    fan_out: int
    measured: float

    @property
    def said(self) -> float:  # the tutorial's 1/fan_in
        return 1 / self.fan_in

    @property
    def formula(self) -> float:  # Glorot and Bengio's 2/(fan_in + fan_out)
        return 2 / (self.fan_in + self.fan_out)


def xavier_variance(fan_in: int = 512, fan_out: int = 64) -> XavierVariance:
    """W_q of the tutorial's §5 sizes (d_model 512 to d_k 64), drawn once from seed 0."""
    weight = torch.empty(fan_out, fan_in)
    nn.init.xavier_uniform_(weight, generator=torch.Generator().manual_seed(0))
    return XavierVariance(fan_in, fan_out, weight.var().item())


def tensor_reciprocal(d_k: int = 64) -> str:
    """§4.1: ``1 / torch.sqrt(torch.tensor(d_k))`` as Python prints it."""
    return repr((1 / torch.sqrt(torch.tensor(float(d_k)))).item())


class _CountProducts(TorchFunctionMode):
    """Counts the matrix products a forward calls (``linear``, ``bmm``, ``matmul``, ``@``)."""

    PRODUCTS = frozenset({F.linear, torch.bmm, torch.matmul, Tensor.matmul, Tensor.__matmul__})

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func in self.PRODUCTS
        return func(*args, **(kwargs or {}))


def products_per_call(module: nn.Module, x: Tensor) -> int:
    """How many matrix products one call of ``module`` on ``x`` runs, one after another."""
    with torch.no_grad(), _CountProducts() as counter:
        module(x)
    return counter.count


@dataclass(frozen=True)
class HeadLoop:
    """§5.2: the tutorial's ``ModuleList`` of heads, and how many products it runs per call."""

    heads: int
    loop_products: int  # the tutorial's MultiHeadAttention: each head's own, in turn
    products_per_head: int


def head_loop(d_model: int = 512, heads: int = 8) -> HeadLoop:
    torch.manual_seed(0)
    mha = tutorial_class("MultiHeadAttention")(d_model, heads)
    x = _randn(1, 4, d_model, seed=0)  # (B, T, d_model)
    one = products_per_call(mha.heads[0], x)
    return HeadLoop(heads, products_per_call(mha, x), one)


@dataclass(frozen=True)
class ImplicitSoftmax:
    """§3.2: softmax without ``dim`` on the tutorial's (B, T, T) scores, over ``SEEDS``."""

    row_sum_min: float  # the largest |row sum - 1| of the weights, on the kindest seed
    row_sum_max: float  # and on the worst
    nan_rows_min: int  # rows holding NaN under the causal mask
    nan_rows_max: int
    rows: int  # the rows of weights there are (B T)


def implicit_softmax(
    batch: int = 2, seq_len: int = 5, d_model: int = 16, d_k: int = 8
) -> ImplicitSoftmax:
    """The tutorial's head's scores (its default init, unit-variance x) given to
    ``F.softmax`` with no ``dim``, which picks dim 0 for a 3-D tensor: the batch."""
    head_class = tutorial_class("ScaledDotProductAttention")
    causal = torch.tril(torch.ones(seq_len, seq_len)).expand(batch, -1, -1)  # (B, T, T)
    sums, nans = [], []
    for seed in SEEDS:
        torch.manual_seed(seed)
        head = head_class(d_model, d_k, d_k)
        x = _randn(batch, seq_len, d_model, seed=seed)  # (B, T, d_model)
        with torch.no_grad():
            scores = torch.bmm(head.W_q(x), head.W_k(x).transpose(1, 2)) / head.scale  # (B, T, T)
            sums.append((F.softmax(scores, dim=0).sum(-1) - 1).abs().max().item())  # dim=None's
            masked = scores.masked_fill(causal == 0, float("-inf"))
            nans.append(int(F.softmax(masked, dim=0).isnan().any(-1).sum()))
    return ImplicitSoftmax(min(sums), max(sums), min(nans), max(nans), batch * seq_len)
