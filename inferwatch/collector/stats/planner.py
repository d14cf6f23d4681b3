"""The read side of the request store: every query of the read API, as functions of an Engine.

Blocking (routes call them through ``asyncio.to_thread``), keyword-only, no HTTP: bad input raises
:class:`ValueError` (:class:`InvalidCursor`, :class:`InvalidFilter`), a database that cannot be reached
or does not answer in time :class:`DatabaseUnavailable` (the routes answer 503). Results are the
response models of :mod:`inferwatch.collector.schemas`. Percentiles are exact (nearest rank over the stored
rows) up to :data:`EXACT_LIMIT` requests in a window, sketched beyond (:func:`compute_stats` has the plans).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import contextvars
import functools
import json
import logging
import re
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, ParamSpec, TypeVar, cast

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Row,
    RowMapping,
    TextClause,
    and_,
    bindparam,
    case,
    func,
    literal_column,
    or_,
    select,
    text,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement

from inferwatch.collector.schemas import (
    FieldStats,
    GroupBy,
    RequestDetail,
    RequestPage,
    RequestRow,
    Side,
    Stats,
    StatsGroup,
    StatsPlan,
)
from inferwatch.collector.stats import rollup, sides, sketch, values
from inferwatch.collector.stats.values import nearest_rank as nearest_rank
from inferwatch.collector.store import db
from inferwatch.collector.store.tables import REQUEST_TABLE, ROLLUP_STATE_TABLE, ROLLUP_TABLE, VALUES_TABLE
from inferwatch.core.schema import DECODE, E2E, GENERATION_TOKENS, PREFILL, PROMPT_TOKENS, QUEUE, TPOT, TTFT

if TYPE_CHECKING:
    import psycopg

SortField = Literal[
    "start_time",
    "time_to_first_token",
    "time_per_output_token",
    "request_duration",
    "request_queue",
    "request_prefill",
    "request_decode",
    "prompt_tokens",
    "generation_tokens",
]
"""Columns the request list can be sorted by."""
Order = Literal["asc", "desc"]

PERCENTILES: Final = (0.5, 0.9, 0.95, 0.99)
STAT_FIELDS: Final = (TTFT, TPOT, E2E, QUEUE)
PHASES: Final = (("queue", QUEUE), ("prefill", PREFILL), ("decode", DECODE))
FAILED: Final = ("error", "abort")
"""finish reasons of failed requests (a request with an ``error`` failed too)."""
MAX_OFFSET: Final = 2**62
"""The largest offset a cursor may carry (far beyond any table; keeps OFFSET within int64)."""
MAX_CURSOR_CHARS: Final = 200
MAX_ROW_ID: Final = 2**63 - 1
MAX_WINDOW: Final = timedelta(days=36_600)
"""The longest stats window (100 years): longer ones reach before year 1."""
READINESS_TIMEOUT_S: Final = 2.0
"""The readiness probe's deadline (a connection attempt takes at least 2 s to time out, whatever this says)."""
NUL: Final = "\x00"
_HEX16: Final = re.compile(r"[0-9a-fA-F]{16}")
_DIGITS: Final = re.compile(r"[0-9]{1,19}")

log = logging.getLogger("inferwatch.collector")

P = ParamSpec("P")
R = TypeVar("R")


class DatabaseUnavailable(RuntimeError):
    """The database cannot be reached, or did not answer within its timeouts (the message says which)."""


def guarded(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn "cannot reach the database" errors of a query into :class:`DatabaseUnavailable`."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if db.is_unreachable(exc):
                raise DatabaseUnavailable(f"database unavailable: {db.describe(exc)}") from exc
            raise

    return wrapper


# --- requests --------------------------------------------------------------------------------------------------------


class InvalidCursor(ValueError):
    """A ``cursor`` this store did not hand out."""


def encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int:
    """The offset in a cursor of :func:`encode_cursor` (0 for none); :class:`InvalidCursor` for anything
    else: not base64 JSON, an offset that is not a whole number in [0, :data:`MAX_OFFSET`]."""
    if not cursor:
        return 0
    if len(cursor) > MAX_CURSOR_CHARS:
        raise InvalidCursor("invalid cursor")
    try:
        pad = "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(cursor + pad))
        offset = data["o"]
    except (ValueError, KeyError, TypeError, IndexError, binascii.Error, RecursionError):
        raise InvalidCursor("invalid cursor") from None
    if type(offset) is not int or not 0 <= offset <= MAX_OFFSET:
        raise InvalidCursor("invalid cursor")
    return offset


class InvalidFilter(ValueError):
    """A filter no stored request can match and the database may not be asked about (a NUL character)."""


@dataclass(frozen=True, kw_only=True)
class RequestFilter:
    """What the request list keeps; None: no condition. ``since`` inclusive, ``until`` exclusive (start times).

    Text with a NUL character is refused (:class:`InvalidFilter`): the store holds none (the sources
    replace it) and PostgreSQL cannot be asked about one.
    """

    engine: str | None = None
    model: str | None = None
    instance: str | None = None
    finish_reason: str | None = None
    lora_adapter: str | None = None
    service: str | None = None
    side: Side = "all"
    """whose rows (:mod:`inferwatch.collector.stats.sides`); the read API asks for the engine side by default."""
    since: datetime | None = None
    until: datetime | None = None
    min_ttft: float | None = None
    min_e2e: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, str) and NUL in value:
                raise InvalidFilter(f"{f.name} must not contain a NUL character")

    def conditions(self) -> list[ColumnElement[bool]]:
        t = REQUEST_TABLE
        conds: list[ColumnElement[bool]] = [
            t.c[name] == value
            for name, value in (
                ("engine", self.engine),
                ("model", self.model),
                ("instance", self.instance),
                ("finish_reason", self.finish_reason),
                ("lora_adapter", self.lora_adapter),
                ("service", self.service),
            )
            if value is not None
        ]
        side = sides.condition(self.side, t.c.service)
        if side is not None:
            conds.append(side)
        if self.since is not None:
            conds.append(t.c.start_time >= self.since)
        if self.until is not None:
            conds.append(t.c.start_time < self.until)
        if self.min_ttft is not None:
            conds.append(t.c[TTFT] >= self.min_ttft)
        if self.min_e2e is not None:
            conds.append(t.c[E2E] >= self.min_e2e)
        return conds


@guarded
def list_requests(
    *,
    engine: Engine,
    filters: RequestFilter,
    sort: SortField = "start_time",
    order: Order = "desc",
    limit: int = 50,
    offset: int = 0,
) -> RequestPage:
    """One page of the matching requests (nulls last, then newest row first) and the total matching."""
    if not 0 <= offset <= MAX_OFFSET:
        raise InvalidCursor("invalid cursor")
    t = REQUEST_TABLE
    key = t.c[sort]
    ordering = [key.desc().nulls_last() if order == "desc" else key.asc().nulls_last(), t.c.id.desc()]
    q = select(t).order_by(*ordering).limit(limit + 1).offset(offset)
    c = select(func.count()).select_from(t)
    conds = filters.conditions()
    if conds:
        q, c = q.where(and_(*conds)), c.where(and_(*conds))
    with engine.connect() as conn:
        rows = [RequestRow.model_validate(dict(r)) for r in conn.execute(q).mappings()]
        count = int(conn.execute(c).scalar_one())
    more = len(rows) > limit
    return RequestPage(
        data=rows[:limit],
        count=count,
        next_cursor=encode_cursor(offset + limit) if more else None,
        side=filters.side,
        service=filters.service,
    )


