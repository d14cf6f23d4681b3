"""Per-target signals: what the diagnosis knows about each engine replica over its window."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from inferwatch.core import vocabulary as V
from inferwatch.core.slo import MeasuredAt
from inferwatch.core.symptoms import Signal

Source = Literal["prometheus", "exporters"]
ENGINE: MeasuredAt = "engine"
PROXY: MeasuredAt = "proxy"


class UpstreamError(RuntimeError):
    """Prometheus or an exporter could not be read: unreachable, too slow, or an error answer."""

    def __init__(self, upstream: str, message: str) -> None:
        super().__init__(f"{upstream}: {message}")
        self.upstream = upstream
        self.message = message


@dataclass(frozen=True, order=True)
class TargetKey:
    """One engine replica: its engine, model and ``instance`` (the exporter it is scraped through)."""

    engine: str
    model: str
    instance: str


@dataclass(frozen=True)
class Observation:
    value: float
    query: str
    """the exact PromQL, or the exporter samples, the value came from."""
    measured_at: MeasuredAt = ENGINE
    """who measured it: the engine (its exporter), or inferwatch proxy in front of it where the engine
    exports no such signal (its client-side counterpart, ``V.CLIENT_COUNTERPARTS``)."""


@dataclass(frozen=True)
class GpuReading:
    """One GPU's figure behind a GPU finding: which GPU, what was read, and its value over the window."""

    gpu: str
    """the GPU as an on-call finds it: ``GPU 0 (GPU-3f6a2c1e-…) on gpu-node-01``."""
    what: str
    """a clock-event reason (``power_cap``), a throttle cause (``power``), or an XID code."""
    value: float
    """the share of the window the reason held; throttled seconds per second; 1 for an XID seen."""
    query: str


@dataclass
class GpuReadings:
    """The per-GPU figures of one replica (several GPUs under tensor parallelism). An empty list means the
    GPU source exports no such family (opt-in fields), or no XID happened."""

    clock_events: list[GpuReading] = field(default_factory=list)
    """share of the window each throttling clock-event reason held, per GPU."""
    throttle_time: list[GpuReading] = field(default_factory=list)
    """throttled seconds per second, per GPU and cause (power, thermal)."""
    xids: list[GpuReading] = field(default_factory=list)
    """the XID codes seen in the window, per GPU."""


LABEL_MAX = 64
"""a label value shown in a finding is cut here: they come from the network (a GPU source's page)."""


def shown_label(value: str) -> str:
    return value if len(value) <= LABEL_MAX else value[: LABEL_MAX - 1] + "…"


def gpu_name(labels: Mapping[str, str]) -> str:
    """``GPU 0 (GPU-3f6a2c1e-…) on gpu-node-01`` from a GPU series' labels (the parts it has)."""
    index, uuid, host = (shown_label(labels.get(k, "")) for k in (V.LABEL_GPU, V.LABEL_GPU_UUID, V.LABEL_HOST))
    text = f"GPU {index}" if index else "GPU"
    if uuid:
        text += f" ({uuid})"
    return text + (f" on {host}" if host else "")


@dataclass
class TargetSignals:
    key: TargetKey
    values: dict[Signal, Observation] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)
    """the labels of the engine's info series (configuration it reveals)."""
    info_query: str = ""
    spec_decode: Observation | None = None
    """draft tokens counted so far: present when the engine runs speculative decoding."""
    gpus: GpuReadings = field(default_factory=GpuReadings)

    def get(self, signal: Signal) -> Observation | None:
        return self.values.get(signal)

    def put(self, signal: Signal, value: float, query: str, measured_at: MeasuredAt = ENGINE) -> None:
        if math.isfinite(value):
            self.values[signal] = Observation(value, query, measured_at)


@dataclass
class Fleet:
    """Every target's signals, as read from one source over one window."""

    source: Source
    window: str
    window_seconds: float
    targets: dict[TargetKey, TargetSignals] = field(default_factory=dict)
    upstream_queries: int = 0
    upstream: str = ""

    def target(self, key: TargetKey) -> TargetSignals:
        found = self.targets.get(key)
        if found is None:
            found = self.targets[key] = TargetSignals(key)
        return found


@dataclass(frozen=True)
class Filters:
    engine: str | None = None
    model: str | None = None
    instance: str | None = None

    def matches(self, key: TargetKey) -> bool:
        return (
            (self.engine is None or key.engine == self.engine)
            and (self.model is None or key.model == self.model)
            and (self.instance is None or key.instance == self.instance)
        )
