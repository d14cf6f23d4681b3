"""Signals from Prometheus: one fixed set of fleet-wide PromQL queries, whatever the fleet's size.

Every query aggregates ``by (engine, model, instance)``, so one query answers for every target
and the number of queries (:func:`fleet_queries`) does not grow with the number of targets. Each
signal keeps its exact PromQL as evidence, to paste into Grafana or the Prometheus UI.

Where an engine exports no such signal (its profile's ``unsupported``: a time to first token, a time
per output token, an end-to-end latency, finished requests by outcome), the query falls back on what
inferwatch proxy measured for that engine and model (the signal's counterpart in
``V.CLIENT_COUNTERPARTS``): ``<engine's> or on (engine, model, instance) <proxy's>``, the proxy's value
put on every target of that engine and model and marked with a ``measured_at="proxy"`` label, so the
finding says which side measured it. The engine's own value wins wherever it has one. The proxy's request
rate is shared evenly among the targets of its engine and model (it cannot tell which replica served a
request); its shares and quantiles hold for each of them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping

import httpx

from inferwatch.collector.diagnosis import gpu
from inferwatch.collector.diagnosis.signals import (
    ENGINE,
    PROXY,
    Filters,
    Fleet,
    GpuReading,
    Observation,
    TargetKey,
    UpstreamError,
    gpu_name,
    shown_label,
)
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import MeasuredAt, duration_seconds
from inferwatch.core.symptoms import SIGNALS, Signal

INSTANCE = "instance"
BY: tuple[str, ...] = (V.LABEL_ENGINE, V.LABEL_MODEL, INSTANCE)
GPU_BY: tuple[str, ...] = (*BY, V.LABEL_HOST, V.LABEL_GPU, V.LABEL_GPU_UUID)
"""one GPU of a replica (the UUID alone would do; host and index name it for the on-call)."""
INFO_QUERY = "info"
SPEC_DECODE_QUERY = "spec_decode"
GPU_CLOCK_EVENTS_QUERY = "gpu_clock_events"
GPU_THROTTLE_TIME_QUERY = "gpu_throttle_time"
GPU_XID_QUERY = "gpu_xid"
P99 = 0.99
MEASURED_AT = "measured_at"
"""the label the fallback puts on the proxy's values (never on an engine's series)."""
PROXIED_QUANTILES: tuple[Signal, ...] = (Signal.E2E_P99, Signal.TTFT_P99, Signal.TPOT_P99)
"""P99 signals the proxy measures too: the engine's histogram, else the proxy's counterpart."""

MAX_WINDOW_SECONDS = 7 * 86400


def window_seconds(window: str) -> float:
    """Seconds of a PromQL-style duration (``10m``); ``ValueError`` names the expected form."""
    try:
        seconds = duration_seconds(window.strip())
    except ValueError:
        seconds = 0
    if seconds == 0:
        raise ValueError(f"window must be a positive duration such as 30s, 10m or 1h, got {window!r}")
    if seconds > MAX_WINDOW_SECONDS:
        raise ValueError(f"window {window!r} is longer than the 7-day maximum")
    return float(seconds)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(filters: Filters, extra: Mapping[str, str] | None = None) -> str:
    matchers = []
    for label, value in (
        (V.LABEL_ENGINE, filters.engine),
        (V.LABEL_MODEL, filters.model),
        (INSTANCE, filters.instance),
    ):
        if value is not None:
            matchers.append(f"{label}={_quote(value)}")
    matchers += [f"{k}={_quote(v)}" for k, v in (extra or {}).items()]
    return "{" + ", ".join(matchers) + "}" if matchers else ""


def _by(labels: tuple[str, ...] = BY) -> str:
    return "by (" + ", ".join(labels) + ")"


def fleet_queries(window: str, filters: Filters) -> dict[str, str]:
    """Every query the diagnosis runs (name -> PromQL): signals, target discovery, info, spec decode."""
    w = f"[{window}]"
    sel = selector(filters)
    by = _by()

    def rate(metric: str, extra: Mapping[str, str] | None = None) -> str:
        return f"sum {by} (rate({metric}{selector(filters, extra)}{w}))"

    def increase(metric: str) -> str:
        return f"sum {by} (increase({metric}{sel}{w}))"

    def p99(spec: V.MetricSpec) -> str:
        return f"histogram_quantile({P99}, sum {_by((*BY, V.LABEL_LE))} (rate({spec.name}_bucket{sel}{w})))"

    def mean(spec: V.MetricSpec) -> str:
        return f"({rate(spec.name + '_sum')} / {rate(spec.name + '_count')})"

    def share(outcome: str) -> str:
        total = rate(V.REQUESTS.name)
        return f"({rate(V.REQUESTS.name, {V.LABEL_OUTCOME: outcome})} or {total} * 0) / {total}"

    def client_share(outcome: str) -> str:
        """The share measured by inferwatch proxy for the engine and model (it sees the client go
        away, which engines report late or not at all), on every target of that engine and model;
        the engine's own share where no proxy stands in front."""
        em = _by((V.LABEL_ENGINE, V.LABEL_MODEL))
        client = V.CLIENT_REQUESTS.name
        total = f"sum {em} (rate({client}{sel}{w}))"
        part = f"sum {em} (rate({client}{selector(filters, {V.LABEL_OUTCOME: outcome})}{w}))"
        targets = f"(0 * {rate(V.REQUESTS.name)})"
        proxied = (
            f"((({part} or {total} * 0) / {total}) + on ({V.LABEL_ENGINE}, {V.LABEL_MODEL}) group_right () {targets})"
        )
        return f"{proxied} or {share(outcome)}"

    def on_targets(by_engine_model: str) -> str:
        """A value per (engine, model) put on every target of that engine and model (the targets' labels),
        marked as the proxy's."""
        targets = f"(0 * max {by} (last_over_time({V.REQUESTS_RUNNING.name}{sel}{w})))"
        spread = f"({by_engine_model} + on ({V.LABEL_ENGINE}, {V.LABEL_MODEL}) group_right () {targets})"
        return f'label_replace({spread}, "{MEASURED_AT}", "{PROXY}", "{V.LABEL_ENGINE}", ".*")'

    def or_proxy(engine_side: str, proxy_side: str) -> str:
        return f"({engine_side}) or on ({', '.join(BY)}) {on_targets(proxy_side)}"

    client_filters = Filters(filters.engine, filters.model)  # the proxy's instance is not the exporter's
    client_sel = selector(client_filters)
    em = _by((V.LABEL_ENGINE, V.LABEL_MODEL))

    def client_p99(spec: V.MetricSpec) -> str:
        return (
            f"histogram_quantile({P99}, sum {_by((V.LABEL_ENGINE, V.LABEL_MODEL, V.LABEL_LE))} "
            f"(rate({spec.name}_bucket{client_sel}{w})))"
        )

    def client_error_share() -> str:
        client = V.CLIENT_COUNTERPARTS[V.REQUESTS.key].name
        total = f"sum {em} (rate({client}{client_sel}{w}))"
        errors = selector(client_filters, {V.LABEL_OUTCOME: V.OUTCOME_ERROR})
        part = f"sum {em} (rate({client}{errors}{w}))"
        return f"(({part} or {total} * 0) / {total})"

    def client_rate_per_target() -> str:
        """The proxy's finished requests per second for the engine and model, shared evenly among its targets
        (the proxy cannot tell which replica served a request)."""
        client = V.CLIENT_COUNTERPARTS[V.REQUESTS.key].name
        replicas = f"count {em} (max {by} (last_over_time({V.REQUESTS_RUNNING.name}{sel}{w})))"
        return f"(sum {em} (rate({client}{client_sel}{w})) / {replicas})"

    proxied = {
        signal: or_proxy(
            p99(SIGNALS[signal].metrics[0]), client_p99(V.CLIENT_COUNTERPARTS[SIGNALS[signal].metrics[0].key])
        )
        for signal in PROXIED_QUANTILES
    }
    info_labels = (*BY, *V.INFO_LABELS)
    gpu = gpu_queries(window, filters)
    return {
        **gpu,
        INFO_QUERY: f"max {_by(info_labels)} (last_over_time({V.ENGINE_INFO.name}{sel}{w}))",
        SPEC_DECODE_QUERY: f"sum {by} (last_over_time({V.SPEC_DECODE_DRAFT_TOKENS.name}{sel}{w}))",
        Signal.REQUEST_RATE: or_proxy(rate(V.REQUESTS.name), client_rate_per_target()),
        Signal.ERROR_RATIO: or_proxy(share(V.OUTCOME_ERROR), client_error_share()),
        Signal.ABORT_RATIO: client_share(V.OUTCOME_ABORT),
        Signal.E2E_P99: proxied[Signal.E2E_P99],
        Signal.QUEUE_P99: p99(V.REQUEST_QUEUE),
        Signal.QUEUE_SHARE: f"{mean(V.REQUEST_QUEUE)} / {mean(V.REQUEST_DURATION)}",
        Signal.WAITING: f"sum {by} (avg_over_time({V.REQUESTS_WAITING.name}{sel}{w}))",
        Signal.RUNNING: f"sum {by} (avg_over_time({V.REQUESTS_RUNNING.name}{sel}{w}))",
        Signal.KV_USAGE: f"max {by} (avg_over_time({V.KV_CACHE_USAGE.name}{sel}{w}))",
        Signal.KV_CAPACITY: f"sum {by} (max_over_time({V.KV_CACHE_CAPACITY.name}{sel}{w}))",
        Signal.PREEMPTION_RATE: rate(V.PREEMPTIONS.name),
        Signal.PREEMPTIONS_PER_REQUEST: f"{increase(V.PREEMPTIONS.name)} / clamp_min({increase(V.REQUESTS.name)}, 1)",
        Signal.TTFT_P99: proxied[Signal.TTFT_P99],
        Signal.TTFT_QUEUE_SHARE: f"{mean(V.REQUEST_QUEUE)} / {mean(V.TIME_TO_FIRST_TOKEN)}",
        Signal.PREFILL_P99: p99(V.REQUEST_PREFILL),
        Signal.PROMPT_TOKENS_MEAN: f"{rate(V.PROMPT_TOKENS.name)} / {rate(V.REQUESTS.name)}",
        Signal.PREFILL_DECODE_RATIO: f"{rate(V.PROMPT_TOKENS.name)} / {rate(V.GENERATION_TOKENS.name)}",
        Signal.TPOT_P99: proxied[Signal.TPOT_P99],
        Signal.GENERATION_RATE: rate(V.GENERATION_TOKENS.name),
    }


