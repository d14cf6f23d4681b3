"""The symptom catalogue: symptom -> how it is detected -> likely cause -> remedies, as data.

This is the operating knowledge inferwatch was founded on, spelled once (like the vocabulary):
the diagnosis (``/api/v1/diagnose``, ``inferwatch diagnose``), the alert runbooks and the
dashboards' operating notes all read it. Symptom ids are stable API values.

Each symptom is detected from *signals*: per-target figures computed from the canonical series
(fleet-wide PromQL, or two scrapes of the exporters) over the diagnosis window. A symptom whose
signals an engine does not expose is ``unknown`` for that target, with the coverage matrix's
reason; it is never guessed. The thresholds below are defaults; ``docs/diagnostics.md`` says why
each was chosen (what a real engine shows in that state), and the collector's settings override
them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from inferwatch.core import vocabulary as V
from inferwatch.core.engines.profile import Knob


class Symptom(StrEnum):
    """Symptom ids: stable values of the diagnose API."""

    LATENCY_P99_HIGH = "latency_p99_high"
    THROUGHPUT_LOW = "throughput_low"
    PREEMPTIONS = "preemptions"
    TTFT_SLOW = "ttft_slow"
    TPOT_SLOW = "tpot_slow"
    ERROR_RATE_HIGH = "error_rate_high"
    STREAMS_ABORTED = "streams_aborted"
    GPU_THROTTLED = "gpu_throttled"
    GPU_ERRORS = "gpu_errors"
    CAPACITY_EXHAUSTED = "capacity_exhausted"
    """not in the catalogue: judged from the headroom model (docs/headroom.md), not from one signal."""


class Status(StrEnum):
    """A symptom's state for one target."""

    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"
    UNKNOWN = "unknown"


SEVERITY_ORDER: Final[dict[Status, int]] = {Status.CRITICAL: 0, Status.WARNING: 1, Status.UNKNOWN: 2, Status.OK: 3}


class Signal(StrEnum):
    """A per-target figure the diagnosis computes from canonical series over its window."""

    REQUEST_RATE = "request_rate"
    ERROR_RATIO = "error_ratio"
    ABORT_RATIO = "abort_ratio"
    E2E_P99 = "e2e_p99"
    QUEUE_P99 = "queue_p99"
    QUEUE_SHARE = "queue_share"
    WAITING = "waiting"
    RUNNING = "running"
    KV_USAGE = "kv_usage"
    KV_CAPACITY = "kv_capacity"
    PREEMPTION_RATE = "preemption_rate"
    PREEMPTIONS_PER_REQUEST = "preemptions_per_request"
    TTFT_P99 = "ttft_p99"
    TTFT_QUEUE_SHARE = "ttft_queue_share"
    PREFILL_P99 = "prefill_p99"
    PROMPT_TOKENS_MEAN = "prompt_tokens_mean"
    PREFILL_DECODE_RATIO = "prefill_decode_ratio"
    TPOT_P99 = "tpot_p99"
    GENERATION_RATE = "generation_rate"
    MAX_CONCURRENCY = "max_concurrency"
    # the GPUs beneath the replica (``llm_gpu_*``; absent without a ``gpus:`` section, docs/gpu.md)
    GPU_COUNT = "gpu_count"
    GPU_ENGINE_ACTIVE = "gpu_engine_active"
    GPU_UTILIZATION = "gpu_utilization"
    GPU_SM_ACTIVE = "gpu_sm_active"
    GPU_TENSOR_ACTIVE = "gpu_tensor_active"
    GPU_DRAM_ACTIVE = "gpu_dram_active"
    GPU_POWER_SHARE = "gpu_power_share"
    GPU_SM_CLOCK = "gpu_sm_clock"
    GPU_TEMPERATURE = "gpu_temperature"
    GPU_THROTTLED_SHARE = "gpu_throttled_share"
    GPU_XID_CRITICAL = "gpu_xid_critical"
    GPU_XID_OTHER = "gpu_xid_other"


