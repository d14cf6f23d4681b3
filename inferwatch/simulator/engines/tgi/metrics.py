"""TGI's router metrics: the raw names (spelled only here), the subset of the Rust
``metrics-exporter-prometheus`` 0.15.3 recorder TGI installs, and the serving model's steps recorded as
``backends/v3`` records its batches and requests."""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from inferwatch.simulator.base import EngineMetrics, SimulatedEngine
from inferwatch.simulator.engines.tgi.protocol import DEFAULT_GENERATION_LENGTH, rust_f64, timings
from inferwatch.simulator.scheduler import Finish, Sequence, StepReport

# -- metric names (raw TGI names are spelled only here) ---------------------------------------------
REQUEST_COUNT = "tgi_request_count"
REQUEST_SUCCESS = "tgi_request_success"
REQUEST_FAILURE = "tgi_request_failure"
REQUEST_DURATION = "tgi_request_duration"
REQUEST_VALIDATION_DURATION = "tgi_request_validation_duration"
REQUEST_QUEUE_DURATION = "tgi_request_queue_duration"
REQUEST_INFERENCE_DURATION = "tgi_request_inference_duration"
REQUEST_MEAN_TPT_DURATION = "tgi_request_mean_time_per_token_duration"
REQUEST_GENERATED_TOKENS = "tgi_request_generated_tokens"
REQUEST_INPUT_LENGTH = "tgi_request_input_length"
REQUEST_MAX_NEW_TOKENS = "tgi_request_max_new_tokens"
QUEUE_SIZE = "tgi_queue_size"
BATCH_NEXT_SIZE = "tgi_batch_next_size"
BATCH_CURRENT_SIZE = "tgi_batch_current_size"
BATCH_CURRENT_MAX_TOKENS = "tgi_batch_current_max_tokens"
BATCH_CONCAT = "tgi_batch_concat"
BATCH_INFERENCE_COUNT = "tgi_batch_inference_count"
BATCH_INFERENCE_SUCCESS = "tgi_batch_inference_success"
BATCH_INFERENCE_FAILURE = "tgi_batch_inference_failure"
BATCH_FORWARD_DURATION = "tgi_batch_forward_duration"
BATCH_DECODE_DURATION = "tgi_batch_decode_duration"
BATCH_FILTER_DURATION = "tgi_batch_filter_duration"
BATCH_INFERENCE_DURATION = "tgi_batch_inference_duration"
BATCH_CONCAT_DURATION = "tgi_batch_concat_duration"
REQUEST_SKIPPED_TOKENS = "tgi_request_skipped_tokens"

COUNTER, GAUGE, HISTOGRAM, SUMMARY = "counter", "gauge", "histogram", "summary"
GROUP = {COUNTER: 0, GAUGE: 1, HISTOGRAM: 2, SUMMARY: 2}

DURATION, INPUT, TOTAL, BATCH = "duration", "input", "total", "batch"


@dataclass(frozen=True)
class FamilySpec:
    kind: str
    help: str | None
    buckets: str | None = None
    """which bucket configuration of the router applies (histograms only)."""


