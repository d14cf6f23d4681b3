"""The careful user's diagnosis, the baseline of ``bench/diagnose.py``: what someone who knows PromQL writes
without inferwatch, given the signals and thresholds of the symptom catalogue.

One fleet-wide query per signal of the diagnosis (:class:`~inferwatch.core.symptoms.Signal`), each
aggregated ``by (engine, model, instance)`` (the expressions one would put in a Grafana table or in
recording rules), all sent at once; then each answer's value put on its target and the catalogue's
thresholds and gates applied in plain Python (a symptom whose signal or gate has no value is skipped;
a consequence of a critical primary is at most a warning, as the catalogue says). What the user does
not write: inferwatch proxy's fallback for engines that lack a signal (this fleet has no proxy), the
target discovery and speculative-decoding queries (targets are read off the answers; speculative
decoding feeds tuning advice, not a symptom), the per-GPU readings behind the GPU findings' evidence, and
the GPU's word on throughput_low's and tpot_slow's causes. So the baseline computes every signal but
judges each symptom from its catalogue threshold alone: less than inferwatch tells, never more.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
import yaml

from inferwatch.collector.diagnosis.prometheus import BY
from inferwatch.collector.diagnosis.signals import TargetKey
from inferwatch.core import vocabulary as V
from inferwatch.core.symptoms import CATALOGUE, Gate, Signal, Status, Symptom

Finding = tuple[str, str, Status]
"""(instance, symptom id, severity): what both diagnoses are compared on."""


def careful_queries(window: str) -> dict[Signal, str]:
    """Signal -> its PromQL, one per signal, written plainly (no fallbacks, no ``or ... * 0`` guards)."""
    w = f"[{window}]"
    by = f"by ({', '.join(BY)})"
    by_le = f"by ({', '.join((*BY, V.LABEL_LE))})"
    per_gpu = f"by ({', '.join((*BY, V.LABEL_GPU_UUID))})"

    def rate(metric: str, matchers: str = "") -> str:
        return f"sum {by} (rate({metric}{matchers}{w}))"

    def p99(spec: V.MetricSpec) -> str:
        return f"histogram_quantile(0.99, sum {by_le} (rate({spec.name}_bucket{w})))"

    def mean(spec: V.MetricSpec) -> str:
        return f"({rate(spec.name + '_sum')} / {rate(spec.name + '_count')})"

    def share(outcome: str) -> str:
        part = rate(V.REQUESTS.name, f'{{{V.LABEL_OUTCOME}="{outcome}"}}')
        return f"{part} / {rate(V.REQUESTS.name)}"

    def over(agg: str, fn: str, spec: V.MetricSpec) -> str:
        return f"{agg} {by} ({fn}({spec.name}{w}))"

    throttling = "|".join(sorted(V.GPU_THROTTLE_CAUSES))
    critical = "|".join(sorted(V.GPU_XID_CRITICAL))
    xid = V.GPU_XID.name
    return {
        Signal.REQUEST_RATE: rate(V.REQUESTS.name),
        Signal.ERROR_RATIO: share(V.OUTCOME_ERROR),
        Signal.ABORT_RATIO: share(V.OUTCOME_ABORT),
        Signal.E2E_P99: p99(V.REQUEST_DURATION),
        Signal.QUEUE_P99: p99(V.REQUEST_QUEUE),
        Signal.QUEUE_SHARE: f"{mean(V.REQUEST_QUEUE)} / {mean(V.REQUEST_DURATION)}",
        Signal.WAITING: over("sum", "avg_over_time", V.REQUESTS_WAITING),
        Signal.RUNNING: over("sum", "avg_over_time", V.REQUESTS_RUNNING),
        Signal.KV_USAGE: over("max", "avg_over_time", V.KV_CACHE_USAGE),
        Signal.KV_CAPACITY: over("sum", "max_over_time", V.KV_CACHE_CAPACITY),
        Signal.PREEMPTION_RATE: rate(V.PREEMPTIONS.name),
        Signal.PREEMPTIONS_PER_REQUEST: (
            f"sum {by} (increase({V.PREEMPTIONS.name}{w})) / sum {by} (increase({V.REQUESTS.name}{w}))"
        ),
        Signal.TTFT_P99: p99(V.TIME_TO_FIRST_TOKEN),
        Signal.TTFT_QUEUE_SHARE: f"{mean(V.REQUEST_QUEUE)} / {mean(V.TIME_TO_FIRST_TOKEN)}",
        Signal.PREFILL_P99: p99(V.REQUEST_PREFILL),
        Signal.PROMPT_TOKENS_MEAN: f"{rate(V.PROMPT_TOKENS.name)} / {rate(V.REQUESTS.name)}",
        Signal.PREFILL_DECODE_RATIO: f"{rate(V.PROMPT_TOKENS.name)} / {rate(V.GENERATION_TOKENS.name)}",
        Signal.TPOT_P99: p99(V.TIME_PER_OUTPUT_TOKEN),
        Signal.GENERATION_RATE: rate(V.GENERATION_TOKENS.name),
        Signal.MAX_CONCURRENCY: (
            f"max by ({', '.join((*BY, V.LABEL_MAX_CONCURRENCY))}) (last_over_time({V.ENGINE_INFO.name}{w}))"
        ),
        Signal.GPU_COUNT: f"count {by} (last_over_time({V.GPU_UTILIZATION.name}{w}))",
        Signal.GPU_ENGINE_ACTIVE: over("avg", "avg_over_time", V.GPU_ENGINE_ACTIVE),
        Signal.GPU_UTILIZATION: over("avg", "avg_over_time", V.GPU_UTILIZATION),
        Signal.GPU_SM_ACTIVE: over("avg", "avg_over_time", V.GPU_SM_ACTIVE),
        Signal.GPU_TENSOR_ACTIVE: over("avg", "avg_over_time", V.GPU_TENSOR_ACTIVE),
        Signal.GPU_DRAM_ACTIVE: over("avg", "avg_over_time", V.GPU_DRAM_ACTIVE),
        Signal.GPU_POWER_SHARE: (
            f"max {by} (avg_over_time({V.GPU_POWER.name}{w}) / avg_over_time({V.GPU_POWER_LIMIT.name}{w}))"
        ),
        Signal.GPU_SM_CLOCK: f"{over('min', 'avg_over_time', V.GPU_SM_CLOCK)} / 1e6",
        Signal.GPU_TEMPERATURE: over("max", "max_over_time", V.GPU_TEMPERATURE),
        Signal.GPU_THROTTLED_SHARE: (
            f'max {by} (avg_over_time({V.GPU_CLOCK_EVENT.name}{{{V.LABEL_REASON}=~"{throttling}"}}{w}) '
            f"or clamp_max(rate({V.GPU_THROTTLE_TIME.name}{w}), 1))"
        ),
        Signal.GPU_XID_CRITICAL: (
            f'count {by} (max {per_gpu} (max_over_time({xid}{{{V.LABEL_XID}=~"{critical}"}}{w})))'
        ),
        Signal.GPU_XID_OTHER: f'count {by} (max {per_gpu} (max_over_time({xid}{{{V.LABEL_XID}!~"{critical}"}}{w})))',
    }


RULES_GROUP = "careful"
RULES_INTERVAL_S = 15


def record_name(signal: Signal, window: str) -> str:
    """The recording rule of ``signal``, named as Prometheus' convention has it: level:metric:operations."""
    return f"{'_'.join(BY)}:{signal.value}:{window}"