@dataclass(frozen=True)
class SignalSpec:
    signal: Signal
    description: str
    unit: str
    metrics: tuple[V.MetricSpec, ...]
    """the canonical metrics it is computed from (an engine missing one cannot give the signal)."""


SIGNALS: Final[Mapping[Signal, SignalSpec]] = {
    s.signal: s
    for s in (
        SignalSpec(Signal.REQUEST_RATE, "finished requests per second", "req/s", (V.REQUESTS,)),
        SignalSpec(Signal.ERROR_RATIO, "share of finished requests that failed in the engine", "ratio", (V.REQUESTS,)),
        SignalSpec(Signal.ABORT_RATIO, "share of requests aborted before they finished", "ratio", (V.REQUESTS,)),
        SignalSpec(Signal.E2E_P99, "P99 end-to-end request latency", "s", (V.REQUEST_DURATION,)),
        SignalSpec(Signal.QUEUE_P99, "P99 time waiting in the queue", "s", (V.REQUEST_QUEUE,)),
        SignalSpec(
            Signal.QUEUE_SHARE,
            "mean queue time / mean end-to-end latency",
            "ratio",
            (V.REQUEST_QUEUE, V.REQUEST_DURATION),
        ),
        SignalSpec(Signal.WAITING, "requests waiting (mean over the window)", "requests", (V.REQUESTS_WAITING,)),
        SignalSpec(Signal.RUNNING, "requests running (mean over the window)", "requests", (V.REQUESTS_RUNNING,)),
        SignalSpec(Signal.KV_USAGE, "KV-cache usage (mean over the window)", "ratio", (V.KV_CACHE_USAGE,)),
        SignalSpec(Signal.KV_CAPACITY, "KV-cache capacity", "tokens", (V.KV_CACHE_CAPACITY,)),
        SignalSpec(Signal.PREEMPTION_RATE, "preemptions per second", "/s", (V.PREEMPTIONS,)),
        SignalSpec(
            Signal.PREEMPTIONS_PER_REQUEST,
            "preemptions per finished request (per one request when none finished in the window)",
            "ratio",
            (V.PREEMPTIONS, V.REQUESTS),
        ),
        SignalSpec(Signal.TTFT_P99, "P99 time to first token", "s", (V.TIME_TO_FIRST_TOKEN,)),
        SignalSpec(
            Signal.TTFT_QUEUE_SHARE,
            "mean queue time / mean time to first token",
            "ratio",
            (V.REQUEST_QUEUE, V.TIME_TO_FIRST_TOKEN),
        ),
        SignalSpec(Signal.PREFILL_P99, "P99 prefill time (scheduled to first token)", "s", (V.REQUEST_PREFILL,)),
        SignalSpec(Signal.PROMPT_TOKENS_MEAN, "mean prompt length", "tokens", (V.PROMPT_TOKENS, V.REQUESTS)),
        SignalSpec(
            Signal.PREFILL_DECODE_RATIO,
            "prompt tokens per generated token",
            "×",
            (V.PROMPT_TOKENS, V.GENERATION_TOKENS),
        ),
        SignalSpec(Signal.TPOT_P99, "P99 time per output token", "s", (V.TIME_PER_OUTPUT_TOKEN,)),
        SignalSpec(Signal.GENERATION_RATE, "output tokens per second", "tok/s", (V.GENERATION_TOKENS,)),
        SignalSpec(
            Signal.MAX_CONCURRENCY,
            "the engine's concurrency limit (from its info series)",
            "requests",
            (V.ENGINE_INFO,),
        ),
        SignalSpec(Signal.GPU_COUNT, "GPUs of the replica", "GPUs", (V.GPU_UTILIZATION, V.GPU_POWER)),
        SignalSpec(
            Signal.GPU_ENGINE_ACTIVE,
            "GPU engine activity (mean over the window and the replica's GPUs)",
            "ratio",
            (V.GPU_ENGINE_ACTIVE,),
        ),
        SignalSpec(
            Signal.GPU_UTILIZATION,
            "GPU utilisation: time a kernel ran (mean over the window and the replica's GPUs)",
            "ratio",
            (V.GPU_UTILIZATION,),
        ),
        SignalSpec(Signal.GPU_SM_ACTIVE, "SM activity (mean over the replica's GPUs)", "ratio", (V.GPU_SM_ACTIVE,)),
        SignalSpec(
            Signal.GPU_TENSOR_ACTIVE,
            "tensor-core activity (mean over the replica's GPUs)",
            "ratio",
            (V.GPU_TENSOR_ACTIVE,),
        ),
        SignalSpec(
            Signal.GPU_DRAM_ACTIVE,
            "device-memory (DRAM) activity (mean over the replica's GPUs)",
            "ratio",
            (V.GPU_DRAM_ACTIVE,),
        ),
        SignalSpec(
            Signal.GPU_POWER_SHARE,
            "power drawn / the board's power limit (the replica's highest GPU)",
            "ratio",
            (V.GPU_POWER, V.GPU_POWER_LIMIT),
        ),
        SignalSpec(Signal.GPU_SM_CLOCK, "SM clock (the replica's slowest GPU)", "MHz", (V.GPU_SM_CLOCK,)),
        SignalSpec(Signal.GPU_TEMPERATURE, "GPU temperature (the replica's hottest GPU)", "°C", (V.GPU_TEMPERATURE,)),
        SignalSpec(
            Signal.GPU_THROTTLED_SHARE,
            "share of the window a GPU of the replica was throttled (its most frequent throttling clock-event "
            "reason, or its throttle time)",
            "ratio",
            (V.GPU_CLOCK_EVENT, V.GPU_THROTTLE_TIME),
        ),
        SignalSpec(
            Signal.GPU_XID_CRITICAL,
            "GPUs of the replica whose last XID error is on the critical list",
            "GPUs",
            (V.GPU_XID,),
        ),
        SignalSpec(
            Signal.GPU_XID_OTHER,
            "GPUs of the replica whose last XID error is not on the critical list",
            "GPUs",
            (V.GPU_XID,),
        ),
    )
}
GPU_SIGNALS: Final[frozenset[Signal]] = frozenset(s for s in Signal if s.value.startswith("gpu_"))
"""The signals read from the GPUs beneath a replica rather than from its engine."""


