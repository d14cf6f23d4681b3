"""Render canonical snapshots in the Prometheus text exposition format (0.0.4)."""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable
from typing import Any

from inferwatch.core import vocabulary as V
from inferwatch.exporters.samples import HistogramValue, SeriesKey, Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _inner_text(key: SeriesKey) -> str:
    """The label pairs of a series, without braces: built once per series, shared by its lines."""
    return ",".join(f'{k}="{_escape(v)}"' for k, v in key)


def _help(spec: V.MetricSpec, note: str | None) -> str:
    text = spec.help if not note else f"{spec.help} {note}"
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_values(values: list[float]) -> list[str]:
    """:func:`~inferwatch.core.vocabulary.format_value` of each value: at C speed (``float.__repr__``
    over the list) when all are finite floats, which a sum tells at C speed too; else one by one."""
    try:
        total = sum(values)
        if type(total) is float and total - total == 0.0:  # NaN or an infinity makes it NaN
            return list(map(float.__repr__, values))  # an int among them raises TypeError
    except TypeError:
        pass
    return [V.format_value(v) for v in values]


@functools.lru_cache(maxsize=256)
def le_suffixes(bounds: tuple[float, ...]) -> tuple[str, ...]:
    """``le="…"} `` for each boundary: the text after a bucket line's labels, up to its value (a few
    layouts serve every scrape, so they are made once)."""
    return tuple(f'le="{V.format_le(b)}"}} ' for b in bounds)


LABEL_TEXTS_LIMIT = 100_000
"""most series keys whose label text a snapshot's :attr:`~Snapshot.label_texts` memo keeps."""

_Layout = tuple[object, Any, tuple[str, ...]]
"""one family's lines as the last render laid them out: what its series were (its ``# HELP`` and
``# TYPE`` lines and its keys in the snapshot's order; a histogram's with each key's boundaries and
bucket count); how its values come in output order (a counter's or gauge's: ``None`` when in the
snapshot's order, else an ``operator.itemgetter`` of their positions in it, so that no key is hashed
again; a histogram's: its keys in output order); and each line's text up to its value (the first
line's with the family's HELP and TYPE lines before it)."""


class RenderCache:
    """What rendering keeps from one scrape to the next (an exporter's): each family's lines' text up to
    their values for the series it had, and the text of a whole page of such families. A family whose
    series are those of the last render costs a look-up and its values; the page's values are formatted
    at once. Safe to share between threads: entries are replaced whole, never changed."""

    __slots__ = ("headers", "layouts", "orders", "page")

    def __init__(self) -> None:
        self.headers: dict[tuple[V.MetricSpec, str | None], str] = {}
        self.layouts: dict[V.MetricSpec, _Layout] = {}
        self.orders: dict[tuple[object, ...], list[V.MetricSpec]] = {}
        """the families a snapshot has (as its dicts list them) -> those of them rendered, in order."""
        self.page: tuple[tuple[_Layout, ...], list[str]] = ((), [])
        """the layouts of the last page, and all its lines' text up to their values."""


def render(
    snapshot: Snapshot,
    vocabulary: V.Vocabulary,
    metrics: Iterable[V.MetricSpec] = V.ALL_METRICS,
    cache: RenderCache | None = None,
) -> str:
    """Render every family of ``snapshot`` that has series, in vocabulary order; ``cache`` (kept by the
    caller from render to render) makes a page laid out as last time cheaper, never different."""
    if cache is None:
        cache = RenderCache()
    texts = snapshot.label_texts
    if texts is None:
        texts = {}
    elif len(texts) > LABEL_TEXTS_LIMIT:  # keys that do not repeat: start over
        texts.clear()
    layouts = cache.layouts
    values, histograms, notes = snapshot.values, snapshot.histograms, snapshot.notes
    shown = (*values, None, *histograms)
    order = cache.orders.get(shown) if metrics is V.ALL_METRICS else None
    if order is None:
        present = values.keys() | histograms.keys()
        order = [spec for spec in metrics if spec in present]
        if metrics is V.ALL_METRICS:
            if len(cache.orders) > 64:  # snapshots whose families keep changing
                cache.orders.clear()
            cache.orders[shown] = order
    numbers: list[float] = []
    used: list[_Layout] = []
    for spec in order:
        if spec.kind is V.Kind.HISTOGRAM:
            hseries = histograms.get(spec)
            if hseries:
                header = _header(cache, spec, notes.get(spec))
                used.append(_histogram_values(spec, header, hseries, layouts, texts, numbers))
        else:
            series = values.get(spec)
            if series:
                header = _header(cache, spec, notes.get(spec))
                keys = tuple(series)  # the same key objects scrape after scrape: compared by identity
                layout = layouts.get(spec)
                if layout is None or layout[0] != (header, keys):
                    layout = layouts[spec] = _value_layout(spec, header, keys, texts)
                pick = layout[1]
                numbers.extend(series.values() if pick is None else pick(tuple(series.values())))
                used.append(layout)
    if not used:
        return ""
    page = tuple(used)
    last, prefixes = cache.page
    if last != page:  # the same layout objects as last time: compared by identity
        prefixes = [prefix for layout in used for prefix in layout[2]]
        cache.page = (page, prefixes)
    # str concatenation mapped over lists: no Python-level loop per line
    lines = list(map(str.__add__, prefixes, format_values(numbers)))
    lines.append("")  # the last line's newline: joined with the others, not copied after
    return "\n".join(lines)


