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

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from inferwatch.core import vocabulary as V
from inferwatch.exporters import textparse
from inferwatch.exporters.samples import HistogramValue, SeriesKey, Snapshot, rebucket
from inferwatch.exporters.textparse import Labels, ParsedText, ParseError

Plan = list[tuple[SeriesKey, list[int] | None, bool, int, int]]
"""a histogram row's plan: per canonical series, in the order the translation adds them, its key, the
positions of its canonical bucket counts (``None`` without buckets), whether they are exact, and the
positions of its ``+Inf`` count and of its sum. Positions index the row's bucket, count and sum values
laid end to end, then a 0.0."""
Shape = tuple[str, list[Labels], list[Labels], list[Labels]]
"""what a plan stands for: the histogram's base name, and its bucket, count and sum samples' label sets."""
Samples = list[tuple[Labels, float]]
T = TypeVar("T")
SumShape = tuple[list[Labels], list[Labels]]
SumPlan = list[tuple[SeriesKey, int, int]]
Step = Callable[[dict[str, "Samples"], Snapshot], None]
"""one row's part of a recorded translation, replayed on a page of the same shape: (samples, snapshot)."""


class TranslateMemo:
    """A target's memo (see the module docstring). Keys depend on the translation's context (the
    target's labels, model and vocabulary): :meth:`use` empties the memo when that changes."""

    __slots__ = (
        "bounds",
        "context",
        "derived",
        "histograms",
        "keys",
        "lines",
        "names",
        "present",
        "programs",
        "recording",
        "sums",
        "texts",
        "unmapped",
    )

    def __init__(self) -> None:
        self.lines = textparse.LineCache()
        self.keys: dict[Hashable, dict[Labels, SeriesKey | None]] = {}
        """a mapping row's *slot* (its id; with a filter, its id and the filter's tag) -> its source label
        sets -> canonical key (``None``: the row or the filter drops them)."""
        self.histograms: dict[Hashable, tuple[Shape, Plan]] = {}
        """a histogram row's slot -> the shape its plan stands for, and the plan."""
        self.sums: dict[Hashable, tuple[SumShape, SumPlan]] = {}
        """a sum-only histogram row's slot -> its sum and count samples' label sets, and per series
        its key and where its sum and count are among them."""
        self.names: dict[int, list[str]] = {}
        """id of a mapping row -> its source names with their aliases (they depend on the engine only)."""
        self.present: dict[tuple[int, tuple[str, ...]], tuple[Any, list[Any]]] = {}
        """(id of a tuple of mapping rows, the names a page has samples of) -> that tuple, and those of
        its rows that read any."""
        self.bounds: dict[int, tuple[float, ...]] = {}
        """id of a histogram row -> the vocabulary's boundaries for its metric."""
        self.texts: dict[SeriesKey, str] = {}
        """series key -> its rendered label pairs (see :attr:`~inferwatch.exporters.samples.Snapshot.label_texts`)."""
        self.programs: dict[Hashable, tuple[object, object, list[Step]]] = {}
        """(id of a tuple of mapping rows, a filter's tag) -> the page shape and rows it was recorded
        for, and its steps (see :func:`~inferwatch.exporters.mapping.translate_rows`)."""
        self.recording: list[Step | None] | None = None
        """the steps of the translation being recorded (``None`` in it: a row no step can replay)."""
        self.derived: dict[Hashable, tuple[object, object]] = {}
        """a hook's slot -> the page shape it was made for, and what the hook made of it (:func:`derive`)."""
        self.unmapped: tuple[tuple[str, ...], list[str]] = ((), [])
        """the family names of the last page, and which of them the engine's mapping leaves unmapped."""
        self.context: tuple[object, ...] = ()

    def use(self, context: tuple[object, ...]) -> None:
        """Forget keys and plans when ``context`` (what series keys are made from) is not the last one."""
        if context != self.context:
            self.context = context
            self.forget_slots()
            self.bounds.clear()
            self.texts.clear()

    def forget_slots(self) -> None:
        """Forget every row's keys and plans."""
        self.keys.clear()
        self.histograms.clear()
        self.sums.clear()
        self.derived.clear()
        self.programs.clear()


def derive(memo: TranslateMemo | None, slot: Hashable, parsed: ParsedText, build: Callable[[], T]) -> T:
    """What ``build`` makes of ``parsed``'s label sets alone, kept in ``memo`` at ``slot`` (an engine
    hook's own) for the pages of the same shape (the cached parse's plan: the same names and label
    sets); made every time without a memo or a cached parse. A hook's work that depends on labels only
    (which models a page has, where each one's samples are, their series keys) is then done once per
    shape, not once per scrape."""
    shape = parsed.shape
    if memo is None or shape is None:
        return build()
    known = memo.derived.get(slot)
    if known is not None and known[0] is shape:
        return cast(T, known[1])
    made = build()
    memo.derived[slot] = (shape, made)
    return made


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


