"""Simulated Hugging Face TGI v3.3.7 (the v3 ``text-generation-router``), faithful on the wire.

Sources: the TGI catalog ``tgi.md`` (§1.1–1.7 metrics, §3.1–3.6 spans and headers, §4 ``/info``), the
catalog-faithful scrape ``tests/fixtures/engines/tgi/3.3.7`` and TGI's router source at v3.3.7
(``router/src/server.rs``, ``lib.rs``, ``validation.rs``, ``infer/mod.rs``, ``backends/v3/src/backend.rs``).

``/metrics`` is rendered by this module in the format of the Rust ``metrics-exporter-prometheus`` 0.15.3
recorder TGI installs: text format 0.0.4, counters without ``_total``, no ``_created``, ``# HELP`` only
for the names TGI describes, counters → gauges → histograms/summaries with a blank line after every
family, families and label sets in an unspecified (shuffled per render) order, numbers in Rust
``Display`` form, the router's bucket configuration (35 geometric duration bounds built by repeated
multiplication, linear token bounds from ``max_input_tokens``/``max_total_tokens``, 1..1024 for the
next-batch size, the skipped-tokens histogram as a summary) and an empty body until the first request.

How the serving model maps onto TGI:

* ``max_total_tokens`` is ``params.max_model_len`` and ``max_input_tokens`` is one less (``/info`` and
  the token buckets agree); validation follows ``validation.rs`` (422 ``{"error", "error_type"}``).
* Every engine step is one router iteration: a step that admits requests from the queue is a
  ``prefill`` call (one ``tgi_batch_next_size`` sample; a ``chunking`` concat when a batch was
  already running), any other step is a ``decode`` call. Forward, decode (post-processing) and filter
  durations are fixed shares of the step time.
* A sequence that fails in the engine (``Finish.ERROR``) is a failed one-request prefill batch:
  ``err="generation"`` and ``tgi_batch_inference_failure{method="prefill"}`` (TGI would also drop the
  running batch it was concatenated with; the serving model does not).
* ``max_concurrent_requests`` (128) is enforced on the requests in the engine (running + waiting),
  for HTTP requests and for the built-in load alike (``err="overloaded"``, HTTP 429).
* Validation time is synthetic (a few hundred µs, growing with the prompt), as the serving model
  starts at queue admission; total = validation + queue + inference. Continuation chunks of
  generations longer than 1024 tokens are not modelled: one sequence generates up to the full budget.
  ``best_of`` > 1 (non-streaming) is validated but runs a single sequence.
* The wire follows the v3.3.7 source where it differs from looser descriptions: stream events omit
  ``top_tokens`` when empty (``skip_serializing_if``) and their index starts at 1; the final event's
  ``details`` carries ``input_length``; a sequence that stops by itself ends with the special EOS token
  (counted in ``generated_tokens``, left out of ``generated_text``); ``/`` defaults ``return_full_text``
  to true (pipeline tag ``text-generation``) and wraps the non-streaming body in a list; streaming
  requests validate inside the stream, so their errors are SSE events of a 200 response; a client
  that disconnects (streaming or not) is counted as ``err="dropped"``.

Spans (when ``engine.spans`` is set) follow TGI's request trace (§3.3): the handler span
(``generate``, ``generate_stream`` or ``chat_completions``; INTERNAL; child of an incoming
``traceparent``, which is honoured even when its sampled flag is off, as TGI samples AlwaysOn) with
the Debug-format timing strings, ``parameters`` and ``seed``; below it Infer ``generate`` (non-stream)
or ``async_stream`` (stream), Infer ``generate_stream``, ``validate`` → ``validate_input`` →
``tokenize``, and ``schedule`` → ``append``, ``queued`` (its duration is the queue time) and the
``infer`` spans, each with a ``send_generation`` child carrying the Debug dump of the generation.
There is one ``infer`` span per token-emitting step the request took part in (prefill chunks that emit
no token fold into the first one); above 64 steps only the first 32 and the last 32 are kept, so a
request has at most 64 ``infer`` spans. ``/`` adds TGI's separate ``compat_generate`` root span.
Batch traces (``next_batch``/``batch``) and the links between them and ``infer`` are not emitted.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import math
import random
import re
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from starlette.types import Receive, Scope, Send

from inferwatch.simulator.base import EngineMetrics, RequestHandle, SimulatedEngine, count_tokens, ns, parent_context
from inferwatch.simulator.model import Finish, Sequence, StepReport

VERSION = "3.3.6-dev0"
"""``CARGO_PKG_VERSION`` of the v3.3.6 and v3.3.7 builds (tgi.md §0)."""
SHA = "dfb3fbe78e0d1d69251bd33065591c61bafdfaa8"
DOCKER_LABEL = "sha-dfb3fbe"
ROUTER = "text-generation-router"
SCOPE = "opentelemetry-otlp"
SERVICE_NAME = "text-generation-inference.router"
COMPUTE_TYPE = "gpu+optimized"
PIPELINE_TAG = "text-generation"
MAX_CONCURRENT_REQUESTS = 128
MAX_BEST_OF = 2
MAX_STOP_SEQUENCES = 4
MAX_TOP_N_TOKENS = 5
VALIDATION_WORKERS = 2
MAX_CLIENT_BATCH_SIZE = 4
DEFAULT_GENERATION_LENGTH = 1024
MAX_INFER_SPANS = 64
EOS_ID, EOS_TEXT, BOS_ID, BOS_TEXT = 2, "</s>", 1, "<s>"
GENERATION_ERROR = "Request failed during generation: Server error: simulated shard failure"

# -- metric names (raw TGI names are spelled only here) --------------------------------------------
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


# -- Rust number and duration formatting ------------------------------------------------------------
def rust_f64(x: float) -> str:
    """Rust's ``Display`` for ``f64``: shortest round-trip digits, never exponent form, no ``.0``."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    if x.is_integer():
        return str(int(x))
    text = repr(x)
    if "e" in text or "E" in text:
        return format(Decimal(text), "f")
    return text


