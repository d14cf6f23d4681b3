"""The diagnosis as it is answered: pydantic models, so ``/openapi.json`` documents every field."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from inferwatch.core.checklist import Check, Verdict
from inferwatch.core.symptoms import Status, Symptom


class Evidence(BaseModel):
    signal: str = Field(description="what was measured, e.g. queue_p99")
    description: str = Field(description="the signal in words")
    value: float
    unit: str
    threshold: str | None = Field(None, description="the condition it was compared with, e.g. '> 5'")
    query: str = Field(description="the exact PromQL (paste it into Grafana) or the exporter samples")


class PhaseShare(BaseModel):
    seconds: float | None
    share: float | None = Field(description="of the end-to-end latency")


class ExampleRequest(BaseModel):
    id: int
    request_id: str | None
    trace_id: str
    engine: str
    model: str | None
    instance: str | None
    start_time: str
    request_duration: float | None
    time_to_first_token: float | None
    time_per_output_token: float | None
    finish_reason: str | None
    phases: dict[str, PhaseShare] = Field(description="queue, prefill, decode and other")


class Finding(BaseModel):
    symptom: Symptom
    severity: Literal[Status.WARNING, Status.CRITICAL]
    engine: str
    model: str
    instance: str
    summary: str
    cause: str
    remedies: list[str]
    evidence: list[Evidence]
    runbook: str
    example_requests: list[ExampleRequest] = Field(default_factory=list)


class TargetStatus(BaseModel):
    engine: str
    model: str
    instance: str
    status: dict[Symptom, Status]
    reasons: dict[Symptom, str] = Field(
        default_factory=dict, description="why a symptom is unknown for this target (coverage, no data)"
    )


class Diagnosis(BaseModel):
    window: str
    source: Literal["prometheus", "exporters"]
    targets: list[TargetStatus]
    findings: list[Finding] = Field(description="most severe first")
    upstream_queries: int = Field(description="queries made to Prometheus, or exporter scrapes")


class CheckResult(BaseModel):
    check: Check
    question: str
    verdict: Verdict
    evidence: list[str]
    remedy: str | None = Field(None, description="what to change, in this engine's terms (when not pass)")


class TargetChecklist(BaseModel):
    engine: str
    model: str
    instance: str
    items: list[CheckResult]


class Checklist(BaseModel):
    window: str
    source: Literal["prometheus", "exporters", "launch"]
    targets: list[TargetChecklist]
