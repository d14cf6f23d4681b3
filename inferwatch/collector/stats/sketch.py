"""Mergeable quantile sketches of latencies: DDSketch-style logarithmic buckets with a stated relative accuracy.

A value ``v`` falls in bucket ``i`` when ``BOUNDS[i-1] < v <= BOUNDS[i]`` (bucket 0: ``v <= BOUNDS[0]``, zero
included; the last: ``v > BOUNDS[-1]``), the bounds growing by ``GAMMA = (1 + a) / (1 - a)`` from
:data:`MIN_VALUE`. A sketch is the count of values per bucket: merging two sketches adds their counts, and a
merged sketch is the sketch of the union (exactly: per-bucket counts are exact). The q-quantile of a sketch is
found by nearest rank over those counts, which finds the bucket of the exact nearest-rank quantile; reported
as the bucket's centre ``2·lo·hi/(lo+hi)``, it is within ``a`` (:data:`RELATIVE_ACCURACY`) of the exact value,
relatively, for values between :data:`MIN_VALUE` and :data:`MAX_VALUE` (below: reported as 0, off by less than
:data:`MIN_VALUE`). The buckets are explicit float64 bounds, compared exactly, so a database can be asked for
the rows of one bucket (``col > lo AND col <= hi``) and find precisely the values the sketch counted there: the
exact percentile is then the right value among the rows of one bucket.

Pure (no database): the stdlib, and numpy to merge many sketches at once. Why not a library: DataDog's
``ddsketch`` (PyPI, pure Python) computes the bucket of a value with a logarithm, whose rounding puts values
next to a bound in a neighbour of the bucket a SQL range would select, and merges through per-bucket Python
objects; this module needs exact float bounds and merges dense count arrays (C-level ``map``, numpy).
"""

from __future__ import annotations

import operator
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from itertools import accumulate
from typing import Final

import numpy as np

RELATIVE_ACCURACY: Final = 0.01
"""A sketched percentile is within 1% of the exact nearest-rank percentile of the same rows."""
GAMMA: Final = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
MIN_VALUE: Final = 1e-6
"""Seconds; smaller values (zero included) share bucket 0 and are reported as 0."""
MAX_VALUE: Final = 1e6
"""Seconds (11.6 days); larger values share the last bucket, reported as this."""


def _bounds() -> tuple[float, ...]:
    out = [MIN_VALUE]
    while out[-1] < MAX_VALUE:
        out.append(out[-1] * GAMMA)
    return tuple(out)


BOUNDS: Final = _bounds()
"""Upper bounds of the buckets 0 .. len(BOUNDS)-1 (bucket len(BOUNDS) is above the last)."""
BUCKETS: Final = len(BOUNDS) + 1
_TYPECODES: Final = ("B", "H", "I", "Q")
_HEADER: Final = struct.Struct("<BHH")
"""typecode index, first bucket, number of buckets."""


def bucket_of(value: float) -> int:
    """The bucket holding ``value`` (a finite number >= 0)."""
    return bisect_left(BOUNDS, value)


def bucket_range(index: int) -> tuple[float | None, float | None]:
    """The bucket's values: ``lo < v <= hi`` (None: unbounded on that side; bucket 0 holds 0 and below)."""
    lo = BOUNDS[index - 1] if index > 0 else None
    hi = BOUNDS[index] if index < len(BOUNDS) else None
    return lo, hi


def estimate(index: int) -> float:
    """The value a sketch reports for a bucket: its centre (relative error <= :data:`RELATIVE_ACCURACY`)."""
    if index == 0:
        return 0.0
    if index >= len(BOUNDS):
        return BOUNDS[-1]
    lo, hi = BOUNDS[index - 1], BOUNDS[index]
    return 2 * lo * hi / (lo + hi)


def encode(counts: dict[int, int]) -> bytes:
    """A sketch (bucket -> count, counts > 0) as bytes: a header (format, first bucket, number of buckets) and the
    counts of its bucket range as little-endian uint32 (uint64 if a count needs it)."""
    if not counts:
        return _HEADER.pack(2, 0, 0)
    lo, hi = min(counts), max(counts)
    dense = [0] * (hi - lo + 1)
    for k, c in counts.items():
        dense[k - lo] = c
    code = 2 if max(dense) < 1 << 32 else 3
    arr = array(_TYPECODES[code], dense)
    if sys.byteorder == "big":  # pragma: no cover - the stored format is little-endian
        arr.byteswap()
    return _HEADER.pack(code, lo, len(dense)) + arr.tobytes()


def decode(data: bytes) -> tuple[int, array[int]]:
    """(first bucket, the counts from there) of :func:`encode`'s bytes."""
    code, lo, n = _HEADER.unpack_from(data)
    arr = array(_TYPECODES[code])
    arr.frombytes(data[_HEADER.size : _HEADER.size + n * arr.itemsize])
    if sys.byteorder == "big":  # pragma: no cover
        arr.byteswap()
    return lo, arr


class Histogram:
    """Bucket counts being merged (dense, every bucket): sketches and single values added in."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts = [0] * BUCKETS

    def add_encoded(self, data: bytes) -> None:
        lo, arr = decode(data)
        if arr:
            hi = lo + len(arr)
            c = self.counts
            c[lo:hi] = map(operator.add, c[lo:hi], arr)

    def add_many(self, datas: Sequence[bytes]) -> None:
        """Many encoded sketches, as :meth:`add_encoded` each: their uint32 counts concatenated and added up by
        one ``bincount`` (much cheaper than one by one: docs/collector.md, 'measurements'). The weights are
        float64: exact while a bucket's sum stays below 2**53."""
        los: list[int] = []
        ns: list[int] = []
        parts: list[bytes] = []
        head = _HEADER.size
        for data in datas:
            code, lo, n = _HEADER.unpack_from(data)
            if code != 2:
                self.add_encoded(data)
            elif n:
                los.append(lo)
                ns.append(n)
                parts.append(data[head : head + 4 * n])
        if not parts:
            return
        counts = np.frombuffer(b"".join(parts), dtype="<u4")
        sizes = np.array(ns, dtype=np.intp)
        offsets = np.array(los, dtype=np.intp) - (np.cumsum(sizes) - sizes)
        buckets = np.arange(len(counts), dtype=np.intp) + np.repeat(offsets, sizes)
        merged: list[int] = np.bincount(buckets, weights=counts, minlength=BUCKETS).astype(np.int64).tolist()
        self.counts = list(map(operator.add, self.counts, merged))

    def add_counts(self, counts: dict[int, int]) -> None:
        c = self.counts
        for k, n in counts.items():
            c[k] += n

    def add_values(self, values: Iterable[float]) -> None:
        c = self.counts
        for v in values:
            c[bisect_left(BOUNDS, v)] += 1

    def total(self) -> int:
        return sum(self.counts)

    def locate(self, ranks: list[int]) -> list[tuple[int, int]]:
        """(bucket, rank within it) of each 0-based rank (ascending) among the values counted."""
        # C-level: a walk of the buckets in Python costs more (docs/collector.md, 'measurements')
        cumulative = list(accumulate(self.counts))
        out: list[tuple[int, int]] = []
        for want in ranks:
            i = bisect_right(cumulative, want)
            if i >= len(cumulative):
                raise IndexError(want)
            out.append((i, want - (cumulative[i - 1] if i else 0)))
        return out
