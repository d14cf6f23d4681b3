"""The request listing of the read API, and what every query of the read side shares.

Blocking (routes call them through ``asyncio.to_thread``), keyword-only, no HTTP: bad input raises
:class:`ValueError` (:class:`InvalidCursor`, :class:`InvalidFilter`), a database that cannot be reached
or does not answer in time :class:`DatabaseUnavailable` (the routes answer 503; :func:`guarded` turns the
driver's errors into it). Results are the response models of :mod:`inferwatch.collector.schemas`. The
statistics are :mod:`inferwatch.collector.stats.planner`'s.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Final, Literal, ParamSpec, TypeVar

from sqlalchemy import Engine, RowMapping, and_, func, or_, select, text
from sqlalchemy.sql.elements import ColumnElement

from inferwatch.collector.schemas import RequestDetail, RequestPage, RequestRow, Side
from inferwatch.collector.stats import sides
from inferwatch.collector.store import db
from inferwatch.collector.store.tables import REQUEST_TABLE
from inferwatch.core.schema import DECODE, E2E, PREFILL, QUEUE, TTFT

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

PHASES: Final = (("queue", QUEUE), ("prefill", PREFILL), ("decode", DECODE))
MAX_OFFSET: Final = 2**62
"""The largest offset a cursor may carry (far beyond any table; keeps OFFSET within int64)."""
MAX_CURSOR_CHARS: Final = 200
MAX_ROW_ID: Final = 2**63 - 1
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


class InvalidFilter(ValueError):
    """A filter no stored request can match and the database may not be asked about (a NUL character)."""


def refuse_nul(obj: Any) -> None:
    """:class:`InvalidFilter` when a text field of the dataclass ``obj`` holds a NUL character."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, str) and NUL in value:
            raise InvalidFilter(f"{f.name} must not contain a NUL character")


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
        refuse_nul(self)

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
