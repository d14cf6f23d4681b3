"""The headroom model's history, read from Prometheus (one range query per series) or the exporters.

Both give a list of :class:`~inferwatch.core.headroom_inputs.Snapshot` oldest first, which
:func:`inferwatch.core.headroom_inputs.windows` turns into one window per replica. Prometheus gives
the whole window at once; the exporters are scraped every ``step / 4`` seconds for the window, so
the answer from them takes as long as the window (the CLI shows progress).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.collector.diagnosis.exporter_scrape import fetch, instance_of, metrics_url
from inferwatch.collector.diagnosis.prometheus import INSTANCE, api_get
from inferwatch.collector.diagnosis.signals import Filters, TargetKey, UpstreamError
from inferwatch.core import vocabulary as V
from inferwatch.core.headroom import ReplicaKey
from inferwatch.core.headroom_inputs import BUCKETED, MEAN_GAUGES, Snapshot, key_of, series_names

SNAPSHOTS_PER_STEP = 4
"""snapshots per sub-window of the TPOT fit: enough that a sub-window's mean batch is a mean."""
BY = (V.LABEL_ENGINE, V.LABEL_MODEL, INSTANCE, V.LABEL_ROLE)
Progress = Callable[[int, int], None]
"""``progress(done, total)`` after each round of exporter scrapes."""


@dataclass(frozen=True)
class History:
    """The snapshots and how they were read (each query or URL, for the evidence)."""

    snapshots: list[Snapshot]
    source: str
    upstream: str
    evidence: dict[str, str]
    """input name -> the query (or scrape) it came from."""


def _selector(filters: Filters) -> str:
    pairs = [(V.LABEL_ENGINE, filters.engine), (V.LABEL_MODEL, filters.model), (INSTANCE, filters.instance)]
    items = [f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in pairs if v]
    return "{" + ",".join(items) + "}" if items else ""


def range_queries(filters: Filters) -> dict[str, str]:
    """sample name (``<histogram>_bucket`` for buckets, the info metric) -> the PromQL read over the range."""
    sel = _selector(filters)
    by = ", ".join(BY)
    out = {name: f"{'avg' if name in MEAN_GAUGES else 'sum'} by ({by}) ({name}{sel})" for name in series_names()}
    for spec in BUCKETED:
        out[f"{spec.name}_bucket"] = f"sum by ({by}, {V.LABEL_LE}) ({spec.name}_bucket{sel})"
    info = ", ".join((*BY, *V.INFO_LABELS))
    out[V.ENGINE_INFO.name] = f"max by ({info}) ({V.ENGINE_INFO.name}{sel})"
    return out


def _points(item: dict[str, object]) -> list[tuple[float, float]]:
    values = item.get("values")
    out = []
    for pair in values if isinstance(values, list) else ():
        if isinstance(pair, list) and len(pair) == 2:
            try:
                out.append((float(str(pair[0])), float(str(pair[1]))))
            except ValueError:
                continue
    return out


async def from_prometheus(
    client: httpx.AsyncClient,
    base_url: str,
    *,
    window_seconds: float,
    step_seconds: float,
    filters: Filters,
    timeout: float = 5.0,
    now: float | None = None,
) -> History:
    """Every series of :func:`range_queries` over the window, at ``step / 4`` resolution."""
    end = time.time() if now is None else now
    resolution = max(1.0, step_seconds / SNAPSHOTS_PER_STEP)
    params = {"start": f"{end - window_seconds:.3f}", "end": f"{end:.3f}", "step": f"{resolution:g}s"}
    queries = range_queries(filters)
    names = list(queries)
    try:
        async with asyncio.timeout(timeout + 1):
            results = await asyncio.gather(
                *(api_get(client, base_url, "query_range", {"query": queries[n], **params}, timeout) for n in names)
            )
    except TimeoutError:
        raise UpstreamError(base_url, f"Prometheus did not answer within {timeout:g} s") from None
    snaps: dict[float, Snapshot] = {}
    for name, result in zip(names, results, strict=True):
        for item in result:
            metric = item.get("metric")
            labels = {str(k): str(v) for k, v in metric.items()} if isinstance(metric, dict) else {}
            key = key_of(labels, labels.get(INSTANCE, V.UNKNOWN))
            if key is None:
                continue
            for at, value in _points(item):
                snap = snaps.get(at)
                if snap is None:
                    snap = snaps[at] = Snapshot(at)
                snap.add(key, name, value, labels)
    evidence = {
        name: f"{q} over the last {window_seconds:g} s at {resolution:g} s steps" for name, q in queries.items()
    }
    ordered = [snaps[t] for t in sorted(snaps)]
    return History(ordered, "prometheus", base_url, evidence)


def parse_page(text: str, instance: str, at: float) -> Snapshot:
    """One exporter page as a snapshot (``ValueError`` when it is not Prometheus text)."""
    snap = Snapshot(at)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = key_of(sample.labels, instance)
            if key is not None:
                snap.add(key, sample.name, sample.value, sample.labels)
    return snap


def _merge(pages: Sequence[tuple[str, str, float]]) -> Snapshot:
    """One snapshot of every exporter's page of one round, at the round's mean time."""
    snap = Snapshot(math.fsum(at for _, _, at in pages) / len(pages))
    for url, text, at in pages:
        try:
            one = parse_page(text, instance_of(url), at)
        except (ValueError, KeyError) as exc:
            raise UpstreamError(url, f"the exporter's answer is not Prometheus text: {exc}") from None
        snap.values.update(one.values)
        snap.buckets.update(one.buckets)
        snap.info.update(one.info)
    return snap


async def from_exporters(
    client: httpx.AsyncClient,
    urls: Sequence[str],
    *,
    window_seconds: float,
    step_seconds: float,
    filters: Filters,
    timeout: float = 5.0,
    progress: Progress | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> History:
    """Scrape every exporter every ``step / 4`` seconds for the window (a round at each end)."""
    targets = [metrics_url(u) for u in urls]
    resolution = max(0.05, step_seconds / SNAPSHOTS_PER_STEP)
    rounds = max(2, round(window_seconds / resolution) + 1)
    started = time.monotonic()
    snaps = []
    for i in range(rounds):
        await sleep(max(0.0, started + i * resolution - time.monotonic()))
        got = await asyncio.gather(*(fetch(client, u, timeout) for u in targets))
        snaps.append(_merge([(u, text, at) for u, (text, at) in zip(targets, got, strict=True)]))
        if progress is not None:
            progress(i + 1, rounds)
    for snap in snaps:
        keep = {k for k in snap.info if filters.matches(_target(k))} | {
            k for k, _ in snap.values if filters.matches(_target(k))
        }
        snap.values = {(k, n): v for (k, n), v in snap.values.items() if k in keep}
        snap.buckets = {(k, n): v for (k, n), v in snap.buckets.items() if k in keep}
        snap.info = {k: v for k, v in snap.info.items() if k in keep}
    where = f"{rounds} scrapes of {', '.join(targets)} {resolution:g} s apart"
    evidence = {name: f"{name} in {where}" for name in range_queries(filters)}
    return History(snaps, "exporters", ", ".join(targets), evidence)


def _target(key: ReplicaKey) -> TargetKey:
    return TargetKey(key.engine, key.model, key.instance)