def rules_yaml(window: str) -> str:
    """The recording rules the careful user would keep: each query of :func:`careful_queries` recorded."""
    rules = [{"record": record_name(s, window), "expr": q} for s, q in careful_queries(window).items()]
    return yaml.safe_dump({"groups": [{"name": RULES_GROUP, "interval": f"{RULES_INTERVAL_S}s", "rules": rules}]})


@dataclass
class Careful:
    values: dict[TargetKey, dict[Signal, float]]
    findings: set[Finding]
    queries: int
    query_s: float
    """sending the queries and reading their answers onto the targets."""
    judge_s: float
    """applying the thresholds."""

    @property
    def targets(self) -> int:
        return len(self.values)


async def _ask(client: httpx.AsyncClient, base: str, promql: str, timeout: float) -> list[dict[str, object]]:
    resp = await client.get(f"{base}/api/v1/query", params={"query": promql}, timeout=timeout)
    resp.raise_for_status()
    result: list[dict[str, object]] = resp.json()["data"]["result"]
    return result


def _target(item: Mapping[str, object]) -> TargetKey:
    labels = item["metric"]
    assert isinstance(labels, dict)
    engine, model, instance = (str(labels.get(k, "")) for k in BY)
    return TargetKey(engine, model, instance)


def _number(item: Mapping[str, object], signal: Signal) -> float:
    if signal is Signal.MAX_CONCURRENCY:
        labels = item["metric"]
        assert isinstance(labels, dict)
        text = str(labels.get(V.LABEL_MAX_CONCURRENCY, ""))
    else:
        pair = item["value"]
        assert isinstance(pair, list)
        text = str(pair[1])
    try:
        return float(text)
    except ValueError:
        return math.nan


