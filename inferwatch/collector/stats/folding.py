"""The rollup job's arithmetic on a chunk of request rows, by column (numpy): per (minute, series) the totals,
value counts and sketch buckets of the rollups, and per minute the value block, encoded as stored.

The rows are those of :func:`inferwatch.collector.stats.rollup.raw_columns`: ``(minute, engine, model, instance,
service, failed, prompt tokens, generation tokens, *latencies)``. Row by row in Python (a ``bisect`` and a few
dictionary updates per value, every value appended to a list and the lists sorted at encoding) this cost the job
3.1 us a row; by column, one pass in Python to number the groups and the rest in numpy (``searchsorted`` for
the buckets, ``bincount`` for the sums, ``lexsort`` for the blocks' sorted runs), 1.6 us (20k rows, the shared
2-core machine; docs/performance.md, collector ingest, "All-in").

The results are those of the row-by-row code: the same buckets (``searchsorted`` left is ``bisect_left``; a
NaN, which ``bisect_left`` puts in bucket 0, goes there too), the same sums (integers summed as float64 are exact
below 2**53), the same bytes of each block (a stable sort by series and value: equal values keep their row
order, as ``list.sort`` keeps them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from inferwatch.collector.stats import sketch, values

_BOUNDS: Final = np.asarray(sketch.BOUNDS, dtype=np.float64)
GroupKey = tuple[Any, str, str | None, str | None, str | None]
"""(minute as the database returned it, engine, model, instance, service)."""


@dataclass(slots=True)
class Chunk:
    """A chunk's aggregates: per group (:attr:`keys`), the totals (requests, failed, prompt tokens, rows with
    them, generation tokens, rows with them), per field the values counted and the sketch's buckets; per minute
    the value block as stored."""

    keys: list[GroupKey]
    totals: list[list[int]]
    counts: list[list[int]]
    sketches: list[list[dict[int, int]]]
    blocks: dict[Any, values.Encoded]


def _floats(col: Sequence[Any]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_] | None]:
    """A column as float64 and where it holds a value (None: everywhere)."""
    arr = np.array(col, dtype=np.float64)  # None becomes NaN
    if None not in col:
        return arr, None
    return arr, np.fromiter((x is not None for x in col), dtype=np.bool_, count=len(col))


def _sums(ids: npt.NDArray[np.intp], n: int, arr: npt.NDArray[np.float64], has: Any) -> tuple[list[int], list[int]]:
    """Per id: the sum of ``arr`` where it has a value, and how many values."""
    if has is not None:
        ids, arr = ids[has], arr[has]
    total = np.bincount(ids, weights=arr, minlength=n).astype(np.int64)
    count = np.bincount(ids, minlength=n)
    return total.tolist(), count.tolist()


def fold_chunk(rows: Sequence[Sequence[Any]], fields: int) -> Chunk:
    """The aggregates of ``rows`` (see the module)."""
    if not rows:
        return Chunk([], [], [], [], {})
    cols = list(zip(*rows, strict=True))
    minute, engine, model, instance, service, failed, pt, gt = cols[:8]
    lat = cols[8 : 8 + fields]
    index: dict[GroupKey, int] = {}
    n = len(rows)
    gid = np.fromiter(
        (index.setdefault(k, len(index)) for k in zip(minute, engine, model, instance, service, strict=True)),
        dtype=np.intp,
        count=n,
    )
    groups = len(index)
    keys = list(index)
    fail = np.array(failed, dtype=np.float64)
    pts, pt_has = _floats(pt)
    gts, gt_has = _floats(gt)
    requests = np.bincount(gid, minlength=groups).tolist()
    failed_sum = np.bincount(gid, weights=fail, minlength=groups).astype(np.int64).tolist()
    pt_sum, pt_count = _sums(gid, groups, pts, pt_has)
    gt_sum, gt_count = _sums(gid, groups, gts, gt_has)
    totals = [[requests[g], failed_sum[g], pt_sum[g], pt_count[g], gt_sum[g], gt_count[g]] for g in range(groups)]
    counts = [[0] * fields for _ in range(groups)]
    sketches: list[list[dict[int, int]]] = [[{} for _ in range(fields)] for _ in range(groups)]
    columns: list[tuple[npt.NDArray[np.float64], Any]] = []
    nb = len(_BOUNDS) + 1
    for j in range(fields):
        v, has = _floats(lat[j])
        columns.append((v, has))
        g, vv = (gid, v) if has is None else (gid[has], v[has])
        b = np.searchsorted(_BOUNDS, vv, side="left")
        nan = np.isnan(vv)
        if nan.any():
            b[nan] = 0
        pairs, seen = np.unique(g * nb + b, return_counts=True)
        for pair, c in zip(pairs.tolist(), seen.tolist(), strict=True):
            grp, bucket = divmod(pair, nb)
            sketches[grp][j][bucket] = c
            counts[grp][j] += c
    return Chunk(keys, totals, counts, sketches, _blocks(keys, gid, totals, columns, fields))


def _blocks(
    keys: list[GroupKey],
    gid: npt.NDArray[np.intp],
    totals: list[list[int]],
    columns: list[tuple[npt.NDArray[np.float64], Any]],
    fields: int,
) -> dict[Any, values.Encoded]:
    """Per minute, the value block of the rows (:meth:`values.Block.encode`'s layout and bytes)."""
    by_minute: dict[Any, list[int]] = {}
    for g, k in enumerate(keys):
        by_minute.setdefault(k[0], []).append(g)
    out: dict[Any, values.Encoded] = {}
    single = len(by_minute) == 1
    for minute, groups in by_minute.items():
        series = sorted(groups, key=lambda g: values.sort_key(keys[g][1:]))
        s = len(series)
        # rank of each group within its minute's block; -1 for the other minutes' groups
        rank = np.full(len(keys), -1, dtype=np.intp)
        rank[series] = np.arange(s, dtype=np.intp)
        row_rank = rank[gid]
        counts = np.zeros((values.NT + fields, s), dtype=np.int64)
        for t in range(values.NT):
            counts[t] = [totals[g][t] for g in series]
        runs = []
        for j, (v, has) in enumerate(columns):
            keep = row_rank >= 0 if not single else None
            if has is not None:
                keep = has if keep is None else keep & has
            r, vv = (row_rank, v) if keep is None else (row_rank[keep], v[keep])
            order = np.lexsort((vv, r))  # by series, then value; stable
            runs.append(vv[order])
            counts[values.NT + j] = np.bincount(r, minlength=s)
        out[minute] = (
            json.dumps([list(keys[g][1:]) for g in series]),
            counts.astype("<i8", copy=False).tobytes(),
            np.concatenate(runs).astype("<f8", copy=False).tobytes(),
        )
    return out
