"""The statistics of the read API: :func:`compute_stats` picks a plan per window and answers with the API's
schemas.

Blocking (routes call it through ``asyncio.to_thread``), keyword-only, no HTTP: bad input raises
:class:`ValueError` (:class:`~inferwatch.collector.stats.listing.InvalidFilter`), a database that cannot be
reached or does not answer in time :class:`~inferwatch.collector.stats.listing.DatabaseUnavailable`.
Percentiles are exact (nearest rank over the stored rows) up to :data:`EXACT_LIMIT` requests in a window,
sketched beyond. The plans: :mod:`~inferwatch.collector.stats.exact` (``values``, ``raw``, ``walk``),
:mod:`~inferwatch.collector.stats.rollup_plan` with :mod:`~inferwatch.collector.stats.tails` (``scan``,
``index``, ``sketch``); what they share, :mod:`~inferwatch.collector.stats.windowing`.
"""

from __future__ import annotations

import functools
import logging
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

from sqlalchemy import Connection, Engine, and_, case, func
from sqlalchemy.sql.elements import ColumnElement

from inferwatch.collector.schemas import FieldStats, GroupBy, Stats, StatsGroup, StatsPlan
from inferwatch.collector.stats import exact, rollup, rollup_plan, sketch, tails
from inferwatch.collector.stats.listing import guarded
from inferwatch.collector.stats.rollup_plan import Agg
from inferwatch.collector.stats.windowing import (
    PERCENTILES,
    STAT_FIELDS,
    Inconsistent,
    State,
    StatsFilter,
    Window,
    aware,
    read_state,
)
from inferwatch.collector.store import db
from inferwatch.collector.store.tables import REQUEST_TABLE
from inferwatch.core.schema import GENERATION_TOKENS, TPOT

log = logging.getLogger("inferwatch.collector")

StatsMode = Literal["auto", "exact", "sketch"]
"""``auto``: exact up to :data:`EXACT_LIMIT` requests in the window, sketched beyond; or always one of the two."""
Plan = StatsPlan
Entry = dict[str, Any]
"""One group's answer before validation: ``key`` (the group), counts, ``good``, a field's stats per field."""

MAX_WINDOW: Final = timedelta(days=36_600)
"""The longest stats window (100 years): longer ones reach before year 1."""
EXACT_LIMIT: Final = 5_000_000
"""``auto`` answers exactly up to this many requests in the window (exact stays fast enough there:
docs/collector.md, 'measurements')."""
SCAN_SHARE: Final = 0.05
"""A window holding less than this share of the table reads the values of its percentiles' buckets from its
own rows (by end time); a larger one from the latency indexes (ranges of the whole table)."""
RAW_LIMIT: Final = 400_000
"""A window of at most about this many rows (estimated from the id of its first row) is answered from its values
gathered per group from its value blocks (plan ``values``; ``raw``, its rows, while the rollups are far behind);
not the rollups' sketches (they hold too few rows per minute and series to be cheaper). The blocks' cost and a
request's memory grow with the window's rows: hence the bound (docs/collector.md, 'measurements')."""
TAIL_LIMIT: Final = 250_000
"""Rows not yet in the rollups beyond which the rollups are not used (a backfill under way): the index walks."""


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
    slos = slos or {}
    filters = filters or StatsFilter()
    start, end, seconds = _bounds(window, now or datetime.now(UTC), since, until)
    w = Window(start=start, end=end, newest=0, bounded=False)
    chosen: Plan = "scan"  # an empty table's answer
    entries: list[Entry] = []
    with engine.connect() as conn:
        conn = _begin_read(conn)
        try:
            st = read_state(conn, start)
            if st.min_id is not None and st.max_id is not None:
                w.newest = int(st.max_id)  # one snapshot on both back ends
                chosen, entries = _answer(engine, conn, w, filters, group_by, st, mode=mode, plan=plan, slos=slos)
        except BaseException:
            conn.rollback()
            raise
        _end_read(conn)
    if chosen == "walk":
        entries = exact.by_walks(engine, w, filters, group_by, _good(slos))
    groups = _groups(entries, group_by, slos, seconds)
    return Stats(window_seconds=seconds, since=start, until=end, group_by=group_by, plan=chosen,
                 side=filters.side, service=filters.service, data=groups)  # fmt: skip