@dataclass(frozen=True)
class Threshold:
    """``signal`` above ``warning`` (or ``critical``) raises the symptom to that severity."""

    signal: Signal
    warning: float
    critical: float

    def status(self, value: float) -> Status:
        if value > self.critical:
            return Status.CRITICAL
        if value > self.warning:
            return Status.WARNING
        return Status.OK


@dataclass(frozen=True)
class Gate:
    """A condition that must hold for the symptom to be reported at all (a cause, not a severity).

    ``signal`` compared to ``value``, or to ``ratio`` times another signal (``of``).
    """

    signal: Signal
    above: float | None = None
    below: float | None = None
    of: Signal | None = None
    """compare with this signal scaled: ``signal > above × of`` / ``signal < below × of``."""
    description: str = ""


@dataclass(frozen=True)
class Remedy:
    text: str
    knobs: tuple[Knob, ...] = ()
    """the engine knobs that carry it out (each engine's spelling comes from its profile)."""


@dataclass(frozen=True)
class SymptomSpec:
    id: Symptom
    title: str
    detection: str
    """how it is detected, in words (the docs and the API say it this way)."""
    threshold: Threshold
    cause: str
    remedies: tuple[Remedy, ...]
    gates: tuple[Gate, ...] = ()
    evidence: tuple[Signal, ...] = ()
    """further signals shown as evidence (besides the threshold's and the gates')."""
    secondary_to: tuple[Symptom, ...] = ()
    """when one of these is critical for the same target, this one is its consequence: at most a warning."""
    alerts: tuple[str, ...] = ()
    """alert names whose firing points at this symptom (webhook enrichment)."""
    slo_metric: V.MetricSpec | None = None
    """a latency SLO on this metric sets the warning threshold (critical: twice it)."""

    @property
    def runbook(self) -> str:
        """Its section's anchor in the generated runbooks (``runbooks.md#<id>``)."""
        return self.id.value

    def signals(self) -> tuple[Signal, ...]:
        out = [self.threshold.signal]
        for gate in self.gates:
            out.append(gate.signal)
            if gate.of is not None:
                out.append(gate.of)
        out.extend(self.evidence)
        return tuple(dict.fromkeys(out))

    def required(self) -> tuple[Signal, ...]:
        """Signals without which the symptom cannot be judged (the threshold's and the gates')."""
        out = [self.threshold.signal]
        for gate in self.gates:
            out.append(gate.signal)
            if gate.of is not None:
                out.append(gate.of)
        return tuple(dict.fromkeys(out))


