"""The collector's request store: one row of ``TABLE_NAME`` per :class:`~inferwatch.collector.record.RequestRecord`.

Column names are the record's field names; the timing and token columns are spelled through the
vocabulary constants of :mod:`inferwatch.collector.record`. The schema is created and evolved only by the
Alembic migrations in the repository's ``migrations/`` directory (``collector.db.ensure_schema``);
``tests/test_collector_storage.py`` checks that these models and the migrations agree.

Times are stored in UTC: ``start_time``, ``end_time`` and ``received_at`` always come back as
timezone-aware UTC datetimes, on SQLite (which has no time zone type) as on PostgreSQL.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
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
    inspect,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from inferwatch.collector.record import (
    CACHED_TOKENS,
    DECODE,
    E2E,
    GENERATION_TOKENS,
    PREFILL,
    PROMPT_TOKENS,
    QUEUE,
    TPOT,
    TTFT,
    RequestRecord,
)
from inferwatch.core import schema

TABLE_NAME: Final = schema.REQUEST_TABLE

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


class Base(DeclarativeBase):
    """Declarative base of the collector's store, with its own metadata and naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class LlmRequest(Base):
    """One finished LLM request (one sequence), as stored.

    Attribute names are short (``ttft``, ``e2e``…); the column names are the
    :class:`~inferwatch.collector.record.RequestRecord` field names. :data:`FIELD_TO_ATTR` maps one to the
    other and :meth:`to_record` turns a row back into a record.
    """

    __tablename__ = TABLE_NAME

    id: Mapped[int] = mapped_column(ID_TYPE, primary_key=True, autoincrement=True)
    trace_id: Mapped[str] = mapped_column(String(32))
    span_id: Mapped[str] = mapped_column(String(16))
    request_id: Mapped[str | None] = mapped_column(String)
    engine: Mapped[str] = mapped_column(String)
    model: Mapped[str | None] = mapped_column(String)
    instance: Mapped[str | None] = mapped_column(String)
    service: Mapped[str | None] = mapped_column(String)
    start_time: Mapped[datetime] = mapped_column(UTCDateTime)
    end_time: Mapped[datetime] = mapped_column(UTCDateTime)
    ttft: Mapped[float | None] = mapped_column(TTFT, Double, key=TTFT)
    ttft_derived: Mapped[bool] = mapped_column(Boolean)
    tpot: Mapped[float | None] = mapped_column(TPOT, Double, key=TPOT)
    e2e: Mapped[float | None] = mapped_column(E2E, Double, key=E2E)
    queue: Mapped[float | None] = mapped_column(QUEUE, Double, key=QUEUE)
    prefill: Mapped[float | None] = mapped_column(PREFILL, Double, key=PREFILL)
    decode: Mapped[float | None] = mapped_column(DECODE, Double, key=DECODE)
    prompt_tokens: Mapped[int | None] = mapped_column(PROMPT_TOKENS, BigInteger, key=PROMPT_TOKENS)
    generation_tokens: Mapped[int | None] = mapped_column(GENERATION_TOKENS, BigInteger, key=GENERATION_TOKENS)
    cached_tokens: Mapped[int | None] = mapped_column(CACHED_TOKENS, BigInteger, key=CACHED_TOKENS)
    finish_reason: Mapped[str | None] = mapped_column(String)
    error: Mapped[str | None] = mapped_column(Text)
    n: Mapped[int | None] = mapped_column(Integer)
    max_tokens: Mapped[int | None] = mapped_column(BigInteger)
    temperature: Mapped[float | None] = mapped_column(Double)
    lora_adapter: Mapped[str | None] = mapped_column(String)
    attributes: Mapped[dict[str, Any]] = mapped_column(JSON_TYPE)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime)
    """when the collector wrote the row (UTC)."""

    __table_args__ = (
        UniqueConstraint("trace_id", "span_id"),
        Index(f"ix_{TABLE_NAME}_start_time", "start_time"),
        Index(f"ix_{TABLE_NAME}_engine_model_start_time", "engine", "model", "start_time"),
        Index(f"ix_{TABLE_NAME}_request_id", "request_id"),
        # Covering indexes for the exact percentiles of /api/v1/stats (ordered by the latency, filtered
        # by time, grouped by engine/model without touching the table) and for sorting the request list.
        *(
            Index(f"ix_{TABLE_NAME}_{col}_stats", col, "start_time", "engine", "model")
            for col in (TTFT, TPOT, E2E, QUEUE)
        ),
    )

    def to_record(self) -> RequestRecord:
        """The stored request as a :class:`RequestRecord` (``id`` and ``received_at`` dropped)."""
        return RequestRecord(**{name: getattr(self, attr) for name, attr in FIELD_TO_ATTR.items()})


REQUEST_TABLE: Final = cast(Table, LlmRequest.__table__)
"""The Core table of :class:`LlmRequest` (column keys = column names = RequestRecord field names)."""


def _field_to_attr() -> dict[str, str]:
    """RequestRecord field name (= column name) -> mapped attribute name, for every record field."""
    mapping: dict[str, str] = {}
    for prop in inspect(LlmRequest).column_attrs:
        name = prop.columns[0].name
        if name not in ("id", "received_at"):
            mapping[name] = prop.key
    return mapping


FIELD_TO_ATTR: Final[dict[str, str]] = _field_to_attr()
"""RequestRecord field name (the column name) -> :class:`LlmRequest` attribute name."""
