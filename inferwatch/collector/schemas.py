"""Response bodies of the collector's HTTP API, as pydantic models: ``/openapi.json`` documents each one.

Field names are the store's column names (:mod:`inferwatch.core.schema`): a request row in the API
is the table row. Times are ISO 8601 with an explicit UTC offset (``2024-05-01T12:00:00+00:00``).
The OTLP models describe the JSON encoding of ``/v1/traces`` answers; the endpoint writes them with
protobuf's own encoder (or as protobuf), not through these models.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema
from pydantic.json_schema import SkipJsonSchema


def _iso(value: datetime) -> str:
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()


IsoDateTime = Annotated[
    datetime,
    PlainSerializer(_iso, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}, mode="serialization"),
]
"""A UTC time, in JSON as ``datetime.isoformat()`` (``+00:00``, not ``Z``)."""

GroupBy = Literal["none", "engine", "model", "instance"]
Side = Literal["engine", "proxy", "all"]
"""Which stored rows count: ``engine``, the spans the engines (and any other service) sent; ``proxy``, those of
``inferwatch proxy`` (service ``inferwatch-proxy``: the client's view of the same requests); ``all``, both (a
request proxied to an engine that sends spans too is then counted twice)."""


class Schema(BaseModel):
    """Base of the response models: attribute docstrings become the documented descriptions."""

    model_config = ConfigDict(use_attribute_docstrings=True)


# --- errors and health -----------------------------------------------------------------------------------------------


class ErrorBody(Schema):
    """FastAPI's error body (401, 400, 404 of the JSON API)."""

    detail: str


class Health(Schema):
    status: Literal["ok"] = "ok"


class Readiness(Schema):
    """200 when the database answers and its schema is at the migrations' head, else 503."""

    database: str
    """``ok``, or what is wrong (the error, or ``migrations not at head``)."""
    queue_depth: int
    """records accepted and not yet taken by the writer."""


# --- OTLP (documentation of the JSON encoding) -----------------------------------------------------------------------


class OtlpPartialSuccess(Schema):
    rejected_spans: str = Field(alias="rejectedSpans")
    """int64, as protobuf's JSON mapping writes it: a decimal string."""
    error_message: str = Field(alias="errorMessage")
    """the distinct reasons, ``; ``-separated."""


class OtlpExportResponse(Schema):
    """``ExportTraceServiceResponse``; ``{}`` when every span was accepted."""

    partial_success: OtlpPartialSuccess | SkipJsonSchema[None] = Field(None, alias="partialSuccess")
    """absent when every span was accepted."""


class RpcStatus(Schema):
    """``google.rpc.Status``: the body of an OTLP/HTTP error."""

    code: int
    """gRPC status code (3 INVALID_ARGUMENT, 8 RESOURCE_EXHAUSTED, 14 UNAVAILABLE...)."""
    message: str


# --- requests --------------------------------------------------------------------------------------------------------


class RequestRow(Schema):
    """One stored request: the row of the request table, column for column."""

    id: int
    trace_id: str
    span_id: str
    request_id: str | None
    engine: str
    model: str | None
    instance: str | None
    service: str | None
    start_time: IsoDateTime
    end_time: IsoDateTime
    time_to_first_token: float | None
    """seconds."""
    ttft_derived: bool
    """True when TTFT was reconstructed (TGI)."""
    time_per_output_token: float | None
    request_duration: float | None
    """end-to-end seconds."""
    request_queue: float | None
    request_prefill: float | None
    request_decode: float | None
    prompt_tokens: int | None
    generation_tokens: int | None
    prefix_cache_hit_tokens: int | None
    finish_reason: str | None
    error: str | None
    n: int | None
    max_tokens: int | None
    temperature: float | None
    lora_adapter: str | None
    tenant: str | None = None
    """who sent it, as inferwatch proxy names it (a keyed hash of the API key, or a header's value)."""
    attributes: dict[str, Any]
    """span attributes not mapped to a column."""
    received_at: IsoDateTime


class RequestPage(Schema):
    data: list[RequestRow]
    count: int
    """requests matching the filters (all pages)."""
    next_cursor: str | None
    """pass as ``cursor`` for the next page; null on the last."""
    side: Side = "engine"
    """the rows listed: the engines' (``engine``), inferwatch proxy's (``proxy``) or both (``all``)."""
    service: str | None = None
    """only the rows of this ``service.name``; null: any."""


class Phase(Schema):
    seconds: float | None
    share: float | None
    """of the end-to-end time."""


class Phases(Schema):
    queue: Phase
    prefill: Phase
    decode: Phase
    other: Phase
    """end-to-end time not in the three phases."""


class RequestDetail(RequestRow):
    """One stored request with its phase breakdown."""

    phases: Phases


class RequestDetails(Schema):
    """Several rows answer the id: the samples of an ``n>1`` request share its request id, and request ids
    repeat across replicas (``instances`` then lists more than one: pass ``?instance=`` to pick one)."""

    data: list[RequestDetail]
    count: int
    instances: list[str | None]
    """the distinct instances of the rows, in the order of their first row."""


# --- stats -----------------------------------------------------------------------------------------------------------


