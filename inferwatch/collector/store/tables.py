"""The collector's request store: the table ``TABLE_NAME``, one row per
:class:`~inferwatch.collector.store.record.RequestRecord`.

A SQLAlchemy Core :class:`~sqlalchemy.Table`, no ORM: column names (and Core keys) are the record's
field names, the timing and token columns spelled through :mod:`inferwatch.core.schema`, so a
record's ``__dict__`` is its row and a row's mapping is a record plus ``id`` and ``received_at``.
The schema is created and evolved only by the Alembic migrations (``collector.db.ensure_schema``);
``migrations/env.py`` compares against :data:`METADATA`, and ``tests/test_collector_storage.py``
checks that this table and the migrations agree.

Times are stored in UTC: ``start_time``, ``end_time`` and ``received_at`` always come back as
timezone-aware UTC datetimes, on SQLite (which has no time zone type) as on PostgreSQL.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Dialect,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB

from inferwatch.core.schema import (
    CACHED_TOKENS,
    DECODE,
    E2E,
    GENERATION_TOKENS,
    PREFILL,
    PROMPT_TOKENS,
    QUEUE,
    TPOT,
    TTFT,
)
from inferwatch.core.schema import (
    REQUEST_TABLE as TABLE_NAME,
)

__all__ = [
    "ALERTS_TABLE",
    "DELIVERIES_TABLE",
    "DELIVERY_ATTEMPTS_TABLE",
    "ID_TYPE",
    "INCIDENTS_TABLE",
    "INCIDENT_EVENTS_TABLE",
    "JSON_TYPE",
    "METADATA",
    "NAMING_CONVENTION",
    "NOTIFICATIONS_TABLE",
    "REQUEST_TABLE",
    "ROLLUP_FIELDS",
    "ROLLUP_STATE_TABLE",
    "ROLLUP_TABLE",
    "TABLE_NAME",
    "VALUES_TABLE",
    "UTCDateTime",
]

NAMING_CONVENTION: Final[dict[str, str]] = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """``DateTime(timezone=True)`` that stores UTC and always returns aware UTC datetimes.

    Naive datetimes are taken to be UTC already. SQLite stores the naive UTC wall time (as
    ``YYYY-MM-DD HH:MM:SS.ffffff`` text, which sorts chronologically); PostgreSQL stores a
    ``timestamptz``.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# BIGINT on PostgreSQL (BIGSERIAL); SQLite needs INTEGER PRIMARY KEY to alias the rowid.
ID_TYPE: Final = BigInteger().with_variant(Integer(), "sqlite")
JSON_TYPE: Final = JSON().with_variant(JSONB(), "postgresql")

METADATA: Final = MetaData(naming_convention=NAMING_CONVENTION)
"""The store's metadata (its naming convention names every constraint and index)."""

REQUEST_TABLE: Final = Table(
    TABLE_NAME,
    METADATA,
    Column("id", ID_TYPE, primary_key=True, autoincrement=True),
    Column("trace_id", String(32), nullable=False),
    Column("span_id", String(16), nullable=False),
    Column("request_id", String),
    Column("engine", String, nullable=False),
    Column("model", String),
    Column("instance", String),
    Column("service", String),
    Column("start_time", UTCDateTime, nullable=False),
    Column("end_time", UTCDateTime, nullable=False),
    Column(TTFT, Double),
    Column("ttft_derived", Boolean, nullable=False),
    Column(TPOT, Double),
    Column(E2E, Double),
    Column(QUEUE, Double),
    Column(PREFILL, Double),
    Column(DECODE, Double),
    Column(PROMPT_TOKENS, BigInteger),
    Column(GENERATION_TOKENS, BigInteger),
    Column(CACHED_TOKENS, BigInteger),
    Column("finish_reason", String),
    Column("error", Text),
    Column("n", Integer),
    Column("max_tokens", BigInteger),
    Column("temperature", Double),
    Column("lora_adapter", String),
    Column("tenant", String),
    Column("attributes", JSON_TYPE, nullable=False),
    Column("received_at", UTCDateTime, nullable=False),
    UniqueConstraint("trace_id", "span_id"),
    Index(f"ix_{TABLE_NAME}_start_time", "start_time"),
    Index(f"ix_{TABLE_NAME}_engine_model_start_time", "engine", "model", "start_time"),
    Index(f"ix_{TABLE_NAME}_request_id", "request_id"),
    # The stats windows hold the requests that finished in them: the window's rows by their end time.
    Index(f"ix_{TABLE_NAME}_end_time", "end_time"),
    # Covering indexes for the exact percentiles of /api/v1/stats (a latency range read in order, filtered by
    # the end time and grouped by engine, model or instance without touching the table) and for sorting the
    # request list.
    *(
        Index(f"ix_{TABLE_NAME}_{col}_stats", col, "end_time", "engine", "model", "instance")
        for col in (TTFT, TPOT, E2E, QUEUE)
    ),
)
"""One finished LLM request (one sequence) per row; ``received_at``: when the collector wrote it (UTC)."""