def _bounds(
    window: timedelta, now: datetime, since: datetime | None, until: datetime | None
) -> tuple[datetime, datetime | None, float]:
    """The window's start, end (None: open) and length in seconds; :class:`ValueError` for one out of bounds."""
    if not timedelta(0) < window <= MAX_WINDOW:
        raise ValueError(f"window must be positive and at most {MAX_WINDOW.days} days")
    end = None if until is None else aware(until)
    start = aware(since) if since is not None else (end or now) - window
    if end is not None and end <= start:
        raise ValueError("until must be after since")
    return start, end, ((end or now) - start).total_seconds()


def _good(slos: dict[str, float]) -> ColumnElement[Any]:
    """1 for a good request, else 0. Built only when a plan needs it (it costs SQLAlchemy's time)."""
    t = REQUEST_TABLE
    conds: list[ColumnElement[bool]] = [~rollup.failed_condition()]
    for name, limit in slos.items():
        col = t.c[name]
        if name == TPOT:
            conds.append((col <= limit) | (func.coalesce(t.c[GENERATION_TOKENS], 0) <= 1))
        else:
            conds.append(col <= limit)
    return case((and_(*conds), 1), else_=0)


def _begin_read(conn: Connection) -> Connection:
    """Start the read's one snapshot: PostgreSQL by its isolation (a stats engine's connections begin at it
    already), SQLite by one read transaction."""
    if conn.dialect.name == "postgresql":
        if conn.default_isolation_level != db.STATS_ISOLATION:
            return conn.execution_options(isolation_level=db.STATS_ISOLATION)
        return conn
    conn.exec_driver_sql("BEGIN")
    return conn


def _end_read(conn: Connection) -> None:
    """End a read transaction that went well. PostgreSQL: by COMMIT, the same as a rollback for a read, but
    psycopg forgets its prepared statements at every ROLLBACK (and sends DEALLOCATE ALL): ended by commit, the
    connection keeps them for the next request (sparing their planning: docs/collector.md, 'measurements'). The
    raw cursors' statements bypass SQLAlchemy, which may not know a transaction is open: the driver commits."""
    if conn.dialect.name != "postgresql":
        conn.rollback()
        return
    if conn.in_transaction():
        conn.commit()
    else:
        conn.connection.dbapi_connection.commit()  # type: ignore[union-attr]


def _answer(
    engine: Engine,
    conn: Connection,
    w: Window,
    filters: StatsFilter,
    group_by: GroupBy,
    st: State,
    *,
    mode: StatsMode,
    plan: Plan | None,
    slos: dict[str, float],
) -> tuple[Plan, list[Entry]]:
    """The plan and its entries, inside the read (``walk``: no entries yet, its walks run after the read)."""
    small = _small_window_plan(st, mode, plan)
    if small == "values":
        entries = exact.from_value_blocks(conn, w, filters, group_by, st, last=not slos)
        if slos:
            _count_good(conn, w, filters, group_by, slos, entries)
        return "values", entries
    if small == "raw":
        return "raw", exact.from_rows(conn, w, filters, group_by, _good(slos))
    if plan == "walk" or (plan is None and _unfolded(st) > TAIL_LIMIT):
        return "walk", []
    aggs, _, _ = rollup_plan.rollup_aggs(conn, w, filters, group_by, st)
    chosen = plan or _rollup_plan(aggs, st, mode)
    helper = _snapshot_helper(engine, conn) if chosen == "index" else None
    try:
        entries = _from_aggs(conn, w, filters, group_by, aggs, chosen, helper)
    except Inconsistent as exc:
        log.warning("stats: rollups disagree with the table (%s); answering by index walks", exc)
        return "walk", []
    if slos:
        _count_good(conn, w, filters, group_by, slos, entries)
    return chosen, entries


