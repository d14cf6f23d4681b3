"""What a statistics read is about: its filter, its window of end times, the state of the table and the
rollups when it starts, and the stretches of the window the rollups (and value blocks) answer.

Shared by the plans (:mod:`~inferwatch.collector.stats.rollup_plan`, :mod:`~inferwatch.collector.stats.tails`,
:mod:`~inferwatch.collector.stats.exact`) and :func:`inferwatch.collector.stats.planner.compute_stats`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, cast

from sqlalchemy import Connection, func, select
from sqlalchemy.sql.elements import ColumnElement

from inferwatch.collector.schemas import Side
from inferwatch.collector.stats import rollup, sides
from inferwatch.collector.stats.listing import refuse_nul
from inferwatch.collector.store.tables import REQUEST_TABLE, ROLLUP_STATE_TABLE
from inferwatch.core.schema import E2E, QUEUE, TPOT, TTFT

if TYPE_CHECKING:
    import psycopg

PERCENTILES: Final = (0.5, 0.9, 0.95, 0.99)
STAT_FIELDS: Final = (TTFT, TPOT, E2E, QUEUE)
MINUTE: Final = timedelta(minutes=1)
HOUR: Final = timedelta(hours=1)
DAY: Final = timedelta(days=1)


@dataclass(frozen=True, kw_only=True)
class StatsFilter:
    """Which requests the stats count; None: no condition. Text with a NUL character is refused. ``side``: the
    engine's rows, the proxy's or both (:mod:`inferwatch.collector.stats.sides`); a key of the rollups, as ``service``
    is, so every plan stays exact under it."""

    engine: str | None = None
    model: str | None = None
    instance: str | None = None
    service: str | None = None
    side: Side = sides.DEFAULT_SIDE

    def __post_init__(self) -> None:
        refuse_nul(self)

    def items(self) -> list[tuple[str, str]]:
        """The columns that must equal a value (the side is :meth:`side_sql`)."""
        return [
            (f.name, getattr(self, f.name))
            for f in fields(self)
            if f.name != "side" and getattr(self, f.name) is not None
        ]

    def side_sql(self, placeholder: str) -> str | None:
        return sides.sql(self.side, placeholder)


def ceil_to(t: datetime, unit: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    steps = -((epoch - t) // unit)
    return epoch + steps * unit


def floor_to(t: datetime, unit: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + ((t - epoch) // unit) * unit


def aware(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def pipeline(conn: Connection) -> AbstractContextManager[Any]:
    """psycopg's pipeline mode on a PostgreSQL connection where libpq has it (14+): the statements run in it are
    sent together and answered in one round trip; else nothing."""
    import psycopg

    if not psycopg.Pipeline.is_supported():
        return contextlib.nullcontext()
    return cast("psycopg.Connection[Any]", conn.connection.dbapi_connection).pipeline()


def pg_cursor(conn: Connection, *, binary: bool = False) -> psycopg.Cursor[Any]:
    """The driver's own cursor of a PostgreSQL connection (its statements prepared on request: ``prepare=True``
    prepares at the first execution, kept by the connection until a rollback)."""
    raw = conn.connection.dbapi_connection
    return cast("psycopg.Connection[Any]", raw).cursor(binary=binary)


@dataclass
class Window:
    start: datetime
    end: datetime | None
    newest: int
    """the largest row id at the start (SQLite: every raw read is bounded by it, one consistent set of rows)."""
    bounded: bool

    def conds(self, filters: StatsFilter) -> list[ColumnElement[bool]]:
        t = REQUEST_TABLE
        out: list[ColumnElement[bool]] = [t.c.end_time >= self.start]
        if self.end is not None:
            out.append(t.c.end_time < self.end)
        if self.bounded:
            out.append(t.c.id <= self.newest)
        out.extend(t.c[name] == value for name, value in filters.items())
        side = sides.condition(filters.side, t.c.service)
        if side is not None:
            out.append(side)
        return out


class Inconsistent(RuntimeError):
    """The rollups and the table disagree (a row committed below the watermark after it moved): answer by the
    index walks instead."""


@dataclass
class State:
    min_id: int | None
    max_id: int | None
    folded: int
    oldest: datetime | None
    longest: float
    first: int | None = None
    """the id of the first row by end time in the window (its distance to ``max_id`` estimates the window's
    rows)."""


_PG_STATE: Final = (
    f"SELECT (SELECT min(id) FROM {REQUEST_TABLE.name}), (SELECT max(id) FROM {REQUEST_TABLE.name}), "
    f"(SELECT folded_id FROM {ROLLUP_STATE_TABLE.name} WHERE name = %(name)s), "
    f"(SELECT min(start_time) FROM {REQUEST_TABLE.name}), (SELECT max({E2E}) FROM {REQUEST_TABLE.name}), "
    f"(SELECT id FROM {REQUEST_TABLE.name} WHERE end_time >= %(start)s ORDER BY end_time LIMIT 1)"
)
""":func:`read_state`'s statement on PostgreSQL."""


