"""Signals + the symptom catalogue -> per-target statuses and findings (pure: no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from inferwatch.collector.diagnosis import gpu
from inferwatch.collector.diagnosis.evidence import AT_PROXY as AT_PROXY  # the finding's words, re-exported
from inferwatch.collector.diagnosis.evidence import Judgement, evidence, fmt, unique
from inferwatch.collector.diagnosis.report import Diagnosis, Evidence, Finding, TargetStatus
from inferwatch.collector.diagnosis.signals import PROXY, Fleet, TargetKey, TargetSignals
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


def _summary(spec: SymptomSpec, threshold: Threshold, status: Status, target: TargetSignals) -> str:
    obs = target.get(threshold.signal)
    assert obs is not None
    unit = SIGNALS[threshold.signal].unit
    limit = threshold.critical if status is Status.CRITICAL else threshold.warning
    text = f"{spec.title}: {SIGNALS[threshold.signal].description} {fmt(obs.value, unit)} > {fmt(limit, unit)}"
    return text + (AT_PROXY if obs.measured_at == PROXY else "")


def _judge(
    spec: SymptomSpec,
    threshold: Threshold,
    target: TargetSignals,
    unknown: str | None,
    gates: list[tuple[Gate, bool | None, Evidence | None]],
) -> Judgement:
    """A symptom judged from the catalogue alone: its threshold's signal, while its gates hold."""
    if unknown is not None:
        return Judgement(Status.UNKNOWN, reason=unknown)
    if any(held is False for _, held, _ in gates):
        return Judgement(Status.OK)
    obs = target.get(threshold.signal)
    assert obs is not None

    def shown(status: Status) -> list[Evidence | None]:
        limit = threshold.critical if status is Status.CRITICAL else threshold.warning
        head = evidence(target, threshold.signal, f"> {limit:g}")
        return [head, *(ev for _, _, ev in gates), *(evidence(target, s, None) for s in spec.evidence)]

    return Judgement(
        threshold.status(obs.value),
        summary=lambda status: _summary(spec, threshold, status, target),
        evidence=shown,
        cause=spec.cause,
        remedies=spec.remedies,
    )


def _finding(
    spec: SymptomSpec, key: TargetKey, judged: Judgement, status: Status, note: str, profile: EngineProfile | None
) -> Finding:
    return Finding(
        symptom=spec.id,
        severity=status,
        engine=key.engine,
        model=key.model,
        instance=key.instance,
        summary=judged.summary(status) + note,
        cause=judged.cause,
        likely_cause=judged.likely_cause,
        remedies=[remedy_text(r, profile) for r in judged.remedies],
        evidence=unique([*judged.evidence(status), *judged.extra]),
        runbook=spec.runbook,
    )


def diagnose(
    fleet: Fleet,
    profiles: Mapping[str, EngineProfile],
    settings: Settings | None = None,
    catalogue: tuple[SymptomSpec, ...] = CATALOGUE,
) -> Diagnosis:
    """Every target's status per symptom, and a finding for each warning or critical one.

    Most symptoms are judged from the catalogue's threshold and gates; the GPU findings and
    ``throughput_low`` by :mod:`~inferwatch.collector.diagnosis.gpu`, which also names the likely cause
    of ``tpot_slow`` from the GPU's activity."""
    settings = settings or Settings()
    specs = {spec.id: spec for spec in (*CATALOGUE, *catalogue)}
    targets: list[TargetStatus] = []
    findings: list[Finding] = []
    order = {spec.id: i for i, spec in enumerate(catalogue)}

    def threshold_of(symptom: Symptom) -> Threshold:
        return settings.threshold(specs[symptom])

    for key, target in sorted(fleet.targets.items()):
        profile = profiles.get(key.engine)
        statuses: dict[Symptom, Status] = {}
        reasons: dict[Symptom, str] = {}
        # symptoms others are consequences of go first
        for spec in sorted(catalogue, key=lambda s: (len(s.secondary_to), order[s.id])):
            threshold = settings.threshold(spec)
            unknown = _unknown_reason(spec, target, profile)
            gates = [(g, _gate_holds(g, target), evidence(target, g.signal, _gate_text(g, target))) for g in spec.gates]
            judge = gpu.JUDGES.get(spec.id)
            if judge is not None:
                context = gpu.Context(
                    spec, threshold, target, fleet.window_seconds, unknown, tuple(gates), threshold_of
                )
                judged = judge(context)
            else:
                judged = _judge(spec, threshold, target, unknown, gates)
            if spec.id is Symptom.TPOT_SLOW:
                judged = gpu.refine_tpot(judged, target, threshold_of)
            if judged.status is Status.UNKNOWN:
                statuses[spec.id], reasons[spec.id] = Status.UNKNOWN, judged.reason or "no data in the window"
                continue
            status, note = judged.status, ""
            primary = [s for s in spec.secondary_to if statuses.get(s) is Status.CRITICAL]
            if status is Status.CRITICAL and primary:
                status = Status.WARNING
                note = f" (a consequence of {', '.join(p.value for p in primary)}: fix that first)"
            statuses[spec.id] = status
            if status in (Status.WARNING, Status.CRITICAL):
                findings.append(_finding(spec, key, judged, status, note, profile))
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
