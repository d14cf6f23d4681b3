"""The inferwatch dashboards in their order, one module per dashboard (:mod:`inferwatch.dashboards.boards`)."""

from __future__ import annotations

from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLOFile
from inferwatch.dashboards.boards import engine, fleet, kv_cache, requests, slos
from inferwatch.dashboards.model import DashboardSpec, Query

UIDS = (fleet.UID, slos.UID, engine.UID, kv_cache.UID, requests.UID)
"""every dashboard's uid, in order (the SLO dashboard only with an SLO file)."""


def dashboards(spec: SLOFile | None, vocabulary: V.Vocabulary) -> list[DashboardSpec]:
    """The inferwatch dashboards; the SLO dashboard only with an SLO file."""
    del vocabulary  # percentiles read whatever buckets the layout has; kept for a uniform signature
    out = [fleet.board()]
    if spec is not None:
        out.append(slos.board(spec))
    out += [engine.board(), kv_cache.board(), requests.board()]
    return out


def all_queries(spec: SLOFile | None, vocabulary: V.Vocabulary) -> list[tuple[str, str, Query]]:
    """(dashboard uid, panel title, query) of every Prometheus query of every dashboard."""
    return [(d.uid, p.title, q) for d in dashboards(spec, vocabulary) for p in d.all_panels() for q in p.queries]
