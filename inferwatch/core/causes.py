"""Causes the GPU tells apart, as data: one symptom, several causes, each with its own remedies.

A symptom of the catalogue (:mod:`inferwatch.core.symptoms`) names its likely cause. Some symptoms have
more than one, and the engine's own series cannot tell them apart; the GPU beneath the replica can
(``llm_gpu_*``, docs/gpu.md). ``throughput_low`` has three: a saturated GPU with its KV cache full (the
symptom's own cause), a GPU idle while requests wait (the bottleneck is outside the GPU), and a throttled
GPU. ``tpot_slow`` has its own cause (a model too big for the hardware, which the GPU shows as a decode
bound by memory bandwidth) and two others the GPU reveals: small batches with kernel overhead, and a
throttled GPU. The diagnosis picks one per finding (``likely_cause``); without GPU series it keeps the
symptom's own cause and says the GPU evidence is missing. Cause ids are stable API values.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from inferwatch.core import vocabulary as V
from inferwatch.core.engines.profile import Knob
from inferwatch.core.symptoms import CATALOGUE, Remedy, Symptom


class Cause(StrEnum):
    """A finding's ``likely_cause``: stable values of the diagnose API."""

    GPU_SATURATED = "gpu_saturated"
    """throughput_low: the KV cache is full (the GPU busy): no memory for a bigger batch."""
    OUTSIDE_GPU = "outside_gpu"
    """throughput_low, tpot_slow: the GPU idles while requests wait: the bottleneck is before or around it."""
    GPU_THROTTLED = "gpu_throttled"
    """throughput_low, tpot_slow: the GPU holds its clocks down (power or temperature)."""
    MEMORY_BANDWIDTH = "memory_bandwidth"
    """tpot_slow: decode bound by memory bandwidth: the model is too big for the hardware."""
    SMALL_BATCHES = "small_batches"
    """tpot_slow: the GPU is busy doing little: small batches, kernel launch overhead."""


@dataclass(frozen=True)
class CauseSpec:
    id: Cause
    symptom: Symptom
    title: str
    condition: str
    """what the GPU shows, in words (docs/gpu.md gives the PromQL)."""
    cause: str
    remedies: tuple[Remedy, ...] = ()
    keep_main: bool = False
    """the symptom's own remedies follow this cause's (the model-too-big remedies of tpot_slow stay)."""


@dataclass(frozen=True)
class GpuThresholds:
    """Where GPU activity counts as busy, idle or bound; docs/gpu.md says why each was chosen."""

    busy_activity: float = 0.9
    """engine activity (``V.GPU_ENGINE_ACTIVE``) at or above which the GPU is saturated."""
    busy_utilization: float = 0.95
    """the same for NVML's utilisation, the fallback without DCGM profiling (it reads higher: one small
    kernel makes a whole sample period busy)."""
    idle_activity: float = 0.5
    """engine activity (or utilisation) below which the GPU idles: half the time or more nothing runs."""
    idle_critical: float = 0.2
    """below this the GPU idles four-fifths of the time while requests wait: critical."""
    dram_bound: float = 0.5
    """DRAM activity at or above which decode counts as bound by memory bandwidth (tensor activity lower)."""
    low_activity: float = 0.3
    """SM, tensor and DRAM activity below this, with the engine active at least ``idle_activity``: each
    step does little work (small batches, kernel launch overhead)."""


GPU_THRESHOLDS: Final = GpuThresholds()

_SPECS = {spec.id: spec for spec in CATALOGUE}

THROTTLE_REMEDIES: Final[tuple[Remedy, ...]] = _SPECS[Symptom.GPU_THROTTLED].remedies
_G = GPU_THRESHOLDS
_THROTTLED = (
    "a throttling clock-event reason holds, or the throttle time grows, for more than "
    f"{_SPECS[Symptom.GPU_THROTTLED].threshold.warning:.0%} of the window"
)

