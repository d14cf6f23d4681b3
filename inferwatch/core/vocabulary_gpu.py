"""The canonical GPU families (``llm_gpu_*``): the GPU beneath an engine replica, in base units.

Part of the one vocabulary (:mod:`inferwatch.core.vocabulary` re-exports every name here: callers write
``V.GPU_UTILIZATION``). The exporter translates a GPU source's dialect (NVIDIA dcgm-exporter's
``DCGM_FI_*`` fields, :mod:`inferwatch.exporters.gpus.dcgm`) into these families for the GPUs one engine
target uses, with that target's ``engine`` and ``model`` labels, so that every rule, panel and finding
joins a GPU to its replica without knowing where it came from. Every family is per GPU
(``gpu``, ``gpu_uuid``, ``gpu_model``, ``host``; ``pool`` when the target states one): several GPUs
under one replica (tensor parallelism) are aggregated by the reader (``avg`` for ratios, ``sum`` for
power, energy and memory, ``max`` for temperature, ``min`` for clocks).

A family the source does not export is absent, not zero: the profiling fields (engine, SM, tensor and
DRAM activity) need DCGM's profiling module, the clock-event reasons, throttle time and power limit
are opt-in fields of dcgm-exporter's counter list, and a GPU that never had an XID error has none.
"""

from __future__ import annotations

from typing import Final

from inferwatch.core.vocabulary_names import LABEL_REASON, LABEL_XID
from inferwatch.core.vocabulary_spec import Aggregation, Kind, MetricSpec

__all__ = [
    "GPU_CLOCK_EVENT",
    "GPU_DRAM_ACTIVE",
    "GPU_ENERGY",
    "GPU_ENGINE_ACTIVE",
    "GPU_MEMORY_FREE",
    "GPU_MEMORY_USED",
    "GPU_METRICS",
    "GPU_POWER",
    "GPU_POWER_LIMIT",
    "GPU_SM_ACTIVE",
    "GPU_SM_CLOCK",
    "GPU_TEMPERATURE",
    "GPU_TENSOR_ACTIVE",
    "GPU_THROTTLE_TIME",
    "GPU_UTILIZATION",
    "GPU_XID",
]


def _gauge(key: str, name: str, unit: str, help_: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(key, name, Kind.GAUGE, unit, help_, labels=labels, aggregation=Aggregation.MAX)


GPU_UTILIZATION: Final = _gauge(
    "gpu_utilization",
    "llm_gpu_utilization_ratio",
    "ratio",
    "Fraction (0-1) of the last sample period during which a kernel ran on the GPU (NVML's utilisation: "
    "busy time, not how much of the GPU was used; one small kernel reads 1).",
)
GPU_ENGINE_ACTIVE: Final = _gauge(
    "gpu_engine_active",
    "llm_gpu_engine_active_ratio",
    "ratio",
    "Fraction (0-1) of time the graphics/compute engine was active (DCGM profiling); absent without it.",
)
GPU_SM_ACTIVE: Final = _gauge(
    "gpu_sm_active",
    "llm_gpu_sm_active_ratio",
    "ratio",
    "Fraction (0-1) of time at least one warp was resident per SM, averaged over the SMs (DCGM profiling): "
    "how much of the GPU a busy engine uses.",
)
GPU_TENSOR_ACTIVE: Final = _gauge(
    "gpu_tensor_active",
    "llm_gpu_tensor_active_ratio",
    "ratio",
    "Fraction (0-1) of cycles the tensor cores were busy (DCGM profiling): the matrix work of prefill and "
    "batched decode.",
)
GPU_DRAM_ACTIVE: Final = _gauge(
    "gpu_dram_active",
    "llm_gpu_dram_active_ratio",
    "ratio",
    "Fraction (0-1) of cycles the device memory interface was busy (DCGM profiling): high with tensor "
    "activity low means decode is bound by memory bandwidth.",
)
GPU_MEMORY_USED: Final = _gauge(
    "gpu_memory_used",
    "llm_gpu_memory_used_bytes",
    "bytes",
    "Framebuffer in use. Engines preallocate their KV cache at start: near-constant, and not how full the "
    "KV cache is (llm_kv_cache_usage_ratio says that).",
)
GPU_MEMORY_FREE: Final = _gauge(
    "gpu_memory_free",
    "llm_gpu_memory_free_bytes",
    "bytes",
    "Framebuffer free.",
)
GPU_POWER: Final = _gauge("gpu_power", "llm_gpu_power_watts", "watts", "Power drawn by the board.")
GPU_POWER_LIMIT: Final = _gauge(
    "gpu_power_limit",
    "llm_gpu_power_limit_watts",
    "watts",
    "The board's power management limit (an opt-in field); a draw at the limit holds the clocks down.",
)
GPU_ENERGY: Final = MetricSpec(
    "gpu_energy",
    "llm_gpu_energy_joules_total",
    Kind.COUNTER,
    "joules",
    "Energy the board consumed since the driver was loaded.",
)
GPU_SM_CLOCK: Final = _gauge("gpu_sm_clock", "llm_gpu_sm_clock_hertz", "hertz", "The SM clock.")
GPU_TEMPERATURE: Final = _gauge("gpu_temperature", "llm_gpu_temperature_celsius", "celsius", "The GPU's temperature.")
GPU_CLOCK_EVENT: Final = _gauge(
    "gpu_clock_event",
    "llm_gpu_clock_event_active",
    "",
    "1 for each reason that holds the clocks down now (power_cap, hw_slowdown, hw_power_brake: power; "
    "sw_thermal, hw_thermal: thermal), 0 for the others; absent when the source does not export the "
    "clock-event reasons (an opt-in field).",
    labels=(LABEL_REASON,),
)
GPU_THROTTLE_TIME: Final = MetricSpec(
    "gpu_throttle_time",
    "llm_gpu_throttle_seconds_total",
    Kind.COUNTER,
    "seconds",
    "Time the clocks were held down by power (reason=power) or temperature (reason=thermal) (opt-in "
    "violation counters).",
    labels=(LABEL_REASON,),
)
GPU_XID: Final = _gauge(
    "gpu_xid",
    "llm_gpu_xid_last",
    "",
    "1, with the XID code, for the last XID error the driver reported for the GPU since the source "
    "started; absent when it reported none. Codes 48, 63, 64, 74, 79, 92, 94, 95 mean the GPU needs "
    "attention (double-bit ECC, row remapping, NVLink, fallen off the bus).",
    labels=(LABEL_XID,),
)

GPU_METRICS: Final[tuple[MetricSpec, ...]] = (
    GPU_UTILIZATION,
    GPU_ENGINE_ACTIVE,
    GPU_SM_ACTIVE,
    GPU_TENSOR_ACTIVE,
    GPU_DRAM_ACTIVE,
    GPU_MEMORY_USED,
    GPU_MEMORY_FREE,
    GPU_POWER,
    GPU_POWER_LIMIT,
    GPU_ENERGY,
    GPU_SM_CLOCK,
    GPU_TEMPERATURE,
    GPU_CLOCK_EVENT,
    GPU_THROTTLE_TIME,
    GPU_XID,
)
"""The GPU beneath an engine, in rendering order (after the engine's own families)."""
