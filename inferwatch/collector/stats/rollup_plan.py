"""The rollups' side of the ``scan``, ``index`` and ``sketch`` plans: each group's exact counts and per-field
bucket counts over a window, merged from the rollups of its whole minutes (hours, days) and the raw rows of its
edges and above the watermark; and where in those buckets each exact percentile lies (:func:`targets`), for
:mod:`~inferwatch.collector.stats.tails` to read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, case, or_, select

from inferwatch.collector.schemas import GroupBy
from inferwatch.collector.stats import rollup, sides, sketch
from inferwatch.collector.stats.values import nearest_rank
from inferwatch.collector.stats.windowing import (
    PERCENTILES,
    STAT_FIELDS,
    State,
    StatsFilter,
    Window,
    periods,
    pg_cursor,
    rollup_range,
)
from inferwatch.collector.store.tables import REQUEST_TABLE, ROLLUP_TABLE
from inferwatch.core.schema import GENERATION_TOKENS, PROMPT_TOKENS


@dataclass(slots=True)
class Agg(rollup.Totals):
    """One group's exact counts and per-field bucket counts, merged from rollups and raw rows."""

    n: list[int] = field(default_factory=lambda: [0] * len(STAT_FIELDS))
    hists: list[sketch.Histogram] = field(default_factory=lambda: [sketch.Histogram() for _ in STAT_FIELDS])


Period = tuple[int, datetime, datetime | None]
"""(period seconds, start, end) of :func:`~inferwatch.collector.stats.windowing.periods`."""


def rollup_aggs(
    conn: Connection, w: Window, filters: StatsFilter, group_by: GroupBy, st: State
) -> tuple[dict[Any, Agg], datetime, datetime | None]:
    """Per group: the rollups of the window's whole minutes (whole hours where they fit) and the raw rows of its
    edges and above the watermark; the (minute-aligned) range the rollups answered."""
    r0, r1 = rollup_range(w, st)
    names = _rollup_columns(group_by)
    spans = periods(r0, r1)
    if conn.dialect.name == "postgresql" and spans:
        rows = _pg_rollup_rows(conn, filters, names, spans)
    else:
        rows = _rollup_rows(conn, filters, names, spans)
    aggs: dict[Any, Agg] = {}
    _fold_rollups(aggs, rows, grouped=group_by != "none")
    _fold_raw(aggs, conn, w, filters, group_by, st.folded, (r0, r1))
    return {k: g for k, g in aggs.items() if g.requests}, r0, r1


def _rollup_columns(group_by: GroupBy) -> list[str]:
    """The rollup columns read: the group, the counts and token sums, each field's count and sketch."""
    return [*([] if group_by == "none" else [group_by]), "requests", "failed", PROMPT_TOKENS,
            f"{PROMPT_TOKENS}_count", GENERATION_TOKENS, f"{GENERATION_TOKENS}_count",
            *(c for f in STAT_FIELDS for c in (f"{f}_count", f"{f}_sketch"))]  # fmt: skip


def _pg_rollup_rows(
    conn: Connection, filters: StatsFilter, names: list[str], spans: list[Period]
) -> list[Sequence[Any]]:
    """PostgreSQL: the rollup rows of the periods in one statement, through the driver's cursor, in binary (the
    sketches as text are hex: twice the bytes to send, encode and decode; docs/collector.md, 'measurements')."""
    r = ROLLUP_TABLE
    params: dict[str, Any] = {}
    parts = []
    fsql = "".join(f" AND {name} = %(f_{name})s" for name, _ in filters.items())
    params.update({f"f_{name}": value for name, value in filters.items()})
    side_sql = filters.side_sql(f"%({sides.PARAM})s")
    if side_sql is not None:
        fsql += f" AND {side_sql}"
        params.update(sides.PARAMS)
    for k, (period, a, b) in enumerate(spans):
        params.update({f"p{k}": period, f"a{k}": a, f"b{k}": b})
        until = "" if b is None else f" AND period_start < %(b{k})s"
        parts.append(
            f"SELECT {', '.join(names)} FROM {r.name} WHERE period_seconds = %(p{k})s "
            f"AND period_start >= %(a{k})s{until}{fsql}"
        )
    cur = pg_cursor(conn, binary=True)
    try:
        cur.execute(" UNION ALL ".join(parts), params)
        return list(cur.fetchall())
    finally:
        cur.close()


def _rollup_rows(conn: Connection, filters: StatsFilter, names: list[str], spans: list[Period]) -> list[Sequence[Any]]:
    """The rollup rows of the periods, a statement per period (SQLite)."""
    r = ROLLUP_TABLE
    rows: list[Sequence[Any]] = []
    fcond = [r.c[name] == value for name, value in filters.items()]
    side = sides.condition(filters.side, r.c.service)
    if side is not None:
        fcond.append(side)
    for period, a, b in spans:
        conds = [r.c.period_seconds == period, r.c.period_start >= a, *fcond]
        if b is not None:
            conds.append(r.c.period_start < b)
        rows.extend(conn.execute(select(*(r.c[n] for n in names)).where(*conds)).all())
    return rows


def _fold_rollups(aggs: dict[Any, Agg], rows: list[Sequence[Any]], *, grouped: bool) -> None:
    """Add the rollup rows (of :func:`_rollup_columns`) to their groups' counts; their sketches merged at once,
    per group and field."""
    sketches: dict[Any, list[list[bytes]]] = {}
    for row in rows:
        key = row[0] if grouped else None
        vals = row[1:] if grouped else row
        g = aggs.get(key)
        if g is None:
            g = aggs[key] = Agg()
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


def _fold_raw(
    aggs: dict[Any, Agg],
    conn: Connection,
    w: Window,
    filters: StatsFilter,
    group_by: GroupBy,
    folded: int,
    answered: tuple[datetime, datetime | None],
) -> None:
    """Add the raw rows to their groups: the edges (below the watermark, outside the range [r0, r1) the rollups
    ``answered``) and everything above the watermark."""
    t = REQUEST_TABLE
    r0, r1 = answered
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
                g = aggs[key] = Agg()
            g.add_request(failed, pt, gt)
            for j, v in enumerate(values):
                if v is not None:
                    g.n[j] += 1
                    g.hists[j].counts[sketch.bucket_of(v)] += 1


Target = tuple[Any, int, int, str]
"""(group, bucket, rank within the bucket, percentile name)."""


def targets(aggs: dict[Any, Agg]) -> list[list[Target]]:
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
