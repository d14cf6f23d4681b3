"""Collector settings (``INFERWATCH_COLLECTOR_*`` environment variables or command-line options)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from inferwatch.core import resources
from inferwatch.core.config import ConfigError, parse_listen

DEFAULT_MAX_BODY = 4 * 1024 * 1024
"""Largest OTLP body accepted, after decompression (``--max-body-bytes``)."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w``."""
    m = _DURATION.match(text)
    if not m:
        raise ConfigError(f"invalid duration {text!r}: use a number and one of s, m, h, d, w (e.g. 7d)")
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


class CollectorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INFERWATCH_COLLECTOR_", extra="ignore")

    database_url: str | None = Field(None, description="SQLAlchemy URL; default: SQLite file under data_dir.")
    data_dir: Path = Field(
        default_factory=lambda: resources.default_data_dir() / "collector",
        description="Where the SQLite database and the spool live (default: the inferwatch data directory, "
        "$INFERWATCH_DATA_DIR or ~/.local/share/inferwatch, then collector/).",
    )
    listen: str = "127.0.0.1:4318"
    grpc_listen: str | None = "127.0.0.1:4317"
    max_body_bytes: int = Field(DEFAULT_MAX_BODY, gt=0)
    queue_limit: int = Field(100_000, gt=0)
    batch_size: int = Field(512, gt=0)
    # --- durability and database timeouts (docs/reliability.md, "Collector") ------------------------------------
    ingest_timeout_seconds: float = Field(
        8.0, gt=0, le=600, description="An export waits this long for its spans to be durable; then 503 (retry)."
    )
    db_write_timeout_seconds: float = Field(
        5.0, gt=0, le=600, description="Deadline of one write transaction; past it the batch is spooled."
    )
    db_connect_timeout_seconds: float = Field(5.0, gt=0, le=600, description="Connecting to the database.")
    db_statement_timeout_seconds: float = Field(
        10.0, gt=0, le=3600, description="One statement (PostgreSQL statement_timeout; SQLite: interrupted)."
    )
    db_pool_timeout_seconds: float = Field(5.0, gt=0, le=600, description="Waiting for a pooled connection.")
    sqlite_busy_timeout_seconds: float = Field(
        5.0, gt=0, le=600, description="SQLite: waiting for another connection's write lock."
    )
    spool_max_bytes: int = Field(
        1 << 30, ge=0, description="Largest spool while the database is down; beyond it exports get 503 (0: none)."
    )
    spool_segment_bytes: int = Field(
        64 << 20,
        ge=4096,
        description="A spool segment is closed past this size, so that replayed segments can be deleted while "
        "records keep arriving.",
    )
    retention: str | None = Field(None, description="Delete requests older than this (e.g. 7d).")
    ingest_tokens: list[str] = Field(default_factory=list, description="Bearer tokens allowed to send OTLP.")
    read_tokens: list[str] = Field(default_factory=list, description="Bearer tokens allowed to read the API.")
    insecure: bool = Field(False, description="Allow a non-loopback listen address without tokens.")
    # --- the on-call surface (diagnosis, checklist, SLO status) -----------------------------------------
    prometheus_url: str | None = Field(None, description="Prometheus with the generated rules, for the diagnosis.")
    exporters: list[str] = Field(
        default_factory=list, description="Exporter URLs to scrape when there is no Prometheus (or it is down)."
    )
    upstream_timeout_seconds: float = Field(5.0, gt=0, le=60, description="Per query to Prometheus or an exporter.")
    exporter_interval_seconds: float = Field(
        5.0, gt=0, le=60, description="Seconds between the two exporter scrapes that give rates."
    )
    slo_file: Path | None = Field(None, description="SLO file; default: the SLOs that ship with inferwatch.")
    diagnose_thresholds: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description='Threshold overrides, symptom -> [warning, critical], e.g. {"tpot_slow": [0.2, 0.4]}.',
    )
    gpu: str | None = Field(None, description="The GPU model the engines run on (e.g. H100), for the checklist.")
    # --- alert webhooks -------------------------------------------------------------------------------------------
    notify_config: Path | None = Field(None, description="Receivers to forward incidents to (YAML notify file).")
    grafana_url: str | None = Field(None, description="Grafana's base URL, for dashboard links in incidents.")
    public_url: str | None = Field(
        None, description="The collector's base URL as users reach it, for incident page links (default: listen)."
    )
    link_secret: str | None = Field(
        None, description="Signs incident page links (default: derived from the read tokens)."
    )
    max_webhook_bytes: int = Field(1 << 20, gt=0, description="Largest Alertmanager webhook body accepted.")
    # --- limits of the receivers (docs/collector.md, "Limits and validation") ----------------------------------
    header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Deadline for a request's line and headers, from the connection's opening (or the first byte "
        "of the next request on a kept connection); slower clients get 408 and are disconnected.",
    )
    body_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Deadline for reading one request body: the OTLP route answers 408 past it; on any route the "
        "server closes the connection 1 s later.",
    )
    max_requests: int = Field(
        100,
        gt=0,
        description="Requests handled at once (from their headers; those still receiving their body are not "
        "counted); beyond: 503. GET /healthz is always answered.",
    )
    max_uploads: int = Field(
        256,
        gt=0,
        description="Requests receiving their body at once (Content-Length > 0 or chunked; requests without a body "
        "never count); at the cap the oldest is closed with 503 and Retry-After: 1 to make room for the new one. "
        "The default bounds the bodies being buffered to 256 x max_body_bytes (4 MiB): 1 GiB.",
    )
    max_connections: int | None = Field(
        None,
        gt=0,
        description="Open HTTP connections, idle and slow ones included; at the cap the one waiting longest for "
        "its request is closed to make room, and when all have a request in progress the newcomer gets 503 "
        "(default: the file descriptor limit less 256, at most 16384).",
    )
    keep_alive_timeout_seconds: float = Field(
        15.0,
        gt=0,
        le=600,
        description="Idle HTTP keep-alive connections are closed after this (uvicorn timeout_keep_alive).",
    )
    decode_concurrency: int = Field(
        2,
        gt=0,
        le=64,
        description="OTLP/HTTP bodies decoded and mapped at once, off the event loop, when there are no ingest "
        "worker processes; others wait.",
    )
    ingest_processes: int | None = Field(
        None,
        ge=0,
        le=64,
        description="Worker processes that decode and map exports (default: one per CPU when there are several; "
        "0: none, the ingest threads do it).",
    )
    ingest_threads: int = Field(
        16, gt=0, le=256, description="Exports being made durable at once, on the ingest's own threads."
    )
    # --- identity: the model and service of spans that do not name them (vLLM's) -----------------------------
    service_models: dict[str, str] = Field(
        default_factory=dict,
        description="service.name -> model, for spans that name no model "
        '(e.g. {"vllm-llama-8b": "meta-llama/Llama-3.1-8B"}).',
    )
    model_from: str | None = Field(
        None, description="A resource attribute whose value is the model of spans that name none (e.g. service.name)."
    )
    service_from: str | None = Field(
        None,
        description="A resource attribute whose value is the service when service.name is missing or the SDK's "
        "placeholder unknown_service (e.g. k8s.deployment.name).",
    )

    @field_validator("grafana_url", "public_url")
    @classmethod
    def _base_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {value!r}")
        return value.rstrip("/") if value else value

    def link_base(self) -> str:
        return self.public_url or f"http://{self.listen}"

    def link_key(self) -> bytes:
        """The secret that signs incident page links."""
        import hashlib

        seed = self.link_secret or ("\n".join(sorted(self.read_tokens)) if self.read_tokens else "")
        return hashlib.sha256(b"inferwatch incident links\n" + seed.encode()).digest()

    @field_validator("prometheus_url")
    @classmethod
    def _prometheus_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"prometheus_url must start with http:// or https://, got {value!r}")
        return value.rstrip("/") if value else value

    @field_validator("diagnose_thresholds")
    @classmethod
    def _thresholds(cls, value: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        from inferwatch.core.symptoms import Symptom

        known = {s.value for s in Symptom}
        for name, (warning, critical) in value.items():
            if name not in known:
                raise ValueError(f"unknown symptom {name!r} in diagnose_thresholds; known: {', '.join(sorted(known))}")
            if not 0 <= warning <= critical:
                raise ValueError(f"{name}: need 0 <= warning <= critical, got [{warning}, {critical}]")
        return value

    @field_validator("retention")
    @classmethod
    def _retention(cls, value: str | None) -> str | None:
        if value:
            parse_duration(value)
        return value

    def url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'inferwatch.db').as_posix()}"

    def retention_delta(self) -> timedelta | None:
        return parse_duration(self.retention) if self.retention else None

    def spool_path(self) -> Path:
        return self.data_dir / "spool.jsonl"

    def check_exposure(self) -> None:
        """Refuse a non-loopback listen address without tokens (unless ``insecure``)."""
        for addr in (self.listen, self.grpc_listen):
            if not addr:
                continue
            host, _ = parse_listen(addr)
            loopback = host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")
            if not loopback and not self.insecure and not (self.ingest_tokens and self.read_tokens):
                raise ConfigError(
                    f"refusing to listen on {addr} without ingest and read tokens; set them or pass --insecure"
                )