def _with_phases(row: RowMapping) -> RequestDetail:
    e2e = row[E2E] or 0.0
    seconds: dict[str, float | None] = {name: row[col] for name, col in PHASES}
    known = sum(v for v in seconds.values() if v is not None)
    phases: dict[str, dict[str, float | None]] = {
        name: {"seconds": v, "share": (v / e2e if e2e and v is not None else None)} for name, v in seconds.items()
    }
    other = max(e2e - known, 0.0)
    phases["other"] = {"seconds": other, "share": other / e2e if e2e else None}
    return RequestDetail.model_validate({**row, "phases": phases})


@guarded
def find_requests(*, engine: Engine, request_id: str, instance: str | None = None) -> list[RequestDetail]:
    """The rows a request id answers (row id, request id or span id), oldest first, with phase breakdowns;
    with ``instance``, only that instance's (request ids repeat across replicas)."""
    if NUL in request_id or (instance is not None and NUL in instance):
        return []  # nothing stored has one, and PostgreSQL cannot be asked
    t = REQUEST_TABLE
    conds: list[ColumnElement[bool]] = [t.c.request_id == request_id]
    if _DIGITS.fullmatch(request_id) and 0 < int(request_id) <= MAX_ROW_ID:
        conds.append(t.c.id == int(request_id))
    if _HEX16.fullmatch(request_id):
        conds.append(t.c.span_id == request_id.lower())
    cond = or_(*conds)
    if instance is not None:
        cond = and_(cond, t.c.instance == instance)
    with engine.connect() as conn:
        return [_with_phases(r) for r in conn.execute(select(t).where(cond).order_by(t.c.id)).mappings()]


@guarded
def slowest_requests(*, engine: Engine, filters: RequestFilter, sort: SortField, limit: int) -> list[RequestDetail]:
    """The ``limit`` matching requests with the highest ``sort`` value (most recent first for ``start_time``),
    with their phase breakdowns: the examples a diagnosis finding shows."""
    t = REQUEST_TABLE
    q = select(t).order_by(t.c[sort].desc().nulls_last(), t.c.id.desc()).limit(limit)
    conds = filters.conditions()
    if conds:
        q = q.where(and_(*conds))
    with engine.connect() as conn:
        return [_with_phases(r) for r in conn.execute(q).mappings()]


# --- stats -----------------------------------------------------------------------------------------------------------

StatsMode = Literal["auto", "exact", "sketch"]
"""``auto``: exact up to :data:`EXACT_LIMIT` requests in the window, sketched beyond; or always one of the two."""
Plan = StatsPlan

EXACT_LIMIT: Final = 5_000_000
"""``auto`` answers exactly up to this many requests in the window (exact stays under a second there)."""
SCAN_SHARE: Final = 0.05
"""A window holding less than this share of the table reads the values of its percentiles' buckets from its
own rows (by end time); a larger one from the latency indexes (ranges of the whole table)."""
RAW_LIMIT: Final = 400_000
"""A window of at most about this many rows (estimated from the id of its first row) is answered from its values
gathered per group from its value blocks (plan ``values``; ``raw``, its rows, while the rollups are far behind);
not the rollups' sketches (they hold too few rows per minute and series to be cheaper). Measured on PostgreSQL at
1M rows: 24 hours (143k rows) in 42-59 ms from the blocks against 93-182 ms by the index plan; at 5M rows (forced
plans, 2026-12-05) 298k rows in 26-27 ms against 161 ms (no grouping) to 3.0 s (by instance) by the scan plan,
the one a window under 5% of the table gets otherwise: the 1-hour window of a 50M-row week (300k rows) took
0.4-1.7 s by it. The blocks' cost grows with the window's rows (about 0.1 us each) and a request holds about
120 bytes per row of the window while it gathers (traced: 36 MB for 298k rows, 47 MB for 387k): hence the bound."""
TAIL_LIMIT: Final = 250_000
"""Rows not yet in the rollups beyond which the rollups are not used (a backfill under way): the index walks."""


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
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, str) and NUL in value:
                raise InvalidFilter(f"{f.name} must not contain a NUL character")

    def items(self) -> list[tuple[str, str]]:
        """The columns that must equal a value (the side is :meth:`side_sql`)."""
        return [
            (f.name, getattr(self, f.name))
            for f in fields(self)
            if f.name != "side" and getattr(self, f.name) is not None
        ]

    def side_sql(self, placeholder: str) -> str | None:
        return sides.sql(self.side, placeholder)


@dataclass(slots=True)
class _Agg(rollup.Totals):
    """One group's exact counts and per-field bucket counts, merged from rollups and raw rows."""

    n: list[int] = field(default_factory=lambda: [0] * len(STAT_FIELDS))
    hists: list[sketch.Histogram] = field(default_factory=lambda: [sketch.Histogram() for _ in STAT_FIELDS])