# --- alert webhooks: notifications, incidents, alerts, their timeline, and the delivery outbox ---------------------
NOTIFICATIONS_TABLE: Final = Table(
    "alert_notifications",
    METADATA,
    Column("id", ID_TYPE, primary_key=True, autoincrement=True),
    Column("received_at", UTCDateTime, nullable=False),
    Column("receiver", String, nullable=False),
    Column("status", String(16), nullable=False),
    Column("group_key", Text, nullable=False),
    Column("group_labels", JSON_TYPE, nullable=False),
    Column("common_labels", JSON_TYPE, nullable=False),
    Column("external_url", Text),
    Column("alert_count", Integer, nullable=False),
    Column("truncated_alerts", Integer, nullable=False),
    Column("changes", Integer, nullable=False),
    Index("ix_alert_notifications_received_at", "received_at"),
)
"""Every webhook call Alertmanager made (re-sends included); ``changes``: alert states it changed."""

INCIDENTS_TABLE: Final = Table(
    "incidents",
    METADATA,
    Column("id", ID_TYPE, primary_key=True, autoincrement=True),
    Column("group_key", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("title", Text, nullable=False),
    Column("severity", String),
    Column("labels", JSON_TYPE, nullable=False),
    Column("opened_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("resolved_at", UTCDateTime),
    Column("enrichment_state", String(16), nullable=False),
    Column("enrichment", JSON_TYPE),
    Column("enriched_at", UTCDateTime),
    Index("ix_incidents_status_opened_at", "status", "opened_at"),
    Index("ix_incidents_group_key", "group_key"),
)
"""One episode of an Alertmanager group: opened by its first firing alert, resolved with its last."""

ALERTS_TABLE: Final = Table(
    "alerts",
    METADATA,
    Column("id", ID_TYPE, primary_key=True, autoincrement=True),
    Column("incident_id", ID_TYPE, ForeignKey("incidents.id", ondelete="CASCADE"), nullable=False),
    Column("fingerprint", String(64), nullable=False),
    Column("starts_at", UTCDateTime, nullable=False),
    Column("ends_at", UTCDateTime),
    Column("status", String(16), nullable=False),
    Column("alertname", String, nullable=False),
    Column("severity", String),
    Column("labels", JSON_TYPE, nullable=False),
    Column("annotations", JSON_TYPE, nullable=False),
    Column("generator_url", Text),
    Column("first_seen_at", UTCDateTime, nullable=False),
    Column("last_seen_at", UTCDateTime, nullable=False),
    Column("resolved_at", UTCDateTime),
    Column("times_seen", Integer, nullable=False),
    UniqueConstraint("fingerprint", "starts_at"),
    Index("ix_alerts_incident_id", "incident_id"),
)
"""One alert (Alertmanager's fingerprint and ``startsAt``), stored once however often it is re-sent."""

INCIDENT_EVENTS_TABLE: Final = Table(
    "incident_events",
    METADATA,
    Column("id", ID_TYPE, primary_key=True, autoincrement=True),
    Column("incident_id", ID_TYPE, ForeignKey("incidents.id", ondelete="CASCADE"), nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("detail", Text, nullable=False),
    Column("alert_id", ID_TYPE),
    Column("forward", Boolean, nullable=False),
    Column("fanned_out", Boolean, nullable=False),
    Index("ix_incident_events_incident_id", "incident_id"),
    Index("ix_incident_events_fanned_out", "forward", "fanned_out"),
)
"""The incident's timeline; events with ``forward`` become one delivery per matching receiver."""

DELIVERIES_TABLE: Final = Table(
    "deliveries",
    METADATA,
    Column("id", ID_TYPE, primary_key=True, autoincrement=True),
    Column("incident_id", ID_TYPE, ForeignKey("incidents.id", ondelete="CASCADE"), nullable=False),
    Column("event_id", ID_TYPE, ForeignKey("incident_events.id", ondelete="CASCADE"), nullable=False),
    Column("receiver", String, nullable=False),
    Column("format", String(16), nullable=False),
    Column("url", Text, nullable=False),
    Column("idempotency_key", String(64), nullable=False),
    Column("payload", JSON_TYPE, nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("next_attempt_at", UTCDateTime, nullable=False),
    Column("lease_until", UTCDateTime),
    Column("delivered_at", UTCDateTime),
    Column("last_status", Integer),
    Column("last_error", Text),
    UniqueConstraint("idempotency_key"),
    UniqueConstraint("event_id", "receiver"),
    Index("ix_deliveries_state_next_attempt_at", "state", "next_attempt_at"),
    Index("ix_deliveries_incident_id", "incident_id"),
)
"""The outbox: one row per (event, receiver); retried with backoff until delivered or dead."""

DELIVERY_ATTEMPTS_TABLE: Final = Table(
    "delivery_attempts",
    METADATA,
    Column("id", ID_TYPE, primary_key=True, autoincrement=True),
    Column("delivery_id", ID_TYPE, ForeignKey("deliveries.id", ondelete="CASCADE"), nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("status_code", Integer),
    Column("error", Text),
    Column("duration_seconds", Double, nullable=False),
    Index("ix_delivery_attempts_delivery_id", "delivery_id"),
)


# --- stats rollups: per minute, hour and day, per (engine, model, instance, service) ------------------------------
ROLLUP_FIELDS: Final = (TTFT, TPOT, E2E, QUEUE)
"""The latency columns the rollups sketch (those ``/api/v1/stats`` reports)."""

ROLLUP_TABLE: Final = Table(
    "request_rollups",
    METADATA,
    Column("id", ID_TYPE, primary_key=True, autoincrement=True),
    Column("period_seconds", Integer, nullable=False),
    Column("period_start", UTCDateTime, nullable=False),
    Column("engine", String, nullable=False),
    Column("model", String),
    Column("instance", String),
    Column("service", String),
    Column("requests", BigInteger, nullable=False),
    Column("failed", BigInteger, nullable=False),
    Column(PROMPT_TOKENS, BigInteger, nullable=False),
    Column(f"{PROMPT_TOKENS}_count", BigInteger, nullable=False),
    Column(GENERATION_TOKENS, BigInteger, nullable=False),
    Column(f"{GENERATION_TOKENS}_count", BigInteger, nullable=False),
    *(
        c
        for f in ROLLUP_FIELDS
        for c in (Column(f"{f}_count", BigInteger, nullable=False), Column(f"{f}_sketch", LargeBinary, nullable=False))
    ),
    Index("ix_request_rollups_period_seconds", "period_seconds", "period_start"),
)
"""The requests that ended in one minute (``period_seconds`` 60), one hour (3600) or one day (86400, UTC) of
one (engine, model, instance, service): counts, token sums (and how many rows reported them), and per latency
column the rows with a value and their log-bucket counts (:mod:`inferwatch.collector.stats.sketch`). Maintained from
the request table by :mod:`inferwatch.collector.stats.rollup`; ``rollup_state`` says up to which row id."""

VALUES_TABLE: Final = Table(
    "request_values",
    METADATA,
    Column("id", ID_TYPE, primary_key=True, autoincrement=True),
    Column("period_seconds", Integer, nullable=False),
    Column("period_start", UTCDateTime, nullable=False),
    Column("series", Text, nullable=False),
    Column("counts", LargeBinary, nullable=False),
    Column("vals", LargeBinary, nullable=False),
    Index("ix_request_values_period_seconds", "period_seconds", "period_start", unique=True),
)
"""Per minute (``period_seconds`` 60): every latency value of the requests that ended in it, per series and
field, sorted (:mod:`inferwatch.collector.stats.values` has the layout): a small window's exact percentiles without
reading its rows. Maintained with the rollups, in the same transactions, on both back ends (PostgreSQL since 0005)."""

ROLLUP_STATE_TABLE: Final = Table(
    "rollup_state",
    METADATA,
    Column("name", String(32), primary_key=True),
    Column("folded_id", BigInteger, nullable=False),
    Column("seen_id", BigInteger),
    Column("seen_at", UTCDateTime),
    Column("updated_at", UTCDateTime, nullable=False),
)
"""The rollups' watermark: every request row with ``id <= folded_id`` is in them, none above; ``seen_id`` the
largest id seen at ``seen_at`` (folded once every transaction that could still commit below it has ended)."""
