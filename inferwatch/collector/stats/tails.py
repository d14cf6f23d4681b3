"""The exact values of the ``scan`` and ``index`` plans: with each percentile located in one log bucket of the
rollups (:func:`~inferwatch.collector.stats.rollup_plan.targets`), its value read from the rows in that bucket,
either the window's own (:func:`pick_by_scan`) or a range of the field's covering index (:func:`pick_by_index`).
Each bucket's rows are counted too: a count the rollups do not have raises
:class:`~inferwatch.collector.stats.windowing.Inconsistent`."""

from __future__ import annotations

import contextvars
import logging
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, Row, TextClause, and_, bindparam, or_, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement

from inferwatch.collector.schemas import GroupBy
from inferwatch.collector.stats import sides, sketch
from inferwatch.collector.stats.rollup_plan import Agg, Target
from inferwatch.collector.stats.windowing import STAT_FIELDS, Inconsistent, StatsFilter, Window
from inferwatch.collector.store.tables import REQUEST_TABLE

log = logging.getLogger("inferwatch.collector")

Picked = dict[tuple[Any, int, str], float]
"""(group, field index, percentile name) -> value."""
SnapshotHelper = Callable[[], AbstractContextManager[Connection | None]]
"""A second connection in the same snapshot as the first (PostgreSQL), or None where there is none."""


def _range(col: Any, bucket: int) -> ColumnElement[bool]:
    lo, hi = sketch.bucket_range(bucket)
    conds = []
    if lo is not None:
        conds.append(col > lo)
    if hi is not None:
        conds.append(col <= hi)
    return and_(*conds) if conds else col.is_not(None)


def pick_by_scan(
    conn: Connection, w: Window, filters: StatsFilter, group_by: GroupBy, aggs: dict[Any, Agg],
    targets: list[list[Target]],
) -> Picked:  # fmt: skip
    """The values at the targets, from the window's own rows (read by end time) that lie in a target bucket."""
    t = REQUEST_TABLE
    wanted, ranges = _scan_wanted(targets)
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
    return _scan_picks(found, wanted, aggs)


Wanted = list[dict[tuple[Any, int], list[tuple[int, str]]]]
"""Per field: (group, bucket) -> the (rank within the bucket, percentile name) wanted there."""


def _scan_wanted(targets: list[list[Target]]) -> tuple[Wanted, list[ColumnElement[bool]]]:
    """The targets by field, group and bucket; the target buckets' ranges of their columns."""
    t = REQUEST_TABLE
    wanted: Wanted = [{} for _ in STAT_FIELDS]
    ranges: list[ColumnElement[bool]] = []
    for j, ts in enumerate(targets):
        buckets = sorted({b for _, b, _, _ in ts})
        for key, b, rank, name in ts:
            wanted[j].setdefault((key, b), []).append((rank, name))
        col = t.c[STAT_FIELDS[j]]
        ranges.extend(_range(col, b) for b in buckets)
    return wanted, ranges


def _scan_picks(found: list[dict[tuple[Any, int], list[float]]], wanted: Wanted, aggs: dict[Any, Agg]) -> Picked:
    """The wanted ranks of each bucket's values (which must be as many as the rollups count there)."""
    out: Picked = {}
    for j, fj in enumerate(found):
        for (key, b), vals in fj.items():
            if len(vals) != aggs[key].hists[j].counts[b]:
                raise Inconsistent(
                    f"{STAT_FIELDS[j]} bucket {b}: {len(vals)} rows, rollups {aggs[key].hists[j].counts[b]}"
                )
            vals.sort()
            for rank, name in wanted[j][(key, b)]:
                out[(key, j, name)] = float(vals[rank])
    return out


def pick_by_index(
    conn: Connection,
    w: Window,
    filters: StatsFilter,
    group_by: GroupBy,
    aggs: dict[Any, Agg],
    targets: list[list[Target]],
    helper: SnapshotHelper | None = None,
) -> Picked:
    """The values at the targets, each bucket read in order from the field's covering (latency, end time,
    engine, model, instance) index: a range of the whole table, filtered by the window inside the index, each
    group's rows numbered there (and counted: they must be the rollups' count). One statement per field, a
    ``UNION ALL`` of its buckets, written out here: building a hundred Core expressions cost more than the
    database's work. With a ``helper`` (PostgreSQL), a second connection in the same snapshot shares the
    statements."""
    params, binds, where = _index_where(w, filters)
    key_names: dict[Any, str] = {}
    for key in aggs:
        if key is not None:
            key_names[key] = f"k{len(key_names)}"
            params[key_names[key]] = key
    query = _IndexQuery(group_by, where, key_names, len(aggs), conn.dialect.name == "postgresql")
    stmts = [(j, text(query.field_sql(j, ts)).bindparams(*binds)) for j, ts in enumerate(targets) if ts]
    results = execute_all(conn, [stmt for _, stmt in stmts], params, helper)
    out: Picked = {}
    for (j, _), rows in zip(stmts, results, strict=True):
        have = query.found(j, rows)
        for key, b, rank, name in targets[j]:
            found = have.get((b, key, rank + 1))
            if found is None or found[0] is None or found[1] != aggs[key].hists[j].counts[b]:
                raise Inconsistent(f"{STAT_FIELDS[j]} bucket {b} of {key!r}: the table disagrees with the rollups")
            out[(key, j, name)] = found[0]
    return out