def rust_duration(nanos: int) -> str:
    """Rust's ``Debug`` for ``std::time::Duration`` (``1.234567ms``, ``2.0315s``, ``812.3µs``, ``950ns``)."""
    nanos = max(0, int(nanos))
    secs, sub = divmod(nanos, 1_000_000_000)
    if secs:
        whole, frac, width, unit = secs, sub, 9, "s"
    elif sub >= 1_000_000:
        whole, frac, width, unit = sub // 1_000_000, sub % 1_000_000, 6, "ms"
    elif sub >= 1_000:
        whole, frac, width, unit = sub // 1_000, sub % 1_000, 3, "µs"
    else:
        whole, frac, width, unit = sub, 0, 0, "ns"
    text = str(whole)
    if frac:
        text += "." + str(frac).zfill(width).rstrip("0")
    return text + unit


_DURATION_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ns|µs|ms|s)$")
_UNIT = {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_rust_duration(text: str) -> float:
    """Seconds from a Rust ``Duration`` Debug string (what a trace consumer has to do)."""
    m = _DURATION_RE.match(text)
    if m is None:
        raise ValueError(f"not a Rust Duration: {text!r}")
    return float(m.group(1)) * _UNIT[m.group(2)]


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


# -- the recorder ------------------------------------------------------------------------------------
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


# -- request timings ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Timings:
    """TGI's per-request durations in nanoseconds (``generate_internal``'s ``Instant`` arithmetic)."""

    validation: int
    queue: int
    inference: int
    per_token: int

    @property
    def total(self) -> int:
        return self.validation + self.queue + self.inference


def validation_ns(seq: Sequence) -> int:
    """Synthetic validation time: semaphore, tokenisation on a validation worker, parameter checks."""
    return 150_000 + 1_100 * seq.prompt_tokens + zlib.crc32(seq.request_id.encode()) % 60_000


def timings(seq: Sequence) -> Timings:
    arrival = seq.arrival
    start = seq.first_scheduled if seq.first_scheduled is not None else arrival
    end = seq.finished_at if seq.finished_at is not None else start
    inference = max(0, round((end - start) * 1e9))
    return Timings(
        validation=validation_ns(seq),
        queue=max(0, round((start - arrival) * 1e9)),
        inference=inference,
        per_token=inference // max(1, seq.generated),
    )


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


# -- request parsing (serde's view of GenerateRequest / ChatRequest) ----------------------------------
class BodyError(Exception):
    """axum's ``Json`` rejection: 400 for bad JSON, 415 without the JSON content type, 422 otherwise."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def response(self) -> Response:
        return PlainTextResponse(self.message, status_code=self.status)


class ClientGone(Exception):
    """The client disconnected before the response (nobody reads it)."""


class TgiError(Exception):
    """An ``InferError`` as the router returns it."""

    def __init__(self, status: int, message: str, error_type: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type

    def body(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type}


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    return "sequence" if isinstance(value, list) else "map"


def _deserialize_error(path: str, value: Any, expected: str) -> BodyError:
    return BodyError(
        422,
        f"Failed to deserialize the JSON body into the target type: {path}: invalid type: "
        f"{_describe(value)}, expected {expected}",
    )


def _opt(d: Mapping[str, Any], key: str, kind: str, path: str) -> Any:
    """An ``Option<T>`` field with ``#[serde(default)]``: absent or null is ``None``."""
    value = d.get(key)
    if value is None:
        return None
    return _typed(value, kind, f"{path}{key}")


def _req(d: Mapping[str, Any], key: str, kind: str, path: str, default: Any) -> Any:
    """A non-``Option`` field with ``#[serde(default)]``: absent is the default, null is an error."""
    if key not in d:
        return default
    return _typed(d[key], kind, f"{path}{key}")


def _typed(value: Any, kind: str, path: str) -> Any:
    if kind == "bool":
        if not isinstance(value, bool):
            raise _deserialize_error(path, value, "a boolean")
        return value
    if kind == "f32":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _deserialize_error(path, value, "f32")
        return float(value)
    if kind in ("u32", "u64", "usize", "i32"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise _deserialize_error(path, value, kind)
        if value < 0 and kind != "i32":
            raise BodyError(
                422,
                "Failed to deserialize the JSON body into the target type: "
                f"{path}: invalid value: integer `{value}`, expected {kind}",
            )
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise _deserialize_error(path, value, "a string")
        return value
    if kind == "strs":
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise _deserialize_error(path, value, "a sequence of strings")
        return list(value)
    return value


def _debug_opt(value: Any) -> str:
    return "None" if value is None else f"Some({_debug(value)})"


def _debug(value: Any) -> str:
    """Rust ``Debug`` of a scalar/collection as TGI's structs hold it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_debug(v) for v in value) + "]"
    if isinstance(value, dict):
        return "Json(" + json.dumps(value, separators=(",", ":")) + ")"
    return str(value)


@dataclass
class Params:
    """``GenerateParameters`` (field order as in ``router/src/lib.rs``)."""

    best_of: int | None = None
    temperature: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    typical_p: float | None = None
    do_sample: bool = False
    max_new_tokens: int | None = None
    return_full_text: bool | None = None
    stop: tuple[str, ...] = ()
    truncate: int | None = None
    watermark: bool = False
    details: bool = False
    decoder_input_details: bool = False
    seed: int | None = None
    top_n_tokens: int | None = None
    grammar: Any = None
    adapter_id: str | None = None

    @classmethod
    def parse(cls, raw: Any) -> Params:
        """An explicit ``parameters`` object (an absent one is ``default_parameters()``: sampling on)."""
        if not isinstance(raw, dict):
            raise _deserialize_error("parameters", raw, "struct GenerateParameters")
        p = "parameters."
        return cls(
            best_of=_opt(raw, "best_of", "usize", p),
            temperature=_opt(raw, "temperature", "f32", p),
            repetition_penalty=_opt(raw, "repetition_penalty", "f32", p),
            frequency_penalty=_opt(raw, "frequency_penalty", "f32", p),
            top_k=_opt(raw, "top_k", "i32", p),
            top_p=_opt(raw, "top_p", "f32", p),
            typical_p=_opt(raw, "typical_p", "f32", p),
            do_sample=_req(raw, "do_sample", "bool", p, False),
            max_new_tokens=_opt(raw, "max_new_tokens", "u32", p),
            return_full_text=_opt(raw, "return_full_text", "bool", p),
            stop=tuple(_req(raw, "stop", "strs", p, [])),
            truncate=_opt(raw, "truncate", "usize", p),
            watermark=_req(raw, "watermark", "bool", p, False),
            details=_req(raw, "details", "bool", p, False),
            decoder_input_details=_req(raw, "decoder_input_details", "bool", p, False),
            seed=_opt(raw, "seed", "u64", p),
            top_n_tokens=_opt(raw, "top_n_tokens", "u32", p),
            grammar=raw.get("grammar"),
            adapter_id=_opt(raw, "adapter_id", "str", p),
        )

    def debug(self) -> str:
        """The handler span's ``parameters`` field: ``GenerateParameters { … }`` in Rust Debug form."""
        fields = [
            ("best_of", _debug_opt(self.best_of)),
            ("temperature", _debug_opt(self.temperature)),
            ("repetition_penalty", _debug_opt(self.repetition_penalty)),
            ("frequency_penalty", _debug_opt(self.frequency_penalty)),
            ("top_k", _debug_opt(self.top_k)),
            ("top_p", _debug_opt(self.top_p)),
            ("typical_p", _debug_opt(self.typical_p)),
            ("do_sample", _debug(self.do_sample)),
            ("max_new_tokens", _debug_opt(self.max_new_tokens)),
            ("return_full_text", _debug_opt(self.return_full_text)),
            ("stop", _debug(list(self.stop))),
            ("truncate", _debug_opt(self.truncate)),
            ("watermark", _debug(self.watermark)),
            ("details", _debug(self.details)),
            ("decoder_input_details", _debug(self.decoder_input_details)),
            ("seed", _debug_opt(self.seed)),
            ("top_n_tokens", _debug_opt(self.top_n_tokens)),
            ("grammar", _debug_opt(self.grammar)),
            ("adapter_id", _debug_opt(self.adapter_id)),
        ]
        return "GenerateParameters { " + ", ".join(f"{k}: {v}" for k, v in fields) + " }"


def parse_generate(body: Any, compat: bool = False) -> tuple[str, Params, bool]:
    """``GenerateRequest`` (or ``CompatGenerateRequest`` with its ``stream`` flag)."""
    target = "CompatGenerateRequest" if compat else "GenerateRequest"
    if not isinstance(body, dict):
        raise BodyError(
            422,
            f"Failed to deserialize the JSON body into the target type: invalid type: {_describe(body)}, "
            f"expected struct {target}",
        )
    if "inputs" not in body:
        raise BodyError(422, "Failed to deserialize the JSON body into the target type: missing field `inputs`")
    inputs = _typed(body["inputs"], "str", "inputs")
    params = Params.parse(body["parameters"]) if "parameters" in body else Params(do_sample=True)
    stream = bool(_req(body, "stream", "bool", "", False)) if compat else False
    return inputs, params, stream


@dataclass
class ChatBody:
    model: str | None
    messages: list[tuple[str, str]]
    stream: bool
    include_usage: bool
    logprobs: bool
    params: Params


def parse_chat(body: Any) -> ChatBody:
    if not isinstance(body, dict):
        raise BodyError(
            422,
            f"Failed to deserialize the JSON body into the target type: invalid type: {_describe(body)}, "
            "expected struct ChatRequest",
        )
    if "messages" not in body:
        raise BodyError(422, "Failed to deserialize the JSON body into the target type: missing field `messages`")
    raw = body["messages"]
    if not isinstance(raw, list):
        raise _deserialize_error("messages", raw, "a sequence")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BodyError(
                422, f"Failed to deserialize the JSON body into the target type: messages[{i}]: missing field `role`"
            )
        content = m.get("content", "")
        if isinstance(content, list):
            parts = []
            for chunk in content:
                if isinstance(chunk, dict) and chunk.get("type") == "text":
                    parts.append(str(chunk.get("text", "")))
                elif isinstance(chunk, dict) and chunk.get("type") == "image_url":
                    parts.append(f"![]({(chunk.get('image_url') or {}).get('url', '')})")
            content = "".join(parts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise _deserialize_error(f"messages[{i}].content", content, "a string or a sequence of chunks")
        messages.append((m["role"], content))
    model = _opt(body, "model", "str", "")
    temperature = _opt(body, "temperature", "f32", "")
    presence = _opt(body, "presence_penalty", "f32", "")
    max_tokens = _opt(body, "max_tokens", "u32", "")
    if max_tokens is None:
        max_tokens = _opt(body, "max_completion_tokens", "u32", "")
    options = body.get("stream_options") or {}
    params = Params(
        temperature=None if temperature == 0.0 else temperature,
        repetition_penalty=None if presence is None else presence + 2.0,
        frequency_penalty=_opt(body, "frequency_penalty", "f32", ""),
        top_p=_opt(body, "top_p", "f32", ""),
        do_sample=temperature != 0.0,
        max_new_tokens=max_tokens,
        stop=tuple(_opt(body, "stop", "strs", "") or ()),
        details=True,
        seed=_opt(body, "seed", "u64", ""),
        top_n_tokens=_opt(body, "top_logprobs", "u32", ""),
        adapter_id=model if model not in (None, "tgi") else None,
    )
    return ChatBody(
        model=model,
        messages=messages,
        stream=bool(_req(body, "stream", "bool", "", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        logprobs=bool(_opt(body, "logprobs", "bool", "")),
        params=params,
    )


def chat_template(messages: list[tuple[str, str]]) -> str:
    """A Llama-3 style template (the simulated tokenizer only counts bytes)."""
    parts = ["<|begin_of_text|>"]
    for role, content in messages:
        parts.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>")
    parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def dumps(obj: Any) -> str:
    """serde_json's compact form."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def sse(obj: Any) -> bytes:
    """axum's ``Event::json_data``: ``data:`` without a space."""
    return f"data:{dumps(obj)}\n\n".encode()


class EventStream(StreamingResponse):
    """An SSE response that always runs ``on_close`` once the response ends (finished or disconnected)."""

    def __init__(self, content: AsyncIterator[bytes], headers: Mapping[str, str], on_close: Callable[[], None]) -> None:
        super().__init__(content, headers=dict(headers))
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


# -- spans -------------------------------------------------------------------------------------------
SITES: dict[str, tuple[str, str, int]] = {
    "generate": ("router/src/server.rs", "text_generation_router::server", 261),
    "generate_stream": ("router/src/server.rs", "text_generation_router::server", 464),
    "chat_completions": ("router/src/server.rs", "text_generation_router::server", 1156),
    "compat_generate": ("router/src/server.rs", "text_generation_router::server", 125),
    "async_stream": ("router/src/server.rs", "text_generation_router::server", 555),
    "infer.generate": ("router/src/infer/mod.rs", "text_generation_router::infer", 244),
    "infer.generate_stream": ("router/src/infer/mod.rs", "text_generation_router::infer", 99),
    "apply_chat_template": ("router/src/infer/mod.rs", "text_generation_router::infer", 226),
    "validate": ("router/src/validation.rs", "text_generation_router::validation", 203),
    "validate_input": ("router/src/validation.rs", "text_generation_router::validation", 132),
    "tokenize": ("router/src/validation.rs", "text_generation_router::validation", 104),
    "schedule": ("backends/v3/src/backend.rs", "text_generation_router_v3::backend", 78),
    "append": ("backends/v3/src/queue.rs", "text_generation_router_v3::queue", 75),
    "queued": ("backends/v3/src/queue.rs", "text_generation_router_v3::queue", 228),
    "infer.admit": ("backends/v3/src/queue.rs", "text_generation_router_v3::queue", 427),
    "infer.step": ("backends/v3/src/backend.rs", "text_generation_router_v3::backend", 277),
    "send_generation": ("backends/v3/src/backend.rs", "text_generation_router_v3::backend", 433),
    "send_error": ("backends/v3/src/backend.rs", "text_generation_router_v3::backend", 543),
}
US = 1_000


@dataclass
class Call:
    """One generation request as the router handles it (what its spans and responses need)."""

    handler: str
    """the handler span name: ``generate``, ``generate_stream`` or ``chat_completions``."""
    inputs: str
    params: Params
    stream: bool = False
    chat: bool = False
    compat: bool = False
    parent: Context | None = None
    seed: int | None = None
    """the seed reported back (``Some`` only when sampling)."""
    input_length: int = 0
    entry_id: int = 0
    model: str = ""
    """chat: the ``model`` of the response."""
    logprobs: bool = False
    include_usage: bool = False

    @property
    def finish_eos(self) -> bool:
        return not self.params.stop


def incoming_context(headers: Mapping[str, str]) -> Context | None:
    """TGI's ``trace_context_middleware``: only ``traceparent``; AlwaysOn, so the parent is used as sampled."""
    value = next((v for k, v in headers.items() if k.lower() == "traceparent"), None)
    if not value:
        return None
    ctx = parent_context({"traceparent": value})
    if ctx is None:
        return None
    sc = trace.get_current_span(ctx).get_span_context()
    if not sc.is_valid:
        return None
    remote = SpanContext(sc.trace_id, sc.span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(remote), Context())


class TgiSim:
    """The simulated TGI router: API routes, metrics and spans around a :class:`SimulatedEngine`."""

    def __init__(self, engine: SimulatedEngine) -> None:
        self.engine = engine
        self.max_total_tokens = engine.params.max_model_len
        self.max_input_tokens = self.max_total_tokens - 1
        self.metrics = TgiMetrics(engine, self.max_input_tokens, self.max_total_tokens)
        self.rng = random.Random(engine.settings.seed * 31 + 17)
        self._entries = 0
        engine.add_observer(self.metrics)
        engine.open_spans(SCOPE, {"service.name": SERVICE_NAME})
        engine.on_internal_finish.append(self._internal_done)
        engine.load.submit = self._submit_internal

    # -- admission ---------------------------------------------------------------------------------
    def permits_in_use(self) -> int:
        m = self.engine.model
        return len(m.running) + len(m.waiting)

    def validate(self, inputs: str, p: Params) -> tuple[int, int]:
        """``Validation::validate``: (input_length, max_total_new_tokens), or a ValidationError message."""
        sampling = p.do_sample or any(v is not None for v in (p.temperature, p.top_k, p.top_p, p.typical_p))
        best_of = p.best_of if p.best_of is not None else 1
        if best_of > 1 and not sampling:
            raise ValueError("you must use sampling when `best_of` is > 1")
        if best_of == 0 or best_of > MAX_BEST_OF:
            raise ValueError(f"`best_of` must be > 0 and <= {MAX_BEST_OF}. Given: {best_of}")
        if (p.temperature if p.temperature is not None else 1.0) <= 0.0:
            raise ValueError("`temperature` must be strictly positive")
        if (p.repetition_penalty if p.repetition_penalty is not None else 1.0) <= 0.0:
            raise ValueError("`repetition_penalty` must be strictly positive")
        if not -2.0 <= (p.frequency_penalty or 0.0) <= 2.0:
            raise ValueError("`frequency_penalty` must be >= -2.0 and <= 2.0")
        if p.top_p is not None and not 0.0 < p.top_p < 1.0:
            raise ValueError("`top_p` must be > 0.0 and < 1.0")
        if p.typical_p is not None and not 0.0 < p.typical_p < 1.0:
            raise ValueError("`typical_p` must be > 0.0 and < 1.0")
        if p.top_k is not None and p.top_k <= 0:
            raise ValueError("`top_k` must be strictly positive")
        if p.max_new_tokens == 0:
            raise ValueError("`max_new_tokens` must be strictly positive")
        if len(p.stop) > MAX_STOP_SEQUENCES:
            raise ValueError(f"`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {len(p.stop)}")
        if p.seed is not None and best_of > 1:
            raise ValueError("`seed` must not be set when `best_of` > 1")
        if p.top_n_tokens is not None and p.top_n_tokens > MAX_TOP_N_TOKENS:
            raise ValueError(f"`top_n_tokens` must be >= 0 and <= {MAX_TOP_N_TOKENS}. Given: {p.top_n_tokens}")
        if not inputs:
            raise ValueError("`inputs` cannot be empty")
        if p.truncate is not None and (p.truncate == 0 or p.truncate > self.max_input_tokens):
            raise ValueError(
                f"`truncate` must be strictly positive and less than {self.max_input_tokens}. Given: {p.truncate}"
            )
        tokens = count_tokens(inputs)
        input_length = min(tokens, p.truncate) if p.truncate is not None else tokens
        return self.check_lengths(input_length, p.max_new_tokens)

    def check_lengths(self, input_length: int, max_new_tokens: int | None) -> tuple[int, int]:
        if max_new_tokens is not None:
            chunk, total_new = min(max_new_tokens, DEFAULT_GENERATION_LENGTH), max_new_tokens
        else:
            total_new = max(0, self.max_total_tokens - input_length)
            chunk = min(total_new, DEFAULT_GENERATION_LENGTH)
        if input_length + chunk > self.max_total_tokens:
            raise ValueError(
                f"`inputs` tokens + `max_new_tokens` must be <= {self.max_total_tokens}. "
                f"Given: {input_length} `inputs` tokens and {chunk} `max_new_tokens`"
            )
        if input_length > self.max_input_tokens:
            raise ValueError(f"`inputs` must have less than {self.max_input_tokens} tokens. Given: {input_length}")
        return input_length, total_new

    def admit(self, call: Call) -> RequestHandle:
        """``Infer::generate_stream``: permit, validation, then the queue. Raises :class:`TgiError`."""
        if self.permits_in_use() >= MAX_CONCURRENT_REQUESTS:
            self.metrics.failure("overloaded")
            raise TgiError(429, "Model is overloaded", "overloaded")
        try:
            input_length, total_new = self.validate(call.inputs, call.params)
        except ValueError as exc:
            self.metrics.failure("validation")
            error = TgiError(422, f"Input validation error: {exc}", "validation")
            self.emit_rejected(call, error.message)
            raise error from None
        call.input_length = input_length
        seed = call.params.seed if call.params.seed is not None else self.rng.getrandbits(64)
        call.seed = seed if call.params.do_sample else None
        eng = self.engine
        return eng.new_request(f"tgi-{eng.next_id()}", input_length, max(1, total_new))

    def _submit_internal(
        self, prompt: int, max_tokens: int, output: int, prefix_key: str | None, prefix_tokens: int
    ) -> None:
        """The built-in load as requests to ``/generate``: counted, limited and validated like them."""
        self.metrics.request()
        if self.permits_in_use() >= MAX_CONCURRENT_REQUESTS:
            self.metrics.failure("overloaded")
            return
        try:
            self.check_lengths(prompt, max_tokens)
        except ValueError:
            self.metrics.failure("validation")
            return
        self.engine.submit_internal(prompt, max_tokens, output, prefix_key, prefix_tokens)

    def _internal_done(self, seq: Sequence) -> None:
        params = Params(max_new_tokens=seq.max_tokens, details=True)
        call = Call("generate", "", params, input_length=seq.prompt_tokens)
        self.emit(seq, call)

    def drop(self, handle: RequestHandle | None) -> None:
        """The client went away before the end: TGI counts ``err="dropped"``."""
        if handle is not None and any(s.finish is None for s in handle.seqs):
            handle.abort()
            self.metrics.failure("dropped")

    # -- tokens ----------------------------------------------------------------------------------------
    def token(self, seq: Sequence, i: int, call: Call) -> dict[str, Any]:
        lp = -((zlib.crc32(f"{seq.request_id}:{i}".encode()) % 2500) / 1000.0)
        if i == seq.generated - 1 and seq.finish is Finish.STOP and call.finish_eos:
            return {"id": EOS_ID, "text": EOS_TEXT, "logprob": round(lp / 25, 4), "special": True}
        text = self.engine.token_text(seq, i)
        return {"id": 100 + zlib.crc32(text.encode()) % 32000, "text": text, "logprob": lp, "special": False}

    def text(self, seq: Sequence, call: Call) -> str:
        toks = (self.token(seq, i, call) for i in range(seq.generated))
        return "".join(t["text"] for t in toks if not t["special"])

    @staticmethod
    def finish_reason(seq: Sequence, call: Call) -> str:
        if seq.finish is Finish.LENGTH:
            return "length"
        return "eos_token" if call.finish_eos else "stop_sequence"

    def prefill_tokens(self, call: Call) -> list[dict[str, Any]]:
        """``decoder_input_details``: the prompt tokens (the first one has no logprob)."""
        out: list[dict[str, Any]] = [{"id": BOS_ID, "text": BOS_TEXT, "logprob": None}]
        for i in range(1, call.input_length):
            piece = call.inputs[4 * (i - 1) : 4 * i] or " "
            lp = -((zlib.crc32(f"{call.inputs}:{i}".encode()) % 4000) / 1000.0)
            out.append({"id": 100 + zlib.crc32(piece.encode()) % 32000, "text": piece, "logprob": lp})
        return out

    def output(self, seq: Sequence, call: Call) -> str:
        text = self.text(seq, call)
        return call.inputs + text if call.params.return_full_text else text

    # -- responses -------------------------------------------------------------------------------------
    def timing_headers(self, seq: Sequence, call: Call) -> dict[str, str]:
        t = timings(seq)
        return {
            "x-compute-type": COMPUTE_TYPE,
            "x-compute-time": rust_f64(t.total / 1e9),
            "x-compute-characters": str(len(call.inputs)),
            "x-total-time": str(t.total // 1_000_000),
            "x-validation-time": str(t.validation // 1_000_000),
            "x-queue-time": str(t.queue // 1_000_000),
            "x-inference-time": str(t.inference // 1_000_000),
            "x-time-per-token": str(t.per_token // 1_000_000),
            "x-prompt-tokens": str(call.input_length),
            "x-generated-tokens": str(seq.generated),
        }

    def stream_headers(self, call: Call) -> dict[str, str]:
        return {
            "content-type": "text/event-stream",
            "cache-control": "no-cache",
            "x-compute-type": COMPUTE_TYPE,
            "x-compute-characters": str(len(call.inputs)),
            "x-accel-buffering": "no",
        }

    async def generate_internal(self, call: Call, request: Request) -> Sequence:
        """``generate_internal``: count, admit, wait; the finished sequence or a :class:`TgiError`."""
        self.metrics.request()
        handle = self.admit(call)
        await self.wait(handle, request)
        seq = handle.seqs[0]
        self.emit(seq, call)
        if seq.finish is Finish.ERROR:
            raise TgiError(424, GENERATION_ERROR, "generation")
        return seq

    async def wait(self, handle: RequestHandle, request: Request) -> None:
        """Wait for the end; a client that disconnects meanwhile drops the request (axum drops the future)."""
        finished = asyncio.ensure_future(handle.wait())
        gone = asyncio.ensure_future(disconnected(request))
        try:
            await asyncio.wait({finished, gone}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self.drop(handle)
            raise
        finally:
            finished.cancel()
            gone.cancel()
        if not finished.done() or finished.cancelled():
            self.drop(handle)
            raise ClientGone

    def generate_body(self, seq: Sequence, call: Call) -> dict[str, Any]:
        body: dict[str, Any] = {"generated_text": self.output(seq, call)}
        if call.params.details or call.params.decoder_input_details:
            body["details"] = {
                "finish_reason": self.finish_reason(seq, call),
                "generated_tokens": seq.generated,
                "seed": call.seed,
                "prefill": self.prefill_tokens(call) if call.params.decoder_input_details else [],
                "tokens": [self.token(seq, i, call) for i in range(seq.generated)],
            }
        return body

    async def generate(self, call: Call, request: Request, wrap: bool) -> Response:
        try:
            seq = await self.generate_internal(call, request)
        except TgiError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        except ClientGone:
            return Response(status_code=499)
        body = self.generate_body(seq, call)
        return Response(
            dumps([body] if wrap else body), media_type="application/json", headers=self.timing_headers(seq, call)
        )

    def admit_stream(self, call: Call) -> RequestHandle:
        """The streaming-only checks of ``generate_stream_internal``, then :meth:`admit`."""
        if call.params.best_of not in (None, 1):
            self.metrics.failure("validation")
            raise TgiError(
                422, "Input validation error: `best_of` != 1 is not supported when streaming tokens", "validation"
            )
        if call.params.decoder_input_details:
            self.metrics.failure("validation")
            raise TgiError(
                422,
                "Input validation error: `decoder_input_details` == true is not supported when streaming tokens",
                "validation",
            )
        return self.admit(call)

    def generate_stream(self, call: Call) -> Response:
        """``generate_stream_internal``: the headers go first; validation and queueing happen in the stream,
        so their errors arrive as SSE events of a 200 response."""
        self.metrics.request()
        admitted: list[RequestHandle] = []

        async def events() -> AsyncIterator[bytes]:
            try:
                handle = self.admit_stream(call)
            except TgiError as error:
                yield self.openai_error(error) if call.chat else sse(error.body())
                if call.chat:
                    yield b"data:[DONE]\n\n"
                return
            admitted.append(handle)
            seq = handle.seqs[0]
            async for index, tok, final in self.tokens(handle, call):
                if call.chat:
                    for chunk in self.chat_chunks(seq, call, tok, final):
                        yield sse(chunk)
                    continue
                details = None
                if final and call.params.details:
                    details = {
                        "finish_reason": self.finish_reason(seq, call),
                        "generated_tokens": seq.generated,
                        "seed": call.seed,
                        "input_length": call.input_length,
                    }
                yield sse(
                    {
                        "index": index,
                        "token": tok,
                        "generated_text": self.output(seq, call) if final else None,
                        "details": details,
                    }
                )
            if seq.finish is Finish.ERROR:
                err = TgiError(424, GENERATION_ERROR, "generation")
                yield self.openai_error(err) if call.chat else sse(err.body())
            if call.chat:
                yield b"data:[DONE]\n\n"

        def close() -> None:
            for handle in admitted:
                self.drop(handle)

        return EventStream(events(), self.stream_headers(call), on_close=close)

    async def tokens(self, handle: RequestHandle, call: Call) -> AsyncIterator[tuple[int, dict[str, Any], bool]]:
        """(index, token, is_last) per generated token; the last one is held until the finish event."""
        seq = handle.seqs[0]
        held: int | None = None
        seen = 0
        async for _, kind in handle.events():
            if kind == "token":
                if held is not None:
                    yield held + 1, self.token(seq, held, call), False
                held = seen
                seen += 1
                continue
            if seq.finish in (Finish.STOP, Finish.LENGTH) and held is not None:
                self.emit(seq, call)
                yield held + 1, self.token(seq, held, call), True
            elif seq.finish is Finish.ERROR:
                self.emit(seq, call)

    # -- chat ------------------------------------------------------------------------------------------
    def fingerprint(self) -> str:
        return f"{self.version}-{DOCKER_LABEL}"

    @property
    def version(self) -> str:
        return self.engine.settings.version or VERSION

    def chat_model(self, body: ChatBody) -> str:
        return self.engine.settings.model if body.model in (None, "tgi") else str(body.model)

    def chat_chunks(self, seq: Sequence, call: Call, tok: dict[str, Any], final: bool) -> list[dict[str, Any]]:
        created = int(time.time())
        delta = {"role": "assistant", "content": "" if tok["special"] else tok["text"]}
        logprobs = None
        if call.logprobs:
            logprobs = {"content": [{"token": tok["text"], "logprob": tok["logprob"], "top_logprobs": []}]}
        finish = None
        if final:
            finish = "stop" if self.finish_reason(seq, call) == "eos_token" else self.finish_reason(seq, call)
        chunks: list[dict[str, Any]] = [
            {
                "object": "chat.completion.chunk",
                "id": "",
                "created": created,
                "model": call.model,
                "system_fingerprint": self.fingerprint(),
                "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
                "usage": None,
            }
        ]
        if final and call.include_usage:
            chunks.append(
                {
                    "object": "chat.completion.chunk",
                    "id": "",
                    "created": created,
                    "model": call.model,
                    "system_fingerprint": self.fingerprint(),
                    "choices": [],
                    "usage": {
                        "prompt_tokens": call.input_length,
                        "completion_tokens": seq.generated,
                        "total_tokens": call.input_length + seq.generated,
                    },
                }
            )
        return chunks

    @staticmethod
    def openai_error(error: TgiError) -> bytes:
        return sse({"error": {"message": error.message, "http_status_code": 422}})

    async def chat(self, request: Request, body: ChatBody) -> Response:
        self.metrics.request()  # chat_completions counts once, generate_internal once more (+2)
        inputs = chat_template(body.messages)
        model = self.chat_model(body)
        call = Call(
            "chat_completions",
            inputs,
            body.params,
            stream=body.stream,
            chat=True,
            parent=incoming_context(request.headers),
            model=model,
            logprobs=body.logprobs,
            include_usage=body.include_usage,
        )
        if body.stream:
            return self.generate_stream(call)
        try:
            seq = await self.generate_internal(call, request)
        except TgiError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        except ClientGone:
            return Response(status_code=499)
        reason = self.finish_reason(seq, call)
        logprobs = None
        if body.logprobs:
            logprobs = {
                "content": [
                    {"token": t["text"], "logprob": t["logprob"], "top_logprobs": []}
                    for t in (self.token(seq, i, call) for i in range(seq.generated))
                ]
            }
        payload = {
            "object": "chat.completion",
            "id": "",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": self.fingerprint(),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self.text(seq, call)},
                    "logprobs": logprobs,
                    "finish_reason": "stop" if reason == "eos_token" else reason,
                }
            ],
            "usage": {
                "prompt_tokens": call.input_length,
                "completion_tokens": seq.generated,
                "total_tokens": call.input_length + seq.generated,
            },
        }
        return Response(dumps(payload), media_type="application/json", headers=self.timing_headers(seq, call))

    # -- spans -----------------------------------------------------------------------------------------
    def _span(
        self,
        name: str,
        site: str,
        parent: Context,
        start: int,
        end: int,
        attrs: Mapping[str, Any] | None = None,
        events: tuple[tuple[str, str, str, int], ...] = (),
        error: bool = False,
        thread: int = 1,
    ) -> Context:
        sink = self.engine.spans
        assert sink is not None
        filepath, namespace, lineno = SITES[site]
        end = max(end, start)
        busy = min(end - start, 8 * US + (end - start) // 50)
        attributes: dict[str, Any] = {
            "code.filepath": filepath,
            "code.namespace": namespace,
            "code.lineno": lineno,
            "thread.id": thread,
            "thread.name": "tokio-runtime-worker",
            "busy_ns": busy,
            "idle_ns": end - start - busy,
        }
        attributes.update(attrs or {})
        span = sink.tracer.start_span(
            name, context=parent, kind=SpanKind.INTERNAL, start_time=start, attributes=attributes
        )
        for message, level, target, at in events:
            span.add_event(message, {"level": level, "target": target}, timestamp=at)
        if error:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=end)
        return trace.set_span_in_context(span, Context())

    def _generation(self, seq: Sequence, call: Call, i: int, last: bool) -> str:
        tok = self.token(seq, i, call)
        tokens = (
            f"Tokens {{ ids: [{tok['id']}], logprobs: [{tok['logprob']!r}], texts: [{_debug(tok['text'])}], "
            f"is_special: [{_debug(tok['special'])}] }}"
        )
        generated = "None"
        if last:
            reason = {"length": "Length", "eos_token": "EosToken", "stop_sequence": "StopSequence"}[
                self.finish_reason(seq, call)
            ]
            generated = (
                f"Some(GeneratedText {{ text: {_debug(self.text(seq, call))}, generated_tokens: {seq.generated}, "
                f"finish_reason: {reason}, seed: {_debug_opt(call.seed)} }})"
            )
        return (
            f"Generation {{ request_id: {call.entry_id}, prefill_tokens: None, tokens: Some({tokens}), "
            f"generated_text: {generated}, top_tokens: [] }}"
        )

    def _handler_spans(
        self,
        call: Call,
        t0: int,
        end: int,
        attrs: dict[str, Any],
        events: tuple[tuple[str, str, str, int], ...],
        error: bool,
        thread: int,
    ) -> Context:
        """compat_generate (``/``), the handler span and the spans down to Infer ``generate_stream``."""
        if call.compat:
            compat_end = t0 + 60 * US if call.stream else end + 5 * US
            self._span(
                "compat_generate",
                "compat_generate",
                Context(),
                t0 - 20 * US,
                compat_end,
                {"default_return_full_text": True, "compute_type": f'ComputeType("{COMPUTE_TYPE}")'},
                thread=thread,
            )
        start = t0 - (60 * US if call.chat else 0)
        attrs = {"parameters": call.params.debug(), **attrs}
        h = self._span(call.handler, call.handler, call.parent or Context(), start, end, attrs, events, error, thread)
        if call.chat:
            self._span("apply_chat_template", "apply_chat_template", h, start + 5 * US, t0 - 5 * US, thread=thread)
        if call.stream:
            mid = self._span("async_stream", "async_stream", h, t0 + 5 * US, end - 10 * US, thread=thread)
        else:
            mid = self._span("generate", "infer.generate", h, t0 + 5 * US, end - 10 * US, thread=thread)
        return self._span("generate_stream", "infer.generate_stream", mid, t0 + 10 * US, end - 15 * US, thread=thread)

    def _validate_spans(self, parent: Context, t0: int, queued: int, error: str | None, thread: int) -> None:
        ev = ((error, "ERROR", "text_generation_router::infer", queued),) if error else ()
        val = self._span(
            "validate", "validate", parent, t0 + 15 * US, queued, events=ev, error=bool(error), thread=thread
        )
        vi = self._span("validate_input", "validate_input", val, t0 + 20 * US, queued - 5 * US, thread=thread)
        self._span("tokenize", "tokenize", vi, t0 + 25 * US, queued - 10 * US, thread=thread)

    def emit_rejected(self, call: Call, message: str) -> None:
        """The trace of a request that failed validation (handler and validate carry the error)."""
        if self.engine.spans is None:
            return
        now = ns(self.engine.clock.now())
        t0 = now - 150 * US
        thread = self.rng.randrange(2, 18)
        ev = ((message, "ERROR", "text_generation_router::infer", now),)
        gs = self._handler_spans(call, t0, now + 30 * US, {}, ev, True, thread)
        self._validate_spans(gs, t0, now, message, thread)

    def emit(self, seq: Sequence, call: Call) -> None:
        """TGI's request trace for a finished sequence (success or generation error)."""
        if self.engine.spans is None or seq.finish not in (Finish.STOP, Finish.LENGTH, Finish.ERROR):
            return
        self._entries += 1
        call.entry_id = self._entries
        t = timings(seq)
        queued = ns(seq.arrival)
        t0 = queued - t.validation
        start = queued + t.queue
        end = start + t.inference
        h_end = end + 45 * US
        thread = self.rng.randrange(2, 18)
        server = "text_generation_router::server"
        failed = seq.finish is Finish.ERROR
        if failed:
            attrs: dict[str, Any] = {}
            events: tuple[tuple[str, str, str, int], ...] = ((GENERATION_ERROR, "ERROR", server, end + 35 * US),)
        else:
            attrs = {
                "total_time": rust_duration(t.total),
                "validation_time": rust_duration(t.validation),
                "queue_time": rust_duration(t.queue),
                "inference_time": rust_duration(t.inference),
                "time_per_token": rust_duration(t.per_token),
                "seed": _debug_opt(call.seed),
            }
            events = (("Success", "INFO", server, end + 40 * US),)
        gs = self._handler_spans(call, t0, h_end, attrs, events, failed, thread)
        self._validate_spans(gs, t0, queued - 2 * US, None, thread)
        sch = self._span("schedule", "schedule", gs, queued, end + 25 * US, thread=thread)
        self._span("append", "append", sch, queued, queued + 4 * US, thread=thread)
        self._span("queued", "queued", sch, queued, start, thread=thread)
        if failed:
            inf = self._span("infer", "infer.admit", sch, start, start + 20 * US, thread=thread)
            ev = ((GENERATION_ERROR, "ERROR", "text_generation_router_v3::backend", start + 10 * US),)
            self._span(
                "send_error", "send_error", inf, start + 5 * US, start + 15 * US, events=ev, error=True, thread=thread
            )
            return
        times = [ns(x) for x in seq.token_times]
        n = len(times)
        keep = range(n) if n <= MAX_INFER_SPANS else [*range(MAX_INFER_SPANS // 2), *range(n - MAX_INFER_SPANS // 2, n)]
        for k in keep:
            begin = start if k == 0 else times[k - 1] + 35 * US
            inf = self._span(
                "infer", "infer.admit" if k == 0 else "infer.step", sch, begin, times[k] + 30 * US, thread=thread
            )
            self._span(
                "send_generation",
                "send_generation",
                inf,
                times[k] + 2 * US,
                times[k] + 12 * US,
                {"generation": self._generation(seq, call, k, k == n - 1)},
                thread=thread,
            )

    # -- API -------------------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """``struct Info`` in field order."""
        return {
            "model_id": self.engine.settings.model,
            "model_sha": None,
            "model_pipeline_tag": PIPELINE_TAG,
            "max_concurrent_requests": MAX_CONCURRENT_REQUESTS,
            "max_best_of": MAX_BEST_OF,
            "max_stop_sequences": MAX_STOP_SEQUENCES,
            "max_input_tokens": self.max_input_tokens,
            "max_total_tokens": self.max_total_tokens,
            "validation_workers": VALIDATION_WORKERS,
            "max_client_batch_size": MAX_CLIENT_BATCH_SIZE,
            "router": ROUTER,
            "version": self.version,
            "sha": SHA,
            "docker_label": DOCKER_LABEL,
        }

    def build_app(self) -> FastAPI:
        app = FastAPI(
            title=f"simulated TGI {VERSION}",
            lifespan=self.engine.lifespan,
            docs_url="/docs",
            openapi_url="/api-doc/openapi.json",
            redoc_url=None,
        )

        def ok() -> Response:
            return Response(status_code=200)

        @app.get("/")
        async def root_health() -> Response:
            return ok()

        @app.get("/health")
        async def health() -> Response:
            return ok()

        @app.get("/ping")
        async def ping() -> Response:
            return ok()

        @app.get("/info")
        async def info() -> Response:
            return Response(dumps(self.info()), media_type="application/json")

        @app.get("/v1/models")
        async def models() -> Response:
            name = self.engine.settings.model
            body = {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": name}]}
            return Response(dumps(body), media_type="application/json")

        @app.get("/metrics")
        async def metrics() -> Response:
            return PlainTextResponse(self.metrics.render())

        @app.post("/generate")
        async def generate(request: Request) -> Response:
            try:
                inputs, params, _ = parse_generate(await read_json(request))
            except BodyError as exc:
                return exc.response()
            call = Call("generate", inputs, params, parent=incoming_context(request.headers))
            return await self.generate(call, request, wrap=False)

        @app.post("/generate_stream")
        async def generate_stream(request: Request) -> Response:
            try:
                inputs, params, _ = parse_generate(await read_json(request))
            except BodyError as exc:
                return exc.response()
            call = Call("generate_stream", inputs, params, stream=True, parent=incoming_context(request.headers))
            return self.generate_stream(call)

        @app.post("/")
        async def compat_generate(request: Request) -> Response:
            try:
                inputs, params, stream = parse_generate(await read_json(request), compat=True)
            except BodyError as exc:
                return exc.response()
            if params.return_full_text is None:
                params.return_full_text = PIPELINE_TAG == "text-generation"
            parent = incoming_context(request.headers)
            if stream:
                call = Call("generate_stream", inputs, params, stream=True, compat=True, parent=parent)
                return self.generate_stream(call)
            return await self.generate(Call("generate", inputs, params, compat=True, parent=parent), request, wrap=True)

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Response:
            try:
                body = parse_chat(await read_json(request))
            except BodyError as exc:
                return exc.response()
            return await self.chat(request, body)

        return app


async def disconnected(request: Request) -> None:
    """Returns once the client has gone (the request body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def read_json(request: Request) -> Any:
    """axum's ``Json`` extractor: content type, then syntax, then (by the caller) the target type."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not (ctype == "application/json" or (ctype.startswith("application/") and ctype.endswith("+json"))):
        raise BodyError(415, "Expected request with `Content-Type: application/json`")
    raw = await request.body()
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise BodyError(400, f"Failed to parse the request body as JSON: {exc}") from None


def create(engine: SimulatedEngine) -> tuple[FastAPI, TgiSim]:
    sim = TgiSim(engine)
    return sim.build_app(), sim
