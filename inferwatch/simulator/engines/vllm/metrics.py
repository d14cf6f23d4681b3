"""vLLM's ``/metrics``: the families of ``PrometheusStatLogger`` (names, label names, bucket families,
pre-created children, ``_created`` series, the ``cache_config_info`` info gauge) and the HTTP
instrumentator's, registered with prometheus_client on a registry of their own."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    generate_latest,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from inferwatch.simulator.base import EngineMetrics, SimulatedEngine, finish_word
from inferwatch.simulator.buckets import ITL_BUCKETS, LATENCY_BUCKETS, TTFT_BUCKETS
from inferwatch.simulator.scheduler import Finish, Sequence, StepReport

LABELS = ["model_name", "engine"]
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
ITERATION_BUCKETS: list[float] = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
N_BUCKETS: list[float] = [1, 2, 5, 10, 20]
PREEMPTION_BUCKETS: list[float] = [1, 2, 3, 4, 5, 10, 20]
HTTP_EXCLUDED = {"/metrics", "/health", "/load", "/ping", "/version", "/server_info"}
HTTP_HIGHR_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    2.5,
    3.0,
    3.5,
    4.0,
    4.5,
    5.0,
    7.5,
    10.0,
    30.0,
    60.0,
]


def tokens_buckets(max_model_len: int) -> list[float]:
    """vLLM's 1-2-5 series up to ``max_model_len``."""
    out: list[float] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_model_len:
                return out
            out.append(v)
        exp += 1


