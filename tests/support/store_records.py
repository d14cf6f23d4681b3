"""Request records for the store tests: numbered records of one trace, batches of them, and what a store holds
(its row count, its ``(trace_id, span_id)`` keys)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, func, select

from inferwatch.collector.store.record import E2E, TTFT, RequestRecord
from inferwatch.collector.store.tables import REQUEST_TABLE

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def make_record(i: int, *, trace: int = 1, start: datetime | None = None, **overrides: Any) -> RequestRecord:
    start = start if start is not None else T0 + timedelta(milliseconds=i)
    values: dict[str, Any] = {
        "trace_id": f"{trace:032x}",
        "span_id": f"{i + 1:016x}",
        "engine": "vllm",
        "start_time": start,
        "end_time": start + timedelta(seconds=1.5),
        "request_id": f"req-{trace}-{i}",
        "model": "m",
        TTFT: 0.05 + i / 1000,
        E2E: 1.5,
    }
    values.update(overrides)
    return RequestRecord(**values)


def batch(n: int, *, trace: int = 1, first: int = 0, **overrides: Any) -> list[RequestRecord]:
    return [make_record(i, trace=trace, **overrides) for i in range(first, first + n)]


def count(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(REQUEST_TABLE)).scalar_one()


def stored_keys(engine: Engine) -> set[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(select(REQUEST_TABLE.c.trace_id, REQUEST_TABLE.c.span_id)).all()
    return {(r.trace_id, r.span_id) for r in rows}


def keys(records: Sequence[RequestRecord]) -> set[tuple[str, str]]:
    return {(r.trace_id, r.span_id) for r in records}
