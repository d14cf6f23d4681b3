"""The stats rollups: new request rows folded into per-minute and per-hour aggregates, by an id watermark.

Off the writer's path: a background thread of each collector (:class:`RollupJob`, started and stopped with
it) reads the request rows above the watermark (``rollup_state.folded_id``) in id order and adds them to the
rollups of the minute and the hour each ended in (per engine, model, instance and service: counts, token sums, and a
log-bucket sketch per latency column, :mod:`inferwatch.collector.stats.sketch`) and to the minute's
value block (:mod:`inferwatch.collector.stats.values`; ten-minute blocks are built from the minutes once a period
has ended, and rebuilt when its minutes change), and moves the watermark in the same transaction.
Idempotent: the watermark moves only from the value the pass read (compare and set), so a pass that raced
another one, or died half way, folds nothing twice. Across collector replicas on one PostgreSQL, one pass
runs at a time (a session advisory lock; the others skip that round).

Which rows are safe to fold: on PostgreSQL, ids are drawn from a sequence when a row is inserted, but the
transactions commit in any order, so a row with a smaller id may become visible after a larger one. A pass
therefore folds only up to the largest id it saw at least :data:`GRACE_S` seconds earlier (``seen_id``): every
transaction that held a smaller id has ended by then (the writer's are bounded by its write deadline, far
shorter). Rows reach the rollups :data:`GRACE_S` to 2 x :data:`GRACE_S` + :data:`INTERVAL_S` seconds after
they are stored; readers add the rows above the watermark from the table itself, so answers never lag. SQLite
commits one writer at a time in id order: no grace there.

Retention: rollups and value blocks whose period ended more than a day before the oldest stored request are deleted.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
import threading
import time
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

from sqlalchemy import Connection, Engine, Select, bindparam, case, delete, func, insert, select, text, update
from sqlalchemy.sql.elements import ColumnElement

from inferwatch.collector.stats import folding, sketch, values
from inferwatch.collector.store import db
from inferwatch.collector.store.tables import (
    REQUEST_TABLE,
    ROLLUP_FIELDS,
    ROLLUP_STATE_TABLE,
    ROLLUP_TABLE,
    VALUES_TABLE,
)
from inferwatch.core.schema import GENERATION_TOKENS, PROMPT_TOKENS

log = logging.getLogger("inferwatch.collector")

STATE_NAME: Final = "requests"
GRACE_S: Final = 30.0
"""PostgreSQL: a row id is folded once it was seen this long ago (longer than any insert transaction lasts)."""
INTERVAL_S: Final = 5.0
"""Between two passes of the job."""
CHUNK: Final = 20_000
"""Request rows read per statement (and transaction)."""
WRITE_ROWS: Final = 200_000
"""At most this many rows folded into the rollups per transaction (a pass also writes when its budget runs out
and at its end): their folds are held in memory meanwhile (about 40 bytes a row)."""
PASS_BUDGET_S: Final = 2.0
"""A pass stops after the chunk that crosses this (the next pass goes on): stop() stays prompt."""
PERIODS: Final = (60, 3600, 86400)
"""Minutes, hours and days (UTC): a week's window reads 7 days of rows per series, not 168 hours of them."""
CLOSE_S: Final = 120.0
"""A ten-minute value block is built this long after its period ended (rows folded later rebuild it)."""
TEN: Final = timedelta(minutes=10)
ROLLUP_RETENTION: Final = timedelta(days=1)
"""Rollups are kept this long past the oldest stored request."""
PG_ROLLUP_LOCK_KEY: Final = 0x1F_E4_77_A8
FAILED: Final = ("error", "abort")
_BOUNDS: Final = sketch.BOUNDS


def failed_condition() -> ColumnElement[bool]:
    """A failed request: finish reason ``error`` or ``abort``, or an error recorded."""
    t = REQUEST_TABLE
    return func.coalesce(t.c.finish_reason, "").in_(FAILED) | t.c.error.is_not(None)


FAILED_FLAG_PG: Final = (
    "CASE WHEN coalesce(finish_reason, '') IN ("
    + ", ".join(f"'{reason}'" for reason in FAILED)
    + ") OR error IS NOT NULL THEN 1 ELSE 0 END"
)
""":func:`failed_condition` as 1 or 0, in PostgreSQL's text (for statements sent through the driver's cursor:
building the SQLAlchemy expression costs more than running it on a small window)."""


