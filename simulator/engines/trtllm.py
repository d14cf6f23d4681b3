"""Simulated TensorRT-LLM ``trtllm-serve`` (PyTorch backend) with the Gen C metrics, faithful on the wire.

What a client or scraper sees (sources: ``trtllm.md`` §2.1-2.5 and §4.1, the fixtures
``tests/fixtures/engines/trtllm/gen-c`` and ``.../json-iteration-stats`` with their SOURCE.md):

* ``GET /prometheus/metrics``: the Gen C families of ``tensorrt_llm/metrics/collector.py`` @ ``050f80de``
  (names, HELP texts, label names, buckets), exposed as prometheus_client renders them in multiprocess
  mode: gauges carry a ``pid`` label (``trtllm_scheduled_batch_size`` the executor worker's, the others
  the server's), counters are named ``..._total`` in HELP/TYPE, there is no ``_created`` series,
  histograms list ``_sum`` first, then the buckets, then ``_count``, and a family appears once one of
  its children was first touched (family order = ``.db`` file order, then first-touch order; not
  sorted). The text is rendered by prometheus_client itself (``make_asgi_app`` over a private registry
  with a collector of our own): no process-global state, no ``PROMETHEUS_MULTIPROC_DIR``.
* ``GET /metrics``: the JSON array of PyTorch iteration stats (camelCase, C++ keys sorted, then the
  keys the Python worker appends), a **destructive** read of a buffer bounded by
  ``iter_stats_max_iterations`` (1000, oldest dropped).
* The collector-loop quirk (§2.4): the server's background loop sleeps until a request finishes, then
  drains the executor's stats queue, logs every iteration to Prometheus and tees it into the ``/metrics``
  buffer. So the iteration gauges and counters, and the JSON ``/metrics`` itself, only move when a
  request finishes. Per-request histograms are logged at each finish; ``trtllm_scheduled_batch_size``
  is published by the worker every step.
* OpenAI API (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``), ``/health``,
  ``/health_generate``, ``/version``; request and response bodies follow ``openai_protocol.py`` and
  ``postprocess_handlers.py`` (chat stream chunks are dumped with ``exclude_none`` and the first one
  ends in ``" \\n\\n"``; completion chunks keep their nulls; stream ids are ``chatcmpl-<executor id>``).
* OpenTelemetry: one SERVER span per request from the tracer ``trt.llm`` with the ``gen_ai.*``
  attributes of §4.1, parented on the incoming ``traceparent``. The span name is **unverified**: the
  catalog only says the implementation was adapted from vLLM, whose span is ``llm_request``, so that
  is used here.

``/version`` answers ``{"version": "1.3.0rc10"}`` (:data:`VERSION`, overridable by ``SimSettings.version``):
the Gen C collector is newer than 1.2 (Gen B shipped around 1.3.0rc5) and the exact release that
carries ``050f80de`` is not verified.

Approximations: speculative decoding (NGram, ``max_draft_len`` 4, as in both fixtures; pass
``speculation=None`` to :func:`create` to turn it off) is drawn from a seeded RNG and reported in the
stats, but tokens are still produced one per step by the serving model. KV block counters are derived
from the serving model (prompt blocks at admission, one block per ``block_size`` generated tokens,
reused blocks = cached prefix tokens / block size). ``gpuMemUsage`` is a synthetic device-wide figure.
The serving model has no per-request deadline, so ``finished_reason="timeout"`` never occurs; client
aborts are ``cancelled``. Engine failures are answered with HTTP 500 and counted in
``trtllm_request_error_total{http_code="500"}`` (upstream's generic handler answers them with 400).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import struct
import time
import uuid
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry, generate_latest, make_asgi_app
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString
from starlette.routing import Mount
from starlette.types import Receive, Scope, Send

from inferwatch.simulator.base import EngineMetrics, SimulatedEngine, count_tokens, ns, parent_context
from inferwatch.simulator.buckets import ITL_BUCKETS as TPOT_BUCKETS
from inferwatch.simulator.buckets import LATENCY_BUCKETS, TTFT_BUCKETS
from inferwatch.simulator.model import Finish, Sequence, StepReport

VERSION = "1.3.0rc10"
SCOPE = "trt.llm"
SPAN_NAME = "llm_request"
"""Unverified (see the module docstring)."""
ENGINE_TYPE = "pytorch"
PROMETHEUS_PATH = "/prometheus/metrics"
JSON_PATH = "/metrics"
ITER_STATS_MAX_ITERATIONS = 1000
GPU_TYPE = "NVIDIA H100 80GB HBM3"
GPU_MEM_BASE = 76_233_572_352
"""bytes in use on the device with no batch (weights + KV pool at ``free_gpu_memory_fraction`` 0.9)."""
GPU_MEM_PER_REQUEST = 1 << 20
WORKER_PID_OFFSET = 257
"""``trtllm_scheduled_batch_size`` is written by the executor worker, a different process."""
CACHE_LEVEL_TIERS = ("gpu", "host")
FINISHED_REASON: dict[Finish | None, str] = {Finish.STOP: "stop", Finish.LENGTH: "length", Finish.ABORT: "cancelled"}

P = "trtllm_"
# Family names used outside the collector (tests, the scheduled-batch gauge).
NUM_REQUESTS_RUNNING = P + "num_requests_running"
SCHEDULED_BATCH_SIZE = P + "scheduled_batch_size"
REQUEST_SUCCESS = P + "request_success_total"
REQUEST_ERROR = P + "request_error_total"

PREFILL_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
CACHED_TOKENS_BUCKETS = (0.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0)
PREFILL_BATCH_BUCKETS = (64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0)

_KEPT = "Resets only when the serving process restarts, not when the KV cache is flushed or evicted."
# (exposed name, type, HELP, buckets); counters are listed under their exposed ``_total`` name.
CATALOG: tuple[tuple[str, str, str, tuple[float, ...]], ...] = (
    (P + "request_success_total", "counter", "Count of successfully processed requests.", ()),
    (
        P + "e2e_request_latency_seconds",
        "histogram",
        "Histogram of end to end request latency in seconds.",
        LATENCY_BUCKETS,
    ),
    (P + "time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    (P + "time_per_output_token_seconds", "histogram", "Histogram of time per output token in seconds.", TPOT_BUCKETS),
    (
        P + "request_queue_time_seconds",
        "histogram",
        "Histogram of time spent in WAITING phase for request.",
        LATENCY_BUCKETS,
    ),
    (
        P + "request_prefill_time_seconds",
        "histogram",
        "Histogram of prefill (context) phase duration in seconds (first_token_time - first_scheduled_time).",
        PREFILL_BUCKETS,
    ),
    (
        P + "request_decode_time_seconds",
        "histogram",
        "Histogram of decode (generation) phase duration in seconds (last_token_time - first_token_time).",
        LATENCY_BUCKETS,
    ),
    (
        P + "request_inference_time_seconds",
        "histogram",
        "Histogram of total inference duration in seconds (last_token_time - first_scheduled_time).",
        LATENCY_BUCKETS,
    ),
    (P + "prompt_tokens_total", "counter", "Cumulative number of prompt (input) tokens processed.", ()),
    (P + "generation_tokens_total", "counter", "Cumulative number of generation (output) tokens produced.", ()),
    (P + "kv_cache_hit_rate", "gauge", "KV cache hit rate", ()),
    (P + "kv_cache_reused_blocks_total", "counter", "Cumulative number of KV cache blocks reused (cache hits)", ()),
    (P + "kv_cache_missed_blocks_total", "counter", "Cumulative number of KV cache blocks missed (cache misses)", ()),
    (P + "kv_cache_utilization", "gauge", "KV cache utilization", ()),
    (P + "num_requests_running", "gauge", "Number of active requests", ()),
    (P + "num_requests_waiting", "gauge", "Number of queued requests", ()),
    (P + "num_requests_completed_total", "counter", "Total number of completed requests across iterations", ()),
    (P + "max_num_active_requests", "gauge", "Maximum number of active requests", ()),
    (P + "iteration_latency_seconds", "gauge", "Iteration latency in seconds", ()),
    (P + "gpu_memory_usage_bytes", "gauge", "GPU memory usage in bytes", ()),
    (P + "cpu_memory_usage_bytes", "gauge", "CPU memory usage in bytes", ()),
    (P + "pinned_memory_usage_bytes", "gauge", "Pinned memory usage in bytes", ()),
    (P + "max_batch_size_static", "gauge", "Static maximum batch size", ()),
    (P + "max_batch_size_runtime", "gauge", "Runtime maximum batch size", ()),
    (P + "max_num_tokens_runtime", "gauge", "Runtime maximum number of tokens", ()),
    (P + "kv_cache_max_blocks", "gauge", "Maximum number of KV cache blocks", ()),
    (P + "kv_cache_free_blocks", "gauge", "Number of free KV cache blocks", ()),
    (P + "kv_cache_used_blocks", "gauge", "Number of used KV cache blocks", ()),
    (P + "kv_cache_tokens_per_block", "gauge", "Number of tokens per KV cache block", ()),
    (P + "num_context_requests", "gauge", "Number of context (prefill) requests", ()),
    (P + "num_generation_requests", "gauge", "Number of generation (decode) requests", ()),
    (P + "num_paused_requests", "gauge", "Number of paused requests", ()),
    (P + "num_scheduled_requests", "gauge", "Number of scheduled requests", ()),
    (P + "total_context_tokens", "gauge", "Total number of context tokens", ()),
    (P + "avg_decoded_tokens_per_iter", "gauge", "Average number of decoded tokens per iteration", ()),
    (P + "spec_decode_num_draft_tokens_total", "counter", "Total number of draft tokens in speculative decoding", ()),
    (
        P + "spec_decode_num_accepted_tokens_total",
        "counter",
        "Total number of accepted tokens in speculative decoding",
        (),
    ),
    (P + "spec_decode_acceptance_length", "gauge", "Acceptance length in speculative decoding", ()),
    (P + "spec_decode_draft_overhead", "gauge", "Draft overhead in speculative decoding", ()),
    (
        P + "prompt_cached_tokens_total",
        "counter",
        f"Process-lifetime total prompt tokens served from KV cache. {_KEPT}",
        (),
    ),
    (
        P + "prompt_cache_hit_tokens_total",
        "counter",
        f"Process-lifetime total prompt tokens served from each KV cache level. {_KEPT} cache_level is the index "
        "into the configured tier list and cache_tier names the memory backing it, so a deployment with a hot and "
        "a cold GPU level reports them as two series sharing the gpu name. Pages already prefetched from disk to "
        "host count as host.",
        (),
    ),
    (
        P + "prompt_cached_tokens_per_request",
        "histogram",
        "Histogram of cached prompt tokens per request.",
        CACHED_TOKENS_BUCKETS,
    ),
    (P + "spec_decode_drafted_tokens_total", "counter", "Total drafted tokens per speculative decoding position.", ()),
    (
        P + "spec_decode_accepted_tokens_total",
        "counter",
        "Total accepted tokens per speculative decoding position.",
        (),
    ),
    (P + "prefill_batch_occupancy", "gauge", "Fraction of max active slots occupied by context requests.", ()),
    (
        P + "prefill_batch_tokens",
        "histogram",
        "Histogram of total context tokens per iteration.",
        PREFILL_BATCH_BUCKETS,
    ),
    (P + "request_error_total", "counter", "Total request errors, labeled by HTTP status code.", ()),
    (
        SCHEDULED_BATCH_SIZE,
        "gauge",
        "Number of real context and generation requests in the latest scheduled batch on this executor rank; zero "
        "when no batch is submitted. Under pipeline parallelism, other microbatches may still be running.",
        (),
    ),
    (P + "model_config_info", "gauge", "Model configuration info", ()),
    (P + "parallel_config_info", "gauge", "Parallelism configuration info", ()),
    (P + "speculative_config_info", "gauge", "Speculative decoding configuration info", ()),
    (P + "kv_cache_config_info", "gauge", "KV cache configuration info", ()),
)


_go_float: Callable[[float], str] = floatToGoString
"""prometheus_client's float formatting (``1.0``, ``+Inf``), as the multiprocess collector writes ``le``."""


