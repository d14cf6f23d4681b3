"""The Gen C families of ``tensorrt_llm/metrics/collector.py`` @ ``050f80de`` (names, HELP texts, label
names, buckets; raw names are spelled only in this package) and prometheus_client's multiprocess mode
in memory: what ``MultiProcessCollector`` would read back from the server's and the worker's files."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from inferwatch.simulator.buckets import ITL_BUCKETS as TPOT_BUCKETS
from inferwatch.simulator.buckets import LATENCY_BUCKETS, TTFT_BUCKETS
from inferwatch.simulator.scheduler import Finish

ENGINE_TYPE = "pytorch"
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