def gpu_queries(window: str, filters: Filters) -> dict[str, str]:
    """The GPU beneath each replica (``llm_gpu_*``, which carry the replica's labels): its activity per
    target (engine activity, else NVML's utilisation: both are asked, the evaluation picks), and per GPU
    the throttling clock-event reasons, the throttle time and the XID codes, for the GPU findings."""
    w = f"[{window}]"
    sel = selector(filters)
    by, per_gpu = _by(), _by(GPU_BY)
    throttling = f'{V.LABEL_REASON}=~"{"|".join(sorted(V.GPU_THROTTLE_CAUSES))}"'
    events = sel[:-1] + ", " + throttling + "}" if sel else "{" + throttling + "}"

    def mean(spec: V.MetricSpec) -> str:
        return f"avg {by} (avg_over_time({spec.name}{sel}{w}))"

    per_gpu_util = f"max {per_gpu} (last_over_time({V.GPU_UTILIZATION.name}{sel}{w}))"
    per_gpu_power = f"max {per_gpu} (last_over_time({V.GPU_POWER.name}{sel}{w}))"
    clock_events = f"max {_by((*GPU_BY, V.LABEL_REASON))} (avg_over_time({V.GPU_CLOCK_EVENT.name}{events}{w}))"
    throttle_time = f"max {_by((*GPU_BY, V.LABEL_REASON))} (rate({V.GPU_THROTTLE_TIME.name}{sel}{w}))"
    power_share = (
        f"max {by} (max {per_gpu} (avg_over_time({V.GPU_POWER.name}{sel}{w})) / "
        f"max {per_gpu} (avg_over_time({V.GPU_POWER_LIMIT.name}{sel}{w})))"
    )
    return {
        Signal.GPU_COUNT: f"count {by} ({per_gpu_util} or {per_gpu_power})",
        Signal.GPU_ENGINE_ACTIVE: mean(V.GPU_ENGINE_ACTIVE),
        Signal.GPU_UTILIZATION: mean(V.GPU_UTILIZATION),
        Signal.GPU_SM_ACTIVE: mean(V.GPU_SM_ACTIVE),
        Signal.GPU_TENSOR_ACTIVE: mean(V.GPU_TENSOR_ACTIVE),
        Signal.GPU_DRAM_ACTIVE: mean(V.GPU_DRAM_ACTIVE),
        Signal.GPU_POWER_SHARE: power_share,
        Signal.GPU_SM_CLOCK: f"min {by} (avg_over_time({V.GPU_SM_CLOCK.name}{sel}{w})) / 1e6",
        Signal.GPU_TEMPERATURE: f"max {by} (max_over_time({V.GPU_TEMPERATURE.name}{sel}{w}))",
        GPU_CLOCK_EVENTS_QUERY: clock_events,
        GPU_THROTTLE_TIME_QUERY: throttle_time,
        GPU_XID_QUERY: f"max {_by((*GPU_BY, V.LABEL_XID))} (max_over_time({V.GPU_XID.name}{sel}{w}))",
    }


