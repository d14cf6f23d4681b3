"""The collector's request store: the table ``TABLE_NAME``, one row per
:class:`~inferwatch.collector.record.RequestRecord`.

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
    Index,
    Integer,
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

__all__ = ["ID_TYPE", "JSON_TYPE", "METADATA", "NAMING_CONVENTION", "REQUEST_TABLE", "TABLE_NAME", "UTCDateTime"]

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
    Column("attributes", JSON_TYPE, nullable=False),
    Column("received_at", UTCDateTime, nullable=False),
    UniqueConstraint("trace_id", "span_id"),
    Index(f"ix_{TABLE_NAME}_start_time", "start_time"),
    Index(f"ix_{TABLE_NAME}_engine_model_start_time", "engine", "model", "start_time"),
    Index(f"ix_{TABLE_NAME}_request_id", "request_id"),
    # Covering indexes for the exact percentiles of /api/v1/stats (ordered by the latency, filtered
    # by time, grouped by engine/model without touching the table) and for sorting the request list.
    *(Index(f"ix_{TABLE_NAME}_{col}_stats", col, "start_time", "engine", "model") for col in (TTFT, TPOT, E2E, QUEUE)),
)
"""One finished LLM request (one sequence) per row; ``received_at``: when the collector wrote it (UTC)."""
