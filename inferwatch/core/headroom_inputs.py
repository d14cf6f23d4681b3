"""The headroom model's inputs from a replica's canonical series over a window (pure, deterministic).

Both sources of the headroom answer, Prometheus (a range query) and the exporters (scraped every few
seconds), produce the same thing: a time-ordered list of :class:`Snapshot`, each holding the summed
canonical series of every replica at one instant. :func:`windows` turns that history into one
:class:`~inferwatch.core.headroom.ReplicaWindow` per replica, exactly as ``docs/headroom.md`` lists
the inputs: counters become increases over the window (a drop is a restart: the new value is the
increase), gauges their mean over the snapshots, histograms their mean and the SLO quantile of what
was observed in the window, and the TPOT fit's points one per sub-window of ``step_seconds``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from inferwatch.core import vocabulary as V
from inferwatch.core.engines.profile import EngineProfile
from inferwatch.core.headroom import BatchPoint, QuantileRatio, ReplicaKey, ReplicaWindow, SLOTarget
from inferwatch.core.headroom_fit import least_squares
from inferwatch.core.quantile import histogram_quantile
from inferwatch.core.slo import SLOFile

SUMMED_GAUGES = (V.REQUESTS_RUNNING.name, V.REQUESTS_WAITING.name, V.KV_CACHE_CAPACITY.name)
MEAN_GAUGES = (V.KV_CACHE_USAGE.name,)
"""Gauges averaged over the replica's series (one per data-parallel rank), not summed."""
COUNTERS = (V.REQUESTS.name, V.PROMPT_TOKENS.name, V.GENERATION_TOKENS.name)
HISTOGRAMS = (
    V.TIME_PER_OUTPUT_TOKEN,
    V.TIME_TO_FIRST_TOKEN,
    V.REQUEST_DURATION,
    V.REQUEST_QUEUE,
    V.REQUEST_PREFILL,
    V.INTER_TOKEN_LATENCY,
)
"""Histograms whose ``_sum`` and ``_count`` the model reads; the latency ones also their buckets (the
inter-token latency's mean stands in for the TPOT fit's points where an engine has no TPOT histogram)."""
BUCKETED = (V.TIME_PER_OUTPUT_TOKEN, V.TIME_TO_FIRST_TOKEN, V.REQUEST_DURATION)


def series_names() -> tuple[str, ...]:
    """Every sample name a snapshot needs (the histograms' ``_sum`` and ``_count``, not buckets)."""
    hist = tuple(f"{h.name}{suffix}" for h in HISTOGRAMS for suffix in ("_sum", "_count"))
    return (*SUMMED_GAUGES, *MEAN_GAUGES, *COUNTERS, *hist)


@dataclass
class Snapshot:
    """Every replica's canonical series at one instant (seconds on any monotonic clock)."""

    at: float
    values: dict[tuple[ReplicaKey, str], float] = field(default_factory=dict)
    """summed over the replica's series (``MEAN_GAUGES``: averaged), by sample name."""
    buckets: dict[tuple[ReplicaKey, str], dict[float, float]] = field(default_factory=dict)
    """cumulative bucket counts of ``BUCKETED`` histograms, by histogram name and ``le``."""
    info: dict[ReplicaKey, dict[str, str]] = field(default_factory=dict)
    """the labels of the replica's engine info series."""

    def add(self, key: ReplicaKey, name: str, value: float, labels: Mapping[str, str]) -> None:
        """Fold one sample in (a sample name the model does not read is ignored)."""
        if not math.isfinite(value) and name != V.ENGINE_INFO.name:
            return
        if name == V.ENGINE_INFO.name:
            self.info.setdefault(key, {k: v for k, v in labels.items() if k in V.INFO_LABELS})
        elif name.endswith("_bucket") and V.LABEL_LE in labels:
            base = name.removesuffix("_bucket")
            if any(h.name == base for h in BUCKETED):
                per = self.buckets.setdefault((key, base), {})
                le = float(labels[V.LABEL_LE])
                per[le] = per.get(le, 0.0) + value
        elif name in MEAN_GAUGES:
            total, count = self.values.get((key, name), 0.0), self.values.get((key, name + "#n"), 0.0)
            self.values[(key, name)] = total + value
            self.values[(key, name + "#n")] = count + 1
        elif name in series_names():
            self.values[(key, name)] = self.values.get((key, name), 0.0) + value

    def value(self, key: ReplicaKey, name: str) -> float | None:
        v = self.values.get((key, name))
        if v is None or name not in MEAN_GAUGES:
            return v
        return v / self.values[(key, name + "#n")]

    def replicas(self) -> set[ReplicaKey]:
        return {key for key, name in self.values if name == V.REQUESTS_RUNNING.name}


def key_of(labels: Mapping[str, str], instance: str) -> ReplicaKey | None:
    """The replica a canonical sample belongs to (``None``: not an engine's series)."""
    engine, model = labels.get(V.LABEL_ENGINE), labels.get(V.LABEL_MODEL)
    if not engine or not model:
        return None
    return ReplicaKey(engine, model, instance, labels.get(V.LABEL_ROLE) or V.ROLE_UNIFIED)


