"""Value blocks: every latency value of the requests that ended in one minute, per field and series, sorted.

The rollups' sketches locate a percentile within 1%; a small window's exact percentiles need the values
themselves, and reading them row by row from the request table costs as much as sorting them (a row of the
table is ~700 bytes; its four latencies are 32). A block holds one minute's requests compactly: ``series``
(JSON, the sorted ``[engine, model, instance, service]`` keys), ``counts`` (int64, row-major by quantity: for each of
:data:`TOTALS` and then each field, one number per series: ``counts[k * S + s]``) and ``vals`` (float64,
field-major, each series' values of a field sorted). Both arrays little-endian. A window then reads one row
per minute (or ten), gathers each group's values and picks their nearest ranks. Maintained with the rollups, in
the same transactions, on both back ends (:mod:`inferwatch.collector.stats.rollup`).

Pure: no database. The reading side (:class:`Gather`) uses numpy: a block's arrays are read in place
(``frombuffer``), each group's values gathered by a stable sort of their group labels (a radix sort) and its
nearest ranks picked by ``partition`` (linear): faster than extending and sorting Python lists, which is what
makes a small window cheaper from its blocks than from its rows on PostgreSQL too (docs/collector.md,
'measurements').
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
from array import array
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

SeriesKey = tuple[str, str | None, str | None, str | None]
"""(engine, model, instance, service)."""

_SWAP: Final = sys.byteorder != "little"
TOTALS: Final = ("requests", "failed", "prompt_tokens", "prompt_count", "generation_tokens", "generation_count")
"""The exact per-series sums a block holds before its value counts."""
NT: Final = len(TOTALS)


def _sort_key(k: SeriesKey) -> tuple[str, str, str, str, bool, bool, bool]:
    return (k[0], k[1] or "", k[2] or "", k[3] or "", k[1] is None, k[2] is None, k[3] is None)


sort_key: Final = _sort_key
"""The order of a block's series."""


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


Encoded = tuple[str, bytes, bytes]
"""A block as stored: (series, counts, vals) (:meth:`Block.encode`)."""


