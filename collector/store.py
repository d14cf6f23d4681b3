"""The read side of the request store: every query of the read API, as functions of an Engine.

Blocking (routes call them through ``asyncio.to_thread``), keyword-only, no HTTP: bad input raises
:class:`ValueError` (:class:`InvalidCursor`, :class:`InvalidFilter`), a database that cannot be reached
or does not answer in time :class:`DatabaseUnavailable` (the routes answer 503). Results are the
response models of :mod:`inferwatch.collector.schemas`. Percentiles are exact: nearest rank over the
stored rows, read by walking the covering (latency, start_time, engine, model) indexes from the nearer end.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import functools
import json
import math
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, ParamSpec, TypeVar

from sqlalchemy import Column, Connection, Engine, RowMapping, and_, case, func, or_, select, text, true
from sqlalchemy.sql.elements import ColumnElement

from inferwatch.collector import db
from inferwatch.collector.models import REQUEST_TABLE
from inferwatch.collector.schemas import FieldStats, GroupBy, RequestDetail, RequestPage, RequestRow, Stats, StatsGroup
from inferwatch.core.schema import DECODE, E2E, GENERATION_TOKENS, PREFILL, PROMPT_TOKENS, QUEUE, TPOT, TTFT

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
            )
            if value is not None
        ]
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
    return RequestPage(data=rows[:limit], count=count, next_cursor=encode_cursor(offset + limit) if more else None)


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


def nearest_rank(n: int, q: float) -> int:
    """0-based index of the q-quantile by the nearest-rank definition (exact, an observed value)."""
    return max(0, min(n - 1, math.ceil(q * n) - 1))


def percentiles(*, engine: Engine, field: str, where: ColumnElement[bool], n: int) -> dict[str, float | None]:
    """Exact nearest-rank :data:`PERCENTILES` of one column over the ``n`` non-null values ``where`` keeps,
    walking its (latency, time, engine, model) index from the nearer end (the high percentiles are a
    short walk down from the maximum)."""
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


MAX_LISTED_STRADDLERS: Final = 5_000
"""Up to this many requests that started before a stats window and finished in it are named by id in the
window's condition; beyond, the database reads each older row's end time."""


def finished_since(conn: Connection, since: datetime) -> ColumnElement[bool]:
    """Requests that finished at or after ``since`` (``end_time >= since``), spelled for the covering
    (latency, start_time, …) indexes: those that started in the window finished in it (a request ends after
    it starts: the sources refuse one that does not), and those that started earlier but finished in it
    (the straddlers, found once here) are named by row id, which every SQLite index holds. Without the
    straddlers each percentile walk would read the end time of every older row it passes."""
    t = REQUEST_TABLE
    started = t.c.start_time >= since
    found = select(t.c.id).where(t.c.start_time < since, t.c.end_time >= since).limit(MAX_LISTED_STRADDLERS + 1)
    straddlers = list(conn.execute(found).scalars())
    if not straddlers:
        return started
    if len(straddlers) > MAX_LISTED_STRADDLERS:
        return or_(started, t.c.end_time >= since)
    return or_(started, t.c.id.in_(straddlers))


@guarded
def compute_stats(
    *,
    engine: Engine,
    window: timedelta,
    group_by: GroupBy = "none",
    slos: dict[str, float] | None = None,
    now: datetime | None = None,
) -> Stats:
    """Exact percentiles (nearest rank over the stored rows), counts and goodput per group, over the
    requests that finished in the last ``window`` (a slow request belongs to the window it ends in: a
    window of start times would leave out its slowest requests and bias the high percentiles low).

    ``slos``: column name -> upper limit in seconds. A request is good when it did not fail and each
    SLO holds (TPOT of single-token outputs counts as 0): vLLM's benchmark definition of goodput.
    """
    if not timedelta(0) < window <= MAX_WINDOW:
        raise ValueError(f"window must be positive and at most {MAX_WINDOW.days} days")
    t = REQUEST_TABLE
    slos = slos or {}
    now = now or datetime.now(UTC)
    since = now - window
    group_col: Column[Any] | None = None if group_by == "none" else t.c[group_by]
    failed = func.coalesce(t.c.finish_reason, "").in_(FAILED) | t.c.error.is_not(None)
    good_conds: list[ColumnElement[bool]] = [~failed]
    for field, limit in slos.items():
        col = t.c[field]
        if field == TPOT:
            good_conds.append((col <= limit) | (func.coalesce(t.c[GENERATION_TOKENS], 0) <= 1))
        else:
            good_conds.append(col <= limit)
    good = case((and_(*good_conds), 1), else_=0)
    cols: list[Any] = [
        func.count().label("requests"),
        func.sum(case((failed, 1), else_=0)).label("failed"),
        func.sum(t.c[PROMPT_TOKENS]).label("prompt_tokens"),
        func.sum(t.c[GENERATION_TOKENS]).label("generation_tokens"),
        func.sum(good).label("good"),
        *(func.count(t.c[f]).label(f"n_{f}") for f in STAT_FIELDS),
    ]
    groups: list[StatsGroup] = []
    with engine.connect() as conn:
        oldest = conn.execute(select(func.min(t.c.start_time))).scalar_one_or_none()
        base_cond: ColumnElement[bool]
        if oldest is not None and (oldest if oldest.tzinfo else oldest.replace(tzinfo=UTC)) >= since:
            base_cond = true()  # every row started (so ended) in the window: index walks need no time filter
        else:
            base_cond = finished_since(conn, since)
        q = select(*([group_col] if group_col is not None else []), *cols).where(base_cond)
        if group_col is not None:
            q = q.group_by(group_col).order_by(group_col)
        for m in conn.execute(q).mappings():
            key = m[group_col.name] if group_col is not None else None
            cond = base_cond if group_col is None else and_(base_cond, group_col == key)
            entry: dict[str, Any] = {
                "requests": int(m["requests"]),
                "failed": int(m["failed"] or 0),
                "prompt_tokens": None if m["prompt_tokens"] is None else int(m["prompt_tokens"]),
                "generation_tokens": None if m["generation_tokens"] is None else int(m["generation_tokens"]),
            }
            if group_col is not None:
                entry[group_by] = key
            # one field per thread: the database walks its indexes outside the GIL
            with ThreadPoolExecutor(max_workers=len(STAT_FIELDS)) as pool:
                futures = [  # each in a copy of this context: the caller's database deadline holds there too
                    pool.submit(
                        contextvars.copy_context().run,
                        percentiles,
                        engine=engine,
                        field=f,
                        where=cond,
                        n=int(m[f"n_{f}"]),
                    )
                    for f in STAT_FIELDS
                ]
                for field, future in zip(STAT_FIELDS, futures, strict=True):
                    entry[field] = FieldStats.model_validate({"count": int(m[f"n_{field}"]), **future.result()})
            if slos:
                good_n = int(m["good"] or 0)
                entry["goodput"] = {
                    "slos": slos,
                    "good_requests": good_n,
                    "share": good_n / entry["requests"] if entry["requests"] else None,
                    "rate_per_second": good_n / window.total_seconds(),
                }
            groups.append(StatsGroup.model_validate(entry))
    return Stats(window_seconds=window.total_seconds(), since=since, group_by=group_by, data=groups)


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
