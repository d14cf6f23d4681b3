"""Triton's ``/metrics``: the core ``nv_inference_*`` families, the TensorRT-LLM backend's ``nv_trt_llm_*``
gauges from the executor's iteration statistics, GPU/CPU facts, in prometheus-cpp's text format."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from inferwatch.simulator.base import EngineMetrics, SimulatedEngine
from inferwatch.simulator.engines.triton.repository import (
    DECOUPLED,
    ENSEMBLE,
    MODEL_VERSION,
    MODELS,
    POSTPROCESSING,
    PREPROCESSING,
    TENSORRT_LLM,
)
from inferwatch.simulator.scheduler import Finish, Sequence, StepReport

FAILURE_REASONS = ("REJECTED", "OTHER", "CANCELED", "BACKEND")
BACKEND_FAILURE = "BACKEND"
CANCELED_FAILURE = "CANCELED"
GPU_UUID = "GPU-5fc2b0a4-3d1e-9f0b-62b7-2f0e94c4a1d3"
FIRST_RESPONSE_BUCKETS = (100.0, 500.0, 2000.0, 5000.0)
TOKEN_LEN_BUCKETS = (10.0, 50.0, 100.0, 500.0, 1000.0)
LOAD_SECONDS = {
    ENSEMBLE: 0.000412803,
    TENSORRT_LLM: 47.201548113,
    POSTPROCESSING: 2.906316854,
    PREPROCESSING: 3.172049117,
}

# -- family names (Triton core metrics.cc, TensorRT-LLM custom_metrics_reporter.cc) ---------------
REQUEST_SUCCESS = "nv_inference_request_success"
REQUEST_FAILURE = "nv_inference_request_failure"
INFERENCE_COUNT = "nv_inference_count"
EXEC_COUNT = "nv_inference_exec_count"
REQUEST_DURATION = "nv_inference_request_duration_us"
QUEUE_DURATION = "nv_inference_queue_duration_us"
COMPUTE_INPUT_DURATION = "nv_inference_compute_input_duration_us"
COMPUTE_INFER_DURATION = "nv_inference_compute_infer_duration_us"
COMPUTE_OUTPUT_DURATION = "nv_inference_compute_output_duration_us"
ENERGY = "nv_energy_consumption"
DISAGGREGATED = "nv_trt_llm_disaggregated_serving_metrics"
PENDING = "nv_inference_pending_request_count"
LOAD_DURATION = "nv_model_load_duration_secs"
PINNED_TOTAL = "nv_pinned_memory_pool_total_bytes"
PINNED_USED = "nv_pinned_memory_pool_used_bytes"
GPU_UTILIZATION = "nv_gpu_utilization"
GPU_MEMORY_TOTAL = "nv_gpu_memory_total_bytes"
GPU_MEMORY_USED = "nv_gpu_memory_used_bytes"
GPU_POWER_USAGE = "nv_gpu_power_usage"
GPU_POWER_LIMIT = "nv_gpu_power_limit"
CPU_UTILIZATION = "nv_cpu_utilization"
CPU_MEMORY_TOTAL = "nv_cpu_memory_total_bytes"
CPU_MEMORY_USED = "nv_cpu_memory_used_bytes"
REQUEST_METRICS = "nv_trt_llm_request_metrics"
RUNTIME_MEMORY = "nv_trt_llm_runtime_memory_metrics"
KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
INFLIGHT_BATCHER = "nv_trt_llm_inflight_batcher_metrics"
GENERAL = "nv_trt_llm_general_metrics"
FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
OUTPUT_TOKEN_LEN = "nv_llm_output_token_len"
INPUT_TOKEN_LEN = "nv_llm_input_token_len"

DURATION_HELP = {
    REQUEST_DURATION: "Cumulative inference request duration in microseconds (includes cached requests)",
    QUEUE_DURATION: "Cumulative inference queuing duration in microseconds (includes cached requests)",
    COMPUTE_INPUT_DURATION: "Cumulative compute input duration in microseconds (does not include cached requests)",
    COMPUTE_INFER_DURATION: "Cumulative compute inference duration in microseconds (does not include cached requests)",
    COMPUTE_OUTPUT_DURATION: "Cumulative inference compute output duration in microseconds (does not include cached "
    "requests)",
}
TRTLLM_HELP = "TRT LLM response metrics"

# Constant host/GPU facts (one H100 80GB, as in the fixture).
RUNTIME_MEMORY_BYTES = {"pinned": 2952841216, "gpu": 16489553920, "cpu": 70416}
GPU_MEMORY_TOTAL_BYTES = 85520809984
GPU_MEMORY_USED_BYTES = 78912618496
GPU_POWER_IDLE_W = 71.842
GPU_POWER_BUSY_W = 412.317
GPU_POWER_LIMIT_W = 700.0
CPU_MEMORY_TOTAL_BYTES = 2164154155008
CPU_MEMORY_USED_BYTES = 187443478528
CPU_UTILIZATION_VALUE = 0.08372093023255814
PINNED_POOL_BYTES = 268435456


# -- prometheus-cpp text ------------------------------------------------------------------------------
def fmt_value(v: float) -> str:
    """prometheus-cpp's double formatting (``%.16g``): integers print without decimals."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return format(v, ".16g")


