"""What one target's translations keep from one scrape to the next, since an engine's page keeps its shape.

A :class:`TranslateMemo` lives in a target's :class:`~inferwatch.exporters.mapping.EngineSession`. It holds
the parser's :class:`~inferwatch.exporters.textparse.LineCache` (a line whose head was seen costs a dict
look-up), the canonical series key of each source label set per mapping row, the label text of each
key for rendering, and per histogram row a *plan*: the work of re-bucketing done once on positions
(where each canonical count, ``+Inf`` count and sum comes from among the row's samples), replayed on
the values of each page whose label sets are those the plan was made from. Memoised or not, a
translation gives the same snapshot, value for value (``tests/test_exporter_memo.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from inferwatch.exporters import textparse
from inferwatch.exporters.samples import SeriesKey, rebucket
from inferwatch.exporters.textparse import Labels, ParseError

Plan = list[tuple[SeriesKey, list[int] | None, bool, int, int]]
"""a histogram row's plan: per canonical series, in the order the translation adds them, its key, the
positions of its canonical bucket counts (``None`` without buckets), whether they are exact, and the
positions of its ``+Inf`` count and of its sum. Positions index the row's bucket, count and sum values
laid end to end, then a 0.0."""
Shape = tuple[str, list[Labels], list[Labels], list[Labels]]
"""what a plan stands for: the histogram's base name, and its bucket, count and sum samples' label sets."""


class TranslateMemo:
    """A target's memo (see the module docstring). Keys depend on the translation's context (the
    target's labels, model and vocabulary): :meth:`use` empties the memo when that changes."""

    __slots__ = ("bounds", "context", "histograms", "keys", "lines", "texts", "unmapped")

    def __init__(self) -> None:
        self.lines = textparse.LineCache()
        self.keys: dict[int, dict[Labels, SeriesKey | None]] = {}
        """id of a mapping row -> its source label sets -> canonical key (``None``: the row drops them)."""
        self.histograms: dict[int, tuple[Shape, Plan]] = {}
        """id of a histogram row -> the shape its plan stands for, and the plan."""
        self.bounds: dict[int, tuple[float, ...]] = {}
        """id of a histogram row -> the vocabulary's boundaries for its metric."""
        self.texts: dict[SeriesKey, str] = {}
        """series key -> its rendered label pairs (see :attr:`~inferwatch.exporters.samples.Snapshot.label_texts`)."""
        self.unmapped: tuple[tuple[str, ...], list[str]] = ((), [])
        """the family names of the last page, and which of them the engine's mapping leaves unmapped."""
        self.context: tuple[object, ...] = ()

    def use(self, context: tuple[object, ...]) -> None:
        """Forget keys and plans when ``context`` (what series keys are made from) is not the last one."""
        if context != self.context:
            self.context = context
            self.keys.clear()
            self.histograms.clear()
            self.bounds.clear()
            self.texts.clear()


def histogram_plan(
    shape: Shape,
    bounds: tuple[float, ...],
    divisor: float,
    key_of: Callable[[Labels], SeriesKey | None],
) -> Plan | None:
    """The work of the translation of a histogram row (its ``_bucket_series``, the totals, ``rebucket``)
    done on positions instead of values; ``key_of`` maps a series' source labels (without ``le``) to
    its canonical key, or ``None`` when the row drops it. ``None`` when no plan can stand for the
    translation: a series gives one boundary twice (``1`` and ``1.0``), which it orders by value."""
    base, bucket_labels, count_labels, sum_labels = shape
    first_count = len(bucket_labels)
    first_sum = first_count + len(count_labels)
    zero = first_sum + len(sum_labels)
    le_cache: dict[str, float] = {}
    series: dict[Labels, tuple[Labels, list[tuple[float, int]]]] = {}
    inf_at: dict[Labels, int] = {}
    for i, labels in enumerate(bucket_labels):
        le, rest, key = bucket_le(labels, base, divisor, le_cache)
        if le == float("inf"):
            inf_at[key] = i
            series.setdefault(key, (tuple(rest), []))
        else:
            series.setdefault(key, (tuple(rest), []))[1].append((le, i))
    count_at = {norm(lbl): first_count + j for j, lbl in enumerate(count_labels)}
    sum_at = {norm(lbl): first_sum + j for j, lbl in enumerate(sum_labels)}
    for key in count_at.keys() - series.keys():
        series[key] = (key, [])
    plan: Plan = []
    for key, (labels, buckets) in series.items():
        canonical = key_of(labels)
        if canonical is None:
            continue
        if len({le for le, _ in buckets}) != len(buckets):
            return None
        buckets.sort()
        total = count_at.get(key, inf_at.get(key, buckets[-1][1] if buckets else zero))
        inf = inf_at.get(key, total)
        positions, exact = rebucket_positions(buckets, bounds, zero) if buckets else (None, False)
        plan.append((canonical, positions, exact, inf, sum_at.get(key, zero)))
    return plan


def rebucket_positions(
    source: list[tuple[float, int]], canonical: tuple[float, ...], zero: int
) -> tuple[list[int], bool]:
    """:func:`~inferwatch.exporters.samples.rebucket` on positions: where each canonical count comes
    from among ``source`` (``(bound, position)`` sorted by bound; ``zero`` for none), and whether all
    are exact."""
    return rebucket(source, canonical, zero)


def bucket_le(
    labels: Labels, base: str, divisor: float, cache: dict[str, float]
) -> tuple[float, list[tuple[str, str]], Labels]:
    """A bucket sample's bound (in canonical units, parsed once per ``le`` string through ``cache``), its other
    labels in source order, and those sorted (the series' key)."""
    le_raw = ""
    rest = []
    for pair in labels:
        if pair[0] == "le":
            le_raw = pair[1]
        else:
            rest.append(pair)
    le = cache.get(le_raw)
    if le is None:
        le = cache[le_raw] = parse_le(base, le_raw, divisor)
    return le, rest, tuple(sorted(rest))


def parse_le(base: str, le_raw: str, divisor: float) -> float:
    """A bucket's ``le`` in canonical units; ParseError when it is not a boundary."""
    try:
        le = float(le_raw) / divisor
    except ValueError:
        raise ParseError(f"{base}_bucket has an invalid le={le_raw!r}") from None
    if le != le:
        raise ParseError(f"{base}_bucket has le={le_raw!r}, not a boundary")
    return le


def norm(labels: Labels) -> Labels:
    """A label set in name order (equal sets written in another order are one key)."""
    return tuple(sorted(labels))
