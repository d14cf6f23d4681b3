"""The headroom answer (``GET /api/v1/headroom``, ``inferwatch headroom``) and its diagnosis finding.

:func:`report` runs the model (:mod:`inferwatch.core.headroom`) on every replica of a history read
by :mod:`~inferwatch.collector.diagnosis.headroom_sources` and names each figure as the recording
rules do. :func:`capacity_findings` turns a model that needs more replicas than it has into the
``capacity_exhausted`` finding, which outranks the symptoms too little capacity causes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, Field

from inferwatch.collector.diagnosis.headroom_sources import History
from inferwatch.collector.diagnosis.report import Diagnosis, Evidence, Finding
from inferwatch.core import vocabulary as V
from inferwatch.core.engines.profile import EngineProfile
from inferwatch.core.headroom import HeadroomSettings, ReplicaHeadroom, ReplicasNeeded, headroom, replicas_needed
from inferwatch.core.headroom_fit import FitSettings
from inferwatch.core.headroom_inputs import windows
from inferwatch.core.slo import HeadroomRules, SLOFile
from inferwatch.core.symptoms import Status, Symptom

CAUSED_BY_CAPACITY = (
    Symptom.LATENCY_P99_HIGH,
    Symptom.TTFT_SLOW,
    Symptom.TPOT_SLOW,
    Symptom.PREEMPTIONS,
    Symptom.THROUGHPUT_LOW,
)
"""Symptoms too little capacity causes: with ``capacity_exhausted`` on their model they are its consequences."""
INPUTS = {
    "request_rate": V.REQUESTS.name,
    "running_mean": V.REQUESTS_RUNNING.name,
    "waiting_growth_per_second": V.REQUESTS_WAITING.name,
    "prompt_tokens_mean": V.PROMPT_TOKENS.name,
    "output_tokens_mean": V.GENERATION_TOKENS.name,
    "queue_seconds_mean": f"{V.REQUEST_QUEUE.name}_sum",
    "prefill_seconds_per_token": f"{V.REQUEST_PREFILL.name}_sum",
    "tpot_points": f"{V.TIME_PER_OUTPUT_TOKEN.name}_sum",
    "kv_usage_mean": V.KV_CACHE_USAGE.name,
    "kv_capacity_tokens": V.KV_CACHE_CAPACITY.name,
    "max_concurrency": V.ENGINE_INFO.name,
}
"""Each model input, and the series (as :func:`headroom_sources.range_queries` names it) it is read from."""


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


class HeadroomLimit(BaseModel):
    slo: str = Field(description=f"an SLO name, or {V.HEADROOM_KV_LIMIT!r} for the first preemption")
    metric: str
    concurrency: float | None = Field(description="the running batch at which it breaks")
    requests_per_second: float | None = Field(description="the request rate at which it breaks")
    reason: str | None = Field(None, description="why it is unknown")


class TpotFit(BaseModel):
    intercept_seconds: float | None
    slope_seconds_per_request: float | None
    points: int
    batch_min: float | None
    batch_max: float | None
    reason: str | None = Field(None, description="why the fit was refused")


class ReplicaHeadroomOut(BaseModel):
    engine: str
    model: str
    instance: str
    role: str
    headroom_ratio: float | None = Field(description="capacity / current load (< 1: over the edge)")
    capacity_requests_per_second: float | None
    capacity_concurrency: float | None
    limiting_slo: str | None = Field(description="the limit reached first")
    load_requests_per_second: float | None = Field(description="served requests per second plus the queue's growth")
    current_concurrency: float | None = Field(description="the mean running batch")
    limits: list[HeadroomLimit]
    fit: TpotFit | None
    reason: str | None = Field(None, description="why the headroom is unknown")
    notes: list[str]
    evidence: dict[str, str] = Field(description="each input of the model, and the query or scrape it came from")


class ModelReplicas(BaseModel):
    model: str
    role: str
    replicas: int = Field(description="replicas of the model (and role) seen")
    load_requests_per_second: float
    capacity_requests_per_second: float | None = Field(description="mean capacity of the replicas that have one")
    replicas_needed: int | None = Field(description="replicas of that capacity that carry the load")
    reason: str | None = None
    evidence: str


class HeadroomReport(BaseModel):
    source: Literal["prometheus", "exporters"]
    upstream: str
    window: str
    step_seconds: float
    replicas: list[ReplicaHeadroomOut]
    models: list[ModelReplicas]
    note: str | None = None


def settings_of(spec: SLOFile | None) -> HeadroomSettings:
    if spec is None:
        return HeadroomSettings()
    h = spec.headroom
    return HeadroomSettings(fit=FitSettings(min_points=h.min_points), kv_fluctuation_z=h.kv_fluctuation_z)


def _replica(r: ReplicaHeadroom, evidence: dict[str, str]) -> ReplicaHeadroomOut:
    fit = r.fit
    return ReplicaHeadroomOut(
        engine=r.key.engine,
        model=r.key.model,
        instance=r.key.instance,
        role=r.key.role,
        headroom_ratio=_finite(r.headroom_ratio),
        capacity_requests_per_second=_finite(r.capacity_requests_per_second),
        capacity_concurrency=_finite(r.capacity_concurrency),
        limiting_slo=r.limiting_slo,
        load_requests_per_second=_finite(r.current_requests_per_second),
        current_concurrency=_finite(r.current_concurrency),
        limits=[
            HeadroomLimit(
                slo=lim.slo,
                metric=lim.metric,
                concurrency=_finite(lim.concurrency),
                requests_per_second=_finite(lim.requests_per_second),
                reason=lim.reason,
            )
            for lim in r.limits
        ],
        fit=None
        if fit is None
        else TpotFit(
            intercept_seconds=_finite(fit.intercept),
            slope_seconds_per_request=_finite(fit.slope),
            points=fit.points,
            batch_min=fit.batch_min,
            batch_max=fit.batch_max,
            reason=fit.reason,
        ),
        reason=r.reason,
        notes=list(r.notes),
        evidence={name: evidence.get(series, series) for name, series in INPUTS.items()},
    )


def _model(n: ReplicasNeeded, source: str) -> ModelReplicas:
    how = (
        f"ceil(sum of the {n.replicas} replicas' load / their mean capacity), from the same {source} reads; "
        f'with the rules loaded: {V.REPLICAS_NEEDED_RECORD}{{model="{n.model}", role="{n.role}"}}'
    )
    return ModelReplicas(
        model=n.model,
        role=n.role,
        replicas=n.replicas,
        load_requests_per_second=n.requests_per_second,
        capacity_requests_per_second=_finite(n.capacity_requests_per_second),
        replicas_needed=n.replicas_needed,
        reason=n.reason,
        evidence=how,
    )


def report(
    history: History, spec: SLOFile, window: str, step_seconds: float, profiles: Mapping[str, EngineProfile]
) -> HeadroomReport:
    """Every replica's headroom and every model's replicas needed, from one history."""
    settings = settings_of(spec)
    results = [headroom(w, settings) for w in windows(history.snapshots, spec, step_seconds, profiles)]
    note = None
    if len(history.snapshots) < 2:
        note = f"{len(history.snapshots)} snapshot(s) of the window: no replica could be judged"
    return HeadroomReport(
        source="prometheus" if history.source == "prometheus" else "exporters",
        upstream=history.upstream,
        window=window,
        step_seconds=step_seconds,
        replicas=[_replica(r, history.evidence) for r in results],
        models=[_model(n, history.source) for n in replicas_needed(results)],
        note=note,
    )


def _more(n: int) -> str:
    return f"{n} more replica" + ("" if n == 1 else "s")


def capacity_findings(result: Diagnosis, found: HeadroomReport, spec: SLOFile | None) -> None:
    """Add ``capacity_exhausted`` per model whose load needs more replicas than it has, first in the
    findings; the symptoms it causes on that model's replicas become its consequences (critical ->
    warning, with a note), as a symptom's consequences do in the catalogue."""
    low = (spec.headroom if spec is not None else HeadroomRules()).low_ratio
    added: list[Finding] = []
    for m in found.models:
        replicas = [r for r in found.replicas if r.model == m.model and r.role == m.role]
        judged = [r for r in replicas if r.headroom_ratio is not None]
        if m.replicas_needed is None or m.capacity_requests_per_second is None or not judged:
            continue
        margin = math.ceil(m.load_requests_per_second * low / m.capacity_requests_per_second - 1e-9)
        if m.replicas_needed > m.replicas:
            severity, more = Status.CRITICAL, m.replicas_needed - m.replicas
        elif margin > m.replicas:
            severity, more = Status.WARNING, margin - m.replicas
        else:
            continue
        added.append(_finding(m, judged, severity, more, low))
    if not added:
        return
    exhausted = {f.model for f in added}
    for finding in result.findings:
        if finding.model in exhausted and finding.symptom in CAUSED_BY_CAPACITY:
            if finding.severity is Status.CRITICAL:
                finding.severity = Status.WARNING
            finding.summary += f" (a consequence of {Symptom.CAPACITY_EXHAUSTED.value}: scale out first)"
    result.findings[:0] = sorted(added, key=lambda f: (f.severity is not Status.CRITICAL, f.model))


