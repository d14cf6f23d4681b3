"""Value blocks: every latency value of the requests that ended in one minute, per field and series, sorted.

The rollups' sketches locate a percentile within 1%; a small window's exact percentiles need the values
themselves, and reading them row by row from the request table costs as much as sorting them (a row of the
table is ~700 bytes; its four latencies are 32). A block holds one minute's requests compactly: ``series``
(JSON, the sorted ``[engine, model, instance]`` keys), ``counts`` (int64, row-major by quantity: for each of
:data:`TOTALS` and then each field, one number per series: ``counts[k * S + s]``) and ``vals`` (float64,
field-major, each series' values of a field sorted). Both arrays little-endian. A window then reads one row
per minute, slices each group's values and sorts runs that are already sorted. Maintained with the rollups, in
the same transactions, on SQLite (:mod:`inferwatch.collector.rollup`; PostgreSQL's own ``percentile_disc``
over a small window's rows is faster than reading blocks into Python, measured in ``bench/stats.py``).

Stdlib only (pure: no database).
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Sequence
from itertools import accumulate
from typing import Any, Final

SeriesKey = tuple[str, str | None, str | None]
"""(engine, model, instance)."""

_SWAP: Final = sys.byteorder != "little"
TOTALS: Final = ("requests", "failed", "prompt_tokens", "prompt_count", "generation_tokens", "generation_count")
"""The exact per-series sums a block holds before its value counts."""
NT: Final = len(TOTALS)


def _sort_key(k: SeriesKey) -> tuple[str, str, str, bool, bool]:
    return (k[0], k[1] or "", k[2] or "", k[1] is None, k[2] is None)


class Block:
    """One period's values per series and field (``fields`` of them), mutable while it is being folded."""

    __slots__ = ("fields", "series", "totals")

    def __init__(self, fields: int) -> None:
        self.fields = fields
        self.series: dict[SeriesKey, list[list[float]]] = {}
        self.totals: dict[SeriesKey, list[int]] = {}

    def add(self, key: SeriesKey, failed: int, pt: int | None, gt: int | None, values: Sequence[float | None]) -> None:
        """One request: failed or not, its token counts and its values (None: not reported)."""
        lists = self.series.get(key)
        if lists is None:
            lists = self.series[key] = [[] for _ in range(self.fields)]
            self.totals[key] = [0] * NT
        tot = self.totals[key]
        tot[0] += 1
        tot[1] += failed
        if pt is not None:
            tot[2] += pt
            tot[3] += 1
        if gt is not None:
            tot[4] += gt
            tot[5] += 1
        for lst, v in zip(lists, values, strict=True):
            if v is not None:
                lst.append(v)

    def merge(self, other: Block) -> None:
        for key, lists in other.series.items():
            mine = self.series.get(key)
            if mine is None:
                self.series[key] = [list(x) for x in lists]
                self.totals[key] = list(other.totals[key])
            else:
                for a, b in zip(mine, lists, strict=True):
                    a.extend(b)
                self.totals[key] = [x + y for x, y in zip(self.totals[key], other.totals[key], strict=True)]

    def encode(self) -> tuple[str, bytes, bytes]:
        """(series, counts, vals) as stored."""
        keys = sorted(self.series, key=_sort_key)
        counts = array("q")
        vals = array("d")
        for t in range(NT):
            counts.extend(self.totals[key][t] for key in keys)
        for j in range(self.fields):
            for key in keys:
                lst = self.series[key][j]
                lst.sort()
                counts.append(len(lst))
                vals.extend(lst)
        if _SWAP:  # pragma: no cover - big-endian hosts
            counts.byteswap()
            vals.byteswap()
        return json.dumps([list(k) for k in keys]), counts.tobytes(), vals.tobytes()

    @classmethod
    def decode(cls, fields: int, series: str, counts_b: bytes, vals_b: bytes) -> Block:
        keys = keys_of(series)
        counts, vals = arrays(counts_b, vals_b)
        b = cls(fields)
        s = len(keys)
        off = 0
        for i, k in enumerate(keys):
            b.series[k] = [[] for _ in range(fields)]
            b.totals[k] = [counts[t * s + i] for t in range(NT)]
        for j in range(fields):
            for i, k in enumerate(keys):
                n = counts[(NT + j) * s + i]
                b.series[k][j].extend(vals[off : off + n])
                off += n
        return b


def keys_of(series: str) -> list[SeriesKey]:
    return [(str(k[0]), k[1], k[2]) for k in json.loads(series)]


def arrays(counts_b: bytes, vals_b: bytes) -> tuple[array[int], array[float]]:
    counts = array("q")
    counts.frombytes(counts_b)
    vals = array("d")
    vals.frombytes(vals_b)
    if _SWAP:  # pragma: no cover - big-endian hosts
        counts.byteswap()
        vals.byteswap()
    return counts, vals


Group = list[Any]
"""A group's accumulator: the :data:`TOTALS` (``NT`` ints) first, its per-field value lists (a list of lists)
last."""
Run = tuple[int, int, Group]
"""Series ``a`` to ``b`` (exclusive) of a block, all of one group."""


class Reader:
    """Gathers the totals and values of many blocks per group: ``group_of`` maps a series to its group's
    accumulator (None: the series is filtered out), asked once per series. A block's runs (adjacent series of
    one group) are worked out once per distinct series list."""

    def __init__(self, fields: int, group_of: Any) -> None:
        self.fields = fields
        self.group_of = group_of
        self._groups: dict[tuple[Any, ...], Group | None] = {}
        self._runs: dict[str, tuple[int, list[Run]]] = {}

    def _plan(self, series: str) -> tuple[int, list[Run]]:
        keys = json.loads(series)
        runs: list[Run] = []
        groups = self._groups
        for i, k in enumerate(keys):
            t = tuple(k)
            if t in groups:
                acc = groups[t]
            else:
                acc = groups[t] = self.group_of((str(k[0]), k[1], k[2]))
            if acc is None:
                continue
            if runs and runs[-1][1] == i and runs[-1][2] is acc:
                runs[-1] = (runs[-1][0], i + 1, acc)
            else:
                runs.append((i, i + 1, acc))
        out = (len(keys), runs)
        self._runs[series] = out
        return out

    def add(self, series: str, counts_b: bytes, vals_b: bytes) -> None:
        planned = self._runs.get(series) or self._plan(series)
        s, runs = planned
        if not runs:
            return
        counts, vals = arrays(counts_b, vals_b)
        for a, b, acc in runs:
            if b - a == 1:
                for k in range(NT):
                    acc[k] += counts[k * s + a]
            else:
                for k in range(NT):
                    acc[k] += sum(counts[k * s + a : k * s + b])
        off = 0
        for j in range(self.fields):
            base = (NT + j) * s
            offs = list(accumulate(counts[base : base + s], initial=off))
            for a, b, acc in runs:
                lo, hi = offs[a], offs[b]
                if hi > lo:
                    acc[-1][j].extend(vals[lo:hi])
            off = offs[-1]