def _ceil(t: datetime, unit: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    steps = -((epoch - t) // unit)
    return epoch + steps * unit


def _floor(t: datetime, unit: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + ((t - epoch) // unit) * unit


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _pipeline(conn: Connection) -> AbstractContextManager[Any]:
    """psycopg's pipeline mode on a PostgreSQL connection where libpq has it (14+): the statements run in it are
    sent together and answered in one round trip; else nothing."""
    import psycopg

    if not psycopg.Pipeline.is_supported():
        return contextlib.nullcontext()
    return cast("psycopg.Connection[Any]", conn.connection.dbapi_connection).pipeline()


def _pg_cursor(conn: Connection, *, binary: bool = False) -> psycopg.Cursor[Any]:
    """The driver's own cursor of a PostgreSQL connection (its statements prepared on request: ``prepare=True``
    prepares at the first execution, kept by the connection until a rollback)."""
    raw = conn.connection.dbapi_connection
    return cast("psycopg.Connection[Any]", raw).cursor(binary=binary)


MINUTE: Final = timedelta(minutes=1)
HOUR: Final = timedelta(hours=1)
DAY: Final = timedelta(days=1)


@dataclass
class _Window:
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


class _Inconsistent(RuntimeError):
    """The rollups and the table disagree (a row committed below the watermark after it moved): answer by the
    index walks instead."""


@dataclass
class _State:
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
""":func:`_state`'s statement on PostgreSQL."""


def _state(conn: Connection, start: datetime) -> _State:
    """In one round trip: the table's id range, the rollups' watermark, the oldest start, the longest request,
    the window's first row."""
    t = REQUEST_TABLE
    s = ROLLUP_STATE_TABLE
    if conn.dialect.name == "postgresql":  # the driver's own cursor: SQLAlchemy's statement costs more (0.7 ms)
        cur = _pg_cursor(conn)
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
    return _State(
        row[0], row[1], int(row[2] or 0), None if oldest is None else _aware(oldest), float(row[4] or 0.0), row[5]
    )


def _rollup_range(w: _Window, st: _State) -> tuple[datetime, datetime | None]:
    """The minute-aligned part [r0, r1) of the window that the rollups (and value blocks) answer; the rest is
    read raw."""
    start = w.start
    if st.oldest is not None:
        # rows deleted by retention started before the oldest stored one; those that ended after it may still
        # be counted in the rollups: read that stretch raw
        frontier = _aware(st.oldest) + timedelta(seconds=float(st.longest) + 60)
        start = max(start, frontier)
    r0 = _ceil(start, MINUTE)
    r1 = None if w.end is None else max(r0, _floor(w.end, MINUTE))
    return r0, r1


def _periods(r0: datetime, r1: datetime | None) -> list[tuple[int, datetime, datetime | None]]:
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
        c0 = _ceil(a, unit)
        c1 = None if b is None else _floor(b, unit)
        if c1 is not None and c1 <= c0:
            split(a, b, rest)
            return
        split(a, c0, rest)
        out.append((seconds, c0, c1))
        if c1 is not None:
            split(c1, b, rest)

    split(r0, r1, ((86400, DAY), (3600, HOUR)))
    return out


def _rollup_aggs(
    conn: Connection, w: _Window, filters: StatsFilter, group_by: GroupBy, st: _State
) -> tuple[dict[Any, _Agg], datetime, datetime | None]:
    """Per group: the rollups of the window's whole minutes (whole hours where they fit) and the raw rows of its
    edges and above the watermark; the (minute-aligned) range the rollups answered."""
    t = REQUEST_TABLE
    r = ROLLUP_TABLE
    folded = st.folded
    r0, r1 = _rollup_range(w, st)
    aggs: dict[Any, _Agg] = {}
    names = [*([] if group_by == "none" else [group_by]), "requests", "failed", PROMPT_TOKENS,
             f"{PROMPT_TOKENS}_count", GENERATION_TOKENS, f"{GENERATION_TOKENS}_count",
             *(c for f in STAT_FIELDS for c in (f"{f}_count", f"{f}_sketch"))]  # fmt: skip
    periods = _periods(r0, r1)
    rollup_rows: list[Sequence[Any]] = []
    if conn.dialect.name == "postgresql" and periods:
        # one statement, through the driver's cursor, in binary: the sketches as text are hex (twice the bytes to
        # send, encode and decode; 7 days of hours and minutes took 66 ms more to fetch)
        params: dict[str, Any] = {}
        parts = []
        fsql = "".join(f" AND {name} = %(f_{name})s" for name, _ in filters.items())
        params.update({f"f_{name}": value for name, value in filters.items()})
        side_sql = filters.side_sql(f"%({sides.PARAM})s")
        if side_sql is not None:
            fsql += f" AND {side_sql}"
            params.update(sides.PARAMS)
        for k, (period, a, b) in enumerate(periods):
            params.update({f"p{k}": period, f"a{k}": a, f"b{k}": b})
            until = "" if b is None else f" AND period_start < %(b{k})s"
            parts.append(
                f"SELECT {', '.join(names)} FROM {r.name} WHERE period_seconds = %(p{k})s "
                f"AND period_start >= %(a{k})s{until}{fsql}"
            )
        cur = _pg_cursor(conn, binary=True)
        try:
            cur.execute(" UNION ALL ".join(parts), params)
            rollup_rows = list(cur.fetchall())
        finally:
            cur.close()
    else:
        fcond = [r.c[name] == value for name, value in filters.items()]
        side = sides.condition(filters.side, r.c.service)
        if side is not None:
            fcond.append(side)
        for period, a, b in periods:
            conds = [r.c.period_seconds == period, r.c.period_start >= a, *fcond]
            if b is not None:
                conds.append(r.c.period_start < b)
            rollup_rows.extend(conn.execute(select(*(r.c[n] for n in names)).where(*conds)).all())
    sketches: dict[Any, list[list[bytes]]] = {}
    for row in rollup_rows:
        key = None if group_by == "none" else row[0]
        vals = row if group_by == "none" else row[1:]
        g = aggs.get(key)
        if g is None:
            g = aggs[key] = _Agg()
        g.requests += vals[0]
        g.failed += vals[1]
        g.prompt_tokens += vals[2]
        g.prompt_count += vals[3]
        g.generation_tokens += vals[4]
        g.generation_count += vals[5]
        n = g.n
        pending = sketches.get(key)
        if pending is None:
            pending = sketches[key] = [[] for _ in STAT_FIELDS]
        for j in range(len(STAT_FIELDS)):
            n[j] += vals[6 + 2 * j]
            pending[j].append(vals[7 + 2 * j])
    for key, pending in sketches.items():  # merged at once, per group and field
        for hist, datas in zip(aggs[key].hists, pending, strict=True):
            hist.add_many(datas)
    # the raw rows: the edges (below the watermark, outside the rollups' range) and everything above it
    base = w.conds(filters)
    edges = [t.c.end_time < r0]
    if r1 is not None:
        edges.append(t.c.end_time >= r1)
    raw = [and_(*base, t.c.id <= folded, or_(*edges)), and_(*base, t.c.id > folded)]
    group_col = [] if group_by == "none" else [t.c[group_by]]
    cols = [
        *group_col,
        case((rollup.failed_condition(), 1), else_=0),
        t.c[PROMPT_TOKENS],
        t.c[GENERATION_TOKENS],
        *(t.c[f] for f in STAT_FIELDS),
    ]
    for cond in raw:
        for raw_row in conn.execute(select(*cols).where(cond)).all():
            tup = tuple(raw_row)
            key = tup[0] if group_col else None
            failed, pt, gt, *values = tup[1:] if group_col else tup
            g = aggs.get(key)
            if g is None:
                g = aggs[key] = _Agg()
            g.add_request(failed, pt, gt)
            for j, v in enumerate(values):
                if v is not None:
                    g.n[j] += 1
                    g.hists[j].counts[sketch.bucket_of(v)] += 1
    return {k: g for k, g in aggs.items() if g.requests}, r0, r1


def _range(col: Any, bucket: int) -> ColumnElement[bool]:
    lo, hi = sketch.bucket_range(bucket)
    conds = []
    if lo is not None:
        conds.append(col > lo)
    if hi is not None:
        conds.append(col <= hi)
    return and_(*conds) if conds else col.is_not(None)


Target = tuple[Any, int, int, str]
"""(group, bucket, rank within the bucket, percentile name)."""


def _targets(aggs: dict[Any, _Agg]) -> list[list[Target]]:
    """Per field, where each group's exact percentiles are: their bucket and rank within it."""
    out: list[list[Target]] = [[] for _ in STAT_FIELDS]
    names = [f"p{round(q * 100)}" for q in PERCENTILES]
    for key, g in aggs.items():
        for j in range(len(STAT_FIELDS)):
            n = g.n[j]
            if n:
                found = g.hists[j].locate([nearest_rank(n, q) for q in PERCENTILES])
                out[j].extend((key, b, r, name) for (b, r), name in zip(found, names, strict=True))
    return out


def _pick_by_scan(
    conn: Connection, w: _Window, filters: StatsFilter, group_by: GroupBy, aggs: dict[Any, _Agg],
    targets: list[list[Target]],
) -> dict[tuple[Any, int, str], float]:  # fmt: skip
    """The values at the targets, from the window's own rows (read by end time) that lie in a target bucket."""
    t = REQUEST_TABLE
    wanted: list[dict[tuple[Any, int], list[tuple[int, str]]]] = [{} for _ in STAT_FIELDS]
    ranges: list[ColumnElement[bool]] = []
    for j, ts in enumerate(targets):
        buckets = sorted({b for _, b, _, _ in ts})
        for key, b, rank, name in ts:
            wanted[j].setdefault((key, b), []).append((rank, name))
        col = t.c[STAT_FIELDS[j]]
        ranges.extend(_range(col, b) for b in buckets)
    if not ranges:
        return {}
    group_col = [] if group_by == "none" else [t.c[group_by]]
    q = select(*group_col, *(t.c[f] for f in STAT_FIELDS)).where(*w.conds(filters), or_(*ranges))
    found: list[dict[tuple[Any, int], list[float]]] = [{k: [] for k in wj} for wj in wanted]
    bounds = sketch.BOUNDS
    for row in conn.execute(q):
        key = row[0] if group_col else None
        values = row[1:] if group_col else row
        for j, v in enumerate(values):
            if v is not None:
                lst = found[j].get((key, bisect_left(bounds, v)))
                if lst is not None:
                    lst.append(v)
    out: dict[tuple[Any, int, str], float] = {}
    for j, fj in enumerate(found):
        for (key, b), vals in fj.items():
            if len(vals) != aggs[key].hists[j].counts[b]:
                raise _Inconsistent(
                    f"{STAT_FIELDS[j]} bucket {b}: {len(vals)} rows, rollups {aggs[key].hists[j].counts[b]}"
                )
            vals.sort()
            for rank, name in wanted[j][(key, b)]:
                out[(key, j, name)] = float(vals[rank])
    return out


def _pick_by_index(
    conn: Connection,
    w: _Window,
    filters: StatsFilter,
    group_by: GroupBy,
    aggs: dict[Any, _Agg],
    targets: list[list[Target]],
    helper: SnapshotHelper | None = None,
) -> dict[tuple[Any, int, str], float]:
    """The values at the targets, each bucket read in order from the field's covering (latency, end time,
    engine, model, instance) index: a range of the whole table, filtered by the window inside the index, each
    group's rows numbered there (and counted: they must be the rollups' count). One statement per field, a
    ``UNION ALL`` of its buckets, written out here: building a hundred Core expressions cost more than the
    database's work. With a ``helper`` (PostgreSQL), a second connection in the same snapshot shares the
    statements."""
    t = REQUEST_TABLE
    params: dict[str, Any] = {"start": w.start}
    binds = [bindparam("start", type_=t.c.end_time.type)]
    where = ["end_time >= :start"]
    if w.end is not None:
        params["end"] = w.end
        binds.append(bindparam("end", type_=t.c.end_time.type))
        where.append("end_time < :end")
    for name, value in filters.items():
        params[f"f_{name}"] = value
        where.append(f"{name} = :f_{name}")
    side_sql = filters.side_sql(f":{sides.PARAM}")
    if side_sql is not None:
        where.append(side_sql)
        params.update(sides.PARAMS)
    key_names: dict[Any, str] = {}
    for key in aggs:
        if key is not None:
            key_names[key] = f"k{len(key_names)}"
            params[key_names[key]] = key
    g = "NULL" if group_by == "none" else group_by
    part = "" if group_by == "none" else f"PARTITION BY {group_by} "
    out: dict[tuple[Any, int, str], float] = {}
    stmts: list[tuple[int, TextClause]] = []
    postgres = conn.dialect.name == "postgresql"
    positions: dict[tuple[int, int], dict[int, int]] = {}  # (field, bucket) -> 1-based rank -> place in the picks
    for j, ts in enumerate(targets):
        if not ts:
            continue
        col = STAT_FIELDS[j]
        per_bucket: dict[int, list[tuple[Any, int, str]]] = {}
        for key, b, rank, name in ts:
            per_bucket.setdefault(b, []).append((key, rank, name))
        members = []
        for b, wants in per_bucket.items():
            lo, hi = sketch.bucket_range(b)
            conds = [*where, f"{col} IS NOT NULL"]
            if lo is not None:
                conds.append(f"{col} > {lo!r}")
            if hi is not None:
                conds.append(f"{col} <= {hi!r}")
            keys = {key for key, _, _ in wants}
            if group_by != "none" and len(keys) < len(aggs):
                # only the groups whose percentiles lie in this bucket are numbered (and sorted)
                names = ", ".join(f":{key_names[k]}" for k in keys if k is not None)
                either = [f"{group_by} IN ({names})"] if names else []
                if None in keys:
                    either.append(f"{group_by} IS NULL")
                conds.append("(" + " OR ".join(either) + ")")
            ranked = sorted({rank + 1 for _, rank, _ in wants})
            positions[(j, b)] = {r: k for k, r in enumerate(ranked)}
            where_b = " AND ".join(conds)
            if postgres:  # each group's values sorted by the aggregate, its ranks picked from the array
                picks = ", ".join(f"a[{r}]" for r in ranked)
                grouped = "" if group_by == "none" else f" GROUP BY {group_by}"
                members.append(
                    f"SELECT {b} AS b, g, n, ARRAY[{picks}] AS v FROM (SELECT {g} AS g, count(*) AS n, "
                    f"array_agg({col} ORDER BY {col}) AS a FROM {t.name} WHERE {where_b}{grouped}) AS x{b}"
                )
            else:
                members.append(
                    f"SELECT {b} AS b, g, rn, v, n FROM (SELECT {g} AS g, {col} AS v, "
                    f"row_number() OVER ({part}ORDER BY {col}) AS rn, count(*) OVER ({part.strip()}) AS n "
                    f"FROM {t.name} WHERE {where_b}) AS x{b} WHERE rn IN ({', '.join(map(str, ranked))})"
                )
        stmts.append((j, text(" UNION ALL ".join(members)).bindparams(*binds)))
    results = _execute_all(conn, [stmt for _, stmt in stmts], params, helper)
    for (j, _), rows in zip(stmts, results, strict=True):
        have: dict[tuple[int, Any, int], tuple[float | None, int]] = {}
        for row in rows:
            if postgres:
                for r, k in positions[(j, row.b)].items():
                    have[(row.b, row.g, r)] = (None if row.v[k] is None else float(row.v[k]), int(row.n))
            else:
                have[(row.b, row.g, row.rn)] = (float(row.v), int(row.n))
        for key, b, rank, name in targets[j]:
            found = have.get((b, key, rank + 1))
            if found is None or found[0] is None or found[1] != aggs[key].hists[j].counts[b]:
                raise _Inconsistent(f"{STAT_FIELDS[j]} bucket {b} of {key!r}: the table disagrees with the rollups")
            out[(key, j, name)] = found[0]
    return out


SnapshotHelper = Callable[[], AbstractContextManager[Connection | None]]
"""A second connection in the same snapshot as the first (PostgreSQL), or None where there is none."""


def _execute_all(
    conn: Connection, stmts: list[TextClause], params: dict[str, Any], helper: SnapshotHelper | None
) -> list[Sequence[Row[Any]]]:
    """The statements' rows, in order: on ``conn`` alone, or shared with a second connection in the same
    snapshot (both cores for the database's work), each taking the next statement when it is free."""
    results: list[Sequence[Row[Any]] | None] = [None] * len(stmts)
    if helper is None or len(stmts) < 2:
        return [conn.execute(stmt, params).all() for stmt in stmts]
    todo = iter(range(len(stmts)))
    lock = threading.Lock()

    def drain(c: Connection) -> None:
        while True:
            with lock:
                k = next(todo, None)
            if k is None:
                return
            results[k] = c.execute(stmts[k], params).all()

    def second() -> None:
        with helper() as other:
            if other is not None:
                drain(other)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="stats") as pool:
        fut = pool.submit(contextvars.copy_context().run, second)
        drain(conn)
        fut.result()
    done = [r for r in results if r is not None]
    assert len(done) == len(stmts)  # every statement was taken, and a failed one raised
    return done


@contextmanager
def _snapshot_connection(engine: Engine, snapshot: str) -> Iterator[Connection | None]:
    """A connection of ``engine`` in the exported ``snapshot`` (PostgreSQL's ``SET TRANSACTION SNAPSHOT``), or
    None when it cannot join it (the caller's connection then runs everything)."""
    try:
        with engine.connect() as c:
            c = c.execution_options(isolation_level="REPEATABLE READ")
            try:
                c.exec_driver_sql(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
            except DBAPIError as exc:
                log.debug("stats: no second connection in the snapshot (%s)", exc)
                c.rollback()
                yield None
                return
            try:
                yield c
            finally:
                c.rollback()
    except DBAPIError as exc:
        log.debug("stats: no second connection (%s)", exc)
        yield None


def _raw(
    conn: Connection, w: _Window, filters: StatsFilter, group_by: GroupBy, good: ColumnElement[Any]
) -> list[dict[str, Any]]:
    """A small window: its rows read once (by end time), counted and their values sorted per group (PostgreSQL:
    in the database, ``percentile_disc`` being the nearest rank)."""
    t = REQUEST_TABLE
    group_col = [] if group_by == "none" else [t.c[group_by]]
    if conn.dialect.name == "postgresql":
        return _raw_in_database(conn, w, filters, group_col, good)
    cols = [*group_col, case((rollup.failed_condition(), 1), else_=0), t.c[PROMPT_TOKENS], t.c[GENERATION_TOKENS],
            good, *(t.c[f] for f in STAT_FIELDS)]  # fmt: skip
    q = select(*cols).where(*w.conds(filters))
    groups: dict[Any, list[Any]] = {}
    for row in conn.execute(q):
        tup = tuple(row)
        key = tup[0] if group_col else None
        g = groups.get(key)
        if g is None:
            g = groups[key] = [0, 0, 0, 0, 0, 0, 0, [[] for _ in STAT_FIELDS]]
        failed, pt, gt, ok, *values = tup[1:] if group_col else tup
        g[0] += 1
        g[1] += failed
        g[6] += ok
        if pt is not None:
            g[2] += pt
            g[3] += 1
        if gt is not None:
            g[4] += gt
            g[5] += 1
        for lst, v in zip(g[7], values, strict=True):
            if v is not None:
                lst.append(v)
    return _exact_entries(groups)


def _exact_entries(groups: dict[Any, list[Any]]) -> list[dict[str, Any]]:
    """Entries from each group's [requests, failed, prompt tokens, rows with them, generation tokens, rows with
    them, good, per-field values]: the values sorted, the nearest ranks picked."""
    entries = []
    for key, (requests, failed, pt, ptn, gt, gtn, ok, lists) in groups.items():
        if not requests:
            continue
        entry: dict[str, Any] = {"key": key, "requests": requests, "failed": failed, "good": ok}
        entry.update(prompt_tokens=pt if ptn else None, generation_tokens=gt if gtn else None)
        for f, vs in zip(STAT_FIELDS, lists, strict=True):
            vs.sort()
            n = len(vs)
            entry[f] = FieldStats.model_validate(
                {
                    "count": n,
                    "exact": True,
                    "relative_error": 0.0,
                    **{f"p{round(q * 100)}": (float(vs[nearest_rank(n, q)]) if n else None) for q in PERCENTILES},
                }
            )
        entries.append(entry)
    return entries


_SERIES_INDEX: Final = {"engine": 0, "model": 1, "instance": 2, "service": 3}


def _values(
    conn: Connection, w: _Window, filters: StatsFilter, group_by: GroupBy, st: _State, *, last: bool = False
) -> list[dict[str, Any]]:
    """A small window, exactly, without reading its rows: counts, token sums and values from the value blocks of
    its whole ten-minute periods and of its other whole minutes (:class:`values.Gather`: each group's values
    gathered, nearest ranks picked), the edges and the rows above the watermark read raw, as
    :func:`_rollup_aggs` does. Like the sketch plan, it trusts the watermark (the rollup job's grace)."""
    t = REQUEST_TABLE
    r0, r1 = _rollup_range(w, st)
    gi = None if group_by == "none" else _SERIES_INDEX[group_by]
    wanted = [(_SERIES_INDEX[name], value) for name, value in filters.items()]

    side = filters.side

    def group_of(k: values.SeriesKey) -> Any:
        if any(k[i] != value for i, value in wanted) or not sides.keeps(side, k[3]):
            return values.LEFT_OUT
        return None if gi is None else k[gi]

    gather = values.Gather(len(STAT_FIELDS), group_of)
    blocks = r1 is None or r1 > r0
    edge_rows: Sequence[Any]
    if conn.dialect.name == "postgresql":  # one statement: the blocks, the edges and the rows above the watermark
        edge_rows = []
        for row in _pg_blocks_and_edges(conn, w, filters, group_by, st.folded, r0, r1, blocks=blocks, commit=last):
            if row[0] is None:
                edge_rows.append(row[3:] if gi is not None else row[4:])
            else:
                gather.add_block(row[0], row[1], row[2])
    else:
        if blocks:
            for block in _blocks(conn, r0, r1):
                gather.add_block(*block)
        # one statement: the edges below the watermark and every row above it
        edges = [t.c.end_time < r0]
        if r1 is not None:
            edges.append(t.c.end_time >= r1)
        group_col = [] if gi is None else [t.c[group_by]]
        cols = [*group_col, case((rollup.failed_condition(), 1), else_=0), t.c[PROMPT_TOKENS],
                t.c[GENERATION_TOKENS], *(t.c[f] for f in STAT_FIELDS)]  # fmt: skip
        edge_rows = conn.execute(select(*cols).where(*w.conds(filters), or_(t.c.id > st.folded, *edges))).all()
    if edge_rows:
        columns = list(zip(*edge_rows, strict=True))
        if gi is None:
            columns.insert(0, (None,) * len(edge_rows))
        gather.add_rows(columns[0], columns[1], columns[2], columns[3], columns[4:])
    return _gathered(gather)


def _pg_blocks_and_edges(
    conn: Connection,
    w: _Window,
    filters: StatsFilter,
    group_by: GroupBy,
    folded: int,
    r0: datetime,
    r1: datetime | None,
    *,
    blocks: bool,
    commit: bool = False,
) -> list[tuple[Any, ...]]:
    """PostgreSQL, in one statement through the driver's cursor, in binary (bytea as text is hex, 4x slower to
    send and read): the value blocks of [r0, r1) (with ``blocks``; :data:`_PG_BLOCKS`) as (series, counts,
    vals, None...), and the window's rows outside those whole minutes or above the watermark as (None, None,
    None, group, failed, prompt tokens, generation tokens, *latencies). Written out, not built: building the
    SQLAlchemy statement of the rows took 0.9 ms, running it 0.3; a second statement cost a round trip and its
    planning (0.5 ms). Prepared: on a stats engine, planned once for any parameters
    (:func:`~inferwatch.collector.store.db.make_stats_engine`); written for that plan."""
    t = REQUEST_TABLE.name
    g = "NULL::text" if group_by == "none" else group_by
    cols = [g, rollup.FAILED_FLAG_PG, PROMPT_TOKENS, GENERATION_TOKENS, *STAT_FIELDS]
    params: dict[str, Any] = {"start": w.start, "end": w.end, "folded": folded, "newest": w.newest, "r0": r0, "r1": r1}
    where = []
    for k, (name, value) in enumerate(filters.items()):
        where.append(f"{name} = %(f{k})s")
        params[f"f{k}"] = value
    side_sql = filters.side_sql(f"%({sides.PARAM})s")
    if side_sql is not None:
        where.append(side_sql)
        params.update(sides.PARAMS)
    head = f"SELECT NULL::text, NULL::bytea, NULL::bytea, {', '.join(cols)} FROM {t} WHERE " + "".join(
        f"{c} AND " for c in where
    )
    # three ranges of an index each (one condition with OR made the server visit every row of the window):
    # before the whole minutes, after them, and above the watermark within them. That last one by its ids
    # alone: with both the id and the end-time ranges open to it, a generic plan walked the end times of the
    # whole window (5,900 rows for none)
    parts = [
        head + "end_time >= %(start)s AND end_time < %(r0)s" + ("" if w.end is None else " AND end_time < %(end)s")
    ]
    if r1 is not None:
        parts.append(head + "end_time >= %(r1)s AND end_time < %(end)s")
    parts.append(
        head + "id > %(folded)s AND id <= %(newest)s AND (end_time >= %(r0)s) IS TRUE"
        + ("" if r1 is None else " AND (end_time < %(r1)s) IS TRUE")
    )  # fmt: skip
    if blocks:
        params["last_ten"] = None if r1 is None else r1 - rollup.TEN
        parts.insert(0, _PG_BLOCKS)
    cur = _pg_cursor(conn, binary=True)
    try:
        _prepared(conn, cur, " UNION ALL ".join(parts), params, commit=commit)
        return list(cur.fetchall())
    finally:
        cur.close()


def _prepared(conn: Connection, cur: psycopg.Cursor[Any], sql: str, params: dict[str, Any], *, commit: bool) -> None:
    """Run ``sql`` on ``cur`` prepared (on a stats engine's connection: planned once, generically,
    :func:`~inferwatch.collector.store.db.make_stats_engine`). ``commit``: the statement ends the read, its transaction
    committed in the same round trip (the rows stay readable from ``cur``; 0.08 ms less than a COMMIT of its
    own)."""
    with _pipeline(conn):
        cur.execute(sql, params, prepare=True)
        if commit:
            cast("psycopg.Connection[Any]", conn.connection.dbapi_connection).commit()


def _gathered(gather: values.Gather) -> list[dict[str, Any]]:
    """Entries of the groups a :class:`values.Gather` holds."""
    totals = gather.totals().tolist()
    ranked = gather.ranked(PERCENTILES)
    names = [f"p{round(q * 100)}" for q in PERCENTILES]
    blank: list[float | None] = [None] * len(names)
    entries = []
    for key, (requests, failed_n, pt, ptn, gt, gtn), per_field in zip(gather.keys, totals, ranked, strict=True):
        if not requests:
            continue
        entry: dict[str, Any] = {"key": key, "requests": requests, "failed": failed_n,
                                 "good": 0, "prompt_tokens": pt if ptn else None,
                                 "generation_tokens": gt if gtn else None}  # fmt: skip
        for f, (n, ps) in zip(STAT_FIELDS, per_field, strict=True):  # validated with the group (1.8 us less)
            entry[f] = {"count": n, "exact": True, "relative_error": 0.0, **dict(zip(names, ps or blank, strict=True))}
        entries.append(entry)
    return entries


_PG_BLOCKS: Final = f"""
SELECT v.series, v.counts, v.vals, NULL::text, NULL::int4, NULL::int8, NULL::int8,
  {", ".join("NULL::float8" for _ in STAT_FIELDS)} FROM {VALUES_TABLE.name} AS v
WHERE v.period_start >= %(r0)s AND (%(r1)s::timestamptz IS NULL OR v.period_start < %(r1)s) AND (
  (v.period_seconds = 600 AND (%(last_ten)s::timestamptz IS NULL OR v.period_start <= %(last_ten)s))
  OR (v.period_seconds = 60 AND NOT EXISTS (
    SELECT 1 FROM {VALUES_TABLE.name} AS ten WHERE ten.period_seconds = 600
      AND ten.period_start <= v.period_start AND ten.period_start > v.period_start - interval '10 minutes'
      AND ten.period_start >= %(r0)s AND (%(last_ten)s::timestamptz IS NULL OR ten.period_start <= %(last_ten)s))))
"""
"""The blocks of [r0, r1): each whole ten-minute period's block where it has one, the other minutes' blocks (the
columns of :func:`_pg_blocks_and_edges`)."""


def _blocks(conn: Connection, r0: datetime, r1: datetime | None) -> list[tuple[str, bytes, bytes]]:
    """SQLite: (series, counts, vals) of the value blocks that cover [r0, r1) once: whole ten-minute periods from
    their blocks, the other minutes from theirs (PostgreSQL: :func:`_pg_blocks_and_edges`)."""
    v = VALUES_TABLE
    vq = select(v.c.period_seconds, v.c.period_start, v.c.series, v.c.counts, v.c.vals).where(
        v.c.period_seconds.in_((60, 600)), v.c.period_start >= r0
    )
    if r1 is not None:
        vq = vq.where(v.c.period_start < r1)
    got = conn.execute(vq).all()
    # whole ten-minute periods from their blocks, the other minutes from theirs
    tens = {row[1] for row in got if row[0] == 600 and (r1 is None or row[1] + rollup.TEN <= r1)}
    return [
        (series, counts, vals)
        for period, start, series, counts, vals in got
        if (period == 600 and start in tens) or (period == 60 and rollup.ten_of(start) not in tens)
    ]


def _raw_in_database(
    conn: Connection, w: _Window, filters: StatsFilter, group_col: list[Any], good: ColumnElement[Any]
) -> list[dict[str, Any]]:
    """PostgreSQL's own ordered-set aggregate over the window's rows: one statement, nothing sorted here."""
    t = REQUEST_TABLE
    qs: ColumnElement[Any] = literal_column("ARRAY[" + ", ".join(repr(q) for q in PERCENTILES) + "]::float8[]")
    failed = case((rollup.failed_condition(), 1), else_=0)
    cols: list[Any] = [*group_col, func.count(), func.sum(failed), func.sum(t.c[PROMPT_TOKENS]),
                       func.count(t.c[PROMPT_TOKENS]), func.sum(t.c[GENERATION_TOKENS]),
                       func.count(t.c[GENERATION_TOKENS]), func.sum(good)]  # fmt: skip
    for f in STAT_FIELDS:
        cols += [func.count(t.c[f]), func.percentile_disc(qs).within_group(t.c[f])]
    q = select(*cols).where(*w.conds(filters))
    if group_col:
        q = q.group_by(*group_col)
    entries = []
    for row in conn.execute(q).all():
        tup = tuple(row)
        key = tup[0] if group_col else None
        requests, failed_n, pt, ptn, gt, gtn, ok, *per_field = tup[1:] if group_col else tup
        if not requests:
            continue
        entry: dict[str, Any] = {"key": key, "requests": requests, "failed": int(failed_n or 0), "good": int(ok or 0)}
        entry.update(prompt_tokens=int(pt) if ptn else None, generation_tokens=int(gt) if gtn else None)
        for j, f in enumerate(STAT_FIELDS):
            n, ps = per_field[2 * j], per_field[2 * j + 1]
            values: dict[str, Any] = {"count": n, "exact": True, "relative_error": 0.0}
            for q_, p in zip(PERCENTILES, ps if n else [None] * len(PERCENTILES), strict=True):
                values[f"p{round(q_ * 100)}"] = None if p is None else float(p)
            entry[f] = FieldStats.model_validate(values)
        entries.append(entry)
    return entries


def _goodput_counts(
    conn: Connection, w: _Window, filters: StatsFilter, group_by: GroupBy, good: ColumnElement[Any]
) -> dict[Any, int]:
    t = REQUEST_TABLE
    group_col = [] if group_by == "none" else [t.c[group_by]]
    q = select(*group_col, func.sum(good)).where(*w.conds(filters))
    if group_col:
        q = q.group_by(*group_col)
    return {(row[0] if group_col else None): int(row[-1] or 0) for row in conn.execute(q)}


def percentiles(*, engine: Engine, field: str, where: ColumnElement[bool], n: int) -> dict[str, float | None]:
    """Exact nearest-rank :data:`PERCENTILES` of one column over the ``n`` non-null values ``where`` keeps,
    walking its covering (latency, end time, engine, model, instance) index from the nearer end (the fallback
    while the rollups are far behind)."""
    col = REQUEST_TABLE.c[field]
    fcond = and_(where, col.is_not(None))
    out: dict[str, float | None] = {}
    with engine.connect() as conn:
        for q in PERCENTILES:
            name = f"p{round(q * 100)}"
            if n == 0:
                out[name] = None
                continue
            idx = nearest_rank(n, q)
            if idx < n // 2:
                sel = select(col).where(fcond).order_by(col.asc()).limit(1).offset(idx)
            else:
                sel = select(col).where(fcond).order_by(col.desc()).limit(1).offset(n - 1 - idx)
            out[name] = float(conn.execute(sel).scalar_one())
    return out


def _walk(
    engine: Engine, w: _Window, filters: StatsFilter, group_by: GroupBy, good: ColumnElement[Any]
) -> list[dict[str, Any]]:
    """The rollup-free plan: counts by one aggregate over the window, percentiles by index walks per group."""
    t = REQUEST_TABLE
    group_col: Column[Any] | None = None if group_by == "none" else t.c[group_by]
    failed = rollup.failed_condition()
    cols: list[Any] = [
        func.count().label("requests"),
        func.sum(case((failed, 1), else_=0)).label("failed"),
        func.sum(t.c[PROMPT_TOKENS]).label("prompt_tokens"),
        func.sum(t.c[GENERATION_TOKENS]).label("generation_tokens"),
        func.sum(good).label("good"),
        *(func.count(t.c[f]).label(f"n_{f}") for f in STAT_FIELDS),
    ]
    base = and_(*w.conds(filters))
    q = select(*([group_col] if group_col is not None else []), *cols).where(base)
    if group_col is not None:
        q = q.group_by(group_col)
    with engine.connect() as conn:
        rows = list(conn.execute(q).mappings())
    out = []
    for m in rows:
        if not m["requests"]:  # no grouping: the aggregate's one row of an empty window
            continue
        key = m[group_col.name] if group_col is not None else None
        cond = base if group_col is None else and_(base, group_col == key)
        entry: dict[str, Any] = {
            "key": key,
            "requests": int(m["requests"]),
            "failed": int(m["failed"] or 0),
            "prompt_tokens": None if m["prompt_tokens"] is None else int(m["prompt_tokens"]),
            "generation_tokens": None if m["generation_tokens"] is None else int(m["generation_tokens"]),
            "good": int(m["good"] or 0),
        }
        with ThreadPoolExecutor(max_workers=len(STAT_FIELDS)) as pool:
            futures = [  # each in a copy of this context: the caller's database deadline holds there too
                pool.submit(
                    contextvars.copy_context().run, percentiles, engine=engine, field=f, where=cond, n=int(m[f"n_{f}"])
                )
                for f in STAT_FIELDS
            ]
            for field, future in zip(STAT_FIELDS, futures, strict=True):
                n_field = int(m[f"n_{field}"])
                entry[field] = FieldStats.model_validate(
                    {"count": n_field, "exact": True, "relative_error": 0.0, **future.result()}
                )
        out.append(entry)
    return out


@guarded
def compute_stats(
    *,
    engine: Engine,
    window: timedelta,
    group_by: GroupBy = "none",
    slos: dict[str, float] | None = None,
    now: datetime | None = None,
    filters: StatsFilter | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    mode: StatsMode = "auto",
    plan: Plan | None = None,
) -> Stats:
    """Percentiles (nearest rank), counts and goodput per group over the requests that finished in the
    window: ``end_time`` in [``since``, ``until``), ``since`` defaulting to ``window`` before ``until`` (or now),
    ``until`` to no bound (a slow request belongs to the window it ends in: a window of start times would leave
    out its slowest requests and bias the high percentiles low).

    Counts and token sums are always exact. Percentiles are exact up to :data:`EXACT_LIMIT` requests in the
    window (``mode="auto"``), else sketched (within :data:`sketch.RELATIVE_ACCURACY`, said per field). The plan
    (``plan`` forces one, for tests and benchmarks): the bucket counts of the rollups (plus the window's edges
    and the rows not yet rolled up, read raw) locate each exact percentile in one log bucket; its value is then
    read from the window's rows (``scan``: windows under :data:`SCAN_SHARE` of the table) or from the field's
    covering index (``index``); ``sketch`` reports the bucket's centre. ``walk``: index walks without the
    rollups, while they are far behind. A small window (:data:`RAW_LIMIT`): ``values`` (the value blocks of
    its whole periods, :mod:`inferwatch.collector.stats.values`) or ``raw`` (its rows, while the rollups are behind).

    ``slos``: column name -> upper limit in seconds. A request is good when it did not fail and each SLO holds
    (TPOT of single-token outputs counts as 0): vLLM's benchmark definition of goodput. Goodput is always
    exact: with an SLO the window's rows are read once more.
    """
    if not timedelta(0) < window <= MAX_WINDOW:
        raise ValueError(f"window must be positive and at most {MAX_WINDOW.days} days")
    t = REQUEST_TABLE
    slos = slos or {}
    filters = filters or StatsFilter()
    now = now or datetime.now(UTC)
    end = None if until is None else _aware(until)
    start = _aware(since) if since is not None else (end or now) - window
    if end is not None and end <= start:
        raise ValueError("until must be after since")
    seconds = ((end or now) - start).total_seconds()

    def good() -> ColumnElement[Any]:  # built when a plan needs it (0.1 ms of SQLAlchemy)
        conds: list[ColumnElement[bool]] = [~rollup.failed_condition()]
        for name, limit in slos.items():
            col = t.c[name]
            if name == TPOT:
                conds.append((col <= limit) | (func.coalesce(t.c[GENERATION_TOKENS], 0) <= 1))
            else:
                conds.append(col <= limit)
        return case((and_(*conds), 1), else_=0)

    postgres = engine.dialect.name == "postgresql"
    entries: list[dict[str, Any]] = []
    chosen: Plan
    with engine.connect() as conn:
        if postgres:  # one snapshot: a stats engine's connections begin at that isolation already
            if conn.default_isolation_level != db.STATS_ISOLATION:
                conn = conn.execution_options(isolation_level=db.STATS_ISOLATION)
        else:
            conn.exec_driver_sql("BEGIN")  # SQLite: one read transaction, one snapshot
        try:
            st = _state(conn, start)
            ids = (st.min_id, st.max_id)
            folded = st.folded
            if ids[1] is None or ids[0] is None:
                _end_read(conn)
                return Stats(window_seconds=seconds, since=start, until=end, group_by=group_by, plan="scan",
                             side=filters.side, service=filters.service, data=[])  # fmt: skip
            w = _Window(start=start, end=end, newest=int(ids[1]), bounded=False)  # one snapshot on both back ends
            chosen = plan or "scan"
            if plan is None and mode != "sketch":
                first = st.first
                if first is None or int(ids[1]) - int(first) <= RAW_LIMIT:
                    chosen = "values" if int(ids[1]) - folded <= TAIL_LIMIT else "raw"
            if chosen == "values":
                entries = _values(conn, w, filters, group_by, st, last=not slos)
                if slos:
                    goods = _goodput_counts(conn, w, filters, group_by, good())
                    for e in entries:
                        e["good"] = goods.get(e["key"], 0)
            elif chosen == "raw":
                entries = _raw(conn, w, filters, group_by, good())
            elif plan == "walk" or (plan is None and int(ids[1]) - folded > TAIL_LIMIT):
                chosen = "walk"
            else:
                aggs, _, _ = _rollup_aggs(conn, w, filters, group_by, st)
                n_window = sum(g.requests for g in aggs.values())
                if plan is None:
                    if mode == "sketch" or (mode == "auto" and n_window > EXACT_LIMIT):
                        chosen = "sketch"
                    else:
                        share = n_window / max(1, int(ids[1]) - int(ids[0]) + 1)
                        chosen = "scan" if share < SCAN_SHARE else "index"
                helper: SnapshotHelper | None = None
                if postgres and chosen == "index":
                    snapshot = str(conn.exec_driver_sql("SELECT pg_export_snapshot()").scalar_one())
                    helper = functools.partial(_snapshot_connection, engine, snapshot)
                try:
                    entries = _from_aggs(conn, w, filters, group_by, aggs, chosen, helper)
                except _Inconsistent as exc:
                    log.warning("stats: rollups disagree with the table (%s); answering by index walks", exc)
                    chosen = "walk"
                if slos and chosen not in ("walk", "raw"):
                    goods = _goodput_counts(conn, w, filters, group_by, good())
                    for e in entries:
                        e["good"] = goods.get(e["key"], 0)
        except BaseException:
            conn.rollback()
            raise
        _end_read(conn)
    if chosen == "walk":
        entries = _walk(engine, w, filters, group_by, good())
    groups: list[StatsGroup] = []
    for e in sorted(entries, key=lambda e: (e["key"] is None, e["key"] or "")):
        key, good_n = e.pop("key"), e.pop("good", 0)
        if group_by != "none":
            e[group_by] = key
        if slos:
            e["goodput"] = {
                "slos": slos,
                "good_requests": good_n,
                "share": good_n / e["requests"] if e["requests"] else None,
                "rate_per_second": good_n / seconds,
            }
        groups.append(StatsGroup.model_validate(e))
    return Stats(window_seconds=seconds, since=start, until=end, group_by=group_by, plan=chosen,
                 side=filters.side, service=filters.service, data=groups)  # fmt: skip


def _end_read(conn: Connection) -> None:
    """End a read transaction that went well. PostgreSQL: by COMMIT, the same as a rollback for a read, but
    psycopg forgets its prepared statements at every ROLLBACK (and sends DEALLOCATE ALL): ended by commit, the
    connection keeps them for the next request (planning the state statement alone took 0.5 ms). The raw
    cursors' statements bypass SQLAlchemy, which may not know a transaction is open: the driver commits."""
    if conn.dialect.name != "postgresql":
        conn.rollback()
        return
    if conn.in_transaction():
        conn.commit()
    else:
        conn.connection.dbapi_connection.commit()  # type: ignore[union-attr]


def _from_aggs(
    conn: Connection,
    w: _Window,
    filters: StatsFilter,
    group_by: GroupBy,
    aggs: dict[Any, _Agg],
    plan: Plan,
    helper: SnapshotHelper | None = None,
) -> list[dict[str, Any]]:
    targets = _targets(aggs)
    picked: dict[tuple[Any, int, str], float] = {}
    if plan == "scan":
        picked = _pick_by_scan(conn, w, filters, group_by, aggs, targets)
    elif plan == "index":
        picked = _pick_by_index(conn, w, filters, group_by, aggs, targets, helper)
    else:
        for j, ts in enumerate(targets):
            for key, b, _, name in ts:
                picked[(key, j, name)] = sketch.estimate(b)
    exact = plan != "sketch"
    entries = []
    for key, g in aggs.items():
        entry: dict[str, Any] = {
            "key": key,
            "requests": g.requests,
            "failed": g.failed,
            "prompt_tokens": g.prompt_tokens if g.prompt_count else None,
            "generation_tokens": g.generation_tokens if g.generation_count else None,
        }
        for j, f in enumerate(STAT_FIELDS):
            values: dict[str, Any] = {"count": g.n[j], "exact": exact,
                                      "relative_error": 0.0 if exact else sketch.RELATIVE_ACCURACY}  # fmt: skip
            for q in PERCENTILES:
                name = f"p{round(q * 100)}"
                values[name] = picked.get((key, j, name))
            entry[f] = FieldStats.model_validate(values)
        entries.append(entry)
    return entries


# --- health ----------------------------------------------------------------------------------------------------------


def database_problem(*, engine: Engine, timeout: float = READINESS_TIMEOUT_S) -> str | None:
    """None when the database answers within ``timeout`` and its schema is at the migrations' head; else
    what is wrong."""
    try:
        with db.deadline(timeout):
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return None if db.at_head(engine) else "migrations not at head"
    except Exception as exc:
        return db.describe(exc)
