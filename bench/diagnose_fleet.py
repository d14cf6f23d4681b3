"""The synthetic fleet of ``bench/diagnose.py``: N targets (an engine, model and instance each; a few in
trouble) and their hour of canonical series, written as OpenMetrics for ``promtool`` to backfill."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO

from inferwatch.collector.diagnosis import prometheus
from inferwatch.collector.diagnosis.signals import TargetKey
from inferwatch.core import vocabulary as V
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.symptoms import Symptom

STEP_S = 15
JOB = "inferwatch"
ENGINE_CYCLE = (V.ENGINE_VLLM, V.ENGINE_VLLM, V.ENGINE_TGI, V.ENGINE_TRTLLM, V.ENGINE_TRITON)
MODELS = ("llama-3.1-8b-instruct", "qwen2.5-7b-instruct", "mistral-7b-instruct-v0.3", "llama-3.1-70b-instruct")
PREEMPTING, QUEUEING, FAILING = "preempting", "queueing", "failing"
TROUBLE_EVERY = 25
TROUBLE_AT = {1: PREEMPTING, 2: QUEUEING, 4: FAILING}
"""index % TROUBLE_EVERY -> trouble; with ENGINE_CYCLE: a vLLM preempts, a TGI queues, a Triton fails."""
EXPECTED = {PREEMPTING: Symptom.PREEMPTIONS, QUEUEING: Symptom.LATENCY_P99_HIGH, FAILING: Symptom.ERROR_RATE_HIGH}
INFO: dict[str, dict[str, str]] = {
    V.ENGINE_VLLM: {
        V.LABEL_ENGINE_VERSION: "0.8.5",
        V.LABEL_BLOCK_SIZE: "16",
        V.LABEL_GPU_MEMORY_UTILIZATION: "0.9",
        V.LABEL_PREFIX_CACHING: V.TRUE,
        V.LABEL_KV_CACHE_DTYPE: "auto",
        V.LABEL_MAX_CONCURRENCY: "256",
    },
    V.ENGINE_TGI: {
        V.LABEL_ENGINE_VERSION: "3.2.3",
        V.LABEL_BLOCK_SIZE: "32",
        V.LABEL_GPU_MEMORY_UTILIZATION: "0.95",
        V.LABEL_PREFIX_CACHING: V.TRUE,
        V.LABEL_KV_CACHE_DTYPE: V.UNKNOWN,
        V.LABEL_MAX_CONCURRENCY: "128",
    },
    V.ENGINE_TRTLLM: {
        V.LABEL_ENGINE_VERSION: "0.19.0",
        V.LABEL_BLOCK_SIZE: "32",
        V.LABEL_GPU_MEMORY_UTILIZATION: "0.9",
        V.LABEL_PREFIX_CACHING: V.FALSE,
        V.LABEL_KV_CACHE_DTYPE: "fp8",
        V.LABEL_MAX_CONCURRENCY: "192",
    },
    V.ENGINE_TRITON: {
        V.LABEL_ENGINE_VERSION: "25.04",
        V.LABEL_BLOCK_SIZE: "64",
        V.LABEL_GPU_MEMORY_UTILIZATION: "0.9",
        V.LABEL_PREFIX_CACHING: V.TRUE,
        V.LABEL_KV_CACHE_DTYPE: "auto",
        V.LABEL_MAX_CONCURRENCY: "128",
    },
}


@dataclass(frozen=True)
class Latency:
    """A log-normal latency: its median (seconds) and the sigma of its logarithm."""

    median: float
    sigma: float

    def cdf(self, bound: float) -> float:
        return 0.5 * (1.0 + math.erf((math.log(bound) - math.log(self.median)) / (self.sigma * math.sqrt(2.0))))

    @property
    def mean(self) -> float:
        return self.median * math.exp(self.sigma**2 / 2)


@dataclass
class Target:
    index: int
    engine: str
    model: str
    instance: str
    trouble: str | None
    rate: float
    """finished requests per second."""
    shares: dict[str, float]
    """outcome -> share of finished requests."""
    prompt_tokens: float
    generation_tokens: float
    preemptions_per_request: float
    latency: dict[str, Latency]
    """histogram key -> its distribution."""
    running: float
    waiting: float
    kv_usage: float
    kv_capacity: int
    spec_decode: bool
    finished: list[int] = field(default_factory=list)
    """requests finished per step (index 0: everything before the first sample)."""

    @property
    def key(self) -> TargetKey:
        return TargetKey(self.engine, self.model, self.instance)

    @property
    def labels(self) -> str:
        pairs = ((V.LABEL_ENGINE, self.engine), (V.LABEL_MODEL, self.model), (prometheus.INSTANCE, self.instance))
        return ",".join(f'{k}="{v}"' for k, v in (*pairs, ("job", JOB)))


def make_targets(n: int, steps: int, seed: int = 7) -> list[Target]:
    targets = []
    for i in range(n):
        rng = random.Random(seed * 100_003 + i)
        engine = ENGINE_CYCLE[i % len(ENGINE_CYCLE)]
        trouble = TROUBLE_AT.get(i % TROUBLE_EVERY)
        rate = rng.uniform(0.5, 4.0)
        latency = {
            V.REQUEST_DURATION.key: Latency(rng.uniform(1.5, 4.0), 0.7),
            V.REQUEST_QUEUE.key: Latency(rng.uniform(0.01, 0.02), 0.9),
            V.TIME_TO_FIRST_TOKEN.key: Latency(rng.uniform(0.06, 0.12), 0.45),
            V.REQUEST_PREFILL.key: Latency(rng.uniform(0.04, 0.09), 0.45),
            V.TIME_PER_OUTPUT_TOKEN.key: Latency(rng.uniform(0.015, 0.03), 0.3),
        }
        error = rng.uniform(0.0005, 0.004)
        abort = rng.uniform(0.002, 0.02)
        t = Target(
            index=i,
            engine=engine,
            model=MODELS[(i // len(ENGINE_CYCLE)) % len(MODELS)],
            instance=f"gpu-{i // 8:03d}.inference.internal:{9400 + i % 8}",
            trouble=trouble,
            rate=rate,
            shares={},
            prompt_tokens=rng.uniform(300, 2500),
            generation_tokens=rng.uniform(120, 600),
            preemptions_per_request=0.0,
            latency=latency,
            running=rng.uniform(4, 40),
            waiting=0.1,
            kv_usage=rng.uniform(0.25, 0.75),
            kv_capacity=rng.choice((65_536, 131_072, 262_144, 524_288)),
            spec_decode=engine == V.ENGINE_VLLM and i % 3 == 0,
        )
        if trouble == PREEMPTING:
            t.preemptions_per_request = 0.25
            t.kv_usage, t.waiting, t.running = 0.97, 5.0, 60.0
            latency[V.REQUEST_DURATION.key] = Latency(6.0, 0.8)
            latency[V.TIME_PER_OUTPUT_TOKEN.key] = Latency(0.04, 0.3)
        elif trouble == QUEUEING:
            t.waiting, t.running = 20.0, 128.0
            latency[V.REQUEST_QUEUE.key] = Latency(3.0, 0.5)
            latency[V.REQUEST_DURATION.key] = Latency(9.0, 0.5)
        elif trouble == FAILING:
            error = 0.08
        t.shares = {
            V.OUTCOME_ERROR: error,
            V.OUTCOME_ABORT: abort,
            V.OUTCOME_LENGTH: 0.12,
            V.OUTCOME_STOP: 1.0 - error - abort - 0.12,
        }
        t.finished = [rng.randint(5_000, 200_000)] + [
            max(0, round(rate * STEP_S * (1 + 0.2 * rng.gauss()))) for _ in range(steps)
        ]
        targets.append(t)
    return targets


def _cumulative(values: Sequence[float]) -> Iterator[float]:
    total = 0.0
    for v in values:
        total += v
        yield total


def _shared(finished: Sequence[int], share: float) -> list[int]:
    """Per step, the whole count of ``share`` of the finished requests (the fractions carried over)."""
    out, expected, counted = [], 0.0, 0
    for n in finished:
        expected += n * share
        out.append(math.floor(expected) - counted)
        counted += out[-1]
    return out


def _series(name: str, labels: str, values: Sequence[float], stamps: Sequence[int]) -> str:
    return "".join(f"{name}{{{labels}}} {V.format_value(v)} {ts}\n" for v, ts in zip(values, stamps, strict=True))


def _gauge(rng: random.Random, mean: float, spread: float, low: float, high: float, n: int) -> list[float]:
    return [min(high, max(low, rng.gauss(mean, spread))) for _ in range(n)]


def write_openmetrics(out: IO[str], targets: Sequence[Target], stamps: Sequence[int]) -> int:
    """Every canonical series the diagnosis reads, for every target (an engine's unsupported ones left
    out, as its exporter does), one family after the other; returns the number of samples."""
    profiles = builtin_profiles()
    vocabulary = V.Vocabulary()
    samples = 0

    def exposed(spec: V.MetricSpec, t: Target) -> bool:
        return spec.key not in profiles[t.engine].unsupported

    def increments(spec: V.MetricSpec, t: Target) -> dict[str, list[float]]:
        """extra labels -> the counter's increase per step (the first: its value before the first sample)."""
        if spec is V.REQUESTS:
            return {
                f',{V.LABEL_OUTCOME}="{o}"': [float(c) for c in _shared(t.finished, s)] for o, s in t.shares.items()
            }
        if spec is V.PROMPT_TOKENS:
            return {"": [round(n * t.prompt_tokens) for n in t.finished]}
        if spec is V.GENERATION_TOKENS:
            return {"": [round(n * t.generation_tokens) for n in t.finished]}
        if spec is V.PREEMPTIONS:
            return {"": [float(c) for c in _shared(t.finished, t.preemptions_per_request)]}
        if spec is V.SPEC_DECODE_DRAFT_TOKENS and t.spec_decode:
            return {"": [round(n * t.generation_tokens * 0.7) for n in t.finished]}
        return {}

    stepped = len(stamps)
    for spec in (V.REQUESTS, V.PROMPT_TOKENS, V.GENERATION_TOKENS, V.PREEMPTIONS, V.SPEC_DECODE_DRAFT_TOKENS):
        out.write(f"# TYPE {spec.name.removesuffix('_total')} counter\n")
        for t in targets:
            if not exposed(spec, t):
                continue
            for extra, steps in increments(spec, t).items():
                out.write(_series(spec.name, t.labels + extra, list(_cumulative(steps))[1:], stamps))
                samples += stepped

    for spec in (
        V.REQUEST_DURATION,
        V.REQUEST_QUEUE,
        V.TIME_TO_FIRST_TOKEN,
        V.REQUEST_PREFILL,
        V.TIME_PER_OUTPUT_TOKEN,
    ):
        out.write(f"# TYPE {spec.name} histogram\n")
        bounds = vocabulary.buckets(spec)
        les = vocabulary.le_strings(spec)
        for t in targets:
            if not exposed(spec, t):
                continue
            dist = t.latency[spec.key]
            shares = [dist.cdf(b) for b in bounds]
            cumulative = [0] * (len(bounds) + 1)
            total, count = 0.0, 0
            lines = []
            bucket_labels = [f'{t.labels},{V.LABEL_LE}="{le}"' for le in les]
            for step, n in enumerate(t.finished):
                for j, share in enumerate(shares):
                    cumulative[j] += round(n * share)
                cumulative[-1] += n
                count += n
                total += n * dist.mean
                if step == 0:
                    continue
                ts = stamps[step - 1]
                for labels, c in zip(bucket_labels, cumulative, strict=True):
                    lines.append(f"{spec.name}_bucket{{{labels}}} {c} {ts}\n")
                lines.append(f"{spec.name}_count{{{t.labels}}} {count} {ts}\n")
                lines.append(f"{spec.name}_sum{{{t.labels}}} {total:.6f} {ts}\n")
            out.write("".join(lines))
            samples += len(lines)

    for spec in (V.REQUESTS_RUNNING, V.REQUESTS_WAITING, V.KV_CACHE_USAGE, V.KV_CACHE_CAPACITY, V.ENGINE_INFO):
        out.write(f"# TYPE {spec.name} gauge\n")
        for t in targets:
            if not exposed(spec, t):
                continue
            rng = random.Random(f"{spec.key}/{t.index}")
            labels = t.labels
            values: list[float]
            if spec is V.REQUESTS_RUNNING:
                values = [round(v) for v in _gauge(rng, t.running, 3.0, 0, 1024, stepped)]
            elif spec is V.REQUESTS_WAITING:
                if t.waiting < 1:  # an occasional request waiting for a step
                    values = [1 if rng.random() < t.waiting else 0 for _ in range(stepped)]
                else:
                    values = [round(v) for v in _gauge(rng, t.waiting, t.waiting / 4, 0, 1024, stepped)]
            elif spec is V.KV_CACHE_USAGE:
                values = _gauge(rng, t.kv_usage, 0.015, 0.0, 1.0, stepped)
            elif spec is V.KV_CACHE_CAPACITY:
                values = [t.kv_capacity] * stepped
            else:
                labels += "".join(f',{k}="{v}"' for k, v in INFO[t.engine].items())
                values = [1] * stepped
            out.write(_series(spec.name, labels, values, stamps))
            samples += stepped
    out.write("# EOF\n")
    return samples
