"""The nearest ranks the collector's percentiles are read at (``values.nearest_rank``, ``nearest_ranks``), held to
an oracle of their own (tests/support/percentiles.py: the nearest-rank definition in integers), to hand-worked
ranks at and just past a whole rank, and to PostgreSQL's ``percentile_disc``."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from inferwatch.collector.stats import values, windowing
from tests.conftest import postgres_schema
from tests.support import percentiles as oracle


@pytest.mark.parametrize(("n", "q", "k"), oracle.HAND_CASES)
def test_nearest_rank_at_and_just_past_a_whole_rank(n: int, q: float, k: int) -> None:
    """Hand-worked: where q x n is whole, the rank is q x n itself (not one more); a value more, the next."""
    assert oracle.rank(n, q) == k
    assert values.nearest_rank(n, q) == k - 1
    assert values.nearest_ranks(np.array([n], dtype=np.int64), [q])[0, 0] == k - 1
    assert oracle.percentile_disc([float(v) for v in range(n, 0, -1)], q) == k  # unsorted in, the kth value out


def test_nearest_ranks_agree_with_the_oracle_at_every_size() -> None:
    sizes = np.arange(0, 5001, dtype=np.int64)
    ranks = values.nearest_ranks(sizes, windowing.PERCENTILES)
    for n in range(1, 5001):
        want = [oracle.rank(n, q) - 1 for q in windowing.PERCENTILES]
        assert [values.nearest_rank(n, q) for q in windowing.PERCENTILES] == want, n
        assert ranks[n].tolist() == want, n
    assert ranks[0].tolist() == [0] * len(windowing.PERCENTILES)  # no values: index 0, never read


def test_the_oracle_is_postgresql_percentile_disc() -> None:
    """PostgreSQL's own percentile_disc over 1..n for every n to 400 and the hand-worked sizes: the oracle's ranks
    and the collector's nearest ranks, all equal."""
    sizes = sorted({*range(1, 401), *(n for n, _, _ in oracle.HAND_CASES)})
    qs = ", ".join(str(q) for q in windowing.PERCENTILES)
    sql = (
        f"SELECT n, percentile_disc(ARRAY[{qs}]::float8[]) WITHIN GROUP (ORDER BY v) "
        "FROM unnest(CAST(:sizes AS int[])) AS n, generate_series(1, n) AS v GROUP BY n ORDER BY n"
    )
    with postgres_schema("iw_st") as url:
        eng = create_engine(url, poolclass=NullPool)
        try:
            with eng.connect() as conn:
                got = {n: list(ks) for n, ks in conn.execute(text(sql), {"sizes": sizes})}
        finally:
            eng.dispose()
    assert sorted(got) == sizes
    for n, ks in got.items():
        assert ks == [oracle.rank(n, q) for q in windowing.PERCENTILES], n
        assert ks == [values.nearest_rank(n, q) + 1 for q in windowing.PERCENTILES], n
    for n, q, k in oracle.HAND_CASES:
        assert got[n][windowing.PERCENTILES.index(q)] == k