def _finding(
    m: ModelReplicas, judged: Sequence[ReplicaHeadroomOut], severity: Status, more: int, low: float
) -> Finding:
    first = min(judged, key=lambda r: r.headroom_ratio or 0.0)
    limiting = first.limiting_slo or "its first SLO"
    what = "the KV cache without preemptions" if limiting == V.HEADROOM_KV_LIMIT else f"the {limiting} SLO"
    role = "" if m.role == V.ROLE_UNIFIED else f" ({m.role})"
    summary = (
        f"scale out: {_more(more)} of model {m.model}{role} {'holds' if more == 1 else 'hold'} {what} at the "
        "current load "
        f"({m.load_requests_per_second:.3g} req/s; {m.replicas} replica(s) of about "
        f"{m.capacity_requests_per_second or 0:.3g} req/s each"
        + ("" if severity is Status.CRITICAL else f", kept at {low:g}x headroom")
        + ")"
    )
    evidence = [
        Evidence(
            signal="headroom_ratio",
            description=f"{r.engine} {r.model} @ {r.instance}: capacity / load, limit {r.limiting_slo}",
            value=r.headroom_ratio or 0.0,
            unit="x",
            threshold="< 1" if severity is Status.CRITICAL else f"< {low:g}",
            query=f'{V.HEADROOM_RATIO_RECORD}{{model="{r.model}", instance="{r.instance}"}}; inputs: '
            + r.evidence.get("tpot_points", ""),
        )
        for r in sorted(judged, key=lambda r: r.headroom_ratio or 0.0)[:5]
    ]
    evidence.append(
        Evidence(
            signal="replicas_needed",
            description=f"replicas of {m.model}{role} that hold its SLOs at the current load",
            value=float(m.replicas_needed or 0),
            unit="replicas",
            threshold=f"> {m.replicas} running",
            query=m.evidence,
        )
    )
    engines = sorted({r.engine for r in judged})
    return Finding(
        symptom=Symptom.CAPACITY_EXHAUSTED,
        severity=severity,
        engine=engines[0] if len(engines) == 1 else ",".join(engines),
        model=m.model,
        instance=", ".join(sorted({r.instance for r in judged}))[:200],
        summary=summary,
        cause=f"the load is beyond what {m.replicas} replica(s) serve within the SLOs (docs/headroom.md)",
        remedies=[
            f"add {_more(more)} of {m.model} ({V.REPLICAS_NEEDED_RECORD} drives the generated KEDA/HPA objects)",
            "or shed load at the router until the new replicas are ready",
        ],
        evidence=evidence,
        runbook=V.ALERT_HEADROOM_LOW.lower(),
    )
