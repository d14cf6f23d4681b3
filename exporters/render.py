"""Render canonical snapshots in the Prometheus text exposition format (0.0.4)."""

from __future__ import annotations

from collections.abc import Iterable

from inferwatch.core import vocabulary as V
from inferwatch.exporters.model import SeriesKey, Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(key: SeriesKey, le: str | None = None) -> str:
    parts = [f'{k}="{_escape(v)}"' for k, v in key]
    if le is not None:
        parts.append(f'le="{le}"')
    return "{" + ",".join(parts) + "}" if parts else ""


def _help(spec: V.MetricSpec, note: str | None) -> str:
    text = spec.help if not note else f"{spec.help} {note}"
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def render(snapshot: Snapshot, vocabulary: V.Vocabulary, metrics: Iterable[V.MetricSpec] = V.ALL_METRICS) -> str:
    """Render every family of ``snapshot`` that has series, in vocabulary order."""
    out: list[str] = []
    fmt = V.format_value
    for spec in metrics:
        if spec.kind is V.Kind.HISTOGRAM:
            hseries = snapshot.histograms.get(spec)
            if not hseries:
                continue
            out.append(f"# HELP {spec.name} {_help(spec, snapshot.notes.get(spec))}")
            out.append(f"# TYPE {spec.name} histogram")
            name = spec.name
            for key in sorted(hseries):
                h = hseries[key]
                if h.counts is not None:
                    les = [V.format_le(b) for b in h.bounds]
                    for le, count in zip(les, h.counts, strict=True):
                        out.append(f"{name}_bucket{_labels(key, le)} {fmt(count)}")
                out.append(f"{name}_bucket{_labels(key, '+Inf')} {fmt(h.inf)}")
                lbl = _labels(key)
                out.append(f"{name}_sum{lbl} {fmt(h.total)}")
                out.append(f"{name}_count{lbl} {fmt(h.inf)}")
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
