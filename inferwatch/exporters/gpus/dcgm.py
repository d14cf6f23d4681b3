"""NVIDIA dcgm-exporter's dialect: which ``DCGM_FI_*`` field feeds which ``llm_gpu_*`` family, in which unit,
and which labels name a GPU, its host and the pod that holds it. Data, plus the two fields that are
not a plain value (the clock-event bitmask and the last XID).

Followed: NVIDIA/dcgm-exporter tag ``4.5.3-4.8.2`` (commit 691c9276), ``etc/default-counters.csv`` and
``internal/pkg/collector/{clock_events_collector,xid_collector}.go``; DCGM v4.5.3 ``dcgm_fields.h`` for
units (percent for ``*_UTIL``, 0-1 for ``PROF_*``, MiB for ``FB_*``, mJ for the energy, ns for the
violation counters, MHz for clocks). The fixtures of ``tests/fixtures/gpu/dcgm-exporter/4.5.3-4.8.2/``
and their ``SOURCE.md`` hold the facts and where each comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from inferwatch.core import vocabulary as V

NAME: Final = "dcgm-exporter"
DEFAULT_PORT: Final = 9400
MIB: Final = 1024.0 * 1024.0


@dataclass(frozen=True)
class Field:
    """One DCGM field feeding one canonical GPU family: ``value x scale``, plus constant labels."""

    metric: V.MetricSpec
    source: str
    scale: float = 1.0
    const: dict[str, str] = field(default_factory=dict)


FIELDS: Final[tuple[Field, ...]] = (
    Field(V.GPU_UTILIZATION, "DCGM_FI_DEV_GPU_UTIL", 0.01),
    Field(V.GPU_ENGINE_ACTIVE, "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    Field(V.GPU_SM_ACTIVE, "DCGM_FI_PROF_SM_ACTIVE"),
    Field(V.GPU_TENSOR_ACTIVE, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    Field(V.GPU_DRAM_ACTIVE, "DCGM_FI_PROF_DRAM_ACTIVE"),
    Field(V.GPU_MEMORY_USED, "DCGM_FI_DEV_FB_USED", MIB),
    Field(V.GPU_MEMORY_FREE, "DCGM_FI_DEV_FB_FREE", MIB),
    Field(V.GPU_POWER, "DCGM_FI_DEV_POWER_USAGE"),
    Field(V.GPU_POWER_LIMIT, "DCGM_FI_DEV_POWER_MGMT_LIMIT"),
    Field(V.GPU_ENERGY, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),
    Field(V.GPU_SM_CLOCK, "DCGM_FI_DEV_SM_CLOCK", 1e6),
    Field(V.GPU_TEMPERATURE, "DCGM_FI_DEV_GPU_TEMP"),
    Field(V.GPU_THROTTLE_TIME, "DCGM_FI_DEV_POWER_VIOLATION", 1e-9, {V.LABEL_REASON: V.GPU_THROTTLE_POWER}),
    Field(V.GPU_THROTTLE_TIME, "DCGM_FI_DEV_THERMAL_VIOLATION", 1e-9, {V.LABEL_REASON: V.GPU_THROTTLE_THERMAL}),
)

CLOCK_EVENTS: Final = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
"""A bitmask gauge (opt-in field): PromQL has no bit operators, so it becomes one 0/1 series per reason."""
CLOCK_EVENT_BITS: Final[dict[int, str]] = {
    0x4: V.GPU_CLOCK_POWER_CAP,
    0x8: V.GPU_CLOCK_HW_SLOWDOWN,
    0x20: V.GPU_CLOCK_SW_THERMAL,
    0x40: V.GPU_CLOCK_HW_THERMAL,
    0x80: V.GPU_CLOCK_HW_POWER_BRAKE,
}
"""The bits that mean throttling (``dcgm_fields.h`` DCGM_CLOCKS_EVENT_REASON_*); idle (0x1), application
clocks (0x2), sync boost (0x10) and display clocks (0x100) are not throttling and are left out."""
XID: Final = "DCGM_FI_DEV_XID_ERRORS"
"""A gauge holding the last XID code, present only once the GPU had one (label ``err_code`` = the same code)."""
XID_CODE_LABEL: Final = "err_code"

SOURCES: Final[frozenset[str]] = frozenset({f.source for f in FIELDS} | {CLOCK_EVENTS, XID})

# the labels a GPU's samples carry, each with the spellings seen across versions and flags
GPU_INDEX: Final[tuple[str, ...]] = ("gpu",)
UUID: Final[tuple[str, ...]] = ("UUID", "uuid")
"""``uuid`` with ``--use-old-namespace``."""
MODEL_NAME: Final[tuple[str, ...]] = ("modelName",)
HOSTNAME: Final[tuple[str, ...]] = ("Hostname", "hostname")
"""``Hostname`` up to 4.8.2, ``hostname`` after; absent with ``-n``."""
POD: Final[tuple[str, ...]] = ("pod", "pod_name")
NAMESPACE: Final[tuple[str, ...]] = ("namespace", "pod_namespace")
"""Kubernetes (``-k``): the pod holding the GPU (``pod_name``/``pod_namespace`` with ``--use-old-namespace``)."""