def increase(values: Sequence[float | None]) -> float | None:
    """A counter's increase over the values (``None`` where it was absent); a drop counts as a restart."""
    seen = [v for v in values if v is not None]
    if len(seen) < 2:
        return None
    total = 0.0
    for prev, cur in itertools.pairwise(seen):
        total += cur - prev if cur >= prev else cur
    return total


def _mean(values: Iterable[float | None]) -> float | None:
    seen = [v for v in values if v is not None]
    return math.fsum(seen) / len(seen) if seen else None


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den is not None and den > 0 else None


def slo_targets(spec: SLOFile, key: ReplicaKey) -> tuple[SLOTarget, ...]:
    """The SLO file's latency SLOs that apply to the replica (their selector matches its labels).

    An SLO measured at the proxy, or selecting on a label a replica does not carry, is not the
    replica's: the engine's own series are what the model fits."""
    labels = {V.LABEL_ENGINE: key.engine, V.LABEL_MODEL: key.model, V.LABEL_ROLE: key.role}
    out = []
    for slo in spec.slos:
        lat = slo.indicator.latency
        if lat is None or lat.measured_at != "engine":
            continue
        if any(labels.get(k) != v for k, v in slo.selector.items()):
            continue
        out.append(SLOTarget(slo.name, lat.metric, slo.objective / 100, lat.threshold_seconds))
    return tuple(out)


class _History:
    """One replica's snapshots, with the helpers :func:`windows` reads them through."""

    def __init__(self, key: ReplicaKey, snapshots: Sequence[Snapshot]) -> None:
        self.key = key
        self.snaps = snapshots

    def series(self, name: str, snaps: Sequence[Snapshot] | None = None) -> list[float | None]:
        return [s.value(self.key, name) for s in (self.snaps if snaps is None else snaps)]

    def increase(self, name: str, snaps: Sequence[Snapshot] | None = None) -> float | None:
        return increase(self.series(name, snaps))

    def mean_of(self, spec: V.MetricSpec, snaps: Sequence[Snapshot] | None = None) -> float | None:
        return _ratio(self.increase(f"{spec.name}_sum", snaps), self.increase(f"{spec.name}_count", snaps))

    def has(self, spec: V.MetricSpec) -> bool:
        """Whether the replica exposes the histogram at all (its count in some snapshot)."""
        return any(v is not None for v in self.series(f"{spec.name}_count"))

    def prefill_seconds(self) -> float | None:
        """Prefill seconds over the window: the prefill histogram's sum, else TTFT's minus the queue's (an
        engine without a prefill histogram, e.g. SGLang: the model's prefill time is TTFT minus queue)."""
        if self.has(V.REQUEST_PREFILL):
            return self.increase(f"{V.REQUEST_PREFILL.name}_sum")
        ttft, queue = self.increase(f"{V.TIME_TO_FIRST_TOKEN.name}_sum"), self.increase(f"{V.REQUEST_QUEUE.name}_sum")
        ttft_n, queue_n = (
            self.increase(f"{V.TIME_TO_FIRST_TOKEN.name}_count"),
            self.increase(f"{V.REQUEST_QUEUE.name}_count"),
        )
        if ttft is None or queue is None or not ttft_n or not queue_n:
            return None
        return max(0.0, ttft / ttft_n - queue / queue_n) * ttft_n

    def in_service_seconds(self, snaps: Sequence[Snapshot] | None = None) -> float | None:
        """Seconds finished requests spent in service over ``snaps`` (end to end minus queue)."""
        part = self.snaps if snaps is None else snaps
        if not (self.has(V.REQUEST_DURATION) and self.has(V.REQUEST_QUEUE)) or len(part) < 2:
            return None
        e2e = self.increase(f"{V.REQUEST_DURATION.name}_sum", part)
        queue = self.increase(f"{V.REQUEST_QUEUE.name}_sum", part)
        return None if e2e is None or queue is None else max(0.0, e2e - queue)

    def in_service(self, snaps: Sequence[Snapshot] | None = None) -> float | None:
        """The mean number of requests being served (prefill or decode) over ``snaps``, by Little's law:
        the seconds finished requests spent end to end minus in the queue, per second. Unlike the running
        gauge, which engines sample between steps (finished requests gone, new ones not yet admitted), it
        is the time average the latency curves and Little's law need; ``None`` without both histograms."""
        part = self.snaps if snaps is None else snaps
        seconds = self.in_service_seconds(part)
        span = part[-1].at - part[0].at if len(part) >= 2 else 0.0
        return None if seconds is None or span <= 0 else seconds / span

    def window_buckets(self, spec: V.MetricSpec) -> list[tuple[float, float]]:
        first = next((s.buckets[(self.key, spec.name)] for s in self.snaps if (self.key, spec.name) in s.buckets), None)
        last = self.snaps[-1].buckets.get((self.key, spec.name))
        if first is None or last is None:
            return []
        restarted = any(last.get(le, 0.0) < count for le, count in first.items())
        base = {} if restarted else first
        return sorted((le, last[le] - base.get(le, 0.0)) for le in last)

    def growth(self) -> float | None:
        """The waiting queue's least-squares slope over the window (PromQL's ``deriv``)."""
        waiting = self.series(V.REQUESTS_WAITING.name)
        points = [(s.at, v) for s, v in zip(self.snaps, waiting, strict=True) if v is not None]
        if len(points) < 3 or points[-1][0] - points[0][0] <= 0:
            return None
        return least_squares([t for t, _ in points], [v for _, v in points])[1]