def _f32(value: float) -> float:
    """A C++ ``float`` widened to double, as nlohmann and the collector print it."""
    result: float = struct.unpack("f", struct.pack("f", value))[0]
    return result


# -- prometheus_client multiprocess mode, in memory -----------------------------------------------
Key = tuple[tuple[str, str], ...]


@dataclass
class _Family:
    name: str
    kind: str
    help: str
    buckets: tuple[float, ...]
    file: str
    children: dict[Key, list[float]] = field(default_factory=dict)
    """gauge/counter: ``[value]``; histogram: ``[sum, count per bucket..., count above the last]``."""


class MultiprocessStore:
    """What ``MultiProcessCollector`` would read back from the ``.db`` files of two processes.

    A child exists from its first touch (``.labels()``), with value 0; families are yielded per file
    (counters, the worker's gauges, the server's gauges, histograms) in first-touch order.
    """

    FILES = ("counter", "gauge_worker", "gauge", "histogram")

    def __init__(self, server_pid: int, worker_pid: int) -> None:
        self.pids = {"gauge": str(server_pid), "gauge_worker": str(worker_pid)}
        self.families: dict[str, _Family] = {}
        for name, kind, doc, buckets in CATALOG:
            file = "gauge_worker" if name == SCHEDULED_BATCH_SIZE else kind
            self.families[name] = _Family(name, kind, doc, buckets, file)
        self.order: dict[str, list[_Family]] = {f: [] for f in self.FILES}

    def _child(self, name: str, labels: Mapping[str, str]) -> list[float]:
        fam = self.families[name]
        key = tuple(sorted(labels.items()))
        child = fam.children.get(key)
        if child is None:
            if not fam.children:
                self.order[fam.file].append(fam)
            size = 1 if fam.kind != "histogram" else len(fam.buckets) + 2
            child = fam.children[key] = [0.0] * size
        return child

    def inc(self, name: str, labels: Mapping[str, str], amount: float = 1.0) -> None:
        self._child(name, labels)[0] += amount

    def set(self, name: str, labels: Mapping[str, str], value: float) -> None:
        self._child(name, labels)[0] = float(value)

    def observe(self, name: str, labels: Mapping[str, str], value: float) -> None:
        child = self._child(name, labels)
        buckets = self.families[name].buckets
        child[0] += value
        index = next((i for i, b in enumerate(buckets) if value <= b), len(buckets))
        child[1 + index] += 1

    def value(self, name: str, labels: Mapping[str, str]) -> float | None:
        child = self.families[name].children.get(tuple(sorted(labels.items())))
        return None if child is None else child[0]

    def collect(self) -> Iterable[Metric]:
        for file in self.FILES:
            for fam in self.order[file]:
                yield self._metric(fam)

    def _metric(self, fam: _Family) -> Metric:
        if fam.kind == "counter":
            metric = Metric(fam.name.removesuffix("_total"), fam.help, "counter")
            for key, (value,) in fam.children.items():
                metric.add_sample(fam.name, dict(key), value)
        elif fam.kind == "gauge":
            metric = Metric(fam.name, fam.help, "gauge")
            for key, (value,) in fam.children.items():
                metric.add_sample(fam.name, {**dict(key), "pid": self.pids[fam.file]}, value)
        else:
            metric = Metric(fam.name, fam.help, "histogram")
            for key, child in fam.children.items():
                labels = dict(key)
                metric.add_sample(fam.name + "_sum", labels, child[0])
                acc = 0.0
                for bound, count in zip((*fam.buckets, math.inf), child[1:], strict=True):
                    acc += count
                    metric.add_sample(fam.name + "_bucket", {**labels, "le": _go_float(bound)}, acc)
                metric.add_sample(fam.name + "_count", labels, acc)
        return metric