CONCURRENCY_REMEDY: Final = Remedy(
    "lower the concurrency limit so requests queue in front of the engine instead of inside it, or add replicas",
    (Knob.CONCURRENCY, Knob.ADMISSION),
)

CATALOGUE: Final[tuple[SymptomSpec, ...]] = (
    SymptomSpec(
        Symptom.PREEMPTIONS,
        "Many preemptions",
        "running sequences are evicted from the KV cache and recomputed: the preemption rate is above zero, and "
        "preemptions per finished request above the critical share",
        Threshold(Signal.PREEMPTIONS_PER_REQUEST, 0.0, 0.05),
        "the KV cache is too small for the concurrency: sequences outgrow the free blocks",
        (
            Remedy("lower the concurrency limit", (Knob.CONCURRENCY,)),
            Remedy("give the KV cache more GPU memory", (Knob.GPU_MEMORY,)),
            Remedy("quantize the KV cache (FP8 halves it)", (Knob.KV_CACHE_DTYPE,)),
            Remedy("shard the model over more GPUs (more memory for the cache)", (Knob.TENSOR_PARALLEL,)),
        ),
        gates=(Gate(Signal.PREEMPTION_RATE, above=0.0, description="preemptions in the window"),),
        evidence=(Signal.PREEMPTION_RATE, Signal.KV_USAGE, Signal.WAITING, Signal.KV_CAPACITY),
        alerts=(V.ALERT_PREEMPTIONS_SUSTAINED, V.ALERT_KV_SATURATED, V.ALERT_KV_EXHAUSTION_PREDICTED),
    ),
    SymptomSpec(
        Symptom.LATENCY_P99_HIGH,
        "P99 latency high",
        "requests wait in the engine's queue: P99 queue time above the threshold while requests are waiting",
        Threshold(Signal.QUEUE_P99, 1.0, 5.0),
        "queue backlog: arrivals exceed what the running batch can serve",
        (
            CONCURRENCY_REMEDY,
            Remedy("cap output lengths (max_tokens) so slots free up sooner"),
        ),
        gates=(Gate(Signal.WAITING, above=0.5, description="requests waiting"),),
        evidence=(Signal.E2E_P99, Signal.QUEUE_SHARE, Signal.RUNNING),
        secondary_to=(Symptom.PREEMPTIONS,),
        alerts=(V.ALERT_QUEUE_BACKLOG_GROWING,),
    ),
    SymptomSpec(
        Symptom.THROUGHPUT_LOW,
        "Throughput will not rise",
        "requests wait while the KV cache is (nearly) full: the batch cannot grow for lack of memory, whatever the "
        "concurrency limit. With the GPU's series the GPU tells three causes apart (docs/gpu.md): saturated with "
        "the cache full (this cause and its remedies); idle while requests wait (GPU engine activity under 0.5: the "
        "bottleneck is outside the GPU, in the CPU, the tokenizer or the clients' concurrency); or throttled (see "
        "gpu_throttled: fix the cooling or the power cap)",
        Threshold(Signal.KV_USAGE, 0.9, 0.98),
        "not enough GPU memory for a bigger batch",
        (
            Remedy("quantize the model (AWQ INT4 in general, FP8 on Hopper)", (Knob.QUANTIZATION,)),
            Remedy("quantize the KV cache", (Knob.KV_CACHE_DTYPE,)),
            Remedy("shard with tensor parallelism", (Knob.TENSOR_PARALLEL,)),
            Remedy("give the engine more GPU memory", (Knob.GPU_MEMORY,)),
        ),
        gates=(Gate(Signal.WAITING, above=0.5, description="requests waiting"),),
        evidence=(Signal.RUNNING, Signal.GENERATION_RATE, Signal.KV_CAPACITY, Signal.MAX_CONCURRENCY),
        secondary_to=(Symptom.PREEMPTIONS, Symptom.GPU_THROTTLED),
        alerts=(V.ALERT_KV_SATURATED,),
    ),
    SymptomSpec(
        Symptom.TTFT_SLOW,
        "Slow first token",
        "P99 time to first token above the threshold, and prefill (not queueing) takes most of it",
        Threshold(Signal.TTFT_P99, 0.5, 1.0),
        "prompts too long: prefill dominates the first token",
        (
            Remedy("enable chunked prefill so long prompts do not stall the batch", (Knob.CHUNKED_PREFILL,)),
            Remedy("enable prefix caching for shared prompt prefixes (system prompts)", (Knob.PREFIX_CACHING,)),
            Remedy("shorten prompts or lower the context limit", (Knob.MAX_CONTEXT,)),
        ),
        gates=(
            Gate(
                Signal.TTFT_QUEUE_SHARE,
                below=0.5,
                description="queueing is less than half of the first token's time",
            ),
        ),
        evidence=(Signal.PREFILL_P99, Signal.PROMPT_TOKENS_MEAN, Signal.PREFILL_DECODE_RATIO, Signal.TPOT_P99),
        slo_metric=V.TIME_TO_FIRST_TOKEN,
    ),
    SymptomSpec(
        Symptom.TPOT_SLOW,
        "Slow per-token generation",
        "P99 time per output token above the threshold. With the GPU's profiling series the finding says how the "
        "decode is bound: by memory bandwidth (DRAM activity high, tensor activity lower: the model is too big for "
        "the hardware) or by small batches and kernel overhead (the engine busy, SM, tensor and DRAM activity low)",
        Threshold(Signal.TPOT_P99, 0.1, 0.2),
        "the model is too big for the hardware: each decode step is slow",
        (
            Remedy("serve a smaller or quantized model", (Knob.QUANTIZATION,)),
            Remedy("shard with tensor parallelism", (Knob.TENSOR_PARALLEL,)),
            Remedy("speculative decoding", (Knob.SPECULATIVE_DECODING,)),
        ),
        gates=(
            Gate(
                Signal.PREFILL_DECODE_RATIO,
                below=10.0,
                description="decode-bound traffic (with more prompt tokens, long prefills stall the decodes)",
            ),
        ),
        evidence=(Signal.RUNNING, Signal.GENERATION_RATE),
        secondary_to=(Symptom.GPU_THROTTLED,),
        slo_metric=V.TIME_PER_OUTPUT_TOKEN,
    ),
    SymptomSpec(
        Symptom.ERROR_RATE_HIGH,
        "Error rate high",
        "share of finished requests with outcome error above the threshold",
        Threshold(Signal.ERROR_RATIO, 0.01, 0.05),
        "requests fail inside the engine (out of memory, a shard or backend failure, overload)",
        (
            Remedy("read the engine's log around the errors; failing requests are in the collector's request list"),
            Remedy("out of memory at start-up or under load: lower GPU memory utilization first", (Knob.GPU_MEMORY,)),
        ),
        gates=(Gate(Signal.REQUEST_RATE, above=0.0, description="requests finished in the window"),),
        alerts=(),
    ),
    SymptomSpec(
        Symptom.STREAMS_ABORTED,
        "Streams cut mid-way",
        "share of requests aborted before they finished above the threshold",
        Threshold(Signal.ABORT_RATIO, 0.05, 0.2),
        "clients or proxies drop long streams (timeouts, idle connections)",
        (
            Remedy("stream with SSE and send heartbeats so idle proxies keep the connection"),
            Remedy("make clients reconnect and resume; raise proxy and load-balancer timeouts"),
            Remedy("long requests starved by short ones: use request priority", (Knob.PRIORITY,)),
        ),
        gates=(Gate(Signal.REQUEST_RATE, above=0.0, description="requests finished in the window"),),
    ),
    SymptomSpec(
        Symptom.GPU_THROTTLED,
        "GPU throttled",
        "a GPU of the replica holds its clocks down for power (clock-event reasons power_cap, hw_slowdown, "
        "hw_power_brake) or temperature (sw_thermal, hw_thermal), or its throttle time grows, for more than a "
        "tenth of the window (critical: more than half of it). Unknown when the GPU source exports neither: "
        "dcgm-exporter's clock-event reasons field and its violation counters are opt-in (docs/gpu.md)",
        Threshold(Signal.GPU_THROTTLED_SHARE, 0.1, 0.5),
        "the GPU cannot hold its clocks: it is too hot (cooling) or at its power limit (the power cap); every "
        "step of the engine is slower by about the clock's drop",
        (
            Remedy(
                "thermal: fix the cooling (airflow, fans, inlet temperature, blanking panels) before the GPU "
                "slows further or shuts down"
            ),
            Remedy(
                "power: restore the board's default power limit (nvidia-smi -q -d POWER shows the default and "
                "enforced limits; nvidia-smi -pl sets it) and check the node's power budget"
            ),
            Remedy("until it is fixed, move load to replicas on GPUs that are not throttled"),
        ),
        evidence=(Signal.GPU_SM_CLOCK, Signal.GPU_POWER_SHARE, Signal.GPU_TEMPERATURE, Signal.GPU_COUNT),
        alerts=(V.ALERT_GPU_THROTTLED,),
    ),
    SymptomSpec(
        Symptom.GPU_ERRORS,
        "GPU errors (XID)",
        f"a GPU of the replica reported an XID error: critical for a code on the critical list "
        f"({', '.join(V.GPU_XID_CRITICAL)}: ECC errors, row remapping, NVLink, a GPU fallen off the bus), a "
        "warning for any other code",
        Threshold(Signal.GPU_XID_CRITICAL, 0.0, 0.0),
        "the GPU or its driver failed (critical codes: the hardware needs attention); other codes are often the "
        "application's own fault (13 graphics engine exception, 31 memory page fault)",
        (
            Remedy("drain the replica: send its traffic to the others before it fails more requests"),
            Remedy(
                "stop the engine, reset the GPU (nvidia-smi -r) or reboot the node, and check the GPU's health "
                "(dcgmi diag) before it serves again"
            ),
            Remedy("a critical code that comes back: replace the GPU; NVLink errors: check the NVLink fabric"),
            Remedy("a code off the critical list: read the engine's log at that time (often a crash or a bug)"),
        ),
        evidence=(Signal.GPU_XID_OTHER, Signal.GPU_COUNT),
        alerts=(V.ALERT_GPU_ERRORS,),
    ),
)

FIELD_PITFALLS: Final[tuple[tuple[str, str, Remedy], ...]] = (
    (
        "Out of memory at start-up",
        "the engine reserves more GPU memory than is free",
        Remedy("lower GPU memory utilization first", (Knob.GPU_MEMORY,)),
    ),
    (
        "Long requests starved by short ones",
        "first-come scheduling lets a stream of short requests delay long ones",
        Remedy("request priority", (Knob.PRIORITY,)),
    ),
    (
        "Streams cut off half-way",
        "idle connections closed by proxies or clients",
        Remedy("SSE with heartbeats; clients reconnect"),
    ),
)


def catalogue() -> dict[Symptom, SymptomSpec]:
    """The symptom catalogue by id (a new dict each call)."""
    return {spec.id: spec for spec in CATALOGUE}


@dataclass(frozen=True)
class Thresholds:
    """Overrides of the catalogue's thresholds (``symptom -> (warning, critical)``)."""

    overrides: Mapping[Symptom, tuple[float, float]] = field(default_factory=dict)

    def for_symptom(self, spec: SymptomSpec) -> Threshold:
        if spec.id in self.overrides:
            warning, critical = self.overrides[spec.id]
            return Threshold(spec.threshold.signal, warning, critical)
        return spec.threshold
