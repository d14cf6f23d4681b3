"""SGLang's ``/metrics`` at 44cedc2: the scheduler's and the tokenizer manager's families.

Registered as ``SchedulerMetricsCollector`` and ``TokenizerMetricsCollector`` do
(``python/sglang/srt/observability/metrics_collector.py``), fed as ``scheduler_metrics_mixin.py`` and the
tokenizer manager feed them, and rendered in the multiprocess shape of :mod:`.exposition`.
"""

from __future__ import annotations

from collections.abc import Mapping

from inferwatch.simulator.base import EngineMetrics, SimulatedEngine
from inferwatch.simulator.engines.sglang.exposition import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    MODE_ALL,
    MODE_MOSTRECENT,
    Family,
    Store,
)
from inferwatch.simulator.scheduler import Finish, Sequence, StepReport

P = "sglang:"
SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type")
ENGINE_TYPE = "unified"
DECODE_LOG_INTERVAL = 40
"""``--decode-log-interval``: decode batches between two scheduler stats logs."""
CACHE_SOURCE = "device"
"""the radix cache on the GPU, the only tier without hierarchical cache."""

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.000,
    2.000,
    4.000,
    6.000,
    8.000,
)
QUEUE_BUCKETS = (
    0.0,
    0.1,
    0.2,
    0.5,
    1,
    2,
    3,
    4,
    5,
    10,
    15,
    20,
    30,
    40,
    50,
    60,
    70,
    80,
    90,
    100,
    200,
    300,
    400,
    500,
    600,
    700,
    800,
    900,
    1000,
    1200,
    1400,
    1600,
    1800,
    2000,
    2500,
    3000,
)
RETRACTION_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 75, 100)


TOKENS_BUCKETS = (
    100,
    300,
    500,
    700,
    1000,
    1500,
    2000,
    3000,
    4000,
    5000,
    6000,
    7000,
    8000,
    9000,
    10000,
    12000,
    15000,
    20000,
    22000,
    25000,
    30000,
    35000,
    40000,
    66000,
    99000,
    132000,
    300000,
    600000,
    900000,
    1100000,
)
"""``default_bucket_prompt_tokens`` (``--collect-tokens-histogram``), for prompt and generation lengths."""
ROUTING_KEY_BOUNDS = (1, 2, 3, 5, 7, 10, 20, 50, 100, 200)
"""``ROUTING_KEY_REQ_COUNT_BUCKET_BOUNDS`` of the routing-key ``GaugeHistogram``s (``gt < count <= le``)."""
ROUTING_KEY_HISTOGRAMS: tuple[tuple[str, str], ...] = (
    (
        "routing_key_running_req_count",
        "Distribution of routing keys by running request count (gt < count <= le).",
    ),
    (
        "routing_key_all_req_count",
        "Distribution of routing keys by running+waiting request count (gt < count <= le).",
    ),
)


SCHEDULER_GAUGES: tuple[tuple[str, str], ...] = (
    ("num_running_reqs", "The number of running requests."),
    ("num_used_tokens", "The number of used tokens."),
    ("token_usage", "The token usage."),
    ("pending_prealloc_token_usage", "The token usage for pending preallocated tokens (not preallocated yet)."),
    ("swa_token_usage", "The token usage for SWA layers."),
    ("mamba_usage", "The token usage for Mamba layers."),
    ("decode_sum_seq_lens", "The sum of all sequence lengths in decode."),
    ("gen_throughput", "The generation throughput (token/s)."),
    ("num_queue_reqs", "The number of requests in the waiting queue."),
    ("num_grammar_queue_reqs", "The number of requests in the grammar waiting queue."),
    (
        "num_running_reqs_offline_batch",
        "The number of running low-priority offline batch requests(label is 'batch').",
    ),
    ("cache_hit_rate", "The prefix cache hit rate."),
    ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
    ("spec_accept_length", "The average acceptance length of speculative decoding."),
    (
        "spec_accept_rate",
        "The average acceptance rate of speculative decoding (`accepted tokens / total draft tokens` in batch).",
    ),
    ("num_prefill_prealloc_queue_reqs", "The number of requests in the prefill prealloc queue."),
    ("num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue."),
    ("num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue."),
    ("num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue."),
    ("kv_transfer_speed_gb_s", "The transfer speed of the KV cache in GB/s."),
    ("kv_transfer_latency_ms", "The transfer latency of the KV cache in ms."),
    ("kv_transfer_bootstrap_ms", "The bootstrap time of the KV transfer in ms."),
    ("kv_transfer_alloc_ms", "The allocation waiting time of the KV transfer in ms."),
    ("kv_transfer_total_mb", "The total number of tokens transferred in the KV cache."),
    ("utilization", "The utilization."),
    ("engine_startup_time", "The time taken for the engine to start up."),
    ("engine_load_weights_time", "The time taken for the engine to load weights."),
    ("is_cuda_graph", "Whether the batch is using CUDA graph."),
    ("num_unique_running_routing_keys", "Number of unique routing keys in running batch."),
    ("new_token_ratio", "The new token ratio."),
)
"""``multiprocess_mode="mostrecent"`` gauges that ``log_stats`` sets, in registration order."""
SCHEDULER_ALL_GAUGES: tuple[tuple[str, str], ...] = (
    ("num_retracted_reqs", "The number of retracted requests."),
    ("num_paused_reqs", "The number of paused requests by async weight sync."),
)
"""gauges of the default ``all`` mode (a ``pid`` label each)."""
SCHEDULER_COUNTERS: tuple[tuple[str, str], ...] = (
    ("num_retracted_requests_total", "Total number of retracted requests."),
    ("num_retracted_input_tokens_total", "Total number of retracted input tokens."),
    ("num_retracted_output_tokens_total", "Total number of retracted output tokens."),
    ("num_bootstrap_failed_reqs_total", "The number of bootstrap failed requests."),
    ("num_transfer_failed_reqs_total", "The number of transfer failed requests."),
    ("num_prefill_retries_total", "Total number of prefill retries."),
)
REALTIME_TOKENS_HELP = (
    "Total number of tokens processed (updated on each log interval). mode: prefill_compute, prefill_cache, decode."
)


