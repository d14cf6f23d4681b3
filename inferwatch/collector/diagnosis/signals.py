"""Per-target signals: what the diagnosis knows about each engine replica over its window."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

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


@dataclass
class TargetSignals:
    key: TargetKey
    values: dict[Signal, Observation] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)
    """the labels of the engine's info series (configuration it reveals)."""
    info_query: str = ""
    spec_decode: Observation | None = None
    """draft tokens counted so far: present when the engine runs speculative decoding."""

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
