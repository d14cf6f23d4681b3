"""Signals without Prometheus: scrape the exporters twice, a few seconds apart, and take the deltas.

Each exporter URL is one ``instance`` (its ``host:port``, as Prometheus would label it). Counters
become rates over the interval, histograms the quantiles of the observations made in it, gauges
the mean of the two scrapes. Evidence names the exporter and the samples.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.collector.diagnosis.gpu import summarise
from inferwatch.collector.diagnosis.prometheus import P99
from inferwatch.collector.diagnosis.signals import (
    Filters,
    Fleet,
    GpuReading,
    Observation,
    TargetKey,
    TargetSignals,
    UpstreamError,
    gpu_name,
    shown_label,
)
from inferwatch.core import vocabulary as V
from inferwatch.core.quantile import histogram_quantile
from inferwatch.core.symptoms import Signal

DEFAULT_INTERVAL_S = 5.0


def metrics_url(url: str) -> str:
    """``http://h:9400`` -> ``http://h:9400/metrics``; a URL with a path is kept."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"exporter URL must be http(s)://HOST:PORT[/metrics], got {url!r}")
    return url if parts.path not in ("", "/") else url.rstrip("/") + "/metrics"


def instance_of(url: str) -> str:
    return urlsplit(url).netloc


GPU_FAMILIES = frozenset(m.name for m in V.GPU_METRICS)
GPU_NAMING = (V.LABEL_HOST, V.LABEL_GPU, V.LABEL_GPU_UUID)
GpuId = tuple[str, ...]
"""(host, index, UUID) of one GPU."""


@dataclass
class _Scrape:
    """One exporter scrape, summed per target: counters and gauges, histogram buckets, info labels; and
    the GPU series kept per GPU (``(name, GPU, reason or XID) -> value``)."""

    at: float
    sums: dict[tuple[TargetKey, str], float] = field(default_factory=dict)
    maxes: dict[tuple[TargetKey, str], float] = field(default_factory=dict)
    buckets: dict[tuple[TargetKey, str], dict[float, float]] = field(default_factory=dict)
    info: dict[TargetKey, dict[str, str]] = field(default_factory=dict)
    targets: set[TargetKey] = field(default_factory=set)
    gpus: dict[TargetKey, dict[tuple[str, GpuId, str], float]] = field(default_factory=dict)


def _parse(text: str, instance: str, at: float) -> _Scrape:
    out = _Scrape(at)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if V.LABEL_ENGINE not in labels or V.LABEL_MODEL not in labels:
                continue  # exporter health series: not an engine's
            key = TargetKey(labels[V.LABEL_ENGINE], labels[V.LABEL_MODEL], instance)
            name = sample.name
            if name in GPU_FAMILIES:
                gpu: GpuId = tuple(labels.get(k, "") for k in GPU_NAMING)
                extra = shown_label(labels.get(V.LABEL_REASON) or labels.get(V.LABEL_XID) or "")
                out.gpus.setdefault(key, {})[(name, gpu, extra)] = sample.value
                continue
            if name == V.ENGINE_INFO.name:
                out.info.setdefault(key, {k: v for k, v in labels.items() if k in V.INFO_LABELS})
                continue
            if name == V.REQUESTS_RUNNING.name:
                out.targets.add(key)
            if name.endswith("_bucket"):
                per = out.buckets.setdefault((key, name.removesuffix("_bucket")), {})
                le = float(labels[V.LABEL_LE])
                per[le] = per.get(le, 0.0) + sample.value
                continue
            if name == V.REQUESTS.name:
                outcome = labels.get(V.LABEL_OUTCOME, "")
                slot = (key, f"{name}{{{outcome}}}")
                out.sums[slot] = out.sums.get(slot, 0.0) + sample.value
            out.sums[(key, name)] = out.sums.get((key, name), 0.0) + sample.value
            out.maxes[(key, name)] = max(out.maxes.get((key, name), sample.value), sample.value)
    return out