PER_METHOD = " per method (prefill or decode)"
FAMILIES: dict[str, FamilySpec] = {
    REQUEST_COUNT: FamilySpec(COUNTER, "Total number of requests"),
    REQUEST_SUCCESS: FamilySpec(COUNTER, "Number of successful requests"),
    REQUEST_FAILURE: FamilySpec(COUNTER, None),
    BATCH_CONCAT: FamilySpec(COUNTER, None),
    BATCH_INFERENCE_COUNT: FamilySpec(COUNTER, "Inference calls" + PER_METHOD),
    BATCH_INFERENCE_SUCCESS: FamilySpec(COUNTER, "Number of successful inference calls" + PER_METHOD),
    BATCH_INFERENCE_FAILURE: FamilySpec(COUNTER, None),
    QUEUE_SIZE: FamilySpec(GAUGE, "Current queue size"),
    BATCH_CURRENT_SIZE: FamilySpec(GAUGE, "Current batch size"),
    BATCH_CURRENT_MAX_TOKENS: FamilySpec(GAUGE, "Maximum tokens for the current batch"),
    REQUEST_DURATION: FamilySpec(HISTOGRAM, "Request duration", DURATION),
    REQUEST_VALIDATION_DURATION: FamilySpec(HISTOGRAM, "Request validation duration", DURATION),
    REQUEST_QUEUE_DURATION: FamilySpec(HISTOGRAM, "Request queue duration", DURATION),
    REQUEST_INFERENCE_DURATION: FamilySpec(HISTOGRAM, "Request inference duration", DURATION),
    REQUEST_MEAN_TPT_DURATION: FamilySpec(HISTOGRAM, "Mean time per token per request", DURATION),
    REQUEST_GENERATED_TOKENS: FamilySpec(HISTOGRAM, "Generated tokens per request", TOTAL),
    REQUEST_INPUT_LENGTH: FamilySpec(HISTOGRAM, "Input token length per request", INPUT),
    REQUEST_MAX_NEW_TOKENS: FamilySpec(HISTOGRAM, "Maximum new tokens per request", TOTAL),
    BATCH_NEXT_SIZE: FamilySpec(HISTOGRAM, "Batch size of the next batch", BATCH),
    BATCH_FORWARD_DURATION: FamilySpec(HISTOGRAM, "Batch forward duration" + PER_METHOD, DURATION),
    BATCH_DECODE_DURATION: FamilySpec(HISTOGRAM, "Time spent decoding a batch" + PER_METHOD, DURATION),
    BATCH_FILTER_DURATION: FamilySpec(
        HISTOGRAM, "Time spent filtering batches and sending generated tokens" + PER_METHOD, DURATION
    ),
    BATCH_INFERENCE_DURATION: FamilySpec(HISTOGRAM, "Batch inference duration", DURATION),
    BATCH_CONCAT_DURATION: FamilySpec(HISTOGRAM, None, DURATION),
    REQUEST_SKIPPED_TOKENS: FamilySpec(SUMMARY, "Speculated tokens per request"),
}
SUMMARY_QUANTILES = (0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)
SUMMARY_WINDOW = 60.0


def duration_buckets() -> list[float]:
    """35 bounds: 0.0001 multiplied by 1.5 again and again (the router's float noise included)."""
    value, out = 0.0001, []
    for _ in range(35):
        value *= 1.5
        out.append(value)
    return out


def linear_buckets(max_tokens: int) -> list[float]:
    return [(max_tokens / 100.0) * float(x + 1) for x in range(100)]


def batch_buckets() -> list[float]:
    return [float(x + 1) for x in range(1024)]


# -- the recorder -----------------------------------------------------------------------------------
Labels = tuple[tuple[str, str], ...]


class _Histogram:
    __slots__ = ("count", "counts", "sum")

    def __init__(self, n: int) -> None:
        self.counts = [0] * n
        self.sum = 0.0
        self.count = 0


class _Summary:
    __slots__ = ("count", "recent", "sum")

    def __init__(self) -> None:
        self.recent: deque[tuple[float, float]] = deque(maxlen=20_000)
        self.sum = 0.0
        self.count = 0


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    items = [*labels, extra] if extra else list(labels)
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}"


