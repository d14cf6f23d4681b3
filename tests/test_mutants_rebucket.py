"""The exporter's re-bucketing on hand-computed cases (``mutation/rebucket.toml``, ``rebucket_plan.toml``).

Rule (docs/vocabulary.md, the exporter's inexact-buckets gauge): a canonical boundary the engine also has takes
the engine's cumulative count; any other takes the count at the largest lower engine boundary (0 when there
is none), which never overstates the observations at or below it, and makes the series inexact.
"""

from __future__ import annotations

import pytest

from inferwatch.exporters.memo import histogram_plan, parse_le
from inferwatch.exporters.samples import HistogramValue, rebucket
from inferwatch.exporters.textparse import Labels, ParseError

ENGINE = [(0.1, 1.0), (0.5, 3.0), (1.0, 7.0)]


@pytest.mark.parametrize(
    ("canonical", "counts", "exact"),
    [
        ((0.1, 0.5, 1.0), [1.0, 3.0, 7.0], True),  # the same boundaries
        ((0.5,), [3.0], True),  # a subset
        ((0.05, 0.1, 0.25, 0.5, 1.0, 2.5), [0.0, 1.0, 1.0, 3.0, 7.0, 7.0], False),
        ((0.25,), [1.0], False),  # between two engine boundaries: the lower one's count
        ((0.01,), [0.0], False),  # below every engine boundary
        ((5.0,), [7.0], False),  # above every engine boundary
        ((), [], True),
    ],
)
def test_rebucket(canonical: tuple[float, ...], counts: list[float], exact: bool) -> None:
    assert rebucket(ENGINE, canonical) == (counts, exact)


def test_rebucket_without_engine_buckets_is_all_zero_and_inexact() -> None:
    assert rebucket([], (0.1, 1.0)) == ([0.0, 0.0], False)


def test_rebucket_of_positions_uses_the_given_zero() -> None:
    # the exporter's plans run it on positions: -1 stands for "no engine bucket below"
    assert rebucket([(0.1, 4), (1.0, 5)], (0.05, 0.1, 0.5, 1.0), -1) == ([-1, 4, 4, 5], False)


def test_merge_adds_counts_inf_and_sum() -> None:
    a = HistogramValue((0.1, 1.0), [1.0, 3.0], 4.0, 2.5)
    a.merge(HistogramValue((0.1, 1.0), [2.0, 2.0], 5.0, 1.0))
    assert (a.counts, a.inf, a.total) == ([3.0, 5.0], 9.0, 3.5)


@pytest.mark.parametrize("first_has_buckets", [True, False])
def test_merge_with_a_bucketless_series_has_no_buckets(first_has_buckets: bool) -> None:
    with_buckets = HistogramValue((0.1, 1.0), [1.0, 3.0], 4.0, 2.5)
    without = HistogramValue((0.1, 1.0), None, 2.0, 0.5)
    a, b = (with_buckets, without) if first_has_buckets else (without, with_buckets)
    a.merge(b)
    assert (a.counts, a.inf, a.total) == (None, 6.0, 3.0)


def test_merge_refuses_different_layouts() -> None:
    a = HistogramValue((0.1, 1.0), [1.0, 3.0], 4.0, 2.5)
    with pytest.raises(ValueError, match="zip"):  # not a silently shortened list
        a.merge(HistogramValue((0.1,), [2.0], 5.0, 1.0))


# -- the plans: the same work on positions (inferwatch.exporters.memo) ----------------------------------
# A plan entry is (canonical key, positions of the canonical counts, exact, position of the +Inf count,
# position of the sum); positions index the bucket, count and sum samples laid end to end, then a zero.

BOUNDS = (0.1, 0.5, 1.0)


def model_key(labels: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...] | None:
    name = dict(labels)["s"]
    return None if name == "dropped" else (("model", name),)


def bucket(series: str, le: str) -> tuple[tuple[str, str], ...]:
    return (("s", series), ("le", le))


def test_plan_of_two_series_with_counts_sums_and_an_inf_bucket() -> None:
    buckets = [bucket("a", "1"), bucket("a", "0.1"), bucket("a", "+Inf"), bucket("b", "0.1")]  # positions 0-3
    counts: list[Labels] = [(("s", "a"),), (("s", "b"),)]  # 4, 5
    sums: list[Labels] = [(("s", "b"),), (("s", "a"),)]  # 6, 7; the zero is 8
    plan = histogram_plan(("h", buckets, counts, sums), BOUNDS, 1.0, model_key)
    assert plan == [
        # a: 0.1 is the engine's (position 1), 0.5 is not (the count at 0.1), 1 is (position 0); +Inf at 2
        ((("model", "a"),), [1, 1, 0], False, 2, 7),
        # b: only 0.1 (position 3) for every boundary; no +Inf bucket: its _count (5) stands for it
        ((("model", "b"),), [3, 3, 3], False, 5, 6),
    ]


def test_plan_without_inf_or_count_takes_the_largest_bucket_for_inf() -> None:
    buckets = [bucket("c", "0.5"), bucket("c", "0.1"), bucket("c", "1")]  # positions 0-2; the zero is 3
    plan = histogram_plan(("h", buckets, [], []), BOUNDS, 1.0, model_key)
    assert plan == [((("model", "c"),), [1, 0, 2], True, 2, 3)]


def test_plan_of_a_series_with_a_count_and_no_buckets() -> None:
    counts: list[Labels] = [(("s", "d"),)]  # the count at 0, the sum at 1, the zero at 2
    sums: list[Labels] = [(("s", "d"),)]
    plan = histogram_plan(("h", [], counts, sums), BOUNDS, 1.0, model_key)
    assert plan == [((("model", "d"),), None, False, 0, 1)]


def test_plan_skips_a_dropped_series_and_goes_on() -> None:
    buckets = [bucket("dropped", "0.1"), bucket("e", "0.1")]  # positions 0, 1; the zero is 2
    plan = histogram_plan(("h", buckets, [], []), (0.1,), 1.0, model_key)
    assert plan == [((("model", "e"),), [1], True, 1, 2)]


def test_no_plan_when_a_series_gives_a_boundary_twice() -> None:
    buckets = [bucket("a", "1"), bucket("a", "1.0")]
    assert histogram_plan(("h", buckets, [], []), BOUNDS, 1.0, model_key) is None


def test_parse_le_divides_into_canonical_units() -> None:
    assert parse_le("h", "250", 1000.0) == 0.25  # milliseconds to seconds
    assert parse_le("h", "+Inf", 1000.0) == float("inf")


@pytest.mark.parametrize("le", ["abc", "", "NaN"])
def test_parse_le_refuses_what_is_not_a_boundary(le: str) -> None:
    with pytest.raises(ParseError, match="h_bucket"):
        parse_le("h", le, 1.0)