def to_string6(v: float) -> float:
    """A double that went through C++ ``std::to_string`` (6 decimals) and back, as the backend does."""
    return float(f"{v:.6f}")


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Exposition:
    """Writes families the way prometheus-cpp's text serializer does."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: dict[str, str], value: float, le: str | None = None) -> None:
        pairs = [f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())]
        if le is not None:
            pairs.append(f'le="{le}"')
        rendered = "{" + ",".join(pairs) + "}" if pairs else ""
        self.lines.append(f"{name}{rendered} {fmt_value(value)}")

    def histogram(self, name: str, labels: dict[str, str], hist: Histogram) -> None:
        self.sample(f"{name}_count", labels, hist.count)
        self.sample(f"{name}_sum", labels, hist.total)
        cumulative = 0
        for bound, n in zip(hist.bounds, hist.counts, strict=True):
            cumulative += n
            self.sample(f"{name}_bucket", labels, cumulative, le=fmt_value(bound))
        self.sample(f"{name}_bucket", labels, hist.count, le="+Inf")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass
class Histogram:
    """A prometheus-cpp histogram: per-bucket counts, cumulated when rendered."""

    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)
    count: int = 0
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, v: float) -> None:
        self.count += 1
        self.total += v
        for i, bound in enumerate(self.bounds):
            if v <= bound:
                self.counts[i] += 1
                break


@dataclass
class ModelStats:
    """Triton core's per-model reporter (``metric_model_reporter.cc``)."""

    success: int = 0
    failure: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    durations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DURATION_HELP, 0))
    pending: int = 0
    first_response: Histogram | None = None

    def succeed(self, queue: int, compute_input: int, infer: int, output: int, request: int) -> None:
        """One successful request; each counter grows by ``floor(ns / 1000)``."""
        self.success += 1
        d = self.durations
        d[QUEUE_DURATION] += queue
        d[COMPUTE_INPUT_DURATION] += compute_input
        d[COMPUTE_INFER_DURATION] += infer
        d[COMPUTE_OUTPUT_DURATION] += output
        d[REQUEST_DURATION] += request


@dataclass
class Stage:
    """One model execution's durations in µs (queue, compute input, infer, output, request)."""

    queue: int
    compute_input: int
    infer: int
    output: int
    request: int


@dataclass
class Flow:
    """One request's way through the ensemble (keyed by its engine sequence's id and index)."""

    streaming: bool
    pre: Stage
    ens_queue: int
    trt_queue: int
    trt_input: int
    trt_output: int
    trt_overhead: int
    post: list[Stage] = field(default_factory=list)
    first_observed: bool = False