def _unfolded(st: State) -> int:
    """Rows not yet in the rollups."""
    return int(st.max_id or 0) - st.folded


def _small_window_plan(st: State, mode: StatsMode, plan: Plan | None) -> Plan | None:
    """``values`` or ``raw`` for a small window (or when forced), else None."""
    if plan is not None:
        return plan if plan in ("values", "raw") else None
    if mode == "sketch":
        return None
    if st.first is None or int(st.max_id or 0) - int(st.first) <= RAW_LIMIT:
        return "values" if _unfolded(st) <= TAIL_LIMIT else "raw"
    return None


def _rollup_plan(aggs: dict[Any, Agg], st: State, mode: StatsMode) -> Plan:
    """``sketch`` beyond the exact limit (or asked for), else ``scan`` or ``index`` by the window's share."""
    n_window = sum(g.requests for g in aggs.values())
    if mode == "sketch" or (mode == "auto" and n_window > EXACT_LIMIT):
        return "sketch"
    share = n_window / max(1, int(st.max_id or 0) - int(st.min_id or 0) + 1)
    return "scan" if share < SCAN_SHARE else "index"


def _snapshot_helper(engine: Engine, conn: Connection) -> tails.SnapshotHelper | None:
    """PostgreSQL: a second connection joining this read's snapshot, exported here; None elsewhere."""
    if engine.dialect.name != "postgresql":
        return None
    snapshot = str(conn.exec_driver_sql("SELECT pg_export_snapshot()").scalar_one())
    return functools.partial(tails.snapshot_connection, engine, snapshot)


def _count_good(
    conn: Connection, w: Window, filters: StatsFilter, group_by: GroupBy, slos: dict[str, float], entries: list[Entry]
) -> None:
    """Each entry's exact ``good`` count, by one more read of the window's rows."""
    goods = exact.goodput_counts(conn, w, filters, group_by, _good(slos))
    for e in entries:
        e["good"] = goods.get(e["key"], 0)


def _groups(entries: list[Entry], group_by: GroupBy, slos: dict[str, float], seconds: float) -> list[StatsGroup]:
    """The entries as the API's groups, ordered by key (no group last), with their goodput under ``slos``."""
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
    return groups


def _from_aggs(
    conn: Connection,
    w: Window,
    filters: StatsFilter,
    group_by: GroupBy,
    aggs: dict[Any, Agg],
    plan: Plan,
    helper: tails.SnapshotHelper | None = None,
) -> list[Entry]:
    """The entries of the rollup plans: counts from ``aggs``, percentiles read by ``plan`` (``scan``, ``index``)
    or estimated from the buckets (``sketch``)."""
    targets = rollup_plan.targets(aggs)
    picked: tails.Picked = {}
    if plan == "scan":
        picked = tails.pick_by_scan(conn, w, filters, group_by, aggs, targets)
    elif plan == "index":
        picked = tails.pick_by_index(conn, w, filters, group_by, aggs, targets, helper)
    else:
        for j, ts in enumerate(targets):
            for key, b, _, name in ts:
                picked[(key, j, name)] = sketch.estimate(b)
    is_exact = plan != "sketch"
    entries = []
    for key, g in aggs.items():
        entry: Entry = {
            "key": key,
            "requests": g.requests,
            "failed": g.failed,
            "prompt_tokens": g.prompt_tokens if g.prompt_count else None,
            "generation_tokens": g.generation_tokens if g.generation_count else None,
        }
        for j, f in enumerate(STAT_FIELDS):
            stats: dict[str, Any] = {"count": g.n[j], "exact": is_exact,
                                     "relative_error": 0.0 if is_exact else sketch.RELATIVE_ACCURACY}  # fmt: skip
            for q in PERCENTILES:
                name = f"p{round(q * 100)}"
                stats[name] = picked.get((key, j, name))
            entry[f] = FieldStats.model_validate(stats)
        entries.append(entry)
    return entries
