"""Read canonical histograms and counters the way PromQL would (for the demo's live view)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from inferwatch.core import vocabulary as V


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """PromQL's ``histogram_quantile`` on cumulative ``(le, count)`` pairs (``+Inf`` last).

    Linear interpolation inside the bucket that holds the rank; the upper bound of the highest
    finite bucket when the rank falls in ``+Inf``; ``None`` without observations.
    """
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


@dataclass
class Scrape:
    """One parse of an exporter's canonical output, summed over every label set per engine."""

    at: float
    values: dict[str, float] = field(default_factory=dict)
    """metric name (samples: counters and gauges) -> sum."""
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)
    """histogram name -> le -> cumulative count."""
    gauges_max: dict[str, float] = field(default_factory=dict)
    up: float = 0.0

    @classmethod
    def parse(cls, text: str, at: float) -> Scrape:
        out = cls(at=at)
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == V.EXPORTER_UP.name:
                    out.up = max(out.up, s.value)
                elif s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    per = out.buckets.setdefault(s.name.removesuffix("_bucket"), {})
                    per[le] = per.get(le, 0.0) + s.value
                else:
                    out.values[s.name] = out.values.get(s.name, 0.0) + s.value
                    out.gauges_max[s.name] = max(out.gauges_max.get(s.name, s.value), s.value)
        return out

    def rate(self, earlier: Scrape | None, name: str) -> float | None:
        if earlier is None or name not in self.values or self.at <= earlier.at:
            return None
        delta = self.values[name] - earlier.values.get(name, 0.0)
        return max(delta, 0.0) / (self.at - earlier.at)

    def quantile(self, earlier: Scrape | None, spec: V.MetricSpec, q: float) -> float | None:
        """Quantile of the observations between ``earlier`` and this scrape (all if ``earlier`` is None)."""
        now = self.buckets.get(spec.name)
        if not now:
            return None
        before = earlier.buckets.get(spec.name, {}) if earlier else {}
        pairs = sorted((le, count - before.get(le, 0.0)) for le, count in now.items())
        return histogram_quantile(q, pairs)
