"""The percentile oracle of the stats tests and ``bench/stats.py``: independent of the collector's code.

The collector reports each percentile as an observed value by the nearest-rank definition, as
PostgreSQL's ``percentile_disc`` does: the q-quantile of n sorted values is the smallest one with at
least q x n values at or below it. Here that is computed from the definition alone, in integers (q in
whole hundredths, ``ceil(100q x n / 100)`` by integer division), with no float product to round and
nothing taken from ``inferwatch.collector.stats``; :data:`HAND_CASES` are worked by hand at sizes
where q x n is a whole number (the threshold itself: exactly q x n values at or below the answer),
and just past them.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction


def rank(n: int, q: float) -> int:
    """1-based rank of the q-quantile of ``n`` values: the least k with k >= q x n (and k >= 1)."""
    hundredths = Fraction(str(q)) * 100
    if hundredths.denominator != 1 or not 0 < hundredths <= 100:
        raise ValueError(f"the oracle takes whole percents in (0, 100], not {q}")
    p = int(hundredths)
    return max(1, -(-p * n // 100))


def percentile_disc(values: Sequence[float], q: float) -> float:
    """The q-quantile of ``values`` (sorted here) by the nearest-rank definition."""
    ordered = sorted(values)
    return ordered[rank(len(ordered), q) - 1]


HAND_CASES: tuple[tuple[int, float, int], ...] = (
    # (n, q, 1-based rank) worked by hand: q x n whole -> that rank exactly; a value more -> the next one
    (1, 0.5, 1),
    (1, 0.99, 1),
    (2, 0.5, 1),  # 0.5 x 2 = 1: the first value has half of them at or below it
    (3, 0.5, 2),  # 1.5 -> 2
    (10, 0.9, 9),  # 9 exactly
    (11, 0.9, 10),  # 9.9 -> 10
    (20, 0.95, 19),  # 19 exactly
    (21, 0.95, 20),  # 19.95 -> 20
    (100, 0.5, 50),
    (100, 0.9, 90),
    (100, 0.95, 95),
    (100, 0.99, 99),  # 99 exactly: the 99th, not the largest
    (101, 0.99, 100),  # 99.99 -> 100
    (200, 0.99, 198),
    (1000, 0.95, 950),
)
"""(n, q, the 1-based rank of the q-quantile of n values)."""
