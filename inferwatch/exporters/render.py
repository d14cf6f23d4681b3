"""Render canonical snapshots in the Prometheus text exposition format (0.0.4)."""

from __future__ import annotations

import functools
from collections.abc import Iterable

from inferwatch.core import vocabulary as V
from inferwatch.exporters.samples import SeriesKey, Snapshot

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


def render(snapshot: Snapshot, vocabulary: V.Vocabulary, metrics: Iterable[V.MetricSpec] = V.ALL_METRICS) -> str:
    """Render every family of ``snapshot`` that has series, in vocabulary order."""
    out: list[str] = []
    fmt = V.format_value
    texts = snapshot.label_texts
    if texts is None:
        texts = {}
    elif len(texts) > LABEL_TEXTS_LIMIT:  # keys that do not repeat: start over
        texts.clear()

    def _inner(key: SeriesKey) -> str:
        text = texts.get(key)
        if text is None:
            text = texts[key] = _inner_text(key)
        return text

    def _labels(key: SeriesKey) -> str:
        inner = _inner(key)
        return "{" + inner + "}" if inner else ""

    for spec in metrics:
        if spec.kind is V.Kind.HISTOGRAM:
            hseries = snapshot.histograms.get(spec)
            if not hseries:
                continue
            out.append(f"# HELP {spec.name} {_help(spec, snapshot.notes.get(spec))}")
            out.append(f"# TYPE {spec.name} histogram")
            bucket, total, count = f"{spec.name}_bucket{{", f"{spec.name}_sum", f"{spec.name}_count"
            for key in sorted(hseries):
                h = hseries[key]
                inner = _inner(key)
                # every bucket line shares the series' label string: escaped once, not once per bucket
                prefix = bucket + inner + "," if inner else bucket
                if h.counts is not None:
                    les = le_suffixes(h.bounds)
                    if len(les) != len(h.counts):
                        raise ValueError(f"{spec.name}: {len(h.counts)} bucket counts for {len(les)} boundaries")
                    # str concatenation mapped over lists: no Python-level loop per bucket line
                    out.extend(map(str.__add__, map(prefix.__add__, les), format_values(h.counts)))
                out.append(f'{prefix}le="+Inf"}} {fmt(h.inf)}')
                lbl = "{" + inner + "}" if inner else ""
                out.append(f"{total}{lbl} {fmt(h.total)}")
                out.append(f"{count}{lbl} {fmt(h.inf)}")
        else:
            series = snapshot.values.get(spec)
            if not series:
                continue
            out.append(f"# HELP {spec.name} {_help(spec, snapshot.notes.get(spec))}")
            out.append(f"# TYPE {spec.name} {spec.kind.value}")
            for key in sorted(series):
                out.append(f"{spec.name}{_labels(key)} {fmt(series[key])}")
    out.append("")
    return "\n".join(out)
