"""Nearest-rank percentile indices on hand-computed cases (``mutation/ranks.toml``).

Definition (PostgreSQL's ``percentile_disc``, Hyndman & Fan's type 1): the q-quantile of n sorted values is
the value at 1-based rank ceil(q x n), so the 0-based index is ceil(q x n) - 1, kept inside the values.
"""

from __future__ import annotations

import numpy as np
import pytest

from inferwatch.collector.stats.values import nearest_rank, nearest_ranks

ONE_AND_A_BIT = 1 + 2**-52
"""a quantile a hair above 1, as float arithmetic can produce (e.g. a sum of fractions)."""

CASES = [
    # (n, q, index)
    (1, 0.5, 0),
    (4, 0.5, 1),  # ceil(2) - 1
    (5, 0.5, 2),  # ceil(2.5) - 1
    (10, 0.9, 8),  # ceil(9) - 1
    (10, 0.95, 9),  # ceil(9.5) - 1
    (100, 0.99, 98),  # ceil(99) - 1
    (101, 0.99, 99),  # ceil(99.99) - 1
    (7, 1.0, 6),  # the largest value
    (7, 0.0, 0),  # the smallest value, not the last (a rank of 0 is clamped up)
    (3, ONE_AND_A_BIT, 2),  # ceil(3.0000000000000007) - 1 = 3 is past the end: clamped to the last
    (1, ONE_AND_A_BIT, 0),
]


@pytest.mark.parametrize(("n", "q", "index"), CASES)
def test_nearest_rank(n: int, q: float, index: int) -> None:
    assert nearest_rank(n, q) == index


def test_nearest_ranks_agree_with_the_cases_and_give_0_for_no_values() -> None:
    sizes = np.array([0, 1, 3, 4, 5, 7, 10, 100, 101], dtype=np.int64)
    qs = (0.0, 0.5, 0.9, 0.95, 0.99, 1.0, ONE_AND_A_BIT)
    got = nearest_ranks(sizes, qs)
    assert got.shape == (len(sizes), len(qs))
    expected = {(n, q): i for n, q, i in CASES}
    for r, n in enumerate(sizes.tolist()):
        for c, q in enumerate(qs):
            want = 0 if n == 0 else expected.get((n, q))
            if want is not None:
                assert got[r, c] == want, (n, q)
    assert got[0].tolist() == [0] * len(qs)
    assert got[2].tolist() == [0, 1, 2, 2, 2, 2, 2]  # n=3: ceil(0)-1 -> 0, ceil(1.5)-1, ceil(2.7)-1, ...
