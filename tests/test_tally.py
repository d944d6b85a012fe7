"""The rule that turns seeds into a claim, and says when two tallies differ: tested on synthetic
tallies, not on whichever trap sits on a threshold on one CPU."""

import math
from itertools import product

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.tally import AGREE, ALPHA, MIXED, SEEDS, Tally, agreed, differ, fisher

SLOWER, FLAT, NORMAL = "learns slower", "does not learn", "learns normally"


def tally(**counts: int) -> Tally:
    """``tally(slower=4, flat=1)``: seeds in that order."""
    names = {"slower": SLOWER, "flat": FLAT, "normal": NORMAL}
    return Tally.of([names[k] for k, n in counts.items() for _ in range(n)])


def test_an_outcome_is_claimed_at_four_of_five_seeds_and_not_at_three():
    assert (SEEDS, AGREE) == (5, 4)
    assert tally(flat=5).claim == FLAT
    assert tally(slower=4, normal=1).claim == SLOWER
    assert tally(slower=3, flat=2).claim == MIXED
    assert tally(normal=1, slower=4).claim == SLOWER  # the order of the seeds does not matter


def test_the_text_puts_the_claim_first_and_says_mixed_when_none_is_claimed():
    assert tally(flat=5).text() == "does not learn 5/5"
    assert tally(normal=1, slower=4).text() == "learns slower 4/5 · learns normally 1/5"
    assert tally(slower=2, flat=3).text() == "mixed: does not learn 3/5 · learns slower 2/5"
    assert tally(slower=2, flat=2, normal=1).text().startswith("mixed: learns slower 2/5 · does")


@given(st.lists(st.sampled_from([SLOWER, FLAT, NORMAL, "no conclusion: it does not"]), min_size=1))
def test_the_text_reads_back_as_the_same_tally(outcomes):
    counted = Tally.of(outcomes)
    assert Tally.parse(counted.text()) == counted


@pytest.mark.parametrize(
    "text",
    [
        "learns slower",
        "learns slower 4/5",
        "learns slower 4/5 · learns normally 1/6",
        "",
        "yes (36)",
    ],
)
def test_text_that_is_not_a_whole_tally_is_not_read_as_one(text):
    assert Tally.parse(text) is None


def test_fishers_exact_test_matches_its_textbook_values():
    # the tea-tasting table: 3 of 4 against 1 of 4, two-sided p = 34/70
    assert math.isclose(fisher(3, 4, 1, 4), 34 / 70)
    assert math.isclose(fisher(5, 5, 0, 5), 2 / 252)  # all against none
    assert math.isclose(fisher(4, 5, 1, 5), 52 / 252)
    assert fisher(2, 5, 2, 5) == 1.0


def test_a_tally_that_flips_within_noise_is_not_a_change():
    """The same trap on two CPUs, its seeds split about evenly: these all happen by chance."""
    for a, b in [((3, 2), (2, 3)), ((4, 1), (1, 4)), ((5, 0), (2, 3)), ((4, 1), (3, 2))]:
        first, second = tally(slower=a[0], flat=a[1]), tally(slower=b[0], flat=b[1])
        assert differ(first, second) == [], (a, b)
    assert differ(tally(slower=4, flat=1), tally(slower=2, flat=3)) == []  # a claim lost: noise


def test_a_real_change_is_a_change():
    assert differ(tally(flat=5), tally(normal=5)) == [FLAT, NORMAL]
    assert differ(tally(slower=5), tally(flat=5)) == [SLOWER, FLAT]
    assert differ(tally(slower=5), tally(slower=5)) == []


def test_only_all_against_none_differs_at_five_seeds_a_side():
    """The test's power at n = 5, stated: a count of 5 against 0 differs, 5 against 1 does not."""
    for a, b in product(range(SEEDS + 1), repeat=2):
        differs = fisher(a, SEEDS, b, SEEDS) < ALPHA
        assert differs == ({a, b} == {0, SEEDS}), (a, b)


def test_agreement_scales_with_the_seeds_counted():
    assert agreed(8, 10) and not agreed(7, 10)
    assert agreed(1, 1) and not agreed(0, 1)
