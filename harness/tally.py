"""What a fixed set of seeds supports: each seed's outcome counted, the outcome claimed when
enough seeds agree, and whether two tallies differ by more than chance.

Training amplifies rounding: the same 120 steps on another CPU end elsewhere, and a run near a
threshold falls on either side of it. So no single run is a claim. Every trap is trained on the
same ``SEEDS`` seeds on every machine, and its outcome is stated as a tally: "does not learn
5/5", "learns slower 4/5 · learns normally 1/5". The rule (the README states it):

- an outcome is **claimed** when at least ``AGREE`` of the ``SEEDS`` seeds give it (80%); else
  the tally is **mixed**;
- two tallies (two machines, or two settings of one) **differ** only where, for some outcome,
  Fisher's exact test on its counts gives a two-sided p below ``ALPHA``. With five seeds a
  side, that is 5/5 against 0/5 and nothing milder: 4/5 against 1/5 (p = 0.21) is what two
  machines may well give for a trap whose seeds split about evenly.

The text is one line, claim first, that ``parse`` reads back: the report prints it and the
comparer of two reports reads it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

SEEDS = 5  # seeds every learning probe trains, from its first seed on
AGREE = 4  # of SEEDS: the share of seeds (80%) an outcome needs to be claimed
ALPHA = 0.01  # two tallies differ when an outcome's counts do at this level (Fisher, two-sided)
MIXED = "mixed"
JOIN = " · "
COUNT = re.compile(r"^(?P<outcome>.+) (?P<k>\d+)/(?P<n>\d+)$")


@dataclass(frozen=True)
class Tally:
    """Outcomes and how many seeds gave each, most first (ties in the order first seen)."""

    counts: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, outcomes: Iterable[str]) -> Tally:
        """The tally of one outcome per seed, in seed order."""
        found = Counter(outcomes)
        if not found:
            raise ValueError("a tally needs at least one seed")
        return cls(tuple(found.most_common()))  # most_common keeps first-seen order in ties

    @property
    def n(self) -> int:
        """Seeds counted."""
        return sum(k for _, k in self.counts)

    def count(self, outcome: str) -> int:
        return dict(self.counts).get(outcome, 0)

    @property
    def claim(self) -> str:
        """The outcome at least ``AGREE`` in ``SEEDS`` of the seeds give; else ``MIXED``."""
        outcome, k = self.counts[0]
        return outcome if agreed(k, self.n) else MIXED

    @property
    def claimed(self) -> bool:
        return self.claim != MIXED

    def text(self) -> str:
        """``does not learn 5/5``, ``learns slower 4/5 · learns normally 1/5``, or ``mixed:
        learns slower 3/5 · does not learn 2/5``."""
        counted = JOIN.join(f"{outcome} {k}/{self.n}" for outcome, k in self.counts)
        return counted if self.claimed else f"{MIXED}: {counted}"

    @classmethod
    def parse(cls, text: str) -> Tally | None:
        """The tally ``text()`` wrote (its counts: whether it says "mixed" is the rule's to
        decide again); None when ``text`` is not one."""
        counted = text.strip().removeprefix(f"{MIXED}: ")
        counts, seeds = [], set()
        for part in counted.split(JOIN):
            match = COUNT.match(part.strip())
            if match is None:
                return None
            counts.append((match["outcome"], int(match["k"])))
            seeds.add(int(match["n"]))
        if len(seeds) != 1 or sum(k for _, k in counts) != seeds.pop():
            return None
        return cls(tuple(sorted(counts, key=lambda c: -c[1])))  # most first, as ``of`` orders


def agreed(k: int, n: int) -> bool:
    """Whether ``k`` of ``n`` seeds are enough to claim what they agree on."""
    return k * SEEDS >= AGREE * n


def fisher(a: int, n: int, b: int, m: int) -> float:
    """Fisher's exact test, two-sided: the chance of counts at least as far apart as ``a`` of
    ``n`` against ``b`` of ``m`` when both come from one rate (the tables, given the margins,
    no likelier than the one seen). Counted in integers, so exact."""
    total = a + b

    def weight(x: int) -> int:  # a table's likelihood times comb(n + m, total)
        return math.comb(n, x) * math.comb(m, total - x)

    seen = weight(a)
    tables = (weight(x) for x in range(max(0, total - m), min(n, total) + 1))
    return sum(w for w in tables if w <= seen) / math.comb(n + m, total)


def differ(first: Tally, second: Tally) -> list[str]:
    """The outcomes whose counts in ``first`` and ``second`` differ by more than chance (Fisher,
    p < ``ALPHA``); empty when the two tallies agree."""
    outcomes = dict.fromkeys([o for o, _ in first.counts] + [o for o, _ in second.counts])
    return [
        outcome
        for outcome in outcomes
        if fisher(first.count(outcome), first.n, second.count(outcome), second.n) < ALPHA
    ]