def merge_encoded(fields: int, parts: Sequence[Encoded]) -> Encoded:
    """Stored blocks merged into one, as :meth:`Block.merge` and :meth:`Block.encode` would make it (the same
    bytes: the union of the series in their order, the totals summed, each run the stable sort of the parts'
    runs in order), without making a Python float of any value: each part's arrays are read in place and each
    run merged by numpy's stable sort (timsort: linear on a few sorted runs). The rollup job merges every pass's
    rows into the minute's block this way: decoding the block into lists and sorting them again cost it time
    in proportion to the whole minute on every pass (docs/performance.md, collector ingest, "All-in")."""
    if len(parts) == 1:
        return parts[0]
    read = []
    union: dict[SeriesKey, None] = {}
    for series, counts_b, vals_b in parts:
        keys = parsed_keys(series)
        counts = np.frombuffer(counts_b, dtype="<i8").reshape(NT + fields, len(keys))
        read.append((keys, counts, np.frombuffer(vals_b, dtype="<f8")))
        union.update(dict.fromkeys(keys))
    order = sorted(union, key=_sort_key)
    index = {k: i for i, k in enumerate(order)}
    s = len(order)
    out_counts = np.zeros((NT + fields, s), dtype=np.int64)
    runs: list[list[npt.NDArray[np.float64]]] = [[] for _ in range(fields * s)]
    for keys, counts, vals in read:
        cols = [index[k] for k in keys]
        out_counts[:, cols] += counts
        ends = np.cumsum(counts[NT:].ravel()).tolist()
        start = 0
        for r, end in enumerate(ends):  # field-major: run r is field r // len(keys), series r % len(keys)
            if end > start:
                runs[(r // len(keys)) * s + cols[r % len(keys)]].append(vals[start:end])
            start = end
    pieces = []
    for run in runs:
        if len(run) == 1:
            pieces.append(run[0])
        elif run:
            merged = np.concatenate(run)
            merged.sort(kind="stable")
            pieces.append(merged)
    vals_out = np.concatenate(pieces) if pieces else np.zeros(0, dtype="<f8")
    return (
        json.dumps([list(k) for k in order]),
        out_counts.astype("<i8", copy=False).tobytes(),
        vals_out.astype("<f8", copy=False).tobytes(),
    )


def keys_of(series: str) -> list[SeriesKey]:
    # a block written before the service was a key (migration 0007 empties them) reads as of no service
    return [(str(k[0]), k[1], k[2], k[3] if len(k) > 3 else None) for k in json.loads(series)]


@functools.lru_cache(maxsize=4096)
def parsed_keys(series: str) -> tuple[SeriesKey, ...]:
    """:func:`keys_of`, remembered: a fleet's blocks repeat a few series lists (one per set of series that
    served in a minute), and a window reads each many times (docs/collector.md, 'measurements')."""
    return tuple(keys_of(series))


def arrays(counts_b: bytes, vals_b: bytes) -> tuple[array[int], array[float]]:
    counts = array("q")
    counts.frombytes(counts_b)
    vals = array("d")
    vals.frombytes(vals_b)
    if _SWAP:  # pragma: no cover - big-endian hosts
        counts.byteswap()
        vals.byteswap()
    return counts, vals


SORT_SIZES: Final = (400, 800, 1600, 3200, 6400)
"""The slot sizes :func:`sort_up_to` tries."""


@functools.cache
def sort_up_to() -> int:
    """The largest slot :meth:`Gather.ranked` sorts; a larger one is partitioned at its ranks (linear). Measured
    once per process, on runs of sorted values: which wins depends on the CPU (numpy's sort is vectorized where
    the CPU has AVX-512; docs/collector.md, 'measurements'). Either way the ranks are exact: this only chooses
    the faster."""
    rng = np.random.default_rng(0)
    best = SORT_SIZES[0]
    for n in SORT_SIZES:
        runs = np.concatenate([np.sort(rng.random(n // 16)) for _ in range(16)])
        kth = nearest_ranks(np.array([len(runs)], dtype=np.int64), (0.5, 0.9, 0.95, 0.99))[0]
        buf = runs.copy()
        took = {}
        for how in ("sort", "partition"):
            times = []
            for _ in range(5):
                buf[:] = runs
                t = time.perf_counter()
                if how == "sort":
                    buf.sort()
                else:
                    buf.partition(kth)
                times.append(time.perf_counter() - t)
            took[how] = min(times)
        if took["sort"] > took["partition"]:
            break
        best = n
    return best


SLICE_RUNS: Final = 256
""":meth:`Gather.ranked` copies up to this many runs slice by slice, more by one ``take`` (slices are cheaper for
a few long runs, ``take`` for many short ones: docs/collector.md, 'measurements')."""
GroupKey = Any
"""A group's key (None: no grouping, or an engine, model or instance name, None where the series has none)."""
LEFT_OUT: Final = object()
"""What a :class:`Gather`'s ``group_of`` answers for a series that the filters leave out."""


def nearest_rank(n: int, q: float) -> int:
    """0-based index of the q-quantile by the nearest-rank definition (exact, an observed value); computed as
    PostgreSQL's ``percentile_disc`` does (``ceil(q * n)`` in double precision)."""
    return max(0, min(n - 1, math.ceil(q * n) - 1))


def nearest_ranks(sizes: npt.NDArray[np.int64], quantiles: Sequence[float]) -> npt.NDArray[np.intp]:
    """:func:`nearest_rank` of every size (rows) and quantile (columns) at once, in the same double precision
    (0 where a size is 0)."""
    qs = np.asarray(quantiles, dtype=np.float64)
    ranks = np.ceil(qs[None, :] * sizes[:, None]).astype(np.intp) - 1
    return np.clip(ranks, 0, np.maximum(sizes - 1, 0)[:, None])


class Gather:
    """Totals and values per group from many blocks and raw rows, in numpy arrays; exact nearest ranks at the
    end. ``group_of`` maps a series to its group key, or :data:`LEFT_OUT` (a filter leaves it out); it is asked
    once per series. A block's values come in sorted runs, one per field and series, each labelled with its
    slot ``group * fields + field``; the runs, not the values, are ordered by slot (a block of 32 series and 4
    fields is 128 runs however many values it holds), and each slot's values gathered by one ``take``."""

    def __init__(self, fields: int, group_of: Any) -> None:
        self.fields = fields
        self.group_of = group_of
        self.keys: list[GroupKey] = []
        self._index: dict[GroupKey, int] = {}
        self._series: dict[SeriesKey, int] = {}
        self._plans: dict[str, tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]] | None] = {}
        self._labels: list[npt.NDArray[np.intp]] = []
        self._counts: list[npt.NDArray[np.int64]] = []
        self._vals: list[npt.NDArray[np.float64]] = []
        self._run_slots: list[npt.NDArray[np.intp]] = []
        self._run_lens: list[npt.NDArray[np.int64]] = []
        self._raw_labels: list[int] = []
        self._raw_totals: list[tuple[int, int, int, int, int, int]] = []
        self._raw_vals: list[float] = []
        self._raw_val_labels: list[int] = []

    def group(self, key: GroupKey) -> int:
        """The index of group ``key`` (made on first use)."""
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.keys)
            self.keys.append(key)
        return i

    def _series_label(self, k: SeriesKey) -> int:
        key = self.group_of(k)
        label = self._series[k] = -1 if key is LEFT_OUT else self.group(key)
        return label

    def _plan(self, series: str) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]] | None:
        known = self._series
        labels = np.array(
            [known[k] if k in known else self._series_label(k) for k in parsed_keys(series)], dtype=np.intp
        )
        if bool((labels < 0).all()):
            out = None
        else:  # field-major, as the values are stored: label * fields + field, -1 where left out
            per_field = labels[None, :] * self.fields + np.arange(self.fields, dtype=np.intp)[:, None]
            out = (labels, np.where(labels[None, :] < 0, -1, per_field).ravel())
        self._plans[series] = out
        return out

    def add_block(self, series: str, counts_b: bytes, vals_b: bytes) -> None:
        """One stored block (as :meth:`Block.encode` wrote it)."""
        planned = self._plans[series] if series in self._plans else self._plan(series)
        if planned is None:
            return
        labels, run_slots = planned
        counts = np.frombuffer(counts_b, dtype="<i8").reshape(NT + self.fields, len(labels))
        self._labels.append(labels)
        self._counts.append(counts[:NT])
        self._vals.append(np.frombuffer(vals_b, dtype="<f8"))
        self._run_slots.append(run_slots)
        self._run_lens.append(counts[NT:].ravel())

    def add_rows(
        self,
        keys: Sequence[GroupKey],
        failed: Sequence[int],
        pts: Sequence[int | None],
        gts: Sequence[int | None],
        columns: Sequence[Sequence[float | None]],
    ) -> None:
        """Raw request rows by column (half the time of adding them row by row): their groups, failed flags,
        token counts and one sequence of values per field."""
        group = self.group
        labels = [group(k) for k in keys]
        self._raw_labels.extend(labels)
        self._raw_totals.extend(
            (1, f, pt or 0, pt is not None, gt or 0, gt is not None) for f, pt, gt in zip(failed, pts, gts, strict=True)
        )
        nf = self.fields
        for j, col in enumerate(columns):
            for g, x in zip(labels, col, strict=True):
                if x is not None:
                    self._raw_vals.append(x)
                    self._raw_val_labels.append(g * nf + j)

    def totals(self) -> npt.NDArray[np.int64]:
        """Per group (rows, in :attr:`keys` order), the :data:`TOTALS`."""
        groups = len(self.keys)
        labels = np.concatenate([*self._labels, np.array(self._raw_labels, dtype=np.intp)])
        counts = np.concatenate([*self._counts, np.array(self._raw_totals, dtype=np.int64).reshape(-1, NT).T], axis=1)
        keep = labels >= 0
        labels, counts = labels[keep], counts[:, keep]
        # one bincount per total (cheaper than np.add.at: docs/collector.md, 'measurements'); summed as float64,
        # exact below 2**53
        return np.array(
            [np.bincount(labels, weights=counts[t], minlength=groups) for t in range(NT)], dtype=np.int64
        ).T.reshape(groups, NT)

    def ranked(self, quantiles: Sequence[float]) -> list[list[tuple[int, list[float] | None]]]:
        """Per group (in :attr:`keys` order) and field: the number of values and their nearest-rank
        ``quantiles`` (None: no value). The runs are ordered by slot and the runs that follow each other within
        a slot joined (a block's series of one group; the raw rows' values of a slot, put together first), each
        slot's values taken together, every slot's ranks computed at once (:func:`nearest_ranks`) and picked at
        once; in between, each slot of more than one run is sorted in place, or partitioned at its ranks beyond
        :func:`sort_up_to`."""
        slots = len(self.keys) * self.fields
        raw_slot = np.array(self._raw_val_labels, dtype=np.intp)
        raw_v = np.array(self._raw_vals, dtype=np.float64)
        if len(raw_slot) > 1:  # a raw row's values go to as many slots: each slot's together, one run
            order = np.argsort(raw_slot, kind="stable")
            raw_slot, raw_v = raw_slot[order], raw_v[order]
        v = np.concatenate([*self._vals, raw_v])
        run_slot = np.concatenate([*self._run_slots, raw_slot])
        run_len = np.concatenate([*self._run_lens, np.ones(len(raw_slot), dtype=np.int64)])
        run_start = np.cumsum(run_len) - run_len
        keep = (run_slot >= 0) & (run_len > 0)
        if not bool(keep.all()):
            run_slot, run_len, run_start = run_slot[keep], run_len[keep], run_start[keep]
        if slots > 1:  # each slot's runs together (a radix sort of a few thousand labels)
            order = np.argsort(run_slot.astype(np.int16 if slots < 32768 else np.int32), kind="stable")
            run_slot, run_len, run_start = run_slot[order], run_len[order], run_start[order]
        runs = np.bincount(run_slot, minlength=slots).tolist()  # a slot of one sorted run needs no sort
        if len(run_slot) > 1:
            joined = (run_slot[1:] == run_slot[:-1]) & (run_start[1:] == run_start[:-1] + run_len[:-1])
            if bool(joined.any()):
                heads = np.flatnonzero(np.concatenate(([True], ~joined)))
                run_slot, run_start, run_len = run_slot[heads], run_start[heads], np.add.reduceat(run_len, heads)
        sizes = np.bincount(run_slot, weights=run_len, minlength=slots).astype(np.int64)
        if len(run_len) <= SLICE_RUNS:  # few runs (no grouping): copied slice by slice
            pieces = [v[a : a + n] for a, n in zip(run_start.tolist(), run_len.tolist(), strict=True)]
            v = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float64)
        else:  # run r's values land at out_start[r], read from run_start[r]
            out_start = np.cumsum(run_len) - run_len
            v = v[np.repeat(run_start - out_start, run_len) + np.arange(int(run_len.sum()))]
        ends = np.cumsum(sizes)
        starts = ends - sizes
        ranks = nearest_ranks(sizes, quantiles)
        limit = sort_up_to()
        # v is this call's own array (taken): each slot of several runs sorted (or, when large, partitioned at
        # its ranks: linear) in place; a slot of one run is sorted already
        for a, b, kth, n_runs in zip(starts.tolist(), ends.tolist(), ranks.tolist(), runs, strict=True):
            if n_runs < 2:
                continue
            if b - a > limit:
                v[a:b].partition(kth)
            else:
                v[a:b].sort()
        picked: list[list[float]] = v[np.minimum(starts[:, None] + ranks, len(v) - 1)].tolist() if len(v) else []
        sizes_l: list[int] = sizes.tolist()
        f = self.fields
        return [[(sizes_l[s], picked[s] if sizes_l[s] else None) for s in range(g * f, g * f + f)]
                for g in range(len(self.keys))]  # fmt: skip