class FieldStats(Schema):
    """Nearest-rank percentiles of one column (null when no row has a value): exact, or sketched within a
    stated relative error."""

    count: int
    """rows with a value (always exact)."""
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    exact: bool = True
    """true: the percentiles are observed values, exactly the nearest-rank percentiles of the rows; false:
    sketched (the window holds more requests than the exact limit, or ``percentiles=sketch``)."""
    relative_error: float = 0.0
    """bound on |reported - exact| / exact of each percentile (0 when exact; sketched values below 1 µs are
    reported as 0)."""


class Goodput(Schema):
    slos: dict[str, float]
    """the SLOs given, by column name."""
    good_requests: int
    share: float | None
    rate_per_second: float


class StatsGroup(Schema):
    """One group; its key (``engine``, ``model`` or ``instance``) only with ``group_by``, ``goodput`` only
    with an SLO."""

    requests: int
    failed: int
    prompt_tokens: int | None
    """sum over the requests that report it; null when none does."""
    generation_tokens: int | None
    """sum over the requests that report it; null when none does."""
    engine: str | None = None
    model: str | None = None
    instance: str | None = None
    time_to_first_token: FieldStats
    time_per_output_token: FieldStats
    request_duration: FieldStats
    request_queue: FieldStats
    goodput: Goodput | SkipJsonSchema[None] = None
    """only when an SLO is given."""


StatsPlan = Literal["values", "raw", "scan", "index", "sketch", "walk"]


class Stats(Schema):
    window_seconds: float
    """seconds from ``since`` to ``until`` (or now)."""
    since: IsoDateTime
    """the requests that finished at or after this count."""
    until: IsoDateTime | None = None
    """... and before this; null: no bound."""
    group_by: GroupBy
    plan: StatsPlan = "walk"
    """how the percentiles were found: ``values`` (exact; a small window's values from the per-minute value
    blocks, sorted), ``raw`` (exact; a small window's rows sorted), ``scan`` (exact; the
    window's rows in the percentiles' buckets),
    ``index`` (exact; those buckets read from the covering latency indexes), ``sketch`` (the rollups' log
    buckets, within ``relative_error``), ``walk`` (exact; index walks, while the rollups are far behind)."""
    side: Side = "engine"
    """the rows counted: the engines' (``engine``), inferwatch proxy's (``proxy``), or both (``all``: a request
    both sent spans for counts twice)."""
    service: str | None = None
    """only the rows of this ``service.name``; null: any."""
    data: list[StatsGroup]


# --- usage (chargeback) ----------------------------------------------------------------------------------------------

UsageGroupBy = Literal["tenant", "model"]
SloSource = Literal["file", "query", "none"]


class SloCount(Schema):
    """One latency SLO over a group's requests."""

    requests: int
    """requests the SLO applies to (its selector matches) that have the latency it reads."""
    met: int
    """... whose latency is at most the threshold."""
    attainment: float | None
    """``met / requests``; null without such requests."""


class UsageGroup(Schema):
    """One tenant's or model's requests in the range (or the rest beyond ``limit``, or the total)."""

    key: str | None
    """the tenant or the model; null: the rows without one (the engines' own spans have no tenant)."""
    requests: int
    failed: int
    """finish reason ``error`` or ``abort``, or an error recorded."""
    prompt_tokens: int | None
    """sum over the requests that report it; null when none does."""
    generation_tokens: int | None
    slo_requests: int
    """requests at least one latency SLO applies to (with the latency it reads)."""
    slo_met: int
    """... that met every latency SLO that applies to them."""
    slo_attainment: float | None
    """``slo_met / slo_requests``; null without such requests."""
    slos: dict[str, SloCount]
    """per latency SLO, by name."""
    cost_usd: float | None = None
    """null: the collector cannot price requests (``cost_note`` says why)."""


class UsageSlo(Schema):
    """A latency SLO the attainment is judged by."""

    name: str
    metric: str
    """the request column it reads (``time_to_first_token``, ...)."""
    threshold_seconds: float
    selector: dict[str, str]
    """the rows it applies to (``engine``, ``model`` or ``tenant`` equal to these)."""


class Usage(Schema):
    """Requests, tokens, SLO attainment and cost per tenant or model over a time range (``/api/v1/usage``)."""

    group_by: UsageGroupBy
    since: IsoDateTime
    """the requests that finished at or after this count ..."""
    until: IsoDateTime
    """... and before this."""
    side: Side
    """the rows counted (only inferwatch proxy's rows have a tenant)."""
    slo_source: SloSource
    """where the latency SLOs come from: the collector's SLO file, the query's ``slo_*``, or none."""
    slos: list[UsageSlo]
    groups: list[UsageGroup]
    """the busiest groups first (by requests), at most ``limit``."""
    groups_total: int
    """groups in the range (``groups`` holds them all unless ``truncated``)."""
    truncated: bool
    rest: UsageGroup | None = None
    """the groups beyond ``limit``, summed (key null); null when none."""
    total: UsageGroup
    """every counted request (key null)."""
    cost_note: str | None = None
    """why ``cost_usd`` is null, when it is."""
    notes: list[str] = Field(default_factory=list)
    """SLOs of the file that could not be applied to stored rows, and why."""
