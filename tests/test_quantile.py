"""histogram_quantile as PromQL computes it."""

from __future__ import annotations

import math

import pytest

from inferwatch.core.quantile import histogram_quantile


def test_interpolates_like_promql() -> None:
    buckets = [(0.1, 10.0), (0.5, 60.0), (1.0, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (50 - 10) / 50)
    assert histogram_quantile(0.05, buckets) == pytest.approx(0.05)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * (99 - 60) / 40)


def test_edges() -> None:
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None
    assert histogram_quantile(0.99, [(1.0, 1.0), (math.inf, 10.0)]) == 1.0  # rank in +Inf: top finite bound