def _points(history: _History, step_seconds: float) -> tuple[BatchPoint, ...]:
    """One ``(mean running, mean TPOT)`` point per sub-window of ``step_seconds`` that saw decodes."""
    snaps = history.snaps
    points = []
    start = 0
    for i in range(1, len(snaps)):
        if snaps[i].at - snaps[start].at + 1e-6 < step_seconds:
            continue
        part = snaps[start : i + 1]
        tpot = history.mean_of(V.TIME_PER_OUTPUT_TOKEN, part)
        if tpot is None and not history.has(V.TIME_PER_OUTPUT_TOKEN):
            tpot = history.mean_of(V.INTER_TOKEN_LATENCY, part)
        batch = history.in_service(part)
        if batch is None:
            batch = _mean(history.series(V.REQUESTS_RUNNING.name, part[1:]))
        if tpot is not None and batch is not None:
            points.append(BatchPoint(batch, tpot))
        start = i
    return tuple(points)


def _quantile_ratios(history: _History, slos: Sequence[SLOTarget]) -> tuple[QuantileRatio, ...]:
    out = []
    for spec in BUCKETED:
        mean = history.mean_of(spec)
        for q in sorted({s.quantile for s in slos if s.metric == spec.key}):
            value = histogram_quantile(q, history.window_buckets(spec))
            if value is not None and mean is not None and mean > 0:
                out.append(QuantileRatio(spec.key, q, value / mean))
    return tuple(out)


def _batch_cap(key: ReplicaKey, info: Mapping[str, str], profiles: Mapping[str, EngineProfile]) -> float | None:
    """The engine's cap on running requests from its info labels, unless its profile says the number is not one."""
    profile = profiles.get(key.engine)
    if profile is not None and profile.concurrency_not_a_batch_cap:
        return None
    text = info.get(V.LABEL_MAX_CONCURRENCY, "")
    return float(text) if text.replace(".", "", 1).isdigit() else None


def window(
    history: _History, spec: SLOFile, step_seconds: float, profiles: Mapping[str, EngineProfile]
) -> ReplicaWindow:
    """One replica's :class:`ReplicaWindow` from its snapshots."""
    key, snaps = history.key, history.snaps
    span = snaps[-1].at - snaps[0].at
    requests = history.increase(V.REQUESTS.name)
    slos = slo_targets(spec, key)
    info = next((s.info[key] for s in reversed(snaps) if key in s.info), {})
    capacities = [v for v in history.series(V.KV_CACHE_CAPACITY.name) if v is not None]
    gauge = _mean(history.series(V.REQUESTS_RUNNING.name))
    return ReplicaWindow(
        key=key,
        slos=slos,
        request_rate=requests / span if requests is not None and span > 0 else None,
        running_mean=history.in_service() or gauge,
        running_gauge_mean=gauge,
        waiting_growth_per_second=history.growth(),
        prompt_tokens_mean=_ratio(history.increase(V.PROMPT_TOKENS.name), requests),
        output_tokens_mean=_ratio(history.increase(V.GENERATION_TOKENS.name), requests),
        queue_seconds_mean=history.mean_of(V.REQUEST_QUEUE),
        prefill_seconds_per_token=_ratio(history.prefill_seconds(), history.increase(V.PROMPT_TOKENS.name)),
        tpot_points=_points(history, step_seconds),
        kv_usage_mean=_mean(history.series(V.KV_CACHE_USAGE.name)),
        kv_capacity_tokens=max(capacities) if capacities else None,
        max_concurrency=_batch_cap(key, info, profiles),
        quantile_ratios=_quantile_ratios(history, slos),
        residence_seconds_mean=_ratio(history.in_service_seconds(), requests),
    )


def windows(
    snapshots: Sequence[Snapshot],
    spec: SLOFile,
    step_seconds: float,
    profiles: Mapping[str, EngineProfile] | None = None,
) -> list[ReplicaWindow]:
    """Every replica seen in the last snapshot, from the whole history (oldest first); ``profiles`` tell
    which engines' ``max_concurrency`` caps the batch (all, without them)."""
    snaps = sorted(snapshots, key=lambda s: s.at)
    if len(snaps) < 2:
        return []
    out = []
    for key in sorted(snaps[-1].replicas()):
        mine = [s for s in snaps if (key, V.REQUESTS_RUNNING.name) in s.values]
        if len(mine) >= 2:
            out.append(window(_History(key, mine), spec, step_seconds, profiles or {}))
    return out