async def fetch(client: httpx.AsyncClient, url: str, timeout: float) -> tuple[str, float]:
    """One exporter page and when it came (``time.monotonic()``); :class:`UpstreamError` names the exporter."""
    try:
        resp = await client.get(url, timeout=timeout)
    except httpx.TimeoutException:
        raise UpstreamError(url, f"the exporter did not answer within {timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise UpstreamError(url, f"cannot reach the exporter: {exc.__class__.__name__}: {exc}") from None
    if resp.status_code != 200:
        raise UpstreamError(url, f"the exporter answered HTTP {resp.status_code}")
    return resp.text, time.monotonic()


async def _scrape(client: httpx.AsyncClient, url: str, timeout: float) -> _Scrape:
    text, at = await fetch(client, url, timeout)
    try:
        return _parse(text, instance_of(url), at)
    except (ValueError, KeyError) as exc:
        raise UpstreamError(url, f"the exporter's answer is not Prometheus text: {exc}") from None


def _window(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


def _signals(url: str, first: _Scrape, second: _Scrape, fleet: Fleet) -> None:
    dt = second.at - first.at
    where = f"at {url}, two scrapes {dt:.1f} s apart"

    def delta(key: TargetKey, name: str) -> float | None:
        if (key, name) not in second.sums:
            return None
        return max(second.sums[(key, name)] - first.sums.get((key, name), 0.0), 0.0)

    def shown(name: str, key: TargetKey) -> str:
        a, b = first.sums.get((key, name)), second.sums.get((key, name))
        return f"{name}{{engine={key.engine!r}, model={key.model!r}}} {_fmt(a)} -> {_fmt(b)} {where}"

    def quantile(key: TargetKey, spec: V.MetricSpec) -> tuple[float, str] | None:
        now = second.buckets.get((key, spec.name))
        if not now:
            return None
        before = first.buckets.get((key, spec.name), {})
        pairs = sorted((le, count - before.get(le, 0.0)) for le, count in now.items())
        q = histogram_quantile(P99, pairs)
        if q is None:
            return None
        return q, f"p99 of the {spec.name}_bucket deltas ({pairs[-1][1]:g} observations) {where}"

    def mean_delta(key: TargetKey, spec: V.MetricSpec) -> float | None:
        total, count = delta(key, spec.name + "_sum"), delta(key, spec.name + "_count")
        return None if total is None or not count else total / count

    for key in second.targets | first.targets:
        target = fleet.target(key)
        finished = delta(key, V.REQUESTS.name)
        if finished is not None:
            target.put(Signal.REQUEST_RATE, finished / dt, shown(V.REQUESTS.name, key))
            if finished > 0:
                for signal, outcome in ((Signal.ERROR_RATIO, V.OUTCOME_ERROR), (Signal.ABORT_RATIO, V.OUTCOME_ABORT)):
                    part = delta(key, f"{V.REQUESTS.name}{{{outcome}}}") or 0.0
                    target.put(
                        signal, part / finished, shown(V.REQUESTS.name, key) + f" (outcome={outcome}: +{part:g})"
                    )
        for signal, spec in (
            (Signal.E2E_P99, V.REQUEST_DURATION),
            (Signal.QUEUE_P99, V.REQUEST_QUEUE),
            (Signal.TTFT_P99, V.TIME_TO_FIRST_TOKEN),
            (Signal.PREFILL_P99, V.REQUEST_PREFILL),
            (Signal.TPOT_P99, V.TIME_PER_OUTPUT_TOKEN),
        ):
            got = quantile(key, spec)
            if got is not None:
                target.put(signal, got[0], got[1])
        queue, e2e = mean_delta(key, V.REQUEST_QUEUE), mean_delta(key, V.REQUEST_DURATION)
        ttft = mean_delta(key, V.TIME_TO_FIRST_TOKEN)
        if queue is not None and ttft:
            how = f"mean {V.REQUEST_QUEUE.name} / mean {V.TIME_TO_FIRST_TOKEN.name} {where}"
            target.put(Signal.TTFT_QUEUE_SHARE, queue / ttft, how)
        if queue is not None and e2e:
            target.put(
                Signal.QUEUE_SHARE, queue / e2e, f"mean {V.REQUEST_QUEUE.name} / mean {V.REQUEST_DURATION.name} {where}"
            )
        for signal, spec, use_max in (
            (Signal.WAITING, V.REQUESTS_WAITING, False),
            (Signal.RUNNING, V.REQUESTS_RUNNING, False),
            (Signal.KV_USAGE, V.KV_CACHE_USAGE, True),
        ):
            table = (first.maxes, second.maxes) if use_max else (first.sums, second.sums)
            values = [t[(key, spec.name)] for t in table if (key, spec.name) in t]
            if values:
                target.put(signal, sum(values) / len(values), f"mean of {spec.name} over the two scrapes {where}")
        capacity = second.sums.get((key, V.KV_CACHE_CAPACITY.name))
        if capacity is not None:
            target.put(Signal.KV_CAPACITY, capacity, f"{V.KV_CACHE_CAPACITY.name} {_fmt(capacity)} at {url}")
        preempted = delta(key, V.PREEMPTIONS.name)
        if preempted is not None:
            target.put(Signal.PREEMPTION_RATE, preempted / dt, shown(V.PREEMPTIONS.name, key))
            if finished is not None:  # at least one: long requests may all still run in a short interval
                target.put(
                    Signal.PREEMPTIONS_PER_REQUEST, preempted / max(finished, 1.0), shown(V.PREEMPTIONS.name, key)
                )
        prompt = delta(key, V.PROMPT_TOKENS.name)
        if prompt is not None and finished:
            target.put(Signal.PROMPT_TOKENS_MEAN, prompt / finished, shown(V.PROMPT_TOKENS.name, key))
        generated = delta(key, V.GENERATION_TOKENS.name)
        if generated is not None:
            target.put(Signal.GENERATION_RATE, generated / dt, shown(V.GENERATION_TOKENS.name, key))
            if prompt is not None and generated > 0:
                how = f"{shown(V.PROMPT_TOKENS.name, key)}; {shown(V.GENERATION_TOKENS.name, key)}"
                target.put(Signal.PREFILL_DECODE_RATIO, prompt / generated, how)
        info = second.info.get(key) or first.info.get(key)
        if info:
            target.info = dict(info)
            target.info_query = f"{V.ENGINE_INFO.name} at {url}"
            limit = info.get(V.LABEL_MAX_CONCURRENCY, "")
            if limit.replace(".", "", 1).isdigit():
                target.put(Signal.MAX_CONCURRENCY, float(limit), target.info_query)
        drafts = second.sums.get((key, V.SPEC_DECODE_DRAFT_TOKENS.name))
        if drafts is not None:
            target.spec_decode = Observation(drafts, f"{V.SPEC_DECODE_DRAFT_TOKENS.name} {_fmt(drafts)} at {url}")
        _gpu_signals(target, first.gpus.get(key, {}), second.gpus.get(key, {}), dt, where)


def _gpu_signals(
    target: TargetSignals,
    first: dict[tuple[str, GpuId, str], float],
    second: dict[tuple[str, GpuId, str], float],
    dt: float,
    where: str,
) -> None:
    """The replica's GPU signals and per-GPU readings from two scrapes of its ``llm_gpu_*`` series: gauges
    averaged over the scrapes, then over the GPUs (``avg`` ratios, ``max`` power share and temperature,
    ``min`` clock); throttle time as a rate; an XID seen in either scrape."""

    def per_gpu(spec: V.MetricSpec) -> dict[tuple[GpuId, str], float]:
        """each (GPU, reason or XID) of ``spec``: the mean of its values in the two scrapes."""
        seen: dict[tuple[GpuId, str], list[float]] = {}
        for scrape in (first, second):
            for (name, gpu, extra), value in scrape.items():
                if name == spec.name and math.isfinite(value):
                    seen.setdefault((gpu, extra), []).append(value)
        return {k: sum(v) / len(v) for k, v in seen.items()}

    def mean_of(spec: V.MetricSpec) -> str:
        return f"mean of {spec.name} over the two scrapes and the GPUs {where}"

    gpus = {g for g, _ in per_gpu(V.GPU_UTILIZATION)} | {g for g, _ in per_gpu(V.GPU_POWER)}
    if gpus:
        target.put(
            Signal.GPU_COUNT, float(len(gpus)), f"GPUs with {V.GPU_UTILIZATION.name} or {V.GPU_POWER.name} {where}"
        )
    for signal, spec in (
        (Signal.GPU_ENGINE_ACTIVE, V.GPU_ENGINE_ACTIVE),
        (Signal.GPU_UTILIZATION, V.GPU_UTILIZATION),
        (Signal.GPU_SM_ACTIVE, V.GPU_SM_ACTIVE),
        (Signal.GPU_TENSOR_ACTIVE, V.GPU_TENSOR_ACTIVE),
        (Signal.GPU_DRAM_ACTIVE, V.GPU_DRAM_ACTIVE),
    ):
        values = per_gpu(spec)
        if values:
            target.put(signal, sum(values.values()) / len(values), mean_of(spec))
    power, limit = per_gpu(V.GPU_POWER), per_gpu(V.GPU_POWER_LIMIT)
    shares = [power[k] / limit[k] for k in power if limit.get(k)]
    if shares:
        target.put(Signal.GPU_POWER_SHARE, max(shares), f"{V.GPU_POWER.name} / {V.GPU_POWER_LIMIT.name} {where}")
    clocks = per_gpu(V.GPU_SM_CLOCK)
    if clocks:
        target.put(Signal.GPU_SM_CLOCK, min(clocks.values()) / 1e6, f"the lowest {mean_of(V.GPU_SM_CLOCK)}")
    temperatures = [v for (name, _, _), v in (*first.items(), *second.items()) if name == V.GPU_TEMPERATURE.name]
    if temperatures:
        target.put(Signal.GPU_TEMPERATURE, max(temperatures), f"the highest {V.GPU_TEMPERATURE.name} {where}")

    readings = target.gpus
    events_query = f"mean of {V.GPU_CLOCK_EVENT.name} (throttling reasons) over the two scrapes {where}"
    for (gpu, reason), share in sorted(per_gpu(V.GPU_CLOCK_EVENT).items()):
        if reason in V.GPU_THROTTLE_CAUSES:
            readings.clock_events.append(GpuReading(_gpu_name(gpu), reason, share, events_query))
    time_query = f"{V.GPU_THROTTLE_TIME.name} delta / interval {where}"
    for (name, gpu, reason), now in sorted(second.items()):
        before = first.get((name, gpu, reason))
        if name == V.GPU_THROTTLE_TIME.name and before is not None and dt > 0:
            readings.throttle_time.append(GpuReading(_gpu_name(gpu), reason, max(now - before, 0.0) / dt, time_query))
    xid_query = f"{V.GPU_XID.name} in either scrape {where}"
    codes = {(gpu, xid) for (name, gpu, xid) in (*first, *second) if name == V.GPU_XID.name and xid}
    readings.xids.extend(GpuReading(_gpu_name(gpu), xid, 1.0, xid_query) for gpu, xid in sorted(codes))
    summarise(target, throttle_query=f"{events_query}; {time_query}", xid_query=xid_query)


def _gpu_name(gpu: GpuId) -> str:
    return gpu_name(dict(zip(GPU_NAMING, gpu, strict=True)))


def _fmt(value: float | None) -> str:
    if value is None:
        return "absent"
    return f"{value:g}" if math.isfinite(value) else str(value)


async def read_fleet(
    client: httpx.AsyncClient,
    urls: Sequence[str],
    *,
    interval: float = DEFAULT_INTERVAL_S,
    filters: Filters,
    timeout: float = 5.0,
) -> Fleet:
    """Scrape every exporter, wait ``interval`` seconds, scrape again; the per-target signals.

    Raises :class:`UpstreamError` naming the first exporter that could not be read.
    """
    targets = [metrics_url(u) for u in urls]
    first = await asyncio.gather(*(_scrape(client, u, timeout) for u in targets))
    started = min(s.at for s in first)
    await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
    second = await asyncio.gather(*(_scrape(client, u, timeout) for u in targets))
    seconds = sum(b.at - a.at for a, b in zip(first, second, strict=True)) / len(targets)
    fleet = Fleet(
        "exporters", _window(seconds), seconds, upstream_queries=2 * len(targets), upstream=", ".join(targets)
    )
    for url, a, b in zip(targets, first, second, strict=True):
        _signals(url, a, b, fleet)
    fleet.targets = {k: v for k, v in fleet.targets.items() if filters.matches(k)}
    return fleet


def exporter_urls(values: Iterable[str]) -> list[str]:
    """Validated exporter URLs (``ValueError`` names the bad one)."""
    return [metrics_url(v) for v in values]
