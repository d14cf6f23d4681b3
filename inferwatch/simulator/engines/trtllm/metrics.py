"""The Gen C metrics dialect: the server's ``MetricsCollector``, the executor's iteration stats queue and
the destructive ``/metrics`` buffer, and the collector loop that only drains them when a request finishes."""

from __future__ import annotations

import asyncio
import math
import random
import struct
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from inferwatch.simulator.base import EngineMetrics, SimulatedEngine
from inferwatch.simulator.engines.trtllm.catalog import (
    CACHE_LEVEL_TIERS,
    ENGINE_TYPE,
    FINISHED_REASON,
    GPU_MEM_BASE,
    GPU_MEM_PER_REQUEST,
    GPU_TYPE,
    ITER_STATS_MAX_ITERATIONS,
    REQUEST_ERROR,
    REQUEST_SUCCESS,
    SCHEDULED_BATCH_SIZE,
    WORKER_PID_OFFSET,
    MultiprocessStore,
    P,
)
from inferwatch.simulator.scheduler import Finish, Sequence, StepReport


def _f32(value: float) -> float:
    """A C++ ``float`` widened to double, as nlohmann and the collector print it."""
    result: float = struct.unpack("f", struct.pack("f", value))[0]
    return result


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