def read_state(conn: Connection, start: datetime) -> State:
    """In one round trip: the table's id range, the rollups' watermark, the oldest start, the longest request,
    the window's first row."""
    t = REQUEST_TABLE
    s = ROLLUP_STATE_TABLE
    if conn.dialect.name == "postgresql":
        # the driver's own cursor, the statement prepared: SQLAlchemy's costs more (docs/collector.md, 'measurements')
        cur = pg_cursor(conn)
        try:
            cur.execute(_PG_STATE, {"name": rollup.STATE_NAME, "start": start}, prepare=True)
            got = cur.fetchone()
        finally:
            cur.close()
        assert got is not None
        row: Sequence[Any] = got
    else:
        row = conn.execute(
            select(
                select(func.min(t.c.id)).scalar_subquery(),
                select(func.max(t.c.id)).scalar_subquery(),
                select(s.c.folded_id).where(s.c.name == rollup.STATE_NAME).scalar_subquery(),
                select(func.min(t.c.start_time)).scalar_subquery(),
                select(func.max(t.c[E2E])).scalar_subquery(),
                select(t.c.id).where(t.c.end_time >= start).order_by(t.c.end_time).limit(1).scalar_subquery(),
            )
        ).one()
    oldest = row[3]
    if isinstance(oldest, str):  # SQLite: a scalar subquery's value comes back as stored
        oldest = datetime.fromisoformat(oldest)
    return State(
        row[0], row[1], int(row[2] or 0), None if oldest is None else aware(oldest), float(row[4] or 0.0), row[5]
    )


def rollup_range(w: Window, st: State) -> tuple[datetime, datetime | None]:
    """The minute-aligned part [r0, r1) of the window that the rollups (and value blocks) answer; the rest is
    read raw."""
    start = w.start
    if st.oldest is not None:
        # rows deleted by retention started before the oldest stored one; those that ended after it may still
        # be counted in the rollups: read that stretch raw
        frontier = aware(st.oldest) + timedelta(seconds=float(st.longest) + 60)
        start = max(start, frontier)
    r0 = ceil_to(start, MINUTE)
    r1 = None if w.end is None else max(r0, floor_to(w.end, MINUTE))
    return r0, r1


def periods(r0: datetime, r1: datetime | None) -> list[tuple[int, datetime, datetime | None]]:
    """[r0, r1) as (period seconds, start, end): whole days in day rollups, whole hours around them in hour
    rollups, the minutes around those (empty ranges left out)."""
    out: list[tuple[int, datetime, datetime | None]] = []

    def split(a: datetime, b: datetime | None, levels: tuple[tuple[int, timedelta], ...]) -> None:
        if b is not None and b <= a:
            return
        if not levels:
            out.append((60, a, b))
            return
        (seconds, unit), rest = levels[0], levels[1:]
        c0 = ceil_to(a, unit)
        c1 = None if b is None else floor_to(b, unit)
        if c1 is not None and c1 <= c0:
            split(a, b, rest)
            return
        split(a, c0, rest)
        out.append((seconds, c0, c1))
        if c1 is not None:
            split(c1, b, rest)

    split(r0, r1, ((86400, DAY), (3600, HOUR)))
    return out
