"""SLOs as data: the SLO file (``slos.yaml``), its validation, and the burn-rate alert windows.

Shared by every consumer of SLOs (the rule generator, the dashboards, later the diagnosis), so it
lives in the core. Errors name the file, the line and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from inferwatch.core import vocabulary as V
from inferwatch.core.pricing import CostSettings
from inferwatch.core.yamlfile import YAMLSyntaxError, load_located

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$")
_SERVICE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,62}[A-Za-z0-9])?$")
_DURATION = re.compile(r"^(\d+)([mhdw])$")
_HOURS = {"m": 1 / 60, "h": 1, "d": 24, "w": 168}


DEFAULT_MIN_REQUESTS = 10
"""Below this many requests in a burn alert's long window, one slow request is 10 % of the traffic:
a ratio that pages on noise. 10 keeps a 99 % SLO's page (14.4x budget = 14.4 % bad) from firing on a
single bad request in the hour."""
PERIOD_RULES_INTERVAL = "5m"
"""How often the period SLI, budget and period burn rate are recomputed (a slower rule group)."""


class SLOFileError(ValueError):
    """The SLO file is invalid; the message names the file, line and field."""


def period_hours(period: str) -> float:
    m = _DURATION.match(period)
    if not m:
        raise ValueError(f"period {period!r} must be a number of m, h, d or w (e.g. 30d)")
    return int(m.group(1)) * _HOURS[m.group(2)]


MeasuredAt = Literal["engine", "proxy"]
"""Where an SLI is measured: the engine's own metrics (its exporter), or ``inferwatch proxy`` in front
of it (``llm_client_*``: what the client sees, and the only TTFT TGI has)."""


class LatencyIndicator(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metric: str
    threshold_seconds: float = Field(gt=0)
    measured_at: MeasuredAt = "engine"

    @field_validator("metric")
    @classmethod
    def _metric(cls, value: str) -> str:
        keys = [s.key for s in V.LATENCY_HISTOGRAMS]
        if value not in keys:
            raise ValueError(f"unknown latency metric {value!r}; one of: {', '.join(keys)}")
        return value

    @model_validator(mode="after")
    def _proxy_measures_it(self) -> LatencyIndicator:
        if self.measured_at == "proxy" and self.metric not in V.CLIENT_COUNTERPARTS:
            proxied = [k for k in V.CLIENT_COUNTERPARTS if k in {s.key for s in V.LATENCY_HISTOGRAMS}]
            raise ValueError(
                f"the proxy does not measure {self.metric!r}; measured_at: proxy takes one of: {', '.join(proxied)}"
            )
        return self

    def histogram(self) -> V.MetricSpec:
        """The histogram the SLI reads: the engine's, or the proxy's measurement of the same latency."""
        spec = V.metric_by_key(self.metric)
        return V.CLIENT_COUNTERPARTS[spec.key] if self.measured_at == "proxy" else spec


class ErrorsIndicator(BaseModel):
    model_config = ConfigDict(extra="forbid")

    measured_at: MeasuredAt = "engine"

    def counter(self) -> V.MetricSpec:
        """The requests counter the SLI reads (by outcome)."""
        return V.CLIENT_COUNTERPARTS[V.REQUESTS.key] if self.measured_at == "proxy" else V.REQUESTS


class Indicator(BaseModel):
    model_config = ConfigDict(extra="forbid")

    latency: LatencyIndicator | None = None
    errors: ErrorsIndicator | None = None

    @model_validator(mode="after")
    def _one(self) -> Indicator:
        if (self.latency is None) == (self.errors is None):
            raise ValueError("give exactly one of latency: {...} or errors: {}")
        return self


class SLO(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    objective: float = Field(gt=0, lt=100, description="percent of good events")
    period: str = "30d"
    indicator: Indicator
    selector: dict[str, str] = Field(default_factory=dict)
    group_by: list[str] = Field(default_factory=list)
    min_requests: int = Field(DEFAULT_MIN_REQUESTS, ge=0)
    """The burn-rate alerts stay silent on fewer requests than this in their long window (0: off)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r}: use lowercase letters, digits and dashes (e.g. ttft-500ms)")
        return value

    @field_validator("period")
    @classmethod
    def _period(cls, value: str) -> str:
        hours = period_hours(value)
        if hours < 72:
            raise ValueError(f"period {value!r} is shorter than the longest alert window (3d)")
        return value

    @field_validator("selector")
    @classmethod
    def _selector(cls, value: dict[str, str]) -> dict[str, str]:
        for k in value:
            if not V.is_label_name(k):
                raise ValueError(f"{k!r} is not a label name")
        return value

    @field_validator("group_by")
    @classmethod
    def _group_by(cls, value: list[str]) -> list[str]:
        for k in value:
            if not V.is_label_name(k) or k in (V.SLO_LABEL, V.SLO_SERVICE_LABEL, V.SEVERITY_LABEL, V.LABEL_LE):
                raise ValueError(f"{k!r} cannot be a group_by label")
        return value

    @property
    def error_budget(self) -> Decimal:
        """1 - objective, exact (``99.9`` -> ``0.001``)."""
        return (Decimal(100) - Decimal(str(self.objective))) / Decimal(100)

    @property
    def objective_ratio(self) -> Decimal:
        return Decimal(str(self.objective)) / Decimal(100)


