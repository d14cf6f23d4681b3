"""Render canonical snapshots in the Prometheus text exposition format (0.0.4)."""

from __future__ import annotations

from collections.abc import Iterable

from inferwatch.core import vocabulary as V
from inferwatch.exporters.samples import SeriesKey, Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _inner(key: SeriesKey) -> str:
    """The label pairs of a series, without braces: built once per series, shared by its lines."""
    return ",".join(f'{k}="{_escape(v)}"' for k, v in key)


def _labels(key: SeriesKey) -> str:
    inner = _inner(key)
    return "{" + inner + "}" if inner else ""


def _help(spec: V.MetricSpec, note: str | None) -> str:
    text = spec.help if not note else f"{spec.help} {note}"
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def render(snapshot: Snapshot, vocabulary: V.Vocabulary, metrics: Iterable[V.MetricSpec] = V.ALL_METRICS) -> str:
    """Render every family of ``snapshot`` that has series, in vocabulary order."""
    out: list[str] = []
    fmt = V.format_value
    les_of: dict[tuple[float, ...], list[str]] = {}
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
                    les = les_of.get(h.bounds)
                    if les is None:
                        les = les_of[h.bounds] = [V.format_le(b) for b in h.bounds]
                    out.extend(f'{prefix}le="{le}"}} {fmt(c)}' for le, c in zip(les, h.counts, strict=True))
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