def throttled_share_query(queries: Mapping[str, str]) -> str:
    """The PromQL of the throttled share of the window, per target: what :func:`gpu.summarise` computes
    from the per-GPU readings (shown as its evidence, not run: the readings are)."""
    by = _by()
    return f"max {by} ({queries[GPU_CLOCK_EVENTS_QUERY]} or clamp_max({queries[GPU_THROTTLE_TIME_QUERY]}, 1))"


def _key(labels: Mapping[str, str]) -> TargetKey:
    return TargetKey(
        labels.get(V.LABEL_ENGINE, V.UNKNOWN), labels.get(V.LABEL_MODEL, V.UNKNOWN), labels.get(INSTANCE, V.UNKNOWN)
    )


async def _query(client: httpx.AsyncClient, base_url: str, promql: str, timeout: float) -> list[dict[str, object]]:
    return await api_get(client, base_url, "query", {"query": promql}, timeout)


async def api_get(
    client: httpx.AsyncClient, base_url: str, path: str, params: Mapping[str, str], timeout: float
) -> list[dict[str, object]]:
    """``GET /api/v1/<path>`` (``query`` or ``query_range``): the result list, or :class:`UpstreamError`."""
    url = base_url.rstrip("/") + "/api/v1/" + path
    try:
        resp = await client.get(url, params={**params, "timeout": f"{timeout:g}s"}, timeout=timeout)
    except httpx.TimeoutException:
        raise UpstreamError(base_url, f"Prometheus did not answer within {timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise UpstreamError(base_url, f"cannot reach Prometheus: {exc.__class__.__name__}: {exc}") from None
    try:
        body = resp.json()
    except ValueError:
        raise UpstreamError(
            base_url, f"Prometheus answered HTTP {resp.status_code} with a body that is not JSON"
        ) from None
    if resp.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else None
        raise UpstreamError(base_url, f"Prometheus answered HTTP {resp.status_code}: {error or 'no error message'}")
    data = body.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        raise UpstreamError(base_url, "Prometheus answered without a result list")
    return [r for r in result if isinstance(r, dict)]


def _value(item: Mapping[str, object]) -> float:
    pair = item.get("value")
    if isinstance(pair, list) and len(pair) == 2:
        try:
            return float(str(pair[1]))
        except ValueError:
            return math.nan
    return math.nan


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text not in (None, "", V.UNKNOWN) else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and value > 0 else None


def _labels(item: Mapping[str, object]) -> dict[str, str]:
    metric = item.get("metric")
    return {str(k): str(v) for k, v in metric.items()} if isinstance(metric, dict) else {}


def _side(labels: Mapping[str, str]) -> MeasuredAt:
    return PROXY if labels.get(MEASURED_AT) == PROXY else ENGINE


async def read_fleet(
    client: httpx.AsyncClient,
    base_url: str,
    *,
    window: str,
    filters: Filters,
    timeout: float = 5.0,
) -> Fleet:
    """Run every query of :func:`fleet_queries` concurrently; the per-target signals.

    Raises :class:`UpstreamError` naming Prometheus and the problem (unreachable, slower than
    ``timeout`` seconds, an error answer).
    """
    queries = fleet_queries(window, filters)
    names = list(queries)
    try:
        async with asyncio.timeout(timeout + 1):
            results = await asyncio.gather(*(_query(client, base_url, queries[n], timeout) for n in names))
    except TimeoutError:
        raise UpstreamError(base_url, f"Prometheus did not answer within {timeout:g} s") from None
    fleet = Fleet("prometheus", window, window_seconds(window), upstream_queries=len(names), upstream=base_url)
    by_name = dict(zip(names, results, strict=True))
    # the targets: every engine series with a running gauge in the window (the running signal's own answer)
    for item in by_name[Signal.RUNNING]:
        fleet.target(_key(_labels(item)))
    for item in by_name[INFO_QUERY]:
        labels = _labels(item)
        target = fleet.target(_key(labels))
        if not target.info:
            target.info = {k: v for k, v in labels.items() if k in V.INFO_LABELS}
            target.info_query = queries[INFO_QUERY]
            limit = _number(target.info.get(V.LABEL_MAX_CONCURRENCY))
            if limit is not None:
                target.put(Signal.MAX_CONCURRENCY, limit, queries[INFO_QUERY])
    for item in by_name[SPEC_DECODE_QUERY]:
        target = fleet.target(_key(_labels(item)))
        value = _value(item)
        if math.isfinite(value):
            target.spec_decode = Observation(value, queries[SPEC_DECODE_QUERY])
    _gpu_readings(fleet, by_name, queries)
    for signal in Signal:
        if signal not in by_name:
            continue
        for item in by_name[signal]:
            labels = _labels(item)
            key = _key(labels)
            if key not in fleet.targets:
                continue  # a signal of a target that has no running gauge: not an engine series
            fleet.targets[key].put(signal, _value(item), queries[signal], _side(labels))
    for target in fleet.targets.values():
        gpu.summarise(target, throttle_query=throttled_share_query(queries), xid_query=queries[GPU_XID_QUERY])
    fleet.targets = {k: v for k, v in fleet.targets.items() if filters.matches(k)}
    return fleet


def _gpu_readings(fleet: Fleet, by_name: Mapping[str, list[dict[str, object]]], queries: Mapping[str, str]) -> None:
    """Each target's per-GPU readings: throttling reasons, throttle time, XID codes (targets that have a
    running gauge only, as for every signal)."""
    for name, label in (
        (GPU_CLOCK_EVENTS_QUERY, V.LABEL_REASON),
        (GPU_THROTTLE_TIME_QUERY, V.LABEL_REASON),
        (GPU_XID_QUERY, V.LABEL_XID),
    ):
        for item in by_name[name]:
            labels = _labels(item)
            target = fleet.targets.get(_key(labels))
            value = _value(item)
            if target is None or not math.isfinite(value) or not labels.get(label):
                continue
            found = GpuReading(gpu_name(labels), shown_label(labels[label]), value, queries[name])
            {
                GPU_CLOCK_EVENTS_QUERY: target.gpus.clock_events,
                GPU_THROTTLE_TIME_QUERY: target.gpus.throttle_time,
                GPU_XID_QUERY: target.gpus.xids,
            }[name].append(found)


async def read_cost_per_million(
    client: httpx.AsyncClient, base_url: str, at: float, seconds: int, timeout: float
) -> dict[str, float]:
    """Per model, the mean of the recorded USD per million generated tokens over the ``seconds`` before ``at``
    (the rules' all-in cost of a model's GPUs over its generated tokens, docs/cost.md); models without the
    record (no GPU series, no price) are absent."""
    record = V.COST_PER_MILLION_GENERATION_RECORD
    promql = f"avg by ({V.LABEL_MODEL}) (avg_over_time({record}[{max(60, seconds)}s]))"
    result = await api_get(client, base_url, "query", {"query": promql, "time": f"{at:.3f}"}, timeout)
    out: dict[str, float] = {}
    for item in result:
        value, model = _value(item), _labels(item).get(V.LABEL_MODEL)
        if model and math.isfinite(value) and value >= 0:
            out[model] = value
    return out