class Recorder:
    """The subset of metrics-exporter-prometheus 0.15.3 TGI uses: families appear when first touched."""

    def __init__(self, bounds: Mapping[str, list[float]], rng: random.Random, clock: Callable[[], float]) -> None:
        self.bounds = bounds
        self.les = {k: [rust_f64(b) for b in v] for k, v in bounds.items()}
        self.rng = rng
        self.clock = clock
        self.series: dict[str, dict[Labels, Any]] = {}

    def _series(self, name: str, labels: Labels, make: Callable[[], Any]) -> Any:
        fam = self.series.setdefault(name, {})
        s = fam.get(labels)
        if s is None:
            s = fam[labels] = make()
        return s

    def inc(self, name: str, by: int = 1, **labels: str) -> None:
        key = tuple(labels.items())
        fam = self.series.setdefault(name, {})
        fam[key] = fam.get(key, 0) + by

    def set(self, name: str, value: float, **labels: str) -> None:
        self.series.setdefault(name, {})[tuple(labels.items())] = float(value)

    def add(self, name: str, value: float, **labels: str) -> None:
        key = tuple(labels.items())
        fam = self.series.setdefault(name, {})
        fam[key] = fam.get(key, 0.0) + value

    def observe(self, name: str, value: float, **labels: str) -> None:
        spec = FAMILIES[name]
        if spec.kind == SUMMARY:
            summ: _Summary = self._series(name, tuple(labels.items()), _Summary)
            summ.recent.append((self.clock(), value))
            summ.sum += value
            summ.count += 1
            return
        assert spec.buckets is not None
        bounds = self.bounds[spec.buckets]
        hist: _Histogram = self._series(name, tuple(labels.items()), lambda: _Histogram(len(bounds)))
        idx = bisect.bisect_left(bounds, value)  # metrics-util counts value <= bound
        if idx < len(bounds):
            hist.counts[idx] += 1
        hist.sum += value
        hist.count += 1

    def render(self) -> str:
        groups: list[list[str]] = [[], [], []]
        for name in self.series:
            groups[GROUP[FAMILIES[name].kind]].append(name)
        out: list[str] = []
        for names in groups:
            self.rng.shuffle(names)
            for name in names:
                out.append(self._render_family(name))
        return "".join(out)

    def _render_family(self, name: str) -> str:
        spec = FAMILIES[name]
        lines = []
        if spec.help is not None:
            lines.append(f"# HELP {name} {spec.help}")
        lines.append(f"# TYPE {name} {spec.kind}")
        items = list(self.series[name].items())
        self.rng.shuffle(items)
        for labels, s in items:
            if spec.kind == COUNTER:
                lines.append(f"{name}{_labels(labels)} {int(s)}")
            elif spec.kind == GAUGE:
                lines.append(f"{name}{_labels(labels)} {rust_f64(s)}")
            elif spec.kind == SUMMARY:
                lines.extend(self._render_summary(name, labels, s))
            else:
                assert spec.buckets is not None
                cumulative = 0
                for le, n in zip(self.les[spec.buckets], s.counts, strict=True):
                    cumulative += n
                    lines.append(f"{name}_bucket{_labels(labels, ('le', le))} {cumulative}")
                lines.append(f"{name}_bucket{_labels(labels, ('le', '+Inf'))} {s.count}")
                lines.append(f"{name}_sum{_labels(labels)} {rust_f64(s.sum)}")
                lines.append(f"{name}_count{_labels(labels)} {s.count}")
        return "\n".join(lines) + "\n\n"

    def _render_summary(self, name: str, labels: Labels, s: _Summary) -> list[str]:
        horizon = self.clock() - SUMMARY_WINDOW
        while s.recent and s.recent[0][0] < horizon:
            s.recent.popleft()
        values = sorted(v for _, v in s.recent)
        lines = []
        for q in SUMMARY_QUANTILES:
            v = values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))] if values else 0.0
            lines.append(f"{name}{_labels(labels, ('quantile', rust_f64(q)))} {rust_f64(v)}")
        lines.append(f"{name}_sum{_labels(labels)} {rust_f64(s.sum)}")
        lines.append(f"{name}_count{_labels(labels)} {s.count}")
        return lines