def by_keys(
    memo: TranslateMemo,
    slot: Hashable,
    name: str,
    samples: Samples,
    metric: tuple[V.MetricSpec, float],
    snap: Snapshot,
    key_of: Callable[[Labels], SeriesKey | None],
) -> None:
    """Add a counter or gauge row's samples (those of ``name``) to ``snap``, each label set's canonical
    key looked up in the memo's keys at ``slot`` (``key_of`` fills them: ``None`` for a label set the row
    drops)."""
    keys = memo.keys.get(slot)
    if keys is None or len(keys) > 2 * len(samples) + 1024:  # label sets that do not repeat: bounded
        keys = memo.keys[slot] = {}
    spec, divisor = metric
    add = snap.add_value
    for labels, value in samples:
        key = keys.get(labels, _MISSING)
        if key is _MISSING:
            key = keys[labels] = key_of(labels)
        if key is not None:
            add(spec, key, value / divisor)
    if memo.recording is not None:
        memo.recording.append(_value_step(name, spec, divisor, [keys[labels] for labels, _ in samples]))


def _value_step(name: str, spec: V.MetricSpec, divisor: float, keys: list[SeriesKey | None]) -> Step:
    """:func:`by_keys` replayed: the samples of ``name`` in the order of ``keys`` (their canonical keys)."""

    def step(samples: dict[str, Samples], snap: Snapshot) -> None:
        add = snap.add_value
        for key, (_, value) in zip(keys, samples[name], strict=True):
            if key is not None:
                add(spec, key, value / divisor)

    return step


_MISSING: Any = object()


def by_histogram_plan(
    memo: TranslateMemo,
    slot: Hashable,
    samples: tuple[str, Samples, Samples, Samples],
    metric: tuple[V.MetricSpec, tuple[float, ...], float],
    snap: Snapshot,
    key_of: Callable[[Labels], SeriesKey | None],
) -> bool:
    """Add a histogram row's series to ``snap`` by its plan (made now, and kept at ``slot``, when its
    samples' label sets changed). ``samples``: the base name and the bucket, count and sum samples;
    ``metric``: the canonical metric, its boundaries and the row's divisor. False when no plan can stand
    for the translation (a series gives one boundary twice, e.g. ``1`` and ``1.0``)."""
    base, buckets, counts, sums = samples
    spec, bounds, divisor = metric
    shape = (base, [lbl for lbl, _ in buckets], [lbl for lbl, _ in counts], [lbl for lbl, _ in sums])
    known = memo.histograms.get(slot)
    if known is not None and known[0] == shape:
        plan = known[1]
    else:
        made = histogram_plan(shape, bounds, divisor, key_of)
        if made is None:
            return False
        plan = made
        memo.histograms[slot] = (shape, plan)
    _by_plan(plan, spec, bounds, divisor, buckets, counts, sums, snap)
    if memo.recording is not None:
        names = (f"{base}_bucket", f"{base}_count", f"{base}_sum")

        def step(samples: dict[str, Samples], snap: Snapshot) -> None:
            got = samples.get
            _by_plan(plan, spec, bounds, divisor, got(names[0], []), got(names[1], []), got(names[2], []), snap)

        memo.recording.append(step)
    return True


def _by_plan(
    plan: Plan,
    spec: V.MetricSpec,
    bounds: tuple[float, ...],
    divisor: float,
    buckets: Samples,
    counts: Samples,
    sums: Samples,
    snap: Snapshot,
) -> None:
    values = [v for _, v in buckets]
    values += [v for _, v in counts]
    values += [v for _, v in sums]
    values.append(0.0)
    for key, positions, exact, inf, total in plan:
        if not exact:
            snap.inexact.add(spec)
        canon = None if positions is None else [values[i] for i in positions]
        snap.add_histogram(spec, key, HistogramValue(bounds, canon, values[inf], values[total] / divisor))


def by_sum_plan(
    memo: TranslateMemo,
    slot: Hashable,
    names: tuple[str, str],
    sum_samples: Samples,
    count_samples: Samples,
    metric: tuple[V.MetricSpec, tuple[float, ...], float],
    snap: Snapshot,
    key_of: Callable[[Labels], SeriesKey | None],
) -> None:
    """Add a sum-only histogram row's series (count and sum, no buckets: the samples of ``names``) to
    ``snap`` by a plan made once per shape of its two samples' label sets (kept at ``slot``): per
    series, its key and where its sum and count are."""
    shape = ([lbl for lbl, _ in sum_samples], [lbl for lbl, _ in count_samples])
    known = memo.sums.get(slot)
    if known is not None and known[0] == shape:
        plan = known[1]
    else:
        count_at = {norm(lbl): j for j, lbl in enumerate(shape[1])}
        plan = []
        for i, labels in enumerate(shape[0]):
            j = count_at.get(norm(labels))
            key = None if j is None else key_of(labels)
            if key is not None and j is not None:
                plan.append((key, i, j))
        memo.sums[slot] = (shape, plan)
    spec, bounds, divisor = metric
    _by_sum_plan(plan, spec, bounds, divisor, sum_samples, count_samples, snap)
    if memo.recording is not None:

        def step(samples: dict[str, Samples], snap: Snapshot) -> None:
            _by_sum_plan(plan, spec, bounds, divisor, samples[names[0]], samples[names[1]], snap)

        memo.recording.append(step)