class VllmMetrics(EngineMetrics):
    """vLLM's ``PrometheusStatLogger`` on a registry of its own."""

    def __init__(self, engine: SimulatedEngine) -> None:
        super().__init__(engine)
        reg = self.registry = CollectorRegistry()
        GCCollector(registry=reg)
        PlatformCollector(registry=reg)
        ProcessCollector(registry=reg)
        p = engine.params
        model, rank = engine.settings.model, "0"
        lab = {"model_name": model, "engine": rank}

        def counter(name: str, doc: str, extra: list[str] | None = None) -> Counter:
            return Counter(name, doc, labelnames=LABELS + (extra or []), registry=reg)

        def gauge(name: str, doc: str, extra: list[str] | None = None) -> Gauge:
            return Gauge(name, doc, labelnames=LABELS + (extra or []), registry=reg)

        def hist(name: str, doc: str, buckets: Seq[float]) -> Any:
            return Histogram(name, doc, labelnames=LABELS, buckets=buckets, registry=reg).labels(**lab)

        mfu = "(for Model Flops Utilization calculations)."
        for what in ("flops", "read_bytes", "write_bytes"):
            verb = {
                "flops": "number of floating point operations",
                "read_bytes": "number of bytes read from memory",
                "write_bytes": "number of bytes written to memory",
            }[what]
            counter(f"vllm:estimated_{what}_per_gpu", f"Estimated {verb} per GPU {mfu}").labels(**lab)
        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.").labels(
            **lab
        )
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.").labels(**lab)
        by_reason = gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
            "Sum of all reasons equals vllm:num_requests_waiting.",
            ["reason"],
        )
        self.waiting_capacity = by_reason.labels(**lab, reason="capacity")
        by_reason.labels(**lab, reason="deferred")
        sleep = gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            ["sleep_state"],
        )
        sleep.labels(**lab, sleep_state="awake").set(1)
        sleep.labels(**lab, sleep_state="weights_offloaded")
        sleep.labels(**lab, sleep_state="discard_all")
        self.kv = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.").labels(**lab)
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        ).labels(**lab)
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        ).labels(**lab)
        counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of "
            "queried tokens.",
        ).labels(**lab)
        counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of "
            "cached tokens.",
        ).labels(**lab)
        counter("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.").labels(
            **lab
        )
        counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.").labels(**lab)
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.").labels(
            **lab
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(**lab)
        by_source = counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ["source"])
        self.prompt_computed = by_source.labels(**lab, source="local_compute")
        self.prompt_cache_hit = by_source.labels(**lab, source="local_cache_hit")
        by_source.labels(**lab, source="external_kv_transfer")
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        ).labels(**lab)
        cached_by = counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to "
            "DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
            "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            ["source"],
        )
        self.cached_device = cached_by.labels(**lab, source="device")
        for src in ("host", "p2p", "disk", "external_unspecified"):
            cached_by.labels(**lab, source=src)
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.").labels(
            **lab
        )
        success = counter("vllm:request_success", "Count of successfully processed requests.", ["finished_reason"])
        self.success = {r: success.labels(**lab, finished_reason=r) for r in FINISHED_REASONS}
        rejections = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            labelnames=["model_name", "reason"],
            registry=reg,
        )
        for r in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.labels(model_name=model, reason=r)
        tok = tokens_buckets(p.max_model_len)
        self.h_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok)
        self.h_gen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tok)
        self.h_iter = hist(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS
        )
        self.h_max_gen = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tok,
        )
        self.h_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.h_max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tok
        )
        self.h_ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.h_itl = hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.h_tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.h_e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self.h_queue = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS,
        )
        self.h_inference = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            LATENCY_BUCKETS,
        )
        self.h_prefill = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            LATENCY_BUCKETS,
        )
        self.h_decode = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            LATENCY_BUCKETS,
        )
        self.h_preempt = hist(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            PREEMPTION_BUCKETS,
        )
        self.h_kv_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tok,
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labelnames=sorted(self.cache_config(rank)),
            registry=reg,
        )
        info.labels(**self.cache_config(rank)).set(1)
        self._http: dict[str, Any] | None = None
        self.http()  # registered at start-up; labelled children appear with the first request

    def cache_config(self, rank: str) -> dict[str, str]:
        """vLLM 0.33's CacheConfig fields, stringified with ``str()`` (vllm.md §1.4)."""
        p = self.engine.params
        tokens = p.num_blocks * p.block_size
        fields: dict[str, object] = {
            "block_size": p.block_size,
            "user_specified_block_size": False,
            "kv_cache_layout": None,
            "prefix_match_unit": None,
            "gpu_memory_utilization": 0.92,
            "cache_dtype": "auto",
            "is_attention_free": False,
            "num_gpu_blocks_override": None,
            "sliding_window": None,
            "enable_prefix_caching": p.enable_prefix_caching,
            "prefix_caching_hash_algo": "sha256",
            "prefix_cache_retention_interval": 0,
            "kv_cache_dtype_skip_layers": [],
            "mamba_page_size_padded": None,
            "skip_page_size_padded": None,
            "mamba_block_size": None,
            "mamba_cache_dtype": "auto",
            "mamba_ssm_cache_dtype": "auto",
            "mamba_cache_mode": "none",
            "enable_mamba_shared_prefix_checkpoint": False,
            "replayssm_buffer_len": 16,
            "use_replayssm": False,
            "use_kda_recoverssm": False,
            "num_gpu_blocks": p.num_blocks,
            "num_cpu_blocks": None,
            "effective_attention_block_size": p.block_size,
            "kv_cache_size_tokens": tokens,
            "kv_cache_max_concurrency": round(tokens / p.max_model_len, 2),
            "hash_block_size": None,
            "cache_hit_alignment_tokens": None,
            "kv_sharing_fast_prefill": False,
            "swa_bounded_replay": True,
            "kv_cache_memory_bytes": None,
            "kv_offloading_size": None,
            "kv_offloading_backend": "native",
            "_block_size_resolved": True,
            "engine": rank,
        }
        return {k: str(v) for k, v in fields.items()}

    # -- serving-model events ---------------------------------------------------------------
    def on_step(self, report: StepReport) -> None:
        self.running.set(report.running)
        self.waiting.set(report.waiting)
        self.waiting_capacity.set(report.waiting)
        self.kv.set(report.used_blocks / self.engine.params.num_blocks)
        self.h_iter.observe(report.prefill_tokens + report.decode_seqs)
        if report.preempted:
            self.preemptions.inc(len(report.preempted))
        if report.prefix_queries:
            self.prefix_queries.inc(report.prefix_queries)
        if report.prefix_hits:
            self.prefix_hits.inc(report.prefix_hits)
            self.prompt_cached.inc(report.prefix_hits)
            self.cached_device.inc(report.prefix_hits)
        for seq in report.new_tokens:
            self.generation_tokens.inc()
            if seq.generated == 1:
                ttft = seq.ttft or 0.0
                self.h_ttft.observe(ttft)
                self.prompt_tokens.inc(seq.prompt_tokens)
                self.prompt_computed.inc(seq.prompt_tokens - seq.cached_tokens)
                self.prompt_cache_hit.inc(seq.cached_tokens)
            else:
                self.h_itl.observe(seq.token_times[-1] - seq.token_times[-2])
        for seq in report.finished:
            self.on_finished(seq)

    def on_finished(self, seq: Sequence) -> None:
        if seq.finish is Finish.ERROR:
            self.success["error"].inc()
            return
        self.success[finish_word(seq.finish)].inc()
        self.h_e2e.observe(seq.e2e)
        self.h_queue.observe(seq.queue_time)
        self.h_prefill.observe(seq.prefill_time)
        self.h_decode.observe(seq.decode_time)
        self.h_inference.observe(seq.prefill_time + seq.decode_time)
        self.h_prompt.observe(seq.prompt_tokens)
        self.h_gen.observe(seq.generated)
        self.h_tpot.observe(seq.tpot)
        self.h_preempt.observe(seq.preemptions)
        self.h_kv_computed.observe(seq.prompt_tokens - seq.cached_tokens)
        self.h_max_tokens.observe(seq.max_tokens)

    def on_user_request(self, seqs: list[Sequence]) -> None:
        """Once per user request (all ``n`` samples done), as vLLM records params_n and max generation."""
        done = [s for s in seqs if s.finish not in (Finish.ABORT, Finish.ERROR)]
        if done:
            self.h_n.observe(len(seqs))
            self.h_max_gen.observe(max(s.generated for s in done))

    # -- HTTP instrumentator (prometheus-fastapi-instrumentator's default metrics) ------------
    def http(self) -> dict[str, Any]:
        if self._http is None:
            reg = self.registry
            self._http = {
                "requests": Counter(
                    "http_requests_total",
                    "Total number of requests by method, status and handler.",
                    ["handler", "method", "status"],
                    registry=reg,
                ),
                "req_size": Summary(
                    "http_request_size_bytes",
                    "Content length of incoming requests by handler. Only value of header is respected. Otherwise "
                    "ignored. No percentile calculated. ",
                    ["handler"],
                    registry=reg,
                ),
                "resp_size": Summary(
                    "http_response_size_bytes",
                    "Content length of outgoing responses by handler. Only value of header is respected. Otherwise "
                    "ignored. No percentile calculated. ",
                    ["handler"],
                    registry=reg,
                ),
                "highr": Histogram(
                    "http_request_duration_highr_seconds",
                    "Latency with many buckets but no API specific labels. Made for more accurate percentile "
                    "calculations. ",
                    buckets=HTTP_HIGHR_BUCKETS,
                    registry=reg,
                ),
                "duration": Histogram(
                    "http_request_duration_seconds",
                    "Latency with only few buckets by handler. Made to be only used if aggregation by handler is "
                    "important. ",
                    ["handler", "method"],
                    buckets=[0.1, 0.5, 1],
                    registry=reg,
                ),
            }
        return self._http

    def record_http(self, handler: str, method: str, status: int, req_bytes: int, resp_bytes: int, took: float) -> None:
        h = self.http()
        h["requests"].labels(handler=handler, method=method, status=f"{status // 100}xx").inc()
        h["req_size"].labels(handler=handler).observe(req_bytes)
        h["resp_size"].labels(handler=handler).observe(resp_bytes)
        h["highr"].observe(took)
        h["duration"].labels(handler=handler, method=method).observe(took)

    def render(self) -> str:
        return generate_latest(self.registry).decode()