class TgiMetrics(EngineMetrics):
    """TGI's router metrics, recorded from the serving model's steps as ``backends/v3`` does."""

    content_type = "text/plain; charset=utf-8"

    def __init__(self, engine: SimulatedEngine, max_input_tokens: int, max_total_tokens: int) -> None:
        super().__init__(engine)
        self.rng = random.Random(engine.settings.seed * 7919 + 3)
        bounds = {
            DURATION: duration_buckets(),
            INPUT: linear_buckets(max_input_tokens),
            TOTAL: linear_buckets(max_total_tokens),
            BATCH: batch_buckets(),
        }
        self.recorder = Recorder(bounds, self.rng, engine.clock.now)

    # -- HTTP-level events (router handlers) ---------------------------------------------------------
    def request(self, n: int = 1) -> None:
        self.recorder.inc(REQUEST_COUNT, n)

    def failure(self, err: str, n: int = 1) -> None:
        self.recorder.inc(REQUEST_FAILURE, n, err=err)

    # -- serving-model events -------------------------------------------------------------------------
    def on_submit(self, seq: Sequence) -> None:
        """Validation passed and the entry is appended to the queue."""
        r = self.recorder
        r.observe(REQUEST_INPUT_LENGTH, float(seq.prompt_tokens))
        r.observe(REQUEST_MAX_NEW_TOKENS, float(min(seq.max_tokens, DEFAULT_GENERATION_LENGTH)))
        r.add(QUEUE_SIZE, 1.0)

    def on_step(self, report: StepReport) -> None:
        r = self.recorder
        errors = [s for s in report.finished if s.finish is Finish.ERROR]
        if errors:  # a prefill batch whose RPC failed: every request in it fails
            r.observe(BATCH_NEXT_SIZE, float(len(errors)))
            r.inc(BATCH_INFERENCE_COUNT, method="prefill")
            r.inc(BATCH_INFERENCE_FAILURE, method="prefill")
            self.failure("generation", len(errors))
        if report.scheduled:
            method = "prefill" if report.admitted else "decode"
            if report.admitted:
                r.observe(BATCH_NEXT_SIZE, float(len(report.admitted)))
                if len(report.scheduled) > len(report.admitted):
                    r.inc(BATCH_CONCAT, reason="chunking")
                    concat = 0.00018 + 0.000004 * len(report.scheduled) * self.rng.uniform(0.8, 1.2)
                    r.observe(BATCH_CONCAT_DURATION, concat, method="decode")
            r.inc(BATCH_INFERENCE_COUNT, method=method)
            step = report.duration
            forward = step * self.rng.uniform(0.86, 0.9)
            post = step * self.rng.uniform(0.03, 0.05)
            filt = min(step - forward - post, 0.00003 + step * 0.01)
            r.observe(BATCH_FORWARD_DURATION, forward, method=method)
            r.observe(BATCH_DECODE_DURATION, post, method=method)
            r.observe(BATCH_FILTER_DURATION, max(filt, 0.0), method=method)
            r.observe(BATCH_INFERENCE_DURATION, step, method=method)
            r.inc(BATCH_INFERENCE_SUCCESS, method=method)
        for _ in report.new_tokens:
            r.observe(REQUEST_SKIPPED_TOKENS, 0.0)  # no speculation: tokens in step - 1
        for seq in report.finished:
            if seq.finish in (Finish.STOP, Finish.LENGTH):
                self.on_success(seq)
        r.set(QUEUE_SIZE, float(report.waiting))
        running = self.engine.model.running
        r.set(BATCH_CURRENT_SIZE, float(len(running)))
        r.set(BATCH_CURRENT_MAX_TOKENS, float(sum(s.blocks for s in running) * self.engine.params.block_size))

    def on_success(self, seq: Sequence) -> None:
        """Request-level histograms: only on success, at completion (tgi.md §1.6)."""
        t = timings(seq)
        r = self.recorder
        r.inc(REQUEST_SUCCESS)
        r.observe(REQUEST_DURATION, t.total / 1e9)
        r.observe(REQUEST_VALIDATION_DURATION, t.validation / 1e9)
        r.observe(REQUEST_QUEUE_DURATION, t.queue / 1e9)
        r.observe(REQUEST_INFERENCE_DURATION, t.inference / 1e9)
        r.observe(REQUEST_MEAN_TPT_DURATION, t.per_token / 1e9)
        r.observe(REQUEST_GENERATED_TOKENS, float(seq.generated))

    def render(self) -> str:
        return self.recorder.render()
