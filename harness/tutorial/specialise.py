"""§5.1's "heads specialise", trained: the tutorial's ``MultiHeadAttention`` with two heads, on a
task that needs two look-ups (the tokens one and two places back, read out together), learns to
give one look-up to each head, or to share them.

One attention output has to carry both tokens, in order. A single head that spreads its weight over
both places gets the sum of two value vectors, which says which two tokens but not which came
first: two heads, each on one place, say both. Whether training finds that split is what is
counted, seed by seed, as a tally (training amplifies rounding: a statement over seeds)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.learning import one_thread
from harness.tally import Tally
from harness.tutorial.claims import SEEDS
from harness.tutorial.own_code import tutorial_class

VOCAB, SEQ_LEN, D_MODEL, HEADS = 8, 8, 16, 2
BATCH, STEPS, LR = 32, 100, 1e-2
LOOKBACK = (1, 2)  # the places back each answer reads
SPLIT, SHARED = "one place per head", "heads share the places"


class Lookback(nn.Module):
    """Token and position embeddings, the tutorial's multi-head attention, and a read-out of
    the token at each place in ``LOOKBACK``. No residual path: every answer comes through
    attention."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, D_MODEL)
        self.positions = nn.Embedding(SEQ_LEN, D_MODEL)
        self.attention = tutorial_class("MultiHeadAttention")(D_MODEL, HEADS)
        self.read_out = nn.Linear(D_MODEL, len(LOOKBACK) * VOCAB)

    def embed(self, x: Tensor) -> Tensor:
        return self.tokens(x) + self.positions.weight  # (B, T, d_model)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        out = self.read_out(self.attention(self.embed(x), mask))  # (B, T, 2 V)
        return out.view(*x.shape, len(LOOKBACK), VOCAB)  # (B, T, 2, V)


def _causal(batch: int) -> Tensor:
    return torch.tril(torch.ones(SEQ_LEN, SEQ_LEN)).expand(batch, -1, -1)  # (B, T, T), 1 = attend


def _answered(x: Tensor) -> tuple[slice, Tensor]:
    """The places that have every look-up before them, and the tokens they must name."""
    first = max(LOOKBACK)
    back = [x[:, first - n : SEQ_LEN - n] for n in LOOKBACK]  # each (B, T - first)
    return slice(first, SEQ_LEN), torch.stack(back, dim=-1)  # (B, T - first, 2)


def train(seed: int) -> Lookback:
    torch.manual_seed(seed)
    tokens = torch.Generator().manual_seed(seed)
    model = Lookback()
    optimiser = torch.optim.Adam(model.parameters(), lr=LR)
    mask = _causal(BATCH)
    for _ in range(STEPS):
        x = torch.randint(0, VOCAB, (BATCH, SEQ_LEN), generator=tokens)  # (B, T)
        places, target = _answered(x)
        logits = model(x, mask)[:, places]  # (B, T - 2, 2, V)
        loss = F.cross_entropy(logits.flatten(0, -2), target.flatten())
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return model


@dataclass(frozen=True)
class HeadRoles:
    """What each seed's trained heads do, and how well the model answers."""

    tally: Tally  # SPLIT or SHARED, one per seed
    accuracy_min: float  # the lowest answer accuracy over the seeds, on a held-out batch
    share_min: float  # the least weight a head puts on its own look-up, where they split


def roles(model: Lookback, x: Tensor) -> tuple[str, float, float]:
    """(outcome, accuracy, the smaller of the two heads' weights on their own look-up)."""
    mask = _causal(len(x))
    places, target = _answered(x)
    accuracy = (model(x, mask)[:, places].argmax(-1) == target).float().mean().item()
    query = torch.arange(places.start, SEQ_LEN)
    favourites, shares = set(), []
    for head in model.attention.heads:
        _, weights = head(model.embed(x), mask)  # (B, T, T)
        on = [weights[:, query, query - n].mean().item() for n in LOOKBACK]  # weight per place
        favourites.add(LOOKBACK[on.index(max(on))])
        shares.append(max(on))
    split = favourites == set(LOOKBACK) and min(shares) > 0.5
    return (SPLIT if split else SHARED), accuracy, min(shares)


@functools.cache
def head_roles() -> HeadRoles:
    """Train on ``SEEDS`` (one thread, seeded batches), then read the heads on a held-out
    batch of 256 rows."""
    held_out = torch.Generator().manual_seed(len(SEEDS))
    x = torch.randint(0, VOCAB, (256, SEQ_LEN), generator=held_out)  # (B, T)
    outcomes, accuracies, shares = [], [], []
    with one_thread():
        for seed in SEEDS:
            model = train(seed)
            with torch.no_grad():
                outcome, accuracy, share = roles(model, x)
            outcomes.append(outcome)
            accuracies.append(accuracy)
            shares.extend([share] if outcome == SPLIT else [])
    return HeadRoles(Tally.of(outcomes), min(accuracies), min(shares, default=0.0))
