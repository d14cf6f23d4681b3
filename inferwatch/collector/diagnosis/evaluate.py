"""Signals + the symptom catalogue -> per-target statuses and findings (pure: no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from inferwatch.collector.diagnosis.report import Diagnosis, Evidence, Finding, TargetStatus
from inferwatch.collector.diagnosis.signals import PROXY, Fleet, Observation, TargetSignals
from inferwatch.core import vocabulary as V
from inferwatch.core.engines.profile import EngineProfile
from inferwatch.core.symptoms import (
    CATALOGUE,
    SEVERITY_ORDER,
    SIGNALS,
    Gate,
    Remedy,
    Signal,
    Status,
    Symptom,
    SymptomSpec,
    Threshold,
)


@dataclass(frozen=True)
class Settings:
    """What the evaluation may be told: threshold overrides and SLO-derived latency thresholds."""

    overrides: Mapping[Symptom, tuple[float, float]] = field(default_factory=dict)
    slo_thresholds: Mapping[str, float] = field(default_factory=dict)
    """canonical metric key -> the tightest latency SLO threshold on it (seconds)."""

    def threshold(self, spec: SymptomSpec) -> Threshold:
        if spec.id in self.overrides:
            warning, critical = self.overrides[spec.id]
            return Threshold(spec.threshold.signal, warning, critical)
        if spec.slo_metric is not None and spec.slo_metric.key in self.slo_thresholds:
            limit = self.slo_thresholds[spec.slo_metric.key]
            return Threshold(spec.threshold.signal, limit, 2 * limit)
        return spec.threshold


def _fmt(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value:.1%}" if value < 10 else f"{value:.3g}"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:.3g} {unit}".strip()


AT_PROXY = " (measured by inferwatch proxy, as its clients see it: the engine does not export it)"
"""appended to a signal the proxy measured in the engine's place."""


def _described(signal: Signal, obs: Observation) -> str:
    return SIGNALS[signal].description + (AT_PROXY if obs.measured_at == PROXY else "")


def _evidence(target: TargetSignals, signal: Signal, condition: str | None) -> Evidence | None:
    obs = target.get(signal)
    if obs is None:
        return None
    spec = SIGNALS[signal]
    return Evidence(
        signal=signal.value,
        description=_described(signal, obs),
        value=obs.value,
        unit=spec.unit,
        threshold=condition,
        query=obs.query,
    )


def _gate_holds(gate: Gate, target: TargetSignals) -> bool | None:
    obs = target.get(gate.signal)
    scale = 1.0
    if gate.of is not None:
        other = target.get(gate.of)
        if other is None:
            return None
        scale = other.value
    if obs is None:
        return None
    if gate.above is not None and not obs.value > gate.above * scale:
        return False
    return not (gate.below is not None and not obs.value < gate.below * scale)


def _gate_text(gate: Gate, target: TargetSignals) -> str:
    of = ""
    scale = 1.0
    if gate.of is not None:
        other = target.get(gate.of)
        scale = other.value if other else 1.0
        of = f" × {gate.of.value} ({scale:g})"
    if gate.above is not None:
        return f"> {gate.above:g}{of}"
    return f"< {gate.below:g}{of}"


def _unknown_reason(spec: SymptomSpec, target: TargetSignals, profile: EngineProfile | None) -> str | None:
    for signal in spec.required():
        if target.get(signal) is not None:
            continue
        for metric in SIGNALS[signal].metrics:
            if profile is not None and metric.key in profile.unsupported:
                reason = profile.unsupported[metric.key]
                if metric.key in V.CLIENT_COUNTERPARTS:
                    reason += "; no inferwatch proxy in front of it measured it either"
                return reason
        if signal is Signal.MAX_CONCURRENCY:
            return "the engine does not reveal its concurrency limit (max_concurrency of its info series)"
        return f"no data in the window for {SIGNALS[signal].description}"
    return None