# -- speculative decoding ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Speculation:
    """NGram speculation as configured in the fixtures' deployment (``speculative_config``)."""

    method: str = "NGram"
    max_draft_len: int = 4
    match_rate: float = 0.6
    """share of decode steps where the n-gram lookup finds a draft."""
    accept_first: float = 0.45
    accept_decay: float = 0.75
    """acceptance probability of draft position ``k`` (given ``k-1`` accepted): first x decay**k."""


NGRAM = Speculation()


# -- the metrics dialect ----------------------------------------------------------------------------
@dataclass
class _Stat:
    """One iteration as queued by the executor: the JSON dict plus what the JSON of this build omits."""

    json: dict[str, Any]
    cached_tokens_by_level: list[int]


class TrtllmMetrics(EngineMetrics):
    """``MetricsCollector`` (server) plus the executor's iteration stats queue and the ``/metrics`` buffer."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, engine: SimulatedEngine, speculation: Speculation | None) -> None:
        super().__init__(engine)
        self.speculation = speculation
        self.store = MultiprocessStore(engine.pid, engine.pid + WORKER_PID_OFFSET)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.store)
        model = engine.settings.model
        self.labels = {"model_name": model, "engine_type": ENGINE_TYPE}
        self.rng = random.Random(engine.settings.seed + 11)
        # MetricsCollector.__init__ pre-creates this child; log_config_info runs at server start.
        self.store.inc(P + "prompt_cached_tokens_total", self.labels, 0.0)
        self._log_config_info()
        self._cache_levels_registered = False
        self._prev_reused = 0
        self._prev_missed = 0
        # executor side
        self.iter = 0
        self.queue: deque[_Stat] = deque(maxlen=ITER_STATS_MAX_ITERATIONS)
        self.buffer: deque[dict[str, Any]] = deque(maxlen=ITER_STATS_MAX_ITERATIONS)
        self.alloc_total = 0
        self.alloc_new = 0
        self.reused_blocks = 0
        self.missed_blocks = 0
        self._prev_gpu_forward = 0.0
        self._drafts: dict[int, tuple[list[int], list[int]]] = {}
        self._wake_pending = False

    def _log_config_info(self) -> None:
        p = self.engine.params
        model = self.engine.settings.model
        info = {
            P + "model_config_info": {
                "model": model,
                "served_model_name": model,
                "dtype": "auto",
                "quantization": "none",
                "max_model_len": str(p.max_model_len),
                "gpu_type": GPU_TYPE,
            },
            P + "parallel_config_info": {
                "tensor_parallel_size": "1",
                "pipeline_parallel_size": "1",
                "context_parallel_size": "1",
                "gpu_count": "1",
            },
            P + "kv_cache_config_info": {
                "page_size": str(p.block_size),
                "enable_block_reuse": str(p.enable_prefix_caching),
                "enable_partial_reuse": "True",
                "free_gpu_memory_fraction": "0.9",
                "cache_dtype": "auto",
            },
        }
        if self.speculation is not None:
            info[P + "speculative_config_info"] = {
                "spec_enabled": "true",
                "spec_method": self.speculation.method,
                "spec_num_tokens": str(self.speculation.max_draft_len),
            }
        for name in (
            P + "model_config_info",
            P + "parallel_config_info",
            P + "speculative_config_info",
            P + "kv_cache_config_info",
        ):
            if name in info:
                self.store.set(name, {**self.labels, **info[name]}, 1)

    # -- executor: one iteration -------------------------------------------------------------------
    def on_step(self, report: StepReport) -> None:
        idle = report.running == 0 and report.waiting == 0
        worker = {**self.labels, "rank": "0"}
        self.store.set(SCHEDULED_BATCH_SIZE, worker, 0 if idle else len(report.scheduled))
        self.queue.append(self._iteration(report))
        self.iter += 1
        done = [s for s in report.finished if s.finish is not Finish.ERROR]
        for seq in done:
            self.log_request(seq)
        if done:
            self.wake()

    def _iteration(self, report: StepReport) -> _Stat:
        p = self.engine.params
        bs = p.block_size
        new_active = list(report.admitted)
        for seq in new_active:
            blocks = math.ceil((seq.prompt_tokens + seq.generated) / bs)
            reused = seq.cached_tokens // bs if seq.preemptions == 0 and p.enable_prefix_caching else 0
            if p.enable_prefix_caching:
                self.reused_blocks += reused
                self.missed_blocks += blocks - reused
            self.alloc_total += blocks
            self.alloc_new += blocks - reused
        for seq in report.new_tokens:
            if seq.generated > 1 and (seq.prompt_tokens + seq.generated - 1) % bs == 0:
                self.alloc_total += 1
                self.alloc_new += 1
        completed = sum(1 for s in report.finished if s.finish is not Finish.ERROR)
        lookups = self.reused_blocks + self.missed_blocks
        decode = [s for s in report.new_tokens if s.generated > 1]
        iter_ms = report.duration * 1000.0
        gpu_forward = _f32(iter_ms * 0.47)
        prev_gpu, self._prev_gpu_forward = self._prev_gpu_forward, gpu_forward
        stat: dict[str, Any] = {
            "cpuMemUsage": 0,
            "gpuMemUsage": GPU_MEM_BASE + GPU_MEM_PER_REQUEST * len(report.scheduled),
            "inflightBatchingStats": {
                "avgNumDecodedTokensPerIter": 0.0,
                "microBatchId": 0,
                "numContextRequests": report.context_seqs,
                "numCtxTokens": report.prefill_tokens,
                "numGenRequests": report.decode_seqs,
                "numPausedRequests": len(report.preempted),
                "numScheduledRequests": len(report.scheduled),
            },
            "iter": self.iter,
            "iterLatencyMS": iter_ms,
            "kvCacheStats": {
                "allocNewBlocks": self.alloc_new,
                "allocTotalBlocks": self.alloc_total,
                "cacheHitRate": _f32(self.reused_blocks / lookups) if lookups else 0.0,
                "freeNumBlocks": p.num_blocks - report.used_blocks,
                "maxNumBlocks": p.num_blocks,
                "missedBlocks": self.missed_blocks,
                "reusedBlocks": self.reused_blocks,
                "tokensPerBlock": bs,
                "usedNumBlocks": report.used_blocks,
            },
            "maxBatchSizeRuntime": 0,
            "maxBatchSizeStatic": 0,
            "maxBatchSizeTunerRecommended": 0,
            "maxNumActiveRequests": p.max_num_seqs,
            "maxNumTokensRuntime": 0,
            "maxNumTokensStatic": 0,
            "maxNumTokensTunerRecommended": 0,
            "newActiveRequestsQueueLatencyMS": sum(
                (s.queue_time * 1000.0 for s in new_active if s.first_scheduled == report.start), 0.0
            ),
            "numActiveRequests": report.running + completed,
            "numCompletedRequests": completed,
            "numNewActiveRequests": len(new_active),
            "numQueuedRequests": report.waiting,
            "pinnedMemUsage": 0,
            "specDecodingStats": self._speculate(decode),
            "staticBatchingStats": {
                "emptyGenSlots": 0,
                "numContextRequests": 0,
                "numCtxTokens": 0,
                "numGenTokens": 0,
                "numScheduledRequests": 0,
            },
            "timestamp": datetime.fromtimestamp(report.start).strftime("%m-%d-%Y %H:%M:%S.%f"),
            "attentionDpRank": 0,
            "hostStepTimeMS": iter_ms * 0.5,
            "prevDeviceStepTimeMS": prev_gpu,
            "gpuForwardTimeMS": gpu_forward,
            "schedulerMode": "overlap",
        }
        return _Stat(stat, [report.prefix_hits, 0])

    def _speculate(self, decode: list[Sequence]) -> dict[str, Any] | None:
        spec = self.speculation
        if spec is None:
            return None
        drafted = accepted = with_drafts = 0
        for seq in decode:
            if self.rng.random() >= spec.match_rate:
                continue
            length = self.rng.randint(1, spec.max_draft_len)
            per_drafted, per_accepted = self._drafts.setdefault(
                id(seq), ([0] * spec.max_draft_len, [0] * spec.max_draft_len)
            )
            ok = True
            for k in range(length):
                per_drafted[k] += 1
                ok = ok and self.rng.random() < spec.accept_first * spec.accept_decay**k
                if ok:
                    per_accepted[k] += 1
                    accepted += 1
            drafted += length
            with_drafts += 1
        return {
            "acceptanceLength": (accepted + with_drafts) / with_drafts if with_drafts else 0.0,
            "draftOverhead": 0.0,
            "iterLatencyMS": 0.0,
            "numAcceptedTokens": accepted,
            "numDraftTokens": drafted,
            "numRequestsWithDraftTokens": with_drafts,
        }

    # -- server: per-request metrics (log_request_metrics_dict) --------------------------------------
    def log_request(self, seq: Sequence) -> None:
        """One finished candidate, as ``perf_utils`` derives its metrics dict (non-positive values dropped)."""
        store, lab = self.store, self.labels
        store.inc(REQUEST_SUCCESS, {**lab, "finished_reason": FINISHED_REASON.get(seq.finish, "unknown")})

        def observe(name: str, value: float | None) -> None:
            if value is not None and value > 0:
                store.observe(P + name, lab, value)

        first, last, sched = seq.first_token, seq.last_token, seq.first_scheduled
        observe("e2e_request_latency_seconds", None if last is None else last - seq.arrival)
        observe("time_to_first_token_seconds", seq.ttft)
        if seq.generated >= 2 and first is not None and last is not None:
            observe("time_per_output_token_seconds", (last - first) / (seq.generated - 1))
        if sched is not None:
            store.observe(P + "request_queue_time_seconds", lab, sched - seq.arrival)  # zero kept since #12545
        if first is not None and sched is not None:
            observe("request_prefill_time_seconds", first - sched)
        if first is not None and last is not None:
            observe("request_decode_time_seconds", last - first)
        if last is not None and sched is not None:
            observe("request_inference_time_seconds", last - sched)
        if seq.prompt_tokens > 0:
            store.inc(P + "prompt_tokens_total", lab, seq.prompt_tokens)
        if seq.generated > 0:
            store.inc(P + "generation_tokens_total", lab, seq.generated)
        if seq.cached_tokens > 0:
            store.inc(P + "prompt_cached_tokens_total", lab, seq.cached_tokens)
        store.observe(P + "prompt_cached_tokens_per_request", lab, seq.cached_tokens)
        drafts = self._drafts.pop(id(seq), None)
        if drafts is not None:
            per_drafted, per_accepted = drafts
            last_nonzero = max((i for i, d in enumerate(per_drafted) if d > 0), default=-1)
            for pos in range(last_nonzero + 1):
                pos_labels = {**lab, "token_position": str(pos)}
                if per_drafted[pos] > 0:
                    store.inc(P + "spec_decode_drafted_tokens_total", pos_labels, per_drafted[pos])
                if per_accepted[pos] > 0:
                    store.inc(P + "spec_decode_accepted_tokens_total", pos_labels, per_accepted[pos])

    def on_abort(self, seq: Sequence) -> None:
        """A client went away: the request finishes ``cancelled`` and wakes the collector."""
        self.log_request(seq)
        self.wake()

    def request_error(self, status: int) -> None:
        self.store.inc(REQUEST_ERROR, {**self.labels, "http_code": str(status)})

    # -- server: the background collector loop ------------------------------------------------------
    def wake(self) -> None:
        """Set the collector's wake-up event (a request finished); it drains on the next loop turn."""
        if not self._wake_pending:
            self._wake_pending = True
            asyncio.get_running_loop().call_soon(self.drain)

    def drain_if_woken(self) -> None:
        """Let a pending drain happen before a read (the loop would have run it by then anyway)."""
        if self._wake_pending:
            self.drain()

    def drain(self) -> None:
        if not self._wake_pending:
            return
        self._wake_pending = False
        while self.queue:
            stat = self.queue.popleft()
            self.log_iteration_stats(stat)
            self.buffer.append(stat.json)

    def take_iteration_stats(self) -> list[dict[str, Any]]:
        """``GET /metrics``: what the buffer holds, then clear it."""
        self.drain_if_woken()
        out = list(self.buffer)
        self.buffer.clear()
        return out

    def log_iteration_stats(self, stat: _Stat) -> None:
        """``MetricsCollector.log_iteration_stats`` over one iteration dict."""
        it, store, lab = stat.json, self.store, self.labels

        def gauge(name: str, value: float) -> None:
            store.set(P + name, lab, value)

        gauge("num_requests_running", it["numActiveRequests"])
        gauge("num_requests_waiting", it["numQueuedRequests"])
        if it["numCompletedRequests"] > 0:
            store.inc(P + "num_requests_completed_total", lab, it["numCompletedRequests"])
        gauge("max_num_active_requests", it["maxNumActiveRequests"])
        gauge("iteration_latency_seconds", it["iterLatencyMS"] / 1000.0)
        gauge("gpu_memory_usage_bytes", it["gpuMemUsage"])
        gauge("cpu_memory_usage_bytes", it["cpuMemUsage"])
        gauge("pinned_memory_usage_bytes", it["pinnedMemUsage"])
        gauge("max_batch_size_static", it["maxBatchSizeStatic"])
        gauge("max_batch_size_runtime", it["maxBatchSizeRuntime"])
        gauge("max_num_tokens_runtime", it["maxNumTokensRuntime"])
        kv = it["kvCacheStats"]
        gauge("kv_cache_hit_rate", kv["cacheHitRate"])
        delta = kv["reusedBlocks"] - self._prev_reused
        if delta > 0:
            store.inc(P + "kv_cache_reused_blocks_total", lab, delta)
        self._prev_reused = kv["reusedBlocks"]
        delta = kv["missedBlocks"] - self._prev_missed
        if delta > 0:
            store.inc(P + "kv_cache_missed_blocks_total", lab, delta)
        self._prev_missed = kv["missedBlocks"]
        if kv["maxNumBlocks"]:
            gauge("kv_cache_utilization", kv["usedNumBlocks"] / kv["maxNumBlocks"])
        gauge("kv_cache_max_blocks", kv["maxNumBlocks"])
        gauge("kv_cache_free_blocks", kv["freeNumBlocks"])
        gauge("kv_cache_used_blocks", kv["usedNumBlocks"])
        gauge("kv_cache_tokens_per_block", kv["tokensPerBlock"])
        ifb = it["inflightBatchingStats"]
        gauge("num_context_requests", ifb["numContextRequests"])
        gauge("num_generation_requests", ifb["numGenRequests"])
        gauge("num_paused_requests", ifb["numPausedRequests"])
        gauge("num_scheduled_requests", ifb["numScheduledRequests"])
        gauge("total_context_tokens", ifb["numCtxTokens"])
        if ifb["numCtxTokens"] > 0:
            store.observe(P + "prefill_batch_tokens", lab, ifb["numCtxTokens"])
        gauge("avg_decoded_tokens_per_iter", ifb["avgNumDecodedTokensPerIter"])
        if it["maxNumActiveRequests"] > 0:
            gauge("prefill_batch_occupancy", ifb["numContextRequests"] / it["maxNumActiveRequests"])
        spec = it["specDecodingStats"]
        if spec:
            if spec["numDraftTokens"] > 0:
                store.inc(P + "spec_decode_num_draft_tokens_total", lab, spec["numDraftTokens"])
            if spec["numAcceptedTokens"] > 0:
                store.inc(P + "spec_decode_num_accepted_tokens_total", lab, spec["numAcceptedTokens"])
            gauge("spec_decode_acceptance_length", spec["acceptanceLength"])
            gauge("spec_decode_draft_overhead", spec["draftOverhead"])
        counts = stat.cached_tokens_by_level
        if not self._cache_levels_registered:
            for level, tier in enumerate(CACHE_LEVEL_TIERS):
                store.inc(
                    P + "prompt_cache_hit_tokens_total", {**lab, "cache_level": str(level), "cache_tier": tier}, 0
                )
            self._cache_levels_registered = True
        for level, count in enumerate(counts):
            if count > 0:
                hit = {**lab, "cache_level": str(level), "cache_tier": CACHE_LEVEL_TIERS[level]}
                store.inc(P + "prompt_cache_hit_tokens_total", hit, count)

    def render(self) -> str:
        self.drain_if_woken()
        return generate_latest(self.registry).decode()


