"""The shape of a canonical metric family (:class:`MetricSpec`), shared by the vocabulary's modules.

Part of the one vocabulary: :mod:`inferwatch.core.vocabulary` re-exports every name here (``V.Kind``,
``V.MetricSpec``); the families themselves are defined there and in :mod:`inferwatch.core.vocabulary_gpu`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Aggregation", "Kind", "MetricSpec", "histogram_spec"]


class Kind(StrEnum):
    """Prometheus metric type of a canonical family."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class Aggregation(StrEnum):
    """How several source series that land on one canonical series are combined."""

    SUM = "sum"
    MAX = "max"


@dataclass(frozen=True, eq=False)
class MetricSpec:
    """One canonical metric family (compared by identity: each is a singleton defined here)."""

    key: str
    """Short stable identifier used in configuration (e.g. SLO indicators): ``time_to_first_token``."""
    name: str
    """Exposition name (with ``_total`` for counters)."""
    kind: Kind
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    """Labels beyond the common ``engine``/``model``/``dp_rank``/``role``."""
    otel_name: str | None = None
    buckets: tuple[float, ...] = ()
    aggregation: Aggregation = Aggregation.SUM
    health: bool = False
    """Exporter self-metric rather than an engine signal."""


def histogram_spec(
    key: str, name: str, unit: str, help_: str, buckets: tuple[float, ...], otel: str | None = None
) -> MetricSpec:
    return MetricSpec(key, name, Kind.HISTOGRAM, unit, help_, otel_name=otel, buckets=buckets)