class SglangMetrics(EngineMetrics):
    """The scheduler (TP 0) and the tokenizer manager of one SGLang server."""

    def __init__(self, engine: SimulatedEngine) -> None:
        super().__init__(engine)
        model = engine.settings.model
        self.sched = {
            "model_name": model,
            "engine_type": ENGINE_TYPE,
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        self.tok = {"model_name": model, "engine_type": ENGINE_TYPE}
        s = self.store = Store(engine.pid)
        for name, help_ in SCHEDULER_GAUGES:
            s.add(P + name, help_, GAUGE, SCHEDULER_LABELS, MODE_MOSTRECENT)
        for name, help_ in SCHEDULER_ALL_GAUGES:
            s.add(P + name, help_, GAUGE, SCHEDULER_LABELS, MODE_ALL)
        for name, help_ in SCHEDULER_COUNTERS:
            s.add(P + name, help_, COUNTER, SCHEDULER_LABELS)
        self.queue_time = s.add(
            P + "queue_time_seconds",
            "Histogram of queueing time in seconds.",
            HISTOGRAM,
            SCHEDULER_LABELS,
            buckets=QUEUE_BUCKETS,
        )
        self.realtime = s.add(P + "realtime_tokens_total", REALTIME_TOKENS_HELP, COUNTER, (*SCHEDULER_LABELS, "mode"))
        self.routing = [
            s.add(P + name, help_, GAUGE, (*SCHEDULER_LABELS, "gt", "le"), MODE_MOSTRECENT)
            for name, help_ in ROUTING_KEY_HISTOGRAMS
        ]
        self.prompt_tokens = s.add(
            P + "prompt_tokens_total", "Number of prefill tokens processed.", COUNTER, TOKENIZER_LABELS
        )
        self.generation_tokens = s.add(
            P + "generation_tokens_total", "Number of generation tokens processed.", COUNTER, TOKENIZER_LABELS
        )
        self.cached_tokens = s.add(
            P + "cached_tokens_total",
            "Number of cached prompt tokens by source (device/host/storage).",
            COUNTER,
            (*TOKENIZER_LABELS, "cache_source"),
        )
        self.requests = s.add(P + "num_requests_total", "Number of requests processed.", COUNTER, TOKENIZER_LABELS)
        s.add(P + "num_so_requests_total", "Number of structured output requests processed.", COUNTER, TOKENIZER_LABELS)
        self.aborted = s.add(P + "num_aborted_requests_total", "Number of requests aborted.", COUNTER, TOKENIZER_LABELS)
        self.ttft = s.add(
            P + "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            HISTOGRAM,
            TOKENIZER_LABELS,
            buckets=TTFT_BUCKETS,
        )
        self.itl = s.add(
            P + "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            HISTOGRAM,
            TOKENIZER_LABELS,
            buckets=ITL_BUCKETS,
        )
        self.e2e = s.add(
            P + "e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            HISTOGRAM,
            TOKENIZER_LABELS,
            buckets=E2E_BUCKETS,
        )
        self.prompt_hist = s.add(
            P + "prompt_tokens_histogram",
            "Histogram of prompt token length.",
            HISTOGRAM,
            TOKENIZER_LABELS,
            buckets=TOKENS_BUCKETS,
        )
        self.generation_hist = s.add(
            P + "generation_tokens_histogram",
            "Histogram of generation token length.",
            HISTOGRAM,
            TOKENIZER_LABELS,
            buckets=TOKENS_BUCKETS,
        )
        self.retractions = s.add(
            P + "num_retractions",
            "Histogram of retraction counts per request.",
            HISTOGRAM,
            TOKENIZER_LABELS,
            buckets=RETRACTION_BUCKETS,
        )
        # scheduler state between two stats logs
        self.decode_batches = 0
        self.decode_tokens = 0
        self.retracted_since_log = 0
        self.last_decode_log = engine.clock.now()
        self.gen_throughput = 0.0
        self.startup = 0.0

    def fam(self, name: str) -> Family:
        """A family by its SGLang name without the ``sglang:`` prefix."""
        return self.store[P + name]

    # -- the scheduler ---------------------------------------------------------------------------
    def on_step(self, report: StepReport) -> None:
        for seq in report.admitted:
            if seq.preemptions == 0 and seq.first_scheduled == report.start:
                self.queue_time.observe(self.sched, seq.queue_time)
        if report.preempted:
            self.fam("num_retracted_requests_total").inc(self.sched, len(report.preempted))
            self.fam("num_retracted_input_tokens_total").inc(self.sched, sum(s.prompt_tokens for s in report.preempted))
            self.fam("num_retracted_output_tokens_total").inc(self.sched, sum(s.generated for s in report.preempted))
            self.retracted_since_log += len(report.preempted)
        for seq in report.new_tokens:
            self.on_token(seq)
        for seq in report.finished:
            self.on_finished(seq)
        if report.prefill_tokens:
            # a prefill batch: log_prefill_stats (new and cached tokens of the requests it admitted)
            hits = sum(s.cached_tokens for s in report.admitted if s.preemptions == 0)
            self.realtime.inc({**self.sched, "mode": "prefill_compute"}, report.prefill_tokens)
            if hits:
                self.realtime.inc({**self.sched, "mode": "prefill_cache"}, hits)
            total = report.prefill_tokens + hits
            self.log_stats(report, hits / total if total else 0.0)
        if report.decode_seqs:
            self.decode_batches += 1
            self.decode_tokens += report.decode_seqs
            if self.decode_batches % DECODE_LOG_INTERVAL == 0:
                gap = max(report.end - self.last_decode_log, 1e-9)
                self.gen_throughput = self.decode_tokens / gap
                self.realtime.inc({**self.sched, "mode": "decode"}, self.decode_tokens)
                self.decode_tokens = 0
                self.last_decode_log = report.end
                self.log_stats(report, 0.0)

    def log_stats(self, report: StepReport, cache_hit_rate: float) -> None:
        """``SchedulerMetricsCollector.log_stats``: every gauge, the retraction gauges reset after."""
        p = self.engine.params
        capacity = p.num_blocks * p.block_size
        used = report.used_blocks * p.block_size
        values: dict[str, float] = {name: 0.0 for name, _ in SCHEDULER_GAUGES}
        values.update(
            num_running_reqs=report.running,
            num_used_tokens=used,
            token_usage=used / capacity,
            gen_throughput=self.gen_throughput,
            num_queue_reqs=report.waiting,
            cache_hit_rate=cache_hit_rate,
            max_total_num_tokens=capacity,
            engine_startup_time=self.startup,
            new_token_ratio=0.7,
            is_cuda_graph=0.0,
        )
        for name, value in values.items():
            self.fam(name).set(self.sched, value)
        self.fam("num_retracted_reqs").set(self.sched, self.retracted_since_log)
        self.fam("num_paused_reqs").set(self.sched, 0)
        # no routing keys in the simulated requests: every bucket of the two gauge histograms is empty
        bounds = [str(b) for b in ROUTING_KEY_BOUNDS]
        for fam in self.routing:
            for gt, le in zip(["0", *bounds], [*bounds, "+Inf"], strict=True):
                fam.set({**self.sched, "gt": gt, "le": le}, 0)
        self.retracted_since_log = 0

    # -- the tokenizer manager --------------------------------------------------------------------
    def on_token(self, seq: Sequence) -> None:
        """One output received: TTFT for the first, else one inter-token interval."""
        if seq.generated == 1:
            self.ttft.observe(self.tok, seq.ttft or 0.0)
        elif len(seq.token_times) >= 2:
            self.itl.observe(self.tok, seq.token_times[-1] - seq.token_times[-2])

    def on_finished(self, seq: Sequence) -> None:
        """``observe_one_finished_request`` for a finished request, the abort counter for an aborted one."""
        if seq.finish in (Finish.ABORT, Finish.ERROR):
            self.aborted.inc(self.tok)
            return
        self.prompt_tokens.inc(self.tok, seq.prompt_tokens)
        self.generation_tokens.inc(self.tok, seq.generated)
        if seq.cached_tokens > 0:
            self.cached_tokens.inc({**self.tok, "cache_source": CACHE_SOURCE}, seq.cached_tokens)
        self.requests.inc(self.tok)
        self.e2e.observe(self.tok, seq.e2e)
        self.prompt_hist.observe(self.tok, seq.prompt_tokens)
        self.generation_hist.observe(self.tok, seq.generated)
        self.retractions.observe(self.tok, seq.preemptions)

    def counts(self) -> Mapping[str, float]:
        """The simulator's own totals, as its metrics say them (tests compare them with the exporter's)."""
        return {
            "requests": self.requests.total(),
            "prompt_tokens": self.prompt_tokens.total(),
            "generation_tokens": self.generation_tokens.total(),
            "cached_tokens": self.cached_tokens.total(),
            "retractions": self.fam("num_retracted_requests_total").total(),
            "aborted": self.aborted.total(),
            "ttft_count": self.ttft.total(),
            "e2e_count": self.e2e.total(),
        }

    def render(self) -> str:
        return self.store.render()