def _index_where(w: Window, filters: StatsFilter) -> tuple[dict[str, Any], list[Any], list[str]]:
    """The window's and the filter's conditions as SQL text: (parameters, typed bind parameters, conditions)."""
    end_time = REQUEST_TABLE.c.end_time
    params: dict[str, Any] = {"start": w.start}
    binds = [bindparam("start", type_=end_time.type)]
    where = ["end_time >= :start"]
    if w.end is not None:
        params["end"] = w.end
        binds.append(bindparam("end", type_=end_time.type))
        where.append("end_time < :end")
    for name, value in filters.items():
        params[f"f_{name}"] = value
        where.append(f"{name} = :f_{name}")
    side_sql = filters.side_sql(f":{sides.PARAM}")
    if side_sql is not None:
        where.append(side_sql)
        params.update(sides.PARAMS)
    return params, binds, where


@dataclass
class _IndexQuery:
    """The statements of :func:`pick_by_index`, written out, and where each pick is in their rows."""

    group_by: GroupBy
    where: list[str]
    key_names: dict[Any, str]
    """group -> the name of its parameter."""
    groups: int
    postgres: bool
    positions: dict[tuple[int, int], dict[int, int]] = field(default_factory=dict)
    """(field, bucket) -> 1-based rank -> place in the picks."""

    def field_sql(self, j: int, ts: list[Target]) -> str:
        """Field ``j``'s statement: a ``UNION ALL`` of its target buckets."""
        per_bucket: dict[int, list[tuple[Any, int, str]]] = {}
        for key, b, rank, name in ts:
            per_bucket.setdefault(b, []).append((key, rank, name))
        return " UNION ALL ".join(self._bucket_sql(j, b, wants) for b, wants in per_bucket.items())

    def _bucket_sql(self, j: int, b: int, wants: list[tuple[Any, int, str]]) -> str:
        col = STAT_FIELDS[j]
        group_by = self.group_by
        lo, hi = sketch.bucket_range(b)
        conds = [*self.where, f"{col} IS NOT NULL"]
        if lo is not None:
            conds.append(f"{col} > {lo!r}")
        if hi is not None:
            conds.append(f"{col} <= {hi!r}")
        keys = {key for key, _, _ in wants}
        if group_by != "none" and len(keys) < self.groups:
            conds.append(self._only(keys))  # only the groups whose percentiles lie in this bucket are numbered
        ranked = sorted({rank + 1 for _, rank, _ in wants})
        self.positions[(j, b)] = {r: k for k, r in enumerate(ranked)}
        where_b = " AND ".join(conds)
        g = "NULL" if group_by == "none" else group_by
        if self.postgres:  # each group's values sorted by the aggregate, its ranks picked from the array
            picks = ", ".join(f"a[{r}]" for r in ranked)
            grouped = "" if group_by == "none" else f" GROUP BY {group_by}"
            return (
                f"SELECT {b} AS b, g, n, ARRAY[{picks}] AS v FROM (SELECT {g} AS g, count(*) AS n, "
                f"array_agg({col} ORDER BY {col}) AS a FROM {REQUEST_TABLE.name} WHERE {where_b}{grouped}) AS x{b}"
            )
        part = "" if group_by == "none" else f"PARTITION BY {group_by} "
        return (
            f"SELECT {b} AS b, g, rn, v, n FROM (SELECT {g} AS g, {col} AS v, "
            f"row_number() OVER ({part}ORDER BY {col}) AS rn, count(*) OVER ({part.strip()}) AS n "
            f"FROM {REQUEST_TABLE.name} WHERE {where_b}) AS x{b} WHERE rn IN ({', '.join(map(str, ranked))})"
        )

    def _only(self, keys: set[Any]) -> str:
        """The condition that keeps the rows of these groups."""
        names = ", ".join(f":{self.key_names[k]}" for k in keys if k is not None)
        either = [f"{self.group_by} IN ({names})"] if names else []
        if None in keys:
            either.append(f"{self.group_by} IS NULL")
        return "(" + " OR ".join(either) + ")"

    def found(self, j: int, rows: Sequence[Row[Any]]) -> dict[tuple[int, Any, int], tuple[float | None, int]]:
        """Field ``j``'s picks in its statement's rows: (bucket, group, 1-based rank) -> (value, bucket's rows)."""
        have: dict[tuple[int, Any, int], tuple[float | None, int]] = {}
        for row in rows:
            if self.postgres:
                for r, k in self.positions[(j, row.b)].items():
                    have[(row.b, row.g, r)] = (None if row.v[k] is None else float(row.v[k]), int(row.n))
            else:
                have[(row.b, row.g, row.rn)] = (float(row.v), int(row.n))
        return have


def execute_all(
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
def snapshot_connection(engine: Engine, snapshot: str) -> Iterator[Connection | None]:
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