def _by_sum_plan(
    plan: SumPlan,
    spec: V.MetricSpec,
    bounds: tuple[float, ...],
    divisor: float,
    sum_samples: Samples,
    count_samples: Samples,
    snap: Snapshot,
) -> None:
    for key, i, j in plan:
        snap.add_histogram(spec, key, HistogramValue(bounds, None, count_samples[j][1], sum_samples[i][1] / divisor))
    if plan:
        snap.inexact.add(spec)


MAX_PROGRAMS = 64
"""most (rows, filter tag) pairs whose recorded steps a memo keeps."""


def replay(memo: TranslateMemo, rows: tuple[object, ...], tag: Hashable, parsed: ParsedText, snap: Snapshot) -> bool:
    """Translate ``parsed`` by the steps recorded for ``rows`` and ``tag`` on a page of its shape (the
    same names and label sets: every look-up of the rows gives what it gave then); False when none
    were. What a step adds is what the rows would add, value for value (``tests/test_exporter_memo.py``)."""
    known = memo.programs.get((id(rows), tag))
    if known is None or known[0] is not parsed.shape or known[1] is not rows:
        return False
    samples = parsed.samples
    for step in known[2]:
        step(samples, snap)
    return True


@contextmanager
def recording(memo: TranslateMemo, rows: tuple[object, ...], tag: Hashable, parsed: ParsedText) -> Iterator[None]:
    """Record the steps of the translation of ``rows`` run in the block, for :func:`replay` on the
    pages of ``parsed``'s shape; kept when every row could be recorded and the block ran through."""
    outer, memo.recording = memo.recording, []
    try:
        yield
        steps = memo.recording
    finally:
        memo.recording = outer
    if None not in steps:
        if len(memo.programs) > MAX_PROGRAMS:
            memo.programs.clear()
        memo.programs[(id(rows), tag)] = (parsed.shape, rows, cast(list[Step], steps))


def note_step(metric: V.MetricSpec, note: str) -> Step:
    """:func:`add_note` replayed."""
    return lambda _, snap: add_note(snap, metric, note)


def add_note(snap: Snapshot, metric: V.MetricSpec, note: str) -> None:
    """Append a mapping row's ``note`` to ``metric``'s HELP note, once."""
    if note:
        old = snap.notes.get(metric, "")
        if note not in old:
            snap.notes[metric] = f"{old} {note}".strip()


MAX_PRESENT_SHAPES = 64
"""most (rows, page names) pairs whose present rows a memo keeps."""


def rows_present(memo: TranslateMemo, rows: tuple[T, ...], parsed: ParsedText, present: Callable[[T], bool]) -> list[T]:
    """Those of ``rows`` that are ``present`` (read any sample of ``parsed``: the others add nothing),
    worked out once per set of names a page has (a page keeps its names from scrape to scrape)."""
    names = tuple(parsed.samples)  # the same name objects page after page: compared by identity
    key = (id(rows), names)
    found = memo.present.get(key)
    if found is None or found[0] is not rows:  # (the memo holds ``rows``: its id is not reused meanwhile)
        if len(memo.present) > MAX_PRESENT_SHAPES:
            memo.present.clear()
        found = memo.present[key] = (rows, [row for row in rows if present(row)])
    return cast(list[T], found[1])


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


BucketSeries = dict[Labels, tuple[Labels, list[tuple[float, float]]]]
"""sorted labels without ``le`` -> (those labels as the source ordered them, [(finite le, cumulative count)])."""


def bucket_series(parsed: ParsedText, base: str, divisor: float) -> tuple[BucketSeries, dict[Labels, float]]:
    """The ``<base>_bucket`` samples by series: finite buckets (``le`` in canonical units), ``+Inf`` counts."""
    le_cache: dict[str, float] = {}
    series: BucketSeries = {}
    inf_counts: dict[Labels, float] = {}
    for labels, value in parsed.samples.get(base + "_bucket", ()):
        le, rest, key = bucket_le(labels, base, divisor, le_cache)
        if le == float("inf"):
            inf_counts[key] = value
            series.setdefault(key, (tuple(rest), []))
        else:
            series.setdefault(key, (tuple(rest), []))[1].append((le, value))
    return series, inf_counts