class AlertSettings(BaseModel):
    """Thresholds, durations and severities of the saturation and health alerts."""

    model_config = ConfigDict(extra="forbid")

    kv_cache_saturated_ratio: float = Field(0.95, gt=0, le=1)
    kv_cache_saturated_for: str = "5m"
    kv_cache_prediction_window: str = "30m"
    kv_cache_prediction_horizon_minutes: int = Field(15, gt=0)
    kv_cache_prediction_for: str = "5m"
    preemptions_for: str = "10m"
    queue_growth_window: str = "10m"
    queue_growth_min_increase: float = Field(5, gt=0)
    queue_running_flat_tolerance: float = Field(1, ge=0)
    queue_growth_for: str = "5m"
    target_down_for: str = "2m"
    metrics_absent_for: str = "10m"
    gpu_throttled_for: str = "5m"
    gpu_throttle_min_ratio: float = Field(0.1, gt=0, le=1)
    """a GPU whose clocks were held down more than this share of the last 5 minutes is throttled."""
    gpu_errors_for: str = "1m"
    severities: dict[str, Literal["page", "ticket"]] = Field(default_factory=dict)
    runbook_base_url: str = "alerts/runbooks.md"
    webhook_url: str = "http://127.0.0.1:4318/api/v1/alerts/webhook"
    webhook_credentials_file: str | None = None
    """a file holding the collector's ingest token (Alertmanager sends it as a bearer token)."""
    webhook_token: str | None = None
    """the ingest token itself, written into alertmanager.yml (prefer webhook_credentials_file)."""
    period_rules_interval: str = PERIOD_RULES_INTERVAL
    """the rule group of the period SLI, budget remaining and period burn rate (30-day sums are
    expensive; they move slowly)."""
    group_wait: str = "30s"
    group_interval: str = "5m"
    repeat_interval: str = "4h"
    page_repeat_interval: str = "1h"
    ticket_repeat_interval: str = "12h"

    @field_validator(
        "kv_cache_saturated_for",
        "kv_cache_prediction_window",
        "kv_cache_prediction_for",
        "preemptions_for",
        "queue_growth_window",
        "queue_growth_for",
        "target_down_for",
        "metrics_absent_for",
        "gpu_throttled_for",
        "gpu_errors_for",
        "period_rules_interval",
        "group_wait",
        "group_interval",
        "repeat_interval",
        "page_repeat_interval",
        "ticket_repeat_interval",
    )
    @classmethod
    def _durations(cls, value: str) -> str:
        if not re.match(r"^\d+[smhd]$", value):
            raise ValueError(f"{value!r} is not a Prometheus duration like 5m")
        return value

    @field_validator("runbook_base_url")
    @classmethod
    def _runbook_base(cls, value: str) -> str:
        scheme = value.split("://", 1)[0] if "://" in value else None
        if scheme is not None and scheme not in ("http", "https"):
            raise ValueError(f"{value!r}: give an http(s) URL or a path relative to where the alerts are read")
        if any(c in value for c in " #?"):
            raise ValueError(f"{value!r}: the runbook base cannot hold spaces, '#' or '?' (the anchor is appended)")
        return value

    @model_validator(mode="after")
    def _one_token(self) -> AlertSettings:
        if self.webhook_credentials_file and self.webhook_token:
            raise ValueError("give webhook_credentials_file or webhook_token, not both")
        return self

    @field_validator("severities")
    @classmethod
    def _severities(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(V.SATURATION_ALERTS))
        if unknown:
            raise ValueError(
                f"no alert named {', '.join(map(repr, unknown))}; severities can be set for "
                + ", ".join(V.SATURATION_ALERTS)
            )
        return value


class HeadroomRules(BaseModel):
    """How the headroom recording rules and the low-headroom alert read the replicas (docs/headroom.md)."""

    model_config = ConfigDict(extra="forbid")

    window: str = "30m"
    """the history each replica's headroom is estimated from."""
    step: str = "1m"
    """the evaluation interval, and the sub-window of one (running batch, TPOT) point of the fit."""
    low_ratio: float = Field(1.25, gt=0)
    """the low-headroom alert fires below this headroom (1: the load is at the first SLO's limit)."""
    low_for: str = "15m"
    kv_fluctuation_z: float = Field(3.0, ge=0)
    """standard deviations of the running count kept free in the KV cache."""
    min_points: int = Field(4, ge=3)
    """sub-window points the TPOT fit needs."""

    @field_validator("window", "step", "low_for")
    @classmethod
    def _durations(cls, value: str) -> str:
        if not re.match(r"^\d+[smh]$", value):
            raise ValueError(f"{value!r} is not a Prometheus duration like 30m")
        return value

    @model_validator(mode="after")
    def _points_fit(self) -> HeadroomRules:
        if duration_seconds(self.window) < self.min_points * duration_seconds(self.step):
            raise ValueError(f"window {self.window} holds fewer than min_points={self.min_points} steps of {self.step}")
        return self


