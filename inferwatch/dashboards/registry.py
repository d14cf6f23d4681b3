"""The inferwatch dashboards in their order, one module per dashboard (:mod:`inferwatch.dashboards.boards`)."""

from __future__ import annotations

from collections.abc import Mapping

from inferwatch.core import vocabulary as V
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.engines.profile import EngineProfile
from inferwatch.core.slo import HeadroomRules, SLOFile
from inferwatch.dashboards.boards import cost, engine, fleet, kv_cache, requests, slos
from inferwatch.dashboards.gaps import annotate
from inferwatch.dashboards.panels import DashboardSpec, Query

UIDS = (fleet.UID, slos.UID, engine.UID, kv_cache.UID, requests.UID, cost.UID)
"""every dashboard's uid, in order (the SLO dashboard only with an SLO file)."""


def dashboards(
    spec: SLOFile | None, vocabulary: V.Vocabulary, profiles: Mapping[str, EngineProfile] | None = None
) -> list[DashboardSpec]:
    """The inferwatch dashboards; the SLO dashboard only with an SLO file.

    Every panel says in Grafana why it is empty for an engine: the reasons of ``profiles`` (the
    built-in engine profiles by default), see :mod:`inferwatch.dashboards.gaps`.
    """
    del vocabulary  # percentiles read whatever buckets the layout has; kept for a uniform signature
    out = [fleet.board(spec.headroom if spec is not None else HeadroomRules())]
    if spec is not None:
        out.append(slos.board(spec))
    out += [engine.board(), kv_cache.board(), requests.board(), cost.board(spec)]
    known = builtin_profiles() if profiles is None else profiles
    return [annotate(board, known) for board in out]


def all_queries(spec: SLOFile | None, vocabulary: V.Vocabulary) -> list[tuple[str, str, Query]]:
    """(dashboard uid, panel title, query) of every Prometheus query of every dashboard."""
    return [(d.uid, p.title, q) for d in dashboards(spec, vocabulary) for p in d.all_panels() for q in p.queries]
