"""Value blocks: every latency value of the requests that ended in one minute, per field and series, sorted.

The rollups' sketches locate a percentile within 1%; a small window's exact percentiles need the values
themselves, and reading them row by row from the request table costs as much as sorting them (a row of the
table is ~700 bytes; its four latencies are 32). A block holds one minute's values compactly: ``series`` (JSON,
the sorted ``[engine, model, instance]`` keys), ``counts`` (int64, field-major: the values of field ``j`` of
series ``s`` at ``counts[j * S + s]``) and ``vals`` (float64, field-major, each series' values of a field
sorted). Both arrays little-endian. A window then reads one row per minute, slices each group's values and
sorts runs that are already sorted. Maintained with the rollups, in the same transactions
(:mod:`inferwatch.collector.rollup`).

Stdlib only (pure: no database).
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate
from typing import Any, Final

SeriesKey = tuple[str, str | None, str | None]
"""(engine, model, instance)."""

_SWAP: Final = sys.byteorder != "little"


def _sort_key(k: SeriesKey) -> tuple[str, str, str, bool, bool]:
    return (k[0], k[1] or "", k[2] or "", k[1] is None, k[2] is None)


class Block:
    """One period's values per series and field (``fields`` of them), mutable while it is being folded."""

    __slots__ = ("fields", "series")

    def __init__(self, fields: int) -> None:
        self.fields = fields
        self.series: dict[SeriesKey, list[list[float]]] = {}

    def add(self, key: SeriesKey, values: Sequence[float | None]) -> None:
        """One request's values (None: the request did not report that field)."""
        lists = self.series.get(key)
        if lists is None:
            lists = self.series[key] = [[] for _ in range(self.fields)]
        for lst, v in zip(lists, values, strict=True):
            if v is not None:
                lst.append(v)

    def merge(self, other: Block) -> None:
        for key, lists in other.series.items():
            mine = self.series.get(key)
            if mine is None:
                self.series[key] = [list(x) for x in lists]
            else:
                for a, b in zip(mine, lists, strict=True):
                    a.extend(b)

    def encode(self) -> tuple[str, bytes, bytes]:
        """(series, counts, vals) as stored."""
        keys = sorted(self.series, key=_sort_key)
        counts = array("q")
        vals = array("d")
        for j in range(self.fields):
            for k in keys:
                lst = self.series[k][j]
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
        for k in keys:
            b.series[k] = [[] for _ in range(fields)]
        for j in range(fields):
            for i, k in enumerate(keys):
                n = counts[j * s + i]
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


Run = tuple[int, int, list[list[float]]]
"""Series ``a`` to ``b`` (exclusive) of a block, all of one group: its per-field value lists."""


class Reader:
    """Gathers the values of many blocks per group: ``group_of`` maps a series to its group's per-field lists
    (None: the series is filtered out). The runs of a block's series list are worked out once per distinct
    list (a fleet's minutes mostly share one)."""

    def __init__(self, fields: int, group_of: Any) -> None:
        self.fields = fields
        self.group_of = group_of
        self._runs: dict[str, tuple[int, list[Run]]] = {}

    def _plan(self, series: str) -> tuple[int, list[Run]]:
        keys = keys_of(series)
        runs: list[Run] = []
        for i, k in enumerate(keys):
            acc = self.group_of(k)
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
        off = 0
        for j in range(self.fields):
            offs = list(accumulate(counts[j * s : (j + 1) * s], initial=off))
            for a, b, acc in runs:
                lo, hi = offs[a], offs[b]
                if hi > lo:
                    acc[j].extend(vals[lo:hi])
            off = offs[-1]


def blocks_of(rows: Iterable[tuple[Any, SeriesKey, Sequence[float | None]]], fields: int) -> dict[Any, Block]:
    """Per period key: the block of ``rows`` (period key, series, values)."""
    out: dict[Any, Block] = {}
    for period, key, values in rows:
        b = out.get(period)
        if b is None:
            b = out[period] = Block(fields)
        b.add(key, values)
    return out