CAUSES: Final[tuple[CauseSpec, ...]] = (
    CauseSpec(
        Cause.GPU_THROTTLED,
        Symptom.THROUGHPUT_LOW,
        "GPU throttled",
        _THROTTLED,
        "a throttled GPU: it holds its clocks down (power or temperature), so every step is slower and the "
        "queue cannot drain",
        THROTTLE_REMEDIES,
    ),
    CauseSpec(
        Cause.OUTSIDE_GPU,
        Symptom.THROUGHPUT_LOW,
        "GPU idle while requests wait",
        f"GPU engine activity (or utilisation) under {_G.idle_activity:g} while requests wait (critical under "
        f"{_G.idle_critical:g})",
        "the bottleneck is outside the GPU: the GPU idles while requests wait (the engine's CPU, its tokenizer "
        "or scheduler, or clients that send too few requests at once)",
        (
            Remedy(
                "if the running batch sits at the concurrency limit, raise the limit: the GPU has room",
                (Knob.CONCURRENCY,),
            ),
            Remedy(
                "give the engine's process more CPU (a core at 100 % is the sign) and a fast tokenizer; keep other "
                "work off the node's CPUs"
            ),
            Remedy("raise the clients' concurrency, or put a router with a queue in front, so the batch fills"),
        ),
    ),
    CauseSpec(
        Cause.GPU_SATURATED,
        Symptom.THROUGHPUT_LOW,
        "GPU saturated, KV cache full",
        f"the KV cache over throughput_low's threshold while requests wait (engine activity at least "
        f"{_G.busy_activity:g}, or utilisation at least {_G.busy_utilization:g}, says the GPU is saturated too; the "
        "framebuffer says nothing: engines preallocate it)",
        "not enough GPU memory for a bigger batch: the KV cache is full",
    ),
    CauseSpec(
        Cause.GPU_THROTTLED,
        Symptom.TPOT_SLOW,
        "GPU throttled",
        _THROTTLED,
        "a throttled GPU: its clock is held down, and a decode step takes longer by about the clock's drop",
        THROTTLE_REMEDIES,
        keep_main=True,
    ),
    CauseSpec(
        Cause.OUTSIDE_GPU,
        Symptom.TPOT_SLOW,
        "GPU idle between steps",
        f"GPU engine activity (or utilisation) under {_G.idle_activity:g} while tokens are slow",
        "the GPU idles between decode steps: the time goes to the CPU (scheduling, sampling, detokenizing)",
        (
            Remedy(
                "give the engine's process more CPU and keep other work off the node's CPUs; stream fewer, larger "
                "chunks if the detokenizer is the cost"
            ),
        ),
        keep_main=True,
    ),
    CauseSpec(
        Cause.MEMORY_BANDWIDTH,
        Symptom.TPOT_SLOW,
        "decode bound by memory bandwidth",
        f"DRAM activity at least {_G.dram_bound:g} and tensor activity lower: each step reads the weights and the "
        "KV cache",
        "the model is too big for the hardware's memory bandwidth: each decode step reads all the weights",
    ),
    CauseSpec(
        Cause.SMALL_BATCHES,
        Symptom.TPOT_SLOW,
        "small batches, kernel overhead",
        f"the GPU engine active at least {_G.idle_activity:g} of the time while SM, tensor and DRAM activity stay "
        f"under {_G.low_activity:g}",
        "each decode step does little work: small batches, and kernel launches that cost more than their work",
        (
            Remedy(
                "keep CUDA graphs on (vLLM without --enforce-eager, SGLang without --disable-cuda-graph): they "
                "remove most launch overhead"
            ),
            Remedy(
                "fewer tensor-parallel shards for a small model: at small batches the GPUs wait on each other",
                (Knob.TENSOR_PARALLEL,),
            ),
            Remedy("speculative decoding: more tokens per step", (Knob.SPECULATIVE_DECODING,)),
        ),
        keep_main=True,
    ),
)

GPU_THROTTLE_READING: Final = "gpu_throttle"
GPU_THROTTLE_TIME_READING: Final = "gpu_throttle_time"
GPU_XID_READING: Final = "gpu_xid"
GPU_READINGS: Final = frozenset({GPU_THROTTLE_READING, GPU_THROTTLE_TIME_READING, GPU_XID_READING})
"""The evidence names of one GPU's readings (a finding lists one per GPU and reason or XID code; its
description names the GPU)."""

OTHER_XIDS: Final[dict[str, str]] = {
    "13": "graphics engine exception (often the application's fault)",
    "31": "GPU memory page fault (often the application's fault)",
    "43": "GPU stopped processing (the application's context was stopped)",
    "45": "preemptive cleanup after earlier errors",
    "119": "GSP RPC timeout (the GPU's firmware stopped answering: a reset may be needed)",
}
"""What some XID codes off the critical list mean (NVIDIA's XID catalogue, as dcgm-exporter's
``xid_errors.go`` names them); the critical ones are :data:`V.GPU_XID_CRITICAL`."""


def causes_of(symptom: Symptom) -> tuple[CauseSpec, ...]:
    """The causes the GPU tells apart for ``symptom``, in the order they are tried."""
    return tuple(c for c in CAUSES if c.symptom is symptom)


def cause(symptom: Symptom, cause_id: Cause) -> CauseSpec:
    return next(c for c in CAUSES if c.symptom is symptom and c.id is cause_id)


def remedies(spec: CauseSpec) -> tuple[Remedy, ...]:
    """The cause's remedies: its own, then the symptom's where it keeps them (or only the symptom's)."""
    main = _SPECS[spec.symptom].remedies
    if not spec.remedies:
        return main
    return spec.remedies + main if spec.keep_main else spec.remedies


def xid_meaning(code: str) -> str:
    """What an XID code means, as far as the catalogue knows it."""
    return V.GPU_XID_CRITICAL.get(code) or OTHER_XIDS.get(code) or "see NVIDIA's XID catalogue"
