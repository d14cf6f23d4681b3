"""A symptom judged on one target, and a finding's evidence: each figure with its words, its unit and the
exact query it came from."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from inferwatch.collector.diagnosis.report import Evidence
from inferwatch.collector.diagnosis.signals import PROXY, GpuReading, Observation, TargetSignals
from inferwatch.core.causes import Cause
from inferwatch.core.symptoms import SIGNALS, Remedy, Signal, Status


def _nothing(status: Status) -> list[Evidence | None]:
    return []


def _untitled(status: Status) -> str:
    return ""


@dataclass
class Judgement:
    """One symptom on one target: its status and, should it be a finding, the finding's parts. The summary
    and the evidence are told the final status: a consequence of another finding is judged critical but
    reported as a warning, and its figures are then compared with the warning threshold."""

    status: Status
    reason: str | None = None
    """why it is unknown."""
    summary: Callable[[Status], str] = _untitled
    evidence: Callable[[Status], list[Evidence | None]] = _nothing
    cause: str = ""
    remedies: tuple[Remedy, ...] = ()
    likely_cause: Cause | None = None
    extra: list[Evidence | None] = field(default_factory=list)
    """evidence added after the judgement (the GPU's, for a symptom judged from the engine's signals)."""


AT_PROXY = " (measured by inferwatch proxy, as its clients see it: the engine does not export it)"
"""appended to a signal the proxy measured in the engine's place."""


def fmt(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value:.1%}" if value < 10 else f"{value:.3g}"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:.3g} {unit}".strip()


def described(signal: Signal, obs: Observation) -> str:
    return SIGNALS[signal].description + (AT_PROXY if obs.measured_at == PROXY else "")


def evidence(target: TargetSignals, signal: Signal, condition: str | None) -> Evidence | None:
    """The signal as evidence (``None`` when the target lacks it), compared with ``condition``."""
    obs = target.get(signal)
    if obs is None:
        return None
    spec = SIGNALS[signal]
    return Evidence(
        signal=signal.value,
        description=described(signal, obs),
        value=obs.value,
        unit=spec.unit,
        threshold=condition,
        query=obs.query,
    )


def reading(name: str, description: str, item: GpuReading, unit: str) -> Evidence:
    """One GPU's figure as evidence: ``name`` says what kind (``gpu_throttle``, ``gpu_xid``)."""
    return Evidence(
        signal=name, description=f"{item.gpu}: {description}", value=item.value, unit=unit, query=item.query
    )


def unique(items: Iterable[Evidence | None]) -> list[Evidence]:
    """The evidence without gaps, each figure once (a signal once; a per-GPU reading once per GPU and what)."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for item in items:
        if item is None:
            continue
        key = (item.signal, item.description)
        if key not in seen:
            seen.add(key)
            kept.append(item)
    return kept
