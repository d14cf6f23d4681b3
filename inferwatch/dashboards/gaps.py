"""Which engines leave a panel empty, and why: the engine profiles' reasons in Grafana itself.

A panel reads canonical metrics (sometimes their buckets, or a label such as ``dp_rank``); an engine
whose profile lists one of them as unsupported (``EngineProfile.unsupported``, the coverage matrix's
reasons), a label as unlabelled (``EngineProfile.unlabelled``) or a histogram as bucketless
(``EngineProfile.bucketless``: sum and count only) answers nothing. :func:`annotate` writes those
reasons into every panel's "no value" text and description, so that "not exposed by this engine" is
never mistaken for "no data yet". Engines are known only through the profiles: nothing here names one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from inferwatch.core import vocabulary as V
from inferwatch.core.engines.profile import EngineProfile
from inferwatch.dashboards.panels import NO_DATA_YET, TEXT, DashboardSpec, Panel, Query, Row

SQL_NO_DATA = "No requests stored by the collector for this selection and time range."


@dataclass(frozen=True)
class Coverage:
    """The engines that leave a panel empty, or some of its queries, with the profiles' reasons."""

    empty: dict[str, tuple[str, ...]]
    """engine -> reasons, for engines that answer none of the panel's queries."""
    partial: dict[str, tuple[str, ...]]
    """engine -> reasons, for engines that answer some of the queries only."""


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _needs(panel: Panel) -> list[Query]:
    """The queries an engine must answer for the panel to show it (``signals`` stand for rule queries)."""
    out = [q for q in panel.queries if q.metrics or q.labels]
    if panel.signals:
        # a recording rule over a histogram (a latency SLO) reads its buckets; the headroom rules' means do not
        histograms = [m for m in panel.signals if m.kind is V.Kind.HISTOGRAM] if panel.signal_buckets else []
        reads = " ".join(f"{m.name}_bucket" for m in histograms)
        out.append(Query(reads, "", panel.signals, False))
    return out


def missing(
    profile: EngineProfile,
    metrics: Iterable[V.MetricSpec],
    labels: Iterable[str] = (),
    buckets: Iterable[V.MetricSpec] = (),
) -> tuple[str, ...]:
    """Why ``profile``'s engine cannot answer a query of ``metrics`` selecting on ``labels`` and reading the
    buckets of ``buckets`` (empty: it can)."""
    reasons = [profile.unsupported[m.key] for m in metrics if m.key in profile.unsupported]
    reasons += [profile.unlabelled[label] for label in labels if label in profile.unlabelled]
    reasons += [profile.bucketless[m.key] for m in buckets if m.key in profile.bucketless]
    return _unique(reasons)


def query_missing(profile: EngineProfile, query: Query) -> tuple[str, ...]:
    """Why ``profile``'s engine answers ``query`` with nothing (empty: it answers)."""
    buckets = query.bucket_metrics()
    if not query.any_of:
        return missing(profile, query.metrics, query.labels, buckets)
    parts = [missing(profile, (m,), query.labels, (m,) if m in buckets else ()) for m in query.metrics]
    return _unique(r for part in parts for r in part) if parts and all(parts) else ()


def coverage(panel: Panel, profiles: Mapping[str, EngineProfile]) -> Coverage:
    """The engines for which ``panel`` is empty (every query unanswered) or partly empty."""
    needs = _needs(panel)
    empty: dict[str, tuple[str, ...]] = {}
    partial: dict[str, tuple[str, ...]] = {}
    for name, profile in profiles.items():
        gaps = [query_missing(profile, q) for q in needs]
        reasons = _unique(r for g in gaps for r in g)
        if needs and all(gaps):
            empty[name] = reasons
        elif reasons:
            partial[name] = reasons
    return Coverage(empty, partial)


def _listing(gaps: Mapping[str, tuple[str, ...]], profiles: Mapping[str, EngineProfile], prefix: str) -> str:
    return " · ".join(f"{prefix} {profiles[name].title}: {' '.join(reasons)}" for name, reasons in gaps.items())


def no_value_text(panel: Panel, profiles: Mapping[str, EngineProfile]) -> str:
    """Grafana's text for ``panel`` when it is empty: the engines that cannot fill it and why, then
    what emptiness means for the others."""
    if panel.sql:
        return panel.idle or SQL_NO_DATA
    idle = panel.idle or NO_DATA_YET
    cov = coverage(panel, profiles)
    if not cov.empty:
        return idle
    return f"{_listing(cov.empty, profiles, 'Not exposed by')} · Any other engine: {idle[:1].lower()}{idle[1:]}"


def coverage_note(panel: Panel, profiles: Mapping[str, EngineProfile]) -> str:
    """The sentence the description gains when some engine leaves the panel (partly) empty."""
    cov = coverage(panel, profiles)
    parts = []
    if cov.empty:
        parts.append(_listing(cov.empty, profiles, "Empty for"))
    if cov.partial:
        parts.append(_listing(cov.partial, profiles, "Partly empty for"))
    return " · ".join(parts)


def annotate(spec: DashboardSpec, profiles: Mapping[str, EngineProfile]) -> DashboardSpec:
    """``spec`` with every data panel's "no value" text and coverage note filled in from ``profiles``."""
    items: list[Panel | Row] = []
    for item in spec.panels:
        if isinstance(item, Panel) and item.kind != TEXT:
            note = coverage_note(item, profiles)
            description = f"{item.description} {note}" if note else item.description
            item = dataclasses.replace(item, description=description, no_value=no_value_text(item, profiles))
        items.append(item)
    return dataclasses.replace(spec, panels=tuple(items))