class TritonMetrics(EngineMetrics):
    """Triton core's model/GPU/CPU metrics plus the TensorRT-LLM backend's custom metrics."""

    content_type = "text/plain; charset=utf-8"

    def __init__(self, engine: SimulatedEngine) -> None:
        super().__init__(engine)
        p = engine.params
        self.rng = random.Random(engine.settings.seed + 7)
        self.models = {m: ModelStats() for m in MODELS}
        for m in DECOUPLED:
            self.models[m].first_response = Histogram(FIRST_RESPONSE_BUCKETS)
        self.input_len = Histogram(TOKEN_LEN_BUCKETS)
        self.output_len = Histogram(TOKEN_LEN_BUCKETS)
        self.flows: dict[tuple[str, int], Flow] = {}
        start = engine.clock.now()
        self.requests: dict[str, float] = {
            "waiting": 0,
            "context": 0,
            "scheduled": 0,
            "max": p.max_num_seqs,
            "active": 0,
        }
        self.kv: dict[str, float] = {
            "fraction": 0.0,
            "reused": 0,
            "tokens_per": p.block_size,
            "used": 0,
            "free": p.num_blocks,
            "max": p.num_blocks,
        }
        self.batcher: dict[str, float] = {
            "paused_requests": 0,
            "micro_batch_id": 0,
            "generation_requests": 0,
            "total_context_tokens": 0,
        }
        self.general: dict[str, float] = {"iteration_counter": 0, "timestamp": math.floor(start * 1e6)}
        self.reused_blocks = 0
        self.energy_joules = 0.0
        self._energy_at = start
        self.busy = False

    # -- durations -----------------------------------------------------------------------------------
    def _us(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def _stage(
        self,
        queue: tuple[int, int],
        compute_input: tuple[int, int],
        infer: int,
        out: tuple[int, int],
        overhead: tuple[int, int],
    ) -> Stage:
        q, i, o = self._us(*queue), self._us(*compute_input), self._us(*out)
        return Stage(q, i, infer, o, q + i + infer + o + self._us(*overhead))

    def _preprocess(self, prompt_tokens: int) -> Stage:
        """Tokenization: a few ms, growing with the prompt."""
        infer = 1500 + int(prompt_tokens * 1.2) + self._us(0, 800)
        return self._stage((60, 120), (25, 50), infer, (15, 30), (5, 12))

    def _postprocess(self) -> Stage:
        """Detokenization of one response: well under a millisecond."""
        return self._stage((30, 70), (12, 26), self._us(400, 750), (10, 22), (5, 10))

    # -- serving-model events -------------------------------------------------------------------------
    def on_submit(self, seq: Sequence) -> None:
        """The request went through ``preprocessing`` and reached ``tensorrt_llm``."""
        pre = self._preprocess(seq.prompt_tokens)
        self.models[PREPROCESSING].succeed(pre.queue, pre.compute_input, pre.infer, pre.output, pre.request)
        self.flows[(seq.request_id, seq.seq_index)] = Flow(
            streaming=True,
            pre=pre,
            ens_queue=self._us(2, 5),
            trt_queue=self._us(30, 60),
            trt_input=self._us(90, 160),
            trt_output=self._us(12, 28),
            trt_overhead=self._us(5, 15),
        )

    def set_streaming(self, seq: Sequence, streaming: bool) -> None:
        flow = self.flows.get((seq.request_id, seq.seq_index))
        if flow is not None:
            flow.streaming = streaming

    def on_step(self, report: StepReport) -> None:
        self._iteration_stats(report)
        for seq in report.new_tokens:
            flow = self.flows.get((seq.request_id, seq.seq_index))
            if flow is None or not flow.streaming:
                continue
            flow.post.append(self._postprocess_response())
            if not flow.first_observed:
                self._first_response(flow, seq.ttft or 0.0)
        for seq in report.finished:
            self._finished(seq)

    def _postprocess_response(self) -> Stage:
        post = self._postprocess()
        self.models[POSTPROCESSING].succeed(post.queue, post.compute_input, post.infer, post.output, post.request)
        return post

    def _first_response(self, flow: Flow, engine_seconds: float) -> None:
        """Request start → first response, integer ms, for ``tensorrt_llm`` and the ensemble."""
        flow.first_observed = True
        trt_us = flow.trt_queue + flow.trt_input + engine_seconds * 1e6
        trt_hist, ens_hist = self.models[TENSORRT_LLM].first_response, self.models[ENSEMBLE].first_response
        assert trt_hist is not None and ens_hist is not None
        trt_hist.observe(math.floor(trt_us / 1000))
        post_us = flow.post[0].request if flow.post else 0
        ens_hist.observe(math.floor((flow.ens_queue + flow.pre.request + trt_us + post_us) / 1000))

    def _finished(self, seq: Sequence) -> None:
        flow = self.flows.pop((seq.request_id, seq.seq_index), None)
        if flow is None:
            return
        if seq.finish is Finish.ERROR:
            self.fail(BACKEND_FAILURE)
            return
        if not flow.streaming:  # one response at the end: first and final at once
            flow.post.append(self._postprocess_response())
            self._first_response(flow, seq.e2e)
        infer = math.floor(seq.e2e * 1e6)
        trt = Stage(
            flow.trt_queue,
            flow.trt_input,
            infer,
            flow.trt_output,
            flow.trt_queue + flow.trt_input + infer + flow.trt_output + flow.trt_overhead,
        )
        self.models[TENSORRT_LLM].succeed(trt.queue, trt.compute_input, trt.infer, trt.output, trt.request)
        # The ensemble's compute durations are the sums of its composing models' (ensemble_scheduler.cc),
        # and its request duration covers them.
        parts = [flow.pre, trt, *flow.post]
        ens = Stage(
            flow.ens_queue,
            sum(s.compute_input for s in parts),
            sum(s.infer for s in parts),
            sum(s.output for s in parts),
            0,
        )
        ens.request = ens.queue + ens.compute_input + ens.infer + ens.output + self._us(60, 200)
        self.models[ENSEMBLE].succeed(ens.queue, ens.compute_input, ens.infer, ens.output, ens.request)
        self.input_len.observe(seq.prompt_tokens)
        self.output_len.observe(seq.generated)

    def on_abort(self, seq: Sequence) -> None:
        """The client went away: ``tensorrt_llm`` reports CANCELED, the ensemble OTHER."""
        if self.flows.pop((seq.request_id, seq.seq_index), None) is not None:
            self.fail(CANCELED_FAILURE)

    def on_rejected(self, prompt_tokens: int) -> None:
        """A prompt longer than the engine's max input length: tokenized, then refused by the executor."""
        pre = self._preprocess(prompt_tokens)
        self.models[PREPROCESSING].succeed(pre.queue, pre.compute_input, pre.infer, pre.output, pre.request)
        self.fail(BACKEND_FAILURE)

    def fail(self, reason: str) -> None:
        self.models[TENSORRT_LLM].failure[reason] += 1
        self.models[ENSEMBLE].failure["OTHER"] += 1

    def _iteration_stats(self, report: StepReport) -> None:
        """The backend's gauges from the executor's latest iteration stats."""
        p = self.engine.params
        in_flight = [s for s in report.scheduled if s.finish is None]
        scheduled = len(in_flight)
        context = sum(1 for s in in_flight if s.generated == 0 or s.first_token == report.end)
        active = min(report.running + report.waiting, p.max_num_seqs)
        active = max(active, scheduled)
        self.requests.update(
            active=active, max=p.max_num_seqs, scheduled=scheduled, context=context, waiting=active - scheduled
        )
        self.reused_blocks += report.prefix_hits // p.block_size
        used = report.used_blocks
        self.kv.update(
            max=p.num_blocks,
            used=used,
            free=p.num_blocks - used,
            tokens_per=p.block_size,
            reused=self.reused_blocks,
            fraction=to_string6(used / p.num_blocks),
        )
        self.batcher.update(
            paused_requests=len(report.preempted),
            micro_batch_id=0,
            generation_requests=scheduled - context,
            total_context_tokens=report.prefill_tokens,
        )
        self.general.update(iteration_counter=self.engine.model.step_count, timestamp=math.floor(report.end * 1e6))
        self.busy = scheduled > 0

    # -- exposition -----------------------------------------------------------------------------------
    def _gpu(self) -> tuple[float, float]:
        """(utilization, power in W) of the one GPU, from whether the last iteration had work."""
        if not self.busy:
            return 0.0, GPU_POWER_IDLE_W
        util = min(0.99, 0.55 + 0.02 * self.requests["scheduled"])
        return round(util, 2), GPU_POWER_BUSY_W

    def render(self) -> str:
        now = self.engine.clock.now()
        util, power = self._gpu()
        self.energy_joules += power * max(0.0, now - self._energy_at)
        self._energy_at = now
        out = Exposition()
        mv = {m: {"model": m, "version": MODEL_VERSION} for m in MODELS}
        trt = mv[TENSORRT_LLM]
        gpu = {"gpu_uuid": GPU_UUID}

        # counters
        out.family(REQUEST_SUCCESS, "counter", "Number of successful inference requests, all batch sizes")
        for m in MODELS:
            out.sample(REQUEST_SUCCESS, mv[m], self.models[m].success)
        out.family(REQUEST_FAILURE, "counter", "Number of failed inference requests, all batch sizes")
        for m in MODELS:
            for reason in FAILURE_REASONS:
                out.sample(REQUEST_FAILURE, {**mv[m], "reason": reason}, self.models[m].failure[reason])
        out.family(INFERENCE_COUNT, "counter", "Number of inferences performed (does not include cached requests)")
        for m in MODELS:
            out.sample(INFERENCE_COUNT, mv[m], self.models[m].success)
        out.family(EXEC_COUNT, "counter", "Number of model executions performed (does not include cached requests)")
        for m in MODELS:
            out.sample(EXEC_COUNT, mv[m], self.models[m].success)
        for name, help_text in DURATION_HELP.items():
            out.family(name, "counter", help_text)
            for m in MODELS:
                out.sample(name, mv[m], self.models[m].durations[name])
        out.family(ENERGY, "counter", "GPU energy consumption in joules since the Triton Server started")
        out.sample(ENERGY, gpu, round(self.energy_joules, 3))
        out.family(DISAGGREGATED, "counter", "TRT LLM disaggregated serving metrics")
        for kind in ("request_count", "kv_cache_transfer_ms"):
            out.sample(DISAGGREGATED, {**trt, "disaggregated_serving_type": kind}, 0)

        # gauges
        out.family(PENDING, "gauge", "Instantaneous number of pending requests awaiting execution per-model.")
        for m in MODELS:
            out.sample(PENDING, mv[m], self.models[m].pending)
        out.family(LOAD_DURATION, "gauge", "Model load time in seconds")
        for m in MODELS:
            out.sample(LOAD_DURATION, mv[m], LOAD_SECONDS[m])
        out.family(PINNED_TOTAL, "gauge", "Pinned memory pool total memory size, in bytes")
        out.sample(PINNED_TOTAL, {}, PINNED_POOL_BYTES)
        out.family(PINNED_USED, "gauge", "Pinned memory pool used memory size, in bytes")
        out.sample(PINNED_USED, {}, 0)
        out.family(GPU_UTILIZATION, "gauge", "GPU utilization rate [0.0 - 1.0)")
        out.sample(GPU_UTILIZATION, gpu, util)
        out.family(GPU_MEMORY_TOTAL, "gauge", "GPU total memory, in bytes")
        out.sample(GPU_MEMORY_TOTAL, gpu, GPU_MEMORY_TOTAL_BYTES)
        out.family(GPU_MEMORY_USED, "gauge", "GPU used memory, in bytes")
        out.sample(GPU_MEMORY_USED, gpu, GPU_MEMORY_USED_BYTES)
        out.family(GPU_POWER_USAGE, "gauge", "GPU power usage in watts")
        out.sample(GPU_POWER_USAGE, gpu, power)
        out.family(GPU_POWER_LIMIT, "gauge", "GPU power management limit in watts")
        out.sample(GPU_POWER_LIMIT, gpu, GPU_POWER_LIMIT_W)
        out.family(CPU_UTILIZATION, "gauge", "CPU utilization rate [0.0 - 1.0]")
        out.sample(CPU_UTILIZATION, {}, CPU_UTILIZATION_VALUE)
        out.family(CPU_MEMORY_TOTAL, "gauge", "CPU total memory (RAM), in bytes")
        out.sample(CPU_MEMORY_TOTAL, {}, CPU_MEMORY_TOTAL_BYTES)
        out.family(CPU_MEMORY_USED, "gauge", "CPU used memory (RAM), in bytes")
        out.sample(CPU_MEMORY_USED, {}, CPU_MEMORY_USED_BYTES)
        self._pivot(out, REQUEST_METRICS, "TRT LLM request metrics", "request_type", self.requests)
        self._pivot(out, RUNTIME_MEMORY, "TRT LLM runtime memory metrics", "memory_type", RUNTIME_MEMORY_BYTES)
        self._pivot(out, KV_BLOCKS, "TRT LLM KV cache block metrics", "kv_cache_block_type", self.kv)
        self._pivot(
            out,
            INFLIGHT_BATCHER,
            "TRT LLM inflight_batcher-specific metrics",
            "inflight_batcher_specific_metric",
            self.batcher,
        )
        self._pivot(out, GENERAL, "General TRT LLM metrics", "general_type", self.general)

        # histograms
        out.family(FIRST_RESPONSE, "histogram", "Duration from request to first response in milliseconds")
        for m in DECOUPLED:
            hist = self.models[m].first_response
            assert hist is not None
            out.histogram(FIRST_RESPONSE, mv[m], hist)
        out.family(OUTPUT_TOKEN_LEN, "histogram", TRTLLM_HELP)
        out.histogram(OUTPUT_TOKEN_LEN, {**trt, "response_metric_type": "total_output_tokens"}, self.output_len)
        out.family(INPUT_TOKEN_LEN, "histogram", TRTLLM_HELP)
        out.histogram(INPUT_TOKEN_LEN, {**trt, "response_metric_type": "total_input_tokens"}, self.input_len)
        return out.text()

    @staticmethod
    def _pivot(out: Exposition, name: str, help_text: str, label: str, values: dict[str, Any]) -> None:
        """A backend family pivoted by its category label (gauges of the ``tensorrt_llm`` model)."""
        out.family(name, "gauge", help_text)
        for kind, value in values.items():
            out.sample(name, {"model": TENSORRT_LLM, label: kind, "version": MODEL_VERSION}, float(value))
