"""Canonical samples as the exporter holds them between translation and rendering."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from inferwatch.core import vocabulary as V
from inferwatch.exporters.textparse import NonFiniteSample

SeriesKey = tuple[tuple[str, str], ...]
T = TypeVar("T")


def series_key(labels: Mapping[str, str], extra: Mapping[str, str] | None = None) -> SeriesKey:
    """Canonical label pairs in rendering order: canonical labels first, then ``extra`` sorted."""
    key = [(name, labels[name]) for name in V.LABEL_ORDER if name in labels]
    if extra:
        key.extend(sorted(extra.items()))
    return tuple(key)


@dataclass
class HistogramValue:
    """A canonical histogram series: cumulative counts at the canonical boundaries."""

    bounds: tuple[float, ...]
    counts: list[float] | None
    """Cumulative count per finite bound; ``None`` when the source has no buckets (sum/count only)."""
    inf: float
    total: float

    def merge(self, other: HistogramValue) -> None:
        if self.counts is not None and other.counts is not None:
            self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        else:
            self.counts = None
        self.inf += other.inf
        self.total += other.total


def rebucket(
    source: Sequence[tuple[float, T]],
    canonical: Sequence[float],
    zero: T = 0.0,  # type: ignore[assignment]
) -> tuple[list[T], bool]:
    """Map cumulative source buckets onto canonical boundaries.

    ``source`` holds ``(upper_bound, cumulative_count)`` for the finite source buckets, sorted by
    bound. For each canonical boundary the count is exact when the source has that boundary;
    otherwise it is the cumulative count at the largest source boundary below it (``zero`` if none),
    which never overstates the number of observations at or below the boundary. Returns the counts and
    whether every boundary was exact. (The exporter's plans run it once on the counts' positions instead
    of their values: :func:`inferwatch.exporters.memo.rebucket_positions`.)
    """
    counts: list[T] = []
    exact = True
    j = 0
    n = len(source)
    last = zero
    for bound in canonical:
        while j < n and source[j][0] < bound:
            last = source[j][1]
            j += 1
        if j < n and source[j][0] == bound:
            counts.append(source[j][1])
        else:
            counts.append(last)
            exact = False
    return counts, exact


@dataclass
class Snapshot:
    """Canonical series produced from one engine payload."""

    values: dict[V.MetricSpec, dict[SeriesKey, float]] = field(default_factory=dict)
    histograms: dict[V.MetricSpec, dict[SeriesKey, HistogramValue]] = field(default_factory=dict)
    inexact: set[V.MetricSpec] = field(default_factory=set)
    notes: dict[V.MetricSpec, str] = field(default_factory=dict)
    """Approximation notes per canonical metric (appended to HELP for this engine)."""
    unmapped: list[str] = field(default_factory=list)
    label_texts: dict[SeriesKey, str] | None = None
    """a target's memo of each series key's rendered label pairs (kept across scrapes, shared by the
    snapshots merged from this one): rendering looks a key up instead of escaping its labels again."""

    def add_value(self, spec: V.MetricSpec, key: SeriesKey, value: float) -> None:
        series = self.values.setdefault(spec, {})
        old = series.get(key)
        if old is None:
            series[key] = value
        elif spec.aggregation is V.Aggregation.MAX:
            # NaN wins, whatever the order (a gauge may be NaN; ``max`` would keep or drop it by position)
            series[key] = value if value > old or value != value else old
        else:
            series[key] = old + value

    def set_value(self, spec: V.MetricSpec, key: SeriesKey, value: float) -> None:
        self.values.setdefault(spec, {})[key] = value

    def add_histogram(self, spec: V.MetricSpec, key: SeriesKey, value: HistogramValue) -> None:
        series = self.histograms.setdefault(spec, {})
        old = series.get(key)
        if old is None:
            series[key] = value
        else:
            # a new object: ``old`` may be shared with the snapshots this one was merged from
            merged = HistogramValue(old.bounds, None if old.counts is None else list(old.counts), old.inf, old.total)
            merged.merge(value)
            series[key] = merged

    def metrics(self) -> set[V.MetricSpec]:
        """Canonical metrics with at least one series."""
        return {m for m, s in self.values.items() if s} | {m for m, s in self.histograms.items() if s}

    def value(self, spec: V.MetricSpec, **labels: str) -> float:
        """Sum of the series of ``spec`` whose labels include ``labels`` (a convenience for tests)."""
        total = 0.0
        for key, v in self.values.get(spec, {}).items():
            d = dict(key)
            if all(d.get(k) == val for k, val in labels.items()):
                total += v
        return total

    def histogram(self, spec: V.MetricSpec, **labels: str) -> HistogramValue | None:
        """The merged histogram of the series of ``spec`` matching ``labels``."""
        merged: HistogramValue | None = None
        for key, h in self.histograms.get(spec, {}).items():
            d = dict(key)
            if all(d.get(k) == val for k, val in labels.items()):
                copy = HistogramValue(h.bounds, None if h.counts is None else list(h.counts), h.inf, h.total)
                if merged is None:
                    merged = copy
                else:
                    merged.merge(copy)
        return merged


def merge_snapshots(snapshots: Iterable[Snapshot]) -> Snapshot:
    """Union of several targets' snapshots (their label sets are distinct by configuration).

    The result shares the inputs' :class:`HistogramValue` objects, which no :class:`Snapshot` method
    mutates (:meth:`Snapshot.add_histogram` merges into a new one): a snapshot may be merged by several
    concurrent scrapes that share it. Its series dicts are its own (copied whole, at C speed)."""
    out = Snapshot()
    for snap in snapshots:
        if out.label_texts is None:
            out.label_texts = snap.label_texts
        for spec, series in snap.values.items():
            mine = out.values.get(spec)
            if mine is None:
                if series:
                    out.values[spec] = dict(series)
                continue
            for key, v in series.items():
                out.add_value(spec, key, v)
        for spec, hseries in snap.histograms.items():
            hmine = out.histograms.get(spec)
            if hmine is None:
                if hseries:
                    out.histograms[spec] = dict(hseries)
                continue
            for key, h in hseries.items():
                out.add_histogram(spec, key, h)
        out.inexact |= snap.inexact
        for spec, note in snap.notes.items():
            if note not in out.notes.get(spec, ""):
                out.notes[spec] = f"{out.notes[spec]} {note}".strip() if spec in out.notes else note
        out.unmapped.extend(snap.unmapped)
    return out


def check_finite_snapshot(snap: Snapshot) -> None:
    """Raise :class:`~inferwatch.exporters.textparse.NonFiniteSample` when a canonical counter or histogram
    of ``snap`` is NaN or infinite (whatever computed it: rows, a hook, an engine's JSON)."""
    isfinite = math.isfinite
    for spec, series in snap.values.items():
        # a sum is finite when every term is (at C speed); one that is not may also be finite terms
        # whose sum overflows: then each value is looked at
        if spec.kind is V.Kind.COUNTER and not isfinite(sum(series.values())):
            bad = next((k for k, v in series.items() if not isfinite(v)), None)
            if bad is not None:
                raise NonFiniteSample(f"canonical counter {spec.key} {dict(bad)} is not finite")
    for spec, hseries in snap.histograms.items():
        for key, h in hseries.items():
            if not isfinite(h.inf + h.total + (sum(h.counts) if h.counts else 0.0)) and not (
                isfinite(h.inf) and isfinite(h.total) and all(map(isfinite, h.counts or ()))
            ):
                raise NonFiniteSample(f"canonical histogram {spec.key} {dict(key)} is not finite")