def remedy_text(remedy: Remedy, profile: EngineProfile | None) -> str:
    """A remedy in the engine's own terms: the knob as typed on its launch line."""
    if profile is None or not remedy.knobs:
        return remedy.text
    knobs = [profile.knob(k) for k in remedy.knobs]
    spelled = "; ".join(k for k in knobs if k)
    if not spelled:
        return f"{remedy.text} ({profile.title} has no knob for it)"
    return f"{remedy.text} ({profile.title}: {spelled})"


def _summary(spec: SymptomSpec, threshold: Threshold, status: Status, target: TargetSignals, note: str) -> str:
    obs = target.get(threshold.signal)
    assert obs is not None
    unit = SIGNALS[threshold.signal].unit
    limit = threshold.critical if status is Status.CRITICAL else threshold.warning
    text = f"{spec.title}: {SIGNALS[threshold.signal].description} {_fmt(obs.value, unit)} > {_fmt(limit, unit)}"
    return text + (AT_PROXY if obs.measured_at == PROXY else "") + note


def diagnose(
    fleet: Fleet,
    profiles: Mapping[str, EngineProfile],
    settings: Settings | None = None,
    catalogue: tuple[SymptomSpec, ...] = CATALOGUE,
) -> Diagnosis:
    """Every target's status per symptom, and a finding for each warning or critical one."""
    settings = settings or Settings()
    targets: list[TargetStatus] = []
    findings: list[Finding] = []
    order = {spec.id: i for i, spec in enumerate(catalogue)}
    for key, target in sorted(fleet.targets.items()):
        profile = profiles.get(key.engine)
        statuses: dict[Symptom, Status] = {}
        reasons: dict[Symptom, str] = {}
        # symptoms others are consequences of go first
        for spec in sorted(catalogue, key=lambda s: (len(s.secondary_to), order[s.id])):
            reason = _unknown_reason(spec, target, profile)
            if reason is not None:
                statuses[spec.id], reasons[spec.id] = Status.UNKNOWN, reason
                continue
            threshold = settings.threshold(spec)
            gates = [(g, _gate_holds(g, target)) for g in spec.gates]
            if any(held is False for _, held in gates):
                statuses[spec.id] = Status.OK
                continue
            obs = target.get(threshold.signal)
            assert obs is not None
            status = threshold.status(obs.value)
            note = ""
            primary = [s for s in spec.secondary_to if statuses.get(s) is Status.CRITICAL]
            if status is Status.CRITICAL and primary:
                status = Status.WARNING
                note = f" (a consequence of {', '.join(p.value for p in primary)}: fix that first)"
            statuses[spec.id] = status
            if status not in (Status.WARNING, Status.CRITICAL):
                continue
            limit = threshold.critical if status is Status.CRITICAL else threshold.warning
            evidence = [_evidence(target, threshold.signal, f"> {limit:g}")]
            evidence += [_evidence(target, g.signal, _gate_text(g, target)) for g, _ in gates]
            evidence += [_evidence(target, s, None) for s in spec.evidence]
            seen: set[str] = set()
            kept = []
            for item in evidence:
                if item is not None and item.signal not in seen:
                    seen.add(item.signal)
                    kept.append(item)
            findings.append(
                Finding(
                    symptom=spec.id,
                    severity=status,
                    engine=key.engine,
                    model=key.model,
                    instance=key.instance,
                    summary=_summary(spec, threshold, status, target, note),
                    cause=spec.cause,
                    remedies=[remedy_text(r, profile) for r in spec.remedies],
                    evidence=kept,
                    runbook=spec.runbook,
                )
            )
        targets.append(
            TargetStatus(
                engine=key.engine,
                model=key.model,
                instance=key.instance,
                status={spec.id: statuses[spec.id] for spec in catalogue},
                reasons=reasons,
            )
        )
    findings.sort(key=lambda f: (SEVERITY_ORDER[f.severity], order[f.symptom], f.engine, f.model, f.instance))
    return Diagnosis(
        window=fleet.window,
        source=fleet.source,
        targets=targets,
        findings=findings,
        upstream_queries=fleet.upstream_queries,
    )