def duration_seconds(text: str) -> int:
    """``30m`` -> 1800 (a Prometheus duration of one unit: s, m, h, d or w)."""
    m = re.match(r"^(\d+)([smhdw])$", text)
    if not m:
        raise ValueError(f"{text!r} is not a Prometheus duration like 5m")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]


class SLOFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    service: str = "llm-serving"
    slos: list[SLO] = Field(min_length=1)
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    headroom: HeadroomRules = Field(default_factory=HeadroomRules)
    cost: CostSettings | None = None
    """GPU prices (docs/cost.md); without them no cost rule is generated."""

    @field_validator("service")
    @classmethod
    def _service(cls, value: str) -> str:
        if not _SERVICE.match(value):
            raise ValueError(f"{value!r}: use letters, digits, dashes, dots and underscores (e.g. chat-api)")
        return value

    @model_validator(mode="after")
    def _unique(self) -> SLOFile:
        seen: set[str] = set()
        for slo in self.slos:
            if slo.name in seen:
                raise ValueError(f"two SLOs are named {slo.name!r}")
            seen.add(slo.name)
        return self


def load(path: Path, vocabulary: V.Vocabulary) -> SLOFile:
    """Read and validate an SLO file. Latency thresholds must be canonical bucket boundaries."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SLOFileError(f"{path}: cannot read: {exc.strerror}") from None
    return parse(text, str(path), vocabulary)


def parse(text: str, source: str, vocabulary: V.Vocabulary) -> SLOFile:
    try:
        located = load_located(text)
    except YAMLSyntaxError as exc:
        where = f":{exc.line}" if exc.line is not None else ""
        raise SLOFileError(f"{source}{where}: not valid YAML: {exc.problem}") from None
    raw = located.data
    if not isinstance(raw, dict):
        raise SLOFileError(f"{source}: expected a mapping with 'slos:'")
    try:
        spec = SLOFile.model_validate(raw)
    except ValidationError as exc:
        msgs = [f"{source}:{p.line or '?'}: {p.field}: {p.message}" for p in located.problems(exc)]
        raise SLOFileError("\n".join(msgs)) from None
    for i, slo in enumerate(spec.slos):
        lat = slo.indicator.latency
        if lat is None:
            continue
        metric = lat.histogram()
        bounds = vocabulary.buckets(metric)
        if float(lat.threshold_seconds) not in bounds:
            line = located.line_for(("slos", i, "indicator", "latency", "threshold_seconds"))
            shown = ", ".join(V.format_le(b) for b in bounds)
            raise SLOFileError(
                f"{source}:{line or '?'}: slos.{i}.indicator.latency.threshold_seconds: {lat.threshold_seconds} s is "
                f"not a bucket boundary of {metric.name}, so the exporters would not expose it exactly (an SLI on it "
                f"would silently never fire). Use one of {shown}, or add it to the layout for exporters and "
                f"generator alike: INFERWATCH_SLO_THRESHOLDS='{{\"{lat.metric}\": [{lat.threshold_seconds}]}}'"
            )
    return spec


def decimal_text(value: Decimal | float) -> str:
    """A number written deliberately (no float noise): ``0.001``, ``14.4``, ``1``."""
    try:
        d = Decimal(str(value)).normalize()
    except InvalidOperation:
        return str(value)
    text = format(d, "f")
    return text


@dataclass(frozen=True)
class BurnPair:
    """One multi-window burn-rate alert: its severity, long and short windows and budget share."""

    severity: str
    long: str
    short: str
    budget_percent: Decimal
    """share of the period's error budget consumed in ``long`` at the alerting burn rate."""


# Google SRE workbook, table 5-8 (+ the 1d/2h ticket pair of its example), for a 30-day period.
BURN_PAIRS: tuple[BurnPair, ...] = (
    BurnPair(V.SEVERITY_PAGE, "1h", "5m", Decimal(2)),
    BurnPair(V.SEVERITY_PAGE, "6h", "30m", Decimal(5)),
    BurnPair(V.SEVERITY_TICKET, "1d", "2h", Decimal(10)),
    BurnPair(V.SEVERITY_TICKET, "3d", "6h", Decimal(10)),
)


def burn_factor(pair: BurnPair, slo: SLO) -> Decimal:
    """(budget consumed) x period / long window: 14.4, 6, 3 and 1 for a 30-day period."""
    return (pair.budget_percent / 100) * Decimal(str(period_hours(slo.period))) / Decimal(str(period_hours(pair.long)))


def alert_windows() -> tuple[str, ...]:
    """The long and short windows of the burn-rate alerts, in the order of the alert table."""
    out: list[str] = []
    for pair in BURN_PAIRS:
        for w in (pair.long, pair.short):
            if w not in out:
                out.append(w)
    return tuple(out)