Values = dict[TargetKey, dict[Signal, float]]


async def read(client: httpx.AsyncClient, base: str, window: str, timeout: float, recorded: bool) -> Values:
    """Every signal of every target the answers name; ``recorded``: read off the recording rules' series."""
    queries = {s: record_name(s, window) for s in careful_queries(window)} if recorded else careful_queries(window)
    answers = await asyncio.gather(*(_ask(client, base, q, timeout) for q in queries.values()))
    values: dict[TargetKey, dict[Signal, float]] = {}
    for signal, result in zip(queries, answers, strict=True):
        for item in result:
            value = _number(item, signal)
            if math.isfinite(value):
                values.setdefault(_target(item), {})[signal] = value
    return values


def _holds(gate: Gate, got: Mapping[Signal, float]) -> bool:
    value = got.get(gate.signal)
    scale = got.get(gate.of, math.nan) if gate.of is not None else 1.0
    if value is None or math.isnan(scale):
        return False
    return (gate.above is None or value > gate.above * scale) and (gate.below is None or value < gate.below * scale)


def judge(values: Mapping[TargetKey, Mapping[Signal, float]]) -> set[Finding]:
    """The catalogue's thresholds and gates on each target's signals; primaries first."""
    found: set[Finding] = set()
    ordered = sorted(CATALOGUE, key=lambda s: len(s.secondary_to))
    for key, got in values.items():
        statuses: dict[Symptom, Status] = {}
        for spec in ordered:
            value = got.get(spec.threshold.signal)
            if value is None or not all(_holds(g, got) for g in spec.gates):
                continue
            status = spec.threshold.status(value)
            if spec.id is Symptom.GPU_ERRORS and status is Status.OK and got.get(Signal.GPU_XID_OTHER, 0) > 0:
                status = Status.WARNING
            if status is Status.CRITICAL and any(statuses.get(p) is Status.CRITICAL for p in spec.secondary_to):
                status = Status.WARNING
            statuses[spec.id] = status
            if status in (Status.WARNING, Status.CRITICAL):
                found.add((key.instance, spec.id.value, status))
    return found


async def diagnose(
    client: httpx.AsyncClient, base: str, window: str, timeout: float, *, recorded: bool = False
) -> Careful:
    t0 = time.perf_counter()
    values = await read(client, base, window, timeout, recorded)
    t1 = time.perf_counter()
    found = judge(values)
    t2 = time.perf_counter()
    return Careful(values, found, len(careful_queries(window)), t1 - t0, t2 - t1)