# -- requests ---------------------------------------------------------------------------------------
@dataclass
class _Req:
    """One user request (``n`` candidates) as the executor and the tracer see it."""

    executor_id: int
    seqs: list[Sequence]
    headers: Mapping[str, str] | None
    params: dict[str, Any]
    traced: bool = False


def _dump(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def _without_none(value: Any) -> Any:
    """``model_dump_json(exclude_none=True)``."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


class TrtllmSim:
    """The simulated ``trtllm-serve``: API routes, metrics and spans around a :class:`SimulatedEngine`."""

    def __init__(self, engine: SimulatedEngine, speculation: Speculation | None = NGRAM) -> None:
        self.engine = engine
        self.metrics = TrtllmMetrics(engine, speculation)
        engine.add_observer(self.metrics)
        engine.open_spans(SCOPE, {})
        engine.on_internal_finish.append(self._internal_done)
        self._executor_ids = 0

    def next_executor_id(self) -> int:
        self._executor_ids += 1
        return self._executor_ids

    def _internal_done(self, seq: Sequence) -> None:
        """A request of the built-in load (a client of the HTTP API in spirit) finished."""
        if seq.finish is Finish.ERROR:
            self.metrics.request_error(500)
            return
        self.emit_span(_Req(self.next_executor_id(), [seq], None, {}))

    # -- spans --------------------------------------------------------------------------------------
    def emit_span(self, req: _Req) -> None:
        """``RequestOutput.do_tracing``: one span per finished request with enough perf metrics."""
        sink = self.engine.spans
        if sink is None or req.traced:
            return
        if any(s.finish is None for s in req.seqs):
            return
        req.traced = True
        seq = req.seqs[0]
        if seq.finish is Finish.ERROR or seq.first_token is None:
            return  # "Insufficient request metrics available; trace generation aborted."
        end = seq.last_token or seq.finished_at or seq.arrival
        params = req.params
        attrs: dict[str, Any] = {
            "gen_ai.request.temperature": 1.0 if params.get("temperature") is None else float(params["temperature"]),
            "gen_ai.request.top_p": 1.0 if params.get("top_p") is None else float(params["top_p"]),
            "gen_ai.request.top_k": int(params.get("top_k") or 0),
            "gen_ai.request.max_tokens": seq.max_tokens,
            "gen_ai.request.n": len(req.seqs),
            "gen_ai.request.id": req.executor_id,
            "gen_ai.usage.prompt_tokens": seq.prompt_tokens,
            "gen_ai.usage.completion_tokens": sum(s.generated for s in req.seqs),
            "gen_ai.latency.time_to_first_token": seq.ttft or 0.0,
            "gen_ai.latency.e2e": end - seq.arrival,
            "gen_ai.latency.time_in_queue": seq.queue_time,
            "gen_ai.response.finish_reasons": json.dumps([FINISHED_REASON.get(s.finish, "unknown") for s in req.seqs]),
        }
        ctx = parent_context(req.headers) if req.headers is not None else None
        span = sink.tracer.start_span(
            SPAN_NAME, context=ctx, kind=SpanKind.SERVER, start_time=ns(seq.arrival), attributes=attrs
        )
        span.end(end_time=ns(end))

    # -- API ----------------------------------------------------------------------------------------
    def build_app(self) -> FastAPI:
        app = FastAPI(title=f"simulated trtllm-serve {VERSION}", lifespan=self.engine.lifespan)
        metrics = self.metrics

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200)

        @app.get("/health_generate")
        async def health_generate() -> Response:
            body = {
                "model": self.engine.settings.model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_completion_tokens": 1,
                "stream": False,
                "temperature": 0.0,
            }
            response = await self._serve({}, body, count_tokens("hi") + 10, chat=True, prefix=None)
            if response.status_code == 200:
                return Response(status_code=200, content="Generation health check OK")
            return Response(status_code=500, content="Generation health check failed")

        @app.get("/version")
        async def version() -> JSONResponse:
            return JSONResponse({"version": self.engine.settings.version or VERSION})

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            card = {
                "id": self.engine.settings.model,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "tensorrt_llm",
            }
            return JSONResponse({"object": "list", "data": [card]})

        @app.get(JSON_PATH)
        async def iteration_stats() -> JSONResponse:
            return JSONResponse(metrics.take_iteration_stats())

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            body = await self._body(request, "prompt")
            if isinstance(body, Response):
                return body
            prompt = body["prompt"]
            if isinstance(prompt, list) and not prompt:
                return self._error(400, "'prompt' must not be empty.")
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                tokens, text = len(prompt), " ".join(map(str, prompt))
            else:
                text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
                tokens = count_tokens(text)
            return await self._serve(dict(request.headers), body, tokens, chat=False, prefix=(text, tokens))

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            body = await self._body(request, "messages")
            if isinstance(body, Response):
                return body
            messages = [m for m in body["messages"] if isinstance(m, dict)]
            texts = [_text_of(m.get("content")) for m in messages]
            tokens = count_tokens(" ".join(texts)) + 10
            shared = " ".join(texts[:-1]) if len(texts) > 1 else " ".join(texts)
            prefix = (shared, count_tokens(shared) + 10 if len(texts) > 1 else tokens)
            return await self._serve(dict(request.headers), body, tokens, chat=True, prefix=prefix)

        prometheus = make_asgi_app(registry=metrics.registry)

        async def prometheus_app(scope: Scope, receive: Receive, send: Send) -> None:
            metrics.drain_if_woken()
            await prometheus(scope, receive, send)

        mount = Mount(PROMETHEUS_PATH, app=prometheus_app)
        mount.path_regex = re.compile(f"^{PROMETHEUS_PATH}(?P<path>.*)$")
        app.routes.append(mount)
        return app

    async def _body(self, request: Request, required: str) -> dict[str, Any] | Response:
        """FastAPI's request validation as ``trtllm-serve`` answers it: 400 ``{"error": str(exc)}``."""
        try:
            body = await request.json()
        except ValueError as exc:
            err = {
                "type": "json_invalid",
                "loc": ("body", 0),
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": str(exc).split(":")[0]},
            }
            return self._invalid(err)
        if not isinstance(body, dict):
            return self._invalid(
                {
                    "type": "model_attributes_type",
                    "loc": ("body",),
                    "msg": "Input should be a valid dictionary or object to extract fields from",
                    "input": body,
                }
            )
        for name in (required, "model"):
            if name not in body:
                return self._invalid({"type": "missing", "loc": ("body", name), "msg": "Field required", "input": body})
        if not isinstance(body["model"], str):
            return self._invalid(
                {
                    "type": "string_type",
                    "loc": ("body", "model"),
                    "msg": "Input should be a valid string",
                    "input": body["model"],
                }
            )
        if body.get("stream_options") is not None and not body.get("stream"):
            message = (
                "stream_options can only be set if stream is true"
                if required == "messages"
                else "Stream options can only be defined when stream is true."
            )
            return self._invalid(
                {"type": "value_error", "loc": ("body",), "msg": f"Value error, {message}", "input": body}
            )
        return body

    def _invalid(self, error: dict[str, Any]) -> JSONResponse:
        self.metrics.request_error(400)
        return JSONResponse({"error": f"1 validation error:\n  {error}"}, status_code=400)

    def _error(self, status: int, message: str) -> JSONResponse:
        """``OpenAIServer.create_error_response`` (an ``ErrorResponse``, not wrapped in ``error``)."""
        self.metrics.request_error(status)
        kind = "BadRequestError" if status == 400 else "InternalServerError"
        body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
        return JSONResponse(body, status_code=status)

    def _abort(self, req: _Req) -> None:
        """Abort what is still running (client gone); cancelled candidates are logged as finished."""
        live = [s for s in req.seqs if s.finish is None]
        for seq in live:
            self.engine.loop.abort(seq)
            if seq.finish is Finish.ABORT:
                self.metrics.on_abort(seq)
        self.emit_span(req)

    async def _serve(
        self,
        headers: Mapping[str, str],
        body: dict[str, Any],
        prompt_tokens: int,
        chat: bool,
        prefix: tuple[str, int] | None,
    ) -> Response:
        eng = self.engine
        limit = eng.params.max_model_len
        if prompt_tokens + 1 > limit:
            return self._error(
                400,
                f"The sum of prompt length ({prompt_tokens}) and query length (0) should not exceed "
                f"max_seq_len ({limit})",
            )
        requested = body.get("max_completion_tokens") or body.get("max_tokens")
        max_tokens = int(requested) if requested else (limit - prompt_tokens if chat else 16)
        max_tokens = max(1, min(max_tokens, limit - prompt_tokens))
        n = max(1, int(body.get("n") or 1))
        prefix_key, prefix_tokens = None, 0
        if prefix is not None and prefix[0]:
            prefix_key, prefix_tokens = f"prompt-{zlib.crc32(prefix[0].encode()):08x}", prefix[1]
        executor_id = self.next_executor_id()
        handle = eng.new_request(
            f"trtllm-{executor_id}",
            prompt_tokens,
            max_tokens,
            n=n,
            ignore_eos=bool(body.get("ignore_eos")),
            prefix_key=prefix_key,
            prefix_tokens=prefix_tokens,
        )
        params = {k: body.get(k) for k in ("temperature", "top_p", "top_k")}
        req = _Req(executor_id, handle.seqs, headers, params)
        model = str(body["model"])
        created = int(time.time())

        def usage() -> dict[str, Any]:
            completion = sum(s.generated for s in handle.seqs)
            return {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion,
                "completion_tokens": completion,
                "prompt_tokens_details": {"cached_tokens": handle.seqs[0].cached_tokens},
            }

        def reason(seq: Sequence) -> str:
            return FINISHED_REASON.get(seq.finish, "stop")

        if not body.get("stream"):
            try:
                await handle.wait()
            finally:
                self._abort(req)  # no-op once finished
            failed = next((s for s in handle.seqs if s.finish is Finish.ERROR), None)
            if failed is not None:
                return self._error(500, f"Generation failed: request {executor_id} failed in the executor")
            if chat:
                choices: list[dict[str, Any]] = [
                    {
                        "index": s.seq_index,
                        "message": {
                            "role": "assistant",
                            "content": handle.text(s),
                            "reasoning_content": "",
                            "reasoning": None,
                            "tool_calls": [],
                        },
                        "logprobs": None,
                        "finish_reason": reason(s),
                        "stop_reason": None,
                        "mm_embedding_handle": None,
                        "disaggregated_params": None,
                        "avg_decoded_tokens_per_iter": None,
                    }
                    for s in handle.seqs
                ]
                payload = {
                    "id": f"chatcmpl-{uuid.uuid4().hex}",
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": choices,
                    "usage": usage(),
                    "prompt_token_ids": None,
                    "prompt_token_ids_b64": None,
                }
            else:
                choices = [
                    {
                        "index": s.seq_index,
                        "text": handle.text(s),
                        "token_ids": None,
                        "logprobs": None,
                        "context_logits": None,
                        "finish_reason": reason(s),
                        "stop_reason": None,
                        "disaggregated_params": None,
                        "avg_decoded_tokens_per_iter": None,
                    }
                    for s in handle.seqs
                ]
                payload = {
                    "id": f"cmpl-{uuid.uuid4().hex}",
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": choices,
                    "usage": usage(),
                    "prompt_token_ids": None,
                }
            return JSONResponse(payload)

        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage", True) is not False
        stream_id = f"{'chatcmpl' if chat else 'cmpl'}-{executor_id}"
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choice: dict[str, Any]) -> bytes:
            if chat:  # chat_stream_post_processor: model_dump_json(exclude_none=True)
                payload = {"id": stream_id, "object": obj, "created": created, "model": model, "choices": [choice]}
                return f"data: {_dump(_without_none(payload))}\n\n".encode()
            payload = {
                "id": stream_id,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": None,
            }
            return f"data: {_dump(payload)}\n\n".encode()

        def token_chunk(seq: Sequence, text: str, finish: str | None) -> bytes:
            if chat:
                return chunk(
                    {
                        "index": seq.seq_index,
                        "delta": {"content": text, "reasoning_content": ""},
                        "finish_reason": finish,
                    }
                )
            return chunk(
                {
                    "index": seq.seq_index,
                    "text": text,
                    "token_ids": None,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "avg_decoded_tokens_per_iter": None,
                }
            )

        async def stream() -> AsyncIterator[bytes]:
            try:
                if chat:
                    for s in handle.seqs:
                        first = {
                            "id": stream_id,
                            "object": obj,
                            "created": created,
                            "model": model,
                            "choices": [{"index": s.seq_index, "delta": {"role": "assistant"}}],
                        }
                        yield f"data: {_dump(first)} \n\n".encode()
                # The finish reason rides on the last token's chunk: hold each token back until the next
                # event of its candidate says whether it was the last.
                held: dict[int, str] = {}
                failed = False
                async for seq, kind in handle.events():
                    pending = held.pop(seq.seq_index, None)
                    if kind == "token":
                        if pending is not None:
                            yield token_chunk(seq, pending, None)
                        held[seq.seq_index] = eng.token_text(seq, seq.generated - 1)
                    elif seq.finish is Finish.ERROR:
                        failed = True
                    elif pending is not None:
                        yield token_chunk(seq, pending, reason(seq))
                if failed:
                    error = {
                        "error": {
                            "message": f"Generation failed: request {executor_id} failed in the executor",
                            "type": "server_error",
                            "code": None,
                            "param": None,
                        }
                    }
                    yield f"data: {_dump(error)}\n\n".encode()
                elif include_usage:
                    final = {
                        "id": stream_id,
                        "object": obj,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage(),
                    }
                    yield f"data: {_dump(final)}\n\n".encode()
                yield b"data: [DONE]\n\n"
            finally:
                self._abort(req)

        return StreamingResponse(stream(), media_type="text/event-stream")


def create(engine: SimulatedEngine, speculation: Speculation | None = NGRAM) -> tuple[FastAPI, TrtllmSim]:
    """The app and the sim object; ``speculation=None`` serves without speculative decoding."""
    sim = TrtllmSim(engine, speculation)
    return sim.build_app(), sim
