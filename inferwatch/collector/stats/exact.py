"""The exact plans that do without the rollups' bucket counts: a small window's values from its value blocks
(``values``) or its rows (``raw``), the index walks (``walk``, while the rollups are far behind), and the
goodput counts of every plan."""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, cast

from sqlalchemy import Column, Connection, Engine, and_, case, func, literal_column, or_, select
from sqlalchemy.sql.elements import ColumnElement

from inferwatch.collector.schemas import FieldStats, GroupBy
from inferwatch.collector.stats import rollup, sides, values
from inferwatch.collector.stats.values import nearest_rank
from inferwatch.collector.stats.windowing import (
    PERCENTILES,
    STAT_FIELDS,
    State,
    StatsFilter,
    Window,
    pg_cursor,
    pipeline,
    rollup_range,
)
from inferwatch.collector.store.tables import REQUEST_TABLE, VALUES_TABLE
from inferwatch.core.schema import GENERATION_TOKENS, PROMPT_TOKENS

if TYPE_CHECKING:
    import psycopg


def from_rows(
    conn: Connection, w: Window, filters: StatsFilter, group_by: GroupBy, good: ColumnElement[Any]
) -> list[dict[str, Any]]:
    """A small window: its rows read once (by end time), counted and their values sorted per group (PostgreSQL:
    in the database, ``percentile_disc`` being the nearest rank)."""
    t = REQUEST_TABLE
    group_col = [] if group_by == "none" else [t.c[group_by]]
    if conn.dialect.name == "postgresql":
        return _rows_in_database(conn, w, filters, group_col, good)
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
        failed, pt, gt, ok, *vals = tup[1:] if group_col else tup
        g[0] += 1
        g[1] += failed
        g[6] += ok
        if pt is not None:
            g[2] += pt
            g[3] += 1
        if gt is not None:
            g[4] += gt
            g[5] += 1
        for lst, v in zip(g[7], vals, strict=True):
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


def _rows_in_database(
    conn: Connection, w: Window, filters: StatsFilter, group_col: list[Any], good: ColumnElement[Any]
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
            stats: dict[str, Any] = {"count": n, "exact": True, "relative_error": 0.0}
            for q_, p in zip(PERCENTILES, ps if n else [None] * len(PERCENTILES), strict=True):
                stats[f"p{round(q_ * 100)}"] = None if p is None else float(p)
            entry[f] = FieldStats.model_validate(stats)
        entries.append(entry)
    return entries


_SERIES_INDEX: Final = {"engine": 0, "model": 1, "instance": 2, "service": 3}


def from_value_blocks(
    conn: Connection, w: Window, filters: StatsFilter, group_by: GroupBy, st: State, *, last: bool = False
) -> list[dict[str, Any]]:
    """A small window, exactly, without reading its rows: counts, token sums and values from the value blocks of
    its whole ten-minute periods and of its other whole minutes (:class:`values.Gather`: each group's values
    gathered, nearest ranks picked), the edges and the rows above the watermark read raw, as
    :func:`~inferwatch.collector.stats.rollup_plan.rollup_aggs` does. Like the sketch plan, it trusts the
    watermark (the rollup job's grace)."""
    t = REQUEST_TABLE
    r0, r1 = rollup_range(w, st)
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
    w: Window,
    filters: StatsFilter,
    group_by: GroupBy,
    folded: int,
    r0: datetime,
    r1: datetime | None,
    *,
    blocks: bool,
    commit: bool = False,
) -> list[tuple[Any, ...]]:
    """PostgreSQL, in one statement through the driver's cursor, in binary (bytea as text is hex, slower to send
    and read): the value blocks of [r0, r1) (with ``blocks``; :data:`_PG_BLOCKS`) as (series, counts, vals,
    None...), and the window's rows outside those whole minutes or above the watermark as (None, None, None,
    group, failed, prompt tokens, generation tokens, *latencies). Written out, not built: building the
    SQLAlchemy statement costs more than running it, a second statement a round trip and its planning
    (docs/collector.md, 'measurements'). Prepared: on a stats engine, planned once for any parameters
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
    # whole window (docs/collector.md, 'measurements')
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
    cur = pg_cursor(conn, binary=True)
    try:
        _prepared(conn, cur, " UNION ALL ".join(parts), params, commit=commit)
        return list(cur.fetchall())
    finally:
        cur.close()


def _prepared(conn: Connection, cur: psycopg.Cursor[Any], sql: str, params: dict[str, Any], *, commit: bool) -> None:
    """Run ``sql`` on ``cur`` prepared (on a stats engine's connection: planned once, generically,
    :func:`~inferwatch.collector.store.db.make_stats_engine`). ``commit``: the statement ends the read, its transaction
    committed in the same round trip (the rows stay readable from ``cur``; cheaper than a COMMIT of its own,
    docs/collector.md, 'measurements')."""
    with pipeline(conn):
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
        for f, (n, ps) in zip(STAT_FIELDS, per_field, strict=True):  # validated with the group (cheaper)
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


def goodput_counts(
    conn: Connection, w: Window, filters: StatsFilter, group_by: GroupBy, good: ColumnElement[Any]
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


def by_walks(
    engine: Engine, w: Window, filters: StatsFilter, group_by: GroupBy, good: ColumnElement[Any]
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