def _header(cache: RenderCache, spec: V.MetricSpec, note: str | None) -> str:
    """A family's ``# HELP`` and ``# TYPE`` lines, with the newline after them."""
    header = cache.headers.get((spec, note))
    if header is None:
        kind = "histogram" if spec.kind is V.Kind.HISTOGRAM else spec.kind.value
        header = cache.headers[(spec, note)] = f"# HELP {spec.name} {_help(spec, note)}\n# TYPE {spec.name} {kind}\n"
    return header


def _inner(key: SeriesKey, texts: dict[SeriesKey, str]) -> str:
    text = texts.get(key)
    if text is None:
        text = texts[key] = _inner_text(key)
    return text


def _value_layout(spec: V.MetricSpec, header: str, keys: tuple[SeriesKey, ...], texts: dict[SeriesKey, str]) -> _Layout:
    at = sorted(range(len(keys)), key=keys.__getitem__)  # the keys' positions, in output order
    prefixes = []
    for i in at:
        inner = _inner(keys[i], texts)
        prefixes.append(f"{spec.name}{{{inner}}} " if inner else f"{spec.name} ")
    prefixes[0] = header + prefixes[0]
    pick = None if at == list(range(len(keys))) else operator.itemgetter(*at)
    return (header, keys), pick, tuple(prefixes)


def _histogram_values(
    spec: V.MetricSpec,
    header: str,
    hseries: dict[SeriesKey, HistogramValue],
    layouts: dict[V.MetricSpec, _Layout],
    texts: dict[SeriesKey, str],
    numbers: list[float],
) -> _Layout:
    """A histogram family's layout, its values appended to ``numbers``: per series its buckets, ``+Inf``,
    ``_sum`` and ``_count``."""
    shape = (header, *((key, h.bounds, None if h.counts is None else len(h.counts)) for key, h in hseries.items()))
    layout = layouts.get(spec)
    if layout is None or layout[0] != shape:
        layout = layouts[spec] = _histogram_layout(spec, header, hseries, shape, texts)
    add, extend = numbers.append, numbers.extend
    for key in layout[1]:
        h = hseries[key]
        if h.counts is not None:
            extend(h.counts)
        add(h.inf)
        add(h.total)
        add(h.inf)
    return layout


def _histogram_layout(
    spec: V.MetricSpec,
    header: str,
    hseries: dict[SeriesKey, HistogramValue],
    shape: object,
    texts: dict[SeriesKey, str],
) -> _Layout:
    order = tuple(sorted(hseries))
    bucket, total, count = f"{spec.name}_bucket{{", f"{spec.name}_sum", f"{spec.name}_count"
    prefixes: list[str] = []
    for key in order:
        h = hseries[key]
        inner = _inner(key, texts)
        # every bucket line shares the series' label string: escaped once, not once per bucket
        prefix = bucket + inner + "," if inner else bucket
        if h.counts is not None:
            les = le_suffixes(h.bounds)
            if len(les) != len(h.counts):
                raise ValueError(f"{spec.name}: {len(h.counts)} bucket counts for {len(les)} boundaries")
            prefixes.extend(map(prefix.__add__, les))
        lbl = "{" + inner + "}" if inner else ""
        prefixes += [f'{prefix}le="+Inf"}} ', f"{total}{lbl} ", f"{count}{lbl} "]
    prefixes[0] = header + prefixes[0]
    return shape, order, tuple(prefixes)
