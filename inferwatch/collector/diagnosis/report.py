"""The diagnosis as it is answered: pydantic models, so ``/openapi.json`` documents every field."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from inferwatch.collector.schemas import RequestDetail
from inferwatch.core.causes import Cause
from inferwatch.core.checklist import Check, Verdict
from inferwatch.core.symptoms import Status, Symptom


class Evidence(BaseModel):
    signal: str = Field(description="what was measured, e.g. queue_p99")
    description: str = Field(description="the signal in words")
    value: float
    unit: str
    threshold: str | None = Field(None, description="the condition it was compared with, e.g. '> 5'")
    query: str = Field(description="the exact PromQL (paste it into Grafana) or the exporter samples")


class Finding(BaseModel):
    symptom: Symptom
    severity: Literal[Status.WARNING, Status.CRITICAL]
    engine: str
    model: str
    instance: str
    summary: str
    cause: str
    likely_cause: Cause | None = Field(
        None,
        description="which of the symptom's causes the GPU's series point at (throughput_low: gpu_saturated, "
        "outside_gpu, gpu_throttled; tpot_slow: memory_bandwidth, small_batches, outside_gpu, gpu_throttled); "
        "null when the symptom has one cause or no GPU series tell them apart",
    )
    remedies: list[str]
    evidence: list[Evidence]
    runbook: str
    example_requests: list[RequestDetail] = Field(
        default_factory=list, description="the slowest matching requests of the window, with their phases"
    )


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
    note: str | None = Field(None, description="e.g. why the exporters were read instead of Prometheus")
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
    note: str | None = None
    targets: list[TargetChecklist]


class CapacityPlan(BaseModel):
    kv_dtype: str
    bytes_per_element: float
    kv_bytes_per_token: float = Field(description="all layers and KV heads, over every tensor-parallel GPU")
    kv_bytes_per_token_per_gpu: float
    kv_bytes_per_sequence: float | None = Field(description="one sequence of max_model_len tokens")
    kv_bytes_for_batch: float | None = Field(description="batch sequences of max_model_len tokens")
    weights_bytes: float | None
    weights_estimated: bool
    kv_budget_bytes_per_gpu: float | None
    kv_tokens: int | None = Field(description="KV tokens that fit")
    max_sequences_at_max_len: int | None
    max_sequences_at_average: int | None
    notes: list[str]


class ObservedCapacity(BaseModel):
    engine: str
    model: str
    instance: str
    kv_capacity_tokens: float | None
    kv_usage: float | None
    preemptions_per_second: float | None
    average_sequence_tokens: float | None = Field(description="this window's mean prompt + output per request")
    supported_concurrency: int | None = Field(description="sequences the cache holds at once before preempting")
    plan_vs_observed: float | None = Field(description="planned KV tokens / observed capacity")
    summary: str


class Capacity(BaseModel):
    plan: CapacityPlan | None
    observed: list[ObservedCapacity]
    note: str | None = None