@dataclass(slots=True)
class Totals:
    """Requests, failures and token sums (with how many rows had each) of some rows: the exact part of an
    aggregate, shared by the rollups and the stats that read them."""

    requests: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    prompt_count: int = 0
    generation_tokens: int = 0
    generation_count: int = 0

    def add_request(self, failed: int, pt: int | None, gt: int | None) -> None:
        self.requests += 1
        self.failed += failed
        if pt is not None:
            self.prompt_tokens += pt
            self.prompt_count += 1
        if gt is not None:
            self.generation_tokens += gt
            self.generation_count += 1


@dataclass(slots=True)
class Partial(Totals):
    """The aggregates of some rows of one (period, engine, model, instance)."""

    counts: list[int] = field(default_factory=lambda: [0] * len(ROLLUP_FIELDS))
    sketches: list[dict[int, int]] = field(default_factory=lambda: [{} for _ in ROLLUP_FIELDS])

    def merge(self, other: Partial) -> None:
        self.requests += other.requests
        self.failed += other.failed
        self.prompt_tokens += other.prompt_tokens
        self.prompt_count += other.prompt_count
        self.generation_tokens += other.generation_tokens
        self.generation_count += other.generation_count
        for j, s in enumerate(other.sketches):
            self.counts[j] += other.counts[j]
            mine = self.sketches[j]
            for k, n in s.items():
                mine[k] = mine.get(k, 0) + n

    def add_row(self, failed: int, pt: int | None, gt: int | None, values: tuple[float | None, ...]) -> None:
        """One row, as :func:`folding.fold_chunk` folds many (the reference its test compares with)."""
        self.add_request(failed, pt, gt)
        for j, v in enumerate(values):
            if v is not None:
                self.counts[j] += 1
                s = self.sketches[j]
                b = bisect_left(_BOUNDS, v)
                s[b] = s.get(b, 0) + 1

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "failed": self.failed,
            PROMPT_TOKENS: self.prompt_tokens,
            f"{PROMPT_TOKENS}_count": self.prompt_count,
            GENERATION_TOKENS: self.generation_tokens,
            f"{GENERATION_TOKENS}_count": self.generation_count,
        }
        for j, f in enumerate(ROLLUP_FIELDS):
            out[f"{f}_count"] = self.counts[j]
            out[f"{f}_sketch"] = sketch.encode(self.sketches[j])
        return out

    @classmethod
    def from_row(cls, row: Any) -> Partial:
        p = cls(
            requests=row["requests"],
            failed=row["failed"],
            prompt_tokens=row[PROMPT_TOKENS],
            prompt_count=row[f"{PROMPT_TOKENS}_count"],
            generation_tokens=row[GENERATION_TOKENS],
            generation_count=row[f"{GENERATION_TOKENS}_count"],
        )
        for j, f in enumerate(ROLLUP_FIELDS):
            p.counts[j] = row[f"{f}_count"]
            lo, arr = sketch.decode(row[f"{f}_sketch"])
            p.sketches[j] = {lo + i: c for i, c in enumerate(arr) if c}
        return p


Key = tuple[datetime, str, str | None, str | None, str | None]
"""(period start, engine, model, instance, service)."""


def minute_key_sql(conn: Connection) -> ColumnElement[Any]:
    """The minute a row ended in, computed by the database (cheap per row): PostgreSQL a timestamptz, SQLite the
    ``YYYY-MM-DD HH:MM`` prefix of its stored text."""
    t = REQUEST_TABLE
    if conn.dialect.name == "postgresql":
        return func.date_trunc("minute", t.c.end_time)
    return func.substr(t.c.end_time, 1, 16)


def raw_columns(conn: Connection) -> list[Any]:
    """What folding a row reads: its minute, series, failed flag, token counts, the latency columns."""
    t = REQUEST_TABLE
    return [
        minute_key_sql(conn).label("minute"),
        t.c.engine,
        t.c.model,
        t.c.instance,
        t.c.service,
        case((failed_condition(), 1), else_=0).label("failed"),
        t.c[PROMPT_TOKENS],
        t.c[GENERATION_TOKENS],
        *(t.c[f] for f in ROLLUP_FIELDS),
    ]


def _minute(value: Any) -> datetime:
    if isinstance(value, str):
        return datetime.strptime(value, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
    assert isinstance(value, datetime)
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def fold_rows(rows: Any) -> tuple[dict[Key, Partial], dict[datetime, values.Encoded]]:
    """Per-minute partial aggregates and value blocks of raw rows (of :func:`raw_columns`), by column
    (:func:`folding.fold_chunk`)."""
    c = folding.fold_chunk(rows, len(ROLLUP_FIELDS))
    parts: dict[Key, Partial] = {}
    for (minute, e, m, i, svc), tot, counts, sketches in zip(c.keys, c.totals, c.counts, c.sketches, strict=True):
        r, f, ptok, pc, gtok, gc = tot
        parts[(_minute(minute), e, m, i, svc)] = Partial(r, f, ptok, pc, gtok, gc, counts=counts, sketches=sketches)
    return parts, {_minute(k): b for k, b in c.blocks.items()}


class Pending:
    """The folds of the chunks read since the last write: merged in memory, written (with the watermark) once
    per :data:`WRITE_ROWS` rows or at the end of a pass. Each write merges into the stored rollups and blocks of
    the minutes it touches, whose size grows with the minute: one write per chunk rewrote the current minute's
    block chunk after chunk (docs/performance.md, collector ingest, "All-in")."""

    def __init__(self) -> None:
        self.rows = 0
        self.minutes: dict[Key, Partial] = {}
        self.blocks: dict[datetime, list[values.Encoded]] = {}

    def add(self, rows: Any) -> None:
        parts, blocks = fold_rows(rows)
        self.rows += len(rows)
        for key, p in parts.items():
            mine = self.minutes.get(key)
            if mine is None:
                self.minutes[key] = p
            else:
                mine.merge(p)
        for minute, b in blocks.items():
            self.blocks.setdefault(minute, []).append(b)

    def merged_blocks(self) -> dict[datetime, values.Encoded]:
        nf = len(ROLLUP_FIELDS)
        return {m: values.merge_encoded(nf, bs) for m, bs in self.blocks.items()}


def _write_values(conn: Connection, blocks: dict[datetime, values.Encoded]) -> None:
    """Add ``blocks`` into the stored minute blocks (merged into the existing rows as stored:
    :func:`values.merge_encoded`; the others inserted)."""
    v = VALUES_TABLE
    nf = len(ROLLUP_FIELDS)
    starts = sorted(blocks)
    existing: dict[datetime, tuple[int, values.Encoded]] = {}
    for i in range(0, len(starts), 500):
        q = select(v.c.id, v.c.period_start, v.c.series, v.c.counts, v.c.vals).where(
            v.c.period_seconds == 60, v.c.period_start.in_(starts[i : i + 500])
        )
        for rid, start, series, counts, vals in conn.execute(q).all():
            existing[start] = (rid, (series, counts, vals))
    updates, inserts = [], []
    for start, b in blocks.items():
        old = existing.get(start)
        if old is not None:
            series, counts, vals = values.merge_encoded(nf, [old[1], b])
            updates.append({"rid": old[0], "v_series": series, "v_counts": counts, "v_vals": vals})
        else:
            series, counts, vals = b
            inserts.append({"period_seconds": 60, "period_start": start, "series": series, "counts": counts,
                            "vals": vals})  # fmt: skip
    _store_values(conn, updates, inserts)


def _store_values(conn: Connection, updates: list[dict[str, Any]], inserts: list[dict[str, Any]]) -> None:
    v = VALUES_TABLE
    if updates:
        stmt = (
            update(v)
            .where(v.c.id == bindparam("rid"))
            .values(series=bindparam("v_series"), counts=bindparam("v_counts"), vals=bindparam("v_vals"))
        )
        conn.execute(stmt, updates)
    if inserts:
        conn.execute(insert(v), inserts)


def ten_of(t: datetime) -> datetime:
    """The start of the ten-minute period holding ``t``."""
    return t.replace(minute=t.minute - t.minute % 10, second=0, microsecond=0)


def _consolidate(conn: Connection, periods: set[datetime], now: datetime, *, touched: bool) -> None:
    """(Re)build the ten-minute value blocks of ``periods`` from their minute blocks: those that have one
    already (``touched``: their minutes just changed) and those that ended :data:`CLOSE_S` before ``now``.
    Whether a ten-minute block exists only changes how fast a window is read: one that exists always equals
    its minutes (rebuilt in the same transaction as they change)."""
    v = VALUES_TABLE
    nf = len(ROLLUP_FIELDS)
    ps = sorted(periods)
    have: dict[datetime, int] = {}
    for i in range(0, len(ps), 500):
        q = select(v.c.period_start, v.c.id).where(v.c.period_seconds == 600, v.c.period_start.in_(ps[i : i + 500]))
        have.update((start, rid) for start, rid in conn.execute(q).all())
    closed = now - timedelta(seconds=CLOSE_S)
    todo = [p for p in ps if (touched and p in have) or (p not in have and p + TEN <= closed)]
    updates: list[dict[str, Any]] = []
    inserts: list[dict[str, Any]] = []
    for p in todo:
        q = (
            select(v.c.series, v.c.counts, v.c.vals)
            .where(v.c.period_seconds == 60, v.c.period_start >= p, v.c.period_start < p + TEN)
            .order_by(v.c.period_start)
        )
        minutes = [(row[0], row[1], row[2]) for row in conn.execute(q).all()]
        if not minutes:
            continue
        series, counts, vals = values.merge_encoded(nf, minutes)
        if p in have:
            updates.append({"rid": have[p], "v_series": series, "v_counts": counts, "v_vals": vals})
        else:
            inserts.append({"period_seconds": 600, "period_start": p, "series": series, "counts": counts,
                            "vals": vals})  # fmt: skip
    _store_values(conn, updates, inserts)


def _closing(conn: Connection, now: datetime) -> None:
    """The ten-minute periods of the last hour that ended since the last passes without new rows."""
    v = VALUES_TABLE
    end = ten_of(now - timedelta(seconds=CLOSE_S))
    q = select(v.c.period_start).where(
        v.c.period_seconds == 60, v.c.period_start >= end - timedelta(hours=1), v.c.period_start < end
    )
    periods = {ten_of(start) for (start,) in conn.execute(q).all()}
    if periods:
        _consolidate(conn, periods, now, touched=False)


def by_period(minutes: dict[Key, Partial]) -> dict[int, dict[Key, Partial]]:
    """The minute partials, and the same folded into their hours and their days."""
    hours: dict[Key, Partial] = {}
    days: dict[Key, Partial] = {}
    for (start, e, m, i, svc), p in minutes.items():
        for out, key in (
            (hours, (start.replace(minute=0), e, m, i, svc)),
            (days, (start.replace(hour=0, minute=0), e, m, i, svc)),
        ):
            h = out.get(key)
            if h is None:
                h = out[key] = Partial()
            h.merge(p)
    return {60: minutes, 3600: hours, 86400: days}


def _write(conn: Connection, period: int, parts: dict[Key, Partial]) -> None:
    """Add ``parts`` into the stored rollups of ``period`` (update the existing rows, insert the others)."""
    r = ROLLUP_TABLE
    starts = sorted({k[0] for k in parts})
    existing: dict[Key, tuple[int, Partial]] = {}
    for i in range(0, len(starts), 500):
        q = select(r).where(r.c.period_seconds == period, r.c.period_start.in_(starts[i : i + 500]))
        for row in conn.execute(q).mappings():
            key = (row["period_start"], row["engine"], row["model"], row["instance"], row["service"])
            existing[key] = (row["id"], Partial.from_row(row))
    updates, inserts = [], []
    for key, p in parts.items():
        old = existing.get(key)
        if old is not None:
            old[1].merge(p)
            updates.append({"rid": old[0], **old[1].row()})
        else:
            inserts.append({"period_seconds": period, "period_start": key[0], "engine": key[1], "model": key[2],
                            "instance": key[3], "service": key[4], **p.row()})  # fmt: skip
    if updates:
        names = [c for c in updates[0] if c != "rid"]
        stmt = update(r).where(r.c.id == bindparam("rid")).values({c: bindparam(f"v_{c}") for c in names})
        conn.execute(stmt, [{"rid": u["rid"], **{f"v_{c}": u[c] for c in names}} for u in updates])
    if inserts:
        conn.execute(insert(r), inserts)


@dataclass
class FoldResult:
    folded: int = 0
    """request rows folded."""
    watermark: int = 0
    caught_up: bool = True


def read_state(conn: Connection) -> tuple[int, int | None, datetime | None]:
    s = ROLLUP_STATE_TABLE
    row = conn.execute(select(s.c.folded_id, s.c.seen_id, s.c.seen_at).where(s.c.name == STATE_NAME)).first()
    if row is None:
        return 0, None, None
    return int(row.folded_id), row.seen_id, row.seen_at


def watermark(conn: Connection) -> int:
    """Every request row with an id up to this is in the rollups, none above."""
    return read_state(conn)[0]


def fold_pass(engine: Engine, *, grace: float | None = None, budget: float = PASS_BUDGET_S, chunk: int = CHUNK,
              now: datetime | None = None) -> FoldResult:  # fmt: skip
    """One pass: fold the rows that are safe to fold (see the module), ``chunk`` rows per transaction, until
    none is left or ``budget`` seconds passed. On PostgreSQL only one pass runs at a time across collectors
    (the others return at once, folding nothing)."""
    postgres = engine.dialect.name == "postgresql"
    if grace is None:
        grace = GRACE_S if postgres else 0.0
    now = now or datetime.now(UTC)
    started = time.monotonic()
    result = FoldResult()
    with engine.connect() as conn:
        if postgres:
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": PG_ROLLUP_LOCK_KEY}).scalar_one()
            conn.commit()
            if not got:
                result.caught_up = False
                return result
        try:
            _fold(conn, result, grace, budget, chunk, now, started)
        finally:
            if postgres:
                conn.rollback()
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": PG_ROLLUP_LOCK_KEY})
                conn.commit()
    return result


def _fold(conn: Connection, result: FoldResult, grace: float, budget: float, chunk: int, now: datetime,
          started: float) -> None:  # fmt: skip
    t = REQUEST_TABLE
    s = ROLLUP_STATE_TABLE
    folded, seen_id, seen_at = read_state(conn)
    newest = conn.execute(select(func.max(t.c.id))).scalar_one_or_none() or 0
    conn.commit()
    if grace <= 0:
        target = newest
    elif seen_id is not None and seen_at is not None and seen_at <= now - timedelta(seconds=grace):
        target = seen_id
    else:
        target = folded
    result.watermark = folded
    cols = raw_columns(conn)
    pending = Pending()
    read = folded
    while read < target:
        upto = min(target, read + chunk)
        rows = _chunk(conn, select(*cols).where(t.c.id > read, t.c.id <= upto))
        pending.add(rows)
        read = upto
        over = time.monotonic() - started > budget
        if read < target and pending.rows < WRITE_ROWS and not over:
            continue
        if not _write_pending(conn, pending, folded, read, now):
            result.caught_up = False
            return
        result.folded += pending.rows
        folded = result.watermark = read
        pending = Pending()
        if over and folded < target:
            result.caught_up = False
            return
    with conn.begin():
        values: dict[str, Any] = {"updated_at": now}
        if grace > 0 and (seen_id is None or target == seen_id or seen_id <= folded):
            values.update(seen_id=newest, seen_at=now)
        moved = conn.execute(update(s).where(s.c.name == STATE_NAME, s.c.folded_id == folded).values(**values)).rowcount
        if moved == 0 and conn.execute(select(s.c.name).where(s.c.name == STATE_NAME)).first() is None:
            conn.execute(insert(s).values(name=STATE_NAME, folded_id=folded, **values))
        _closing(conn, now)
        oldest = conn.execute(select(func.min(t.c.start_time))).scalar_one_or_none()
        if oldest is not None:
            cut = oldest - ROLLUP_RETENTION - timedelta(hours=1)
            conn.execute(delete(ROLLUP_TABLE).where(ROLLUP_TABLE.c.period_start < cut))
            conn.execute(delete(VALUES_TABLE).where(VALUES_TABLE.c.period_start < cut))


def _chunk(conn: Connection, statement: Select[Any]) -> Sequence[Sequence[Any]]:
    """The rows of ``statement`` as the driver's tuples (SQLAlchemy's Row objects cost a sixth of a pass), in a
    transaction of their own; PostgreSQL's in binary (its text took twice the CPU and 1.5x the time to fetch)."""
    if conn.dialect.name != "postgresql":
        found = conn.execute(statement)
        rows = found.cursor.fetchall()
        found.close()
        conn.commit()
        return rows
    compiled = statement.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    raw: Any = conn.connection.dbapi_connection  # psycopg's connection
    with raw.cursor(binary=True) as cur:
        cur.execute(str(compiled), compiled.params)
        fetched: list[tuple[Any, ...]] = cur.fetchall()
    raw.commit()
    return fetched


def _write_pending(conn: Connection, pending: Pending, folded: int, upto: int, now: datetime) -> bool:
    """One transaction: the watermark moved from ``folded`` to ``upto`` (compare and set) and ``pending``
    written into the rollups and blocks; False when another pass moved the watermark first (nothing written)."""
    s = ROLLUP_STATE_TABLE
    with conn.begin():
        # compare and set: a pass that raced this one (or an earlier life of it) moved the watermark first
        moved = conn.execute(
            update(s).where(s.c.name == STATE_NAME, s.c.folded_id == folded).values(folded_id=upto, updated_at=now)
        ).rowcount
        if moved == 0:
            if conn.execute(select(s.c.folded_id).where(s.c.name == STATE_NAME)).first() is not None:
                return False
            conn.execute(insert(s).values(name=STATE_NAME, folded_id=upto, updated_at=now))
        for period, p in by_period(pending.minutes).items():
            _write(conn, period, p)
        blocks = pending.merged_blocks()
        if blocks:
            _write_values(conn, blocks)
            _consolidate(conn, {ten_of(m) for m in blocks}, now, touched=True)
    return True


def catch_up(engine: Engine, *, grace: float = 0.0, chunk: int = CHUNK) -> int:
    """Fold every stored row now (benchmarks, tests, a backfill by hand); the rows folded."""
    total = 0
    while True:
        res = fold_pass(engine, grace=grace, budget=3600.0, chunk=chunk)
        total += res.folded
        if res.caught_up:
            return total


THREAD_NAME: Final = "iw-rollups"
"""The rollup thread's name to the operating system (Linux: ``top -H``, ``ps -L``, ``/proc/<pid>/task/*/comm``):
its CPU is told apart from ingest's (bench/collector.py counts it as the maintenance's)."""


def name_os_thread(name: str) -> None:
    """Name the calling thread for the operating system (Linux ``prctl(PR_SET_NAME)``, 15 bytes); elsewhere, or
    when libc cannot be loaded, nothing."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):  # a libc without prctl: unnamed
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)


class Stop(Protocol):
    """What stops a job: a ``threading.Event``, or a ``multiprocessing`` one from another process."""

    def is_set(self) -> bool: ...
    def set(self) -> None: ...
    def wait(self, timeout: float | None = None) -> bool: ...


class RollupJob:
    """The rollup job: a :func:`fold_pass` every ``interval`` seconds until stopped, in a thread of its own
    (:meth:`start`) or in the calling one (:meth:`run`: :mod:`~inferwatch.collector.stats.rollup_process`)."""

    def __init__(self, engine: Engine, interval: float = INTERVAL_S, stop: Stop | None = None) -> None:
        self.engine = engine
        self.interval = interval
        self._stop: Stop = stop if stop is not None else threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.folded = 0
        self.errors = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, name="inferwatch-rollups", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def run(self) -> None:
        """The passes, in the calling thread, until stopped."""
        name_os_thread(THREAD_NAME)
        while not self._stop.is_set():
            try:
                with db.deadline(max(30.0, PASS_BUDGET_S * 5)):
                    res = fold_pass(self.engine)
                self.passes += 1
                self.folded += res.folded
                if not res.caught_up and res.folded:
                    continue  # a backlog: go on at once
            except Exception as exc:
                self.errors += 1
                if db.is_unreachable(exc):
                    log.debug("rollup pass: database unavailable: %s", db.describe(exc))
                else:
                    log.exception("rollup pass failed")
            self._stop.wait(self.interval)
