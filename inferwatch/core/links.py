"""Addresses that several components build: the generated dashboards' stable uids and variables.

The dashboard generator names its dashboards and template variables with these; the collector's
alert enrichment and incident page link to the same dashboards with the alert's labels filled in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final
from urllib.parse import urlencode

UID_FLEET: Final = "inferwatch-fleet"
UID_SLOS: Final = "inferwatch-slos"
UID_ENGINE: Final = "inferwatch-engine"
UID_KV_CACHE: Final = "inferwatch-kv-cache"
UID_REQUESTS: Final = "inferwatch-requests"
UID_COST: Final = "inferwatch-cost"

DASHBOARD_TITLES: Final[dict[str, str]] = {
    UID_FLEET: "LLM Fleet Overview",
    UID_SLOS: "LLM SLOs",
    UID_ENGINE: "LLM Engine Detail",
    UID_KV_CACHE: "LLM KV Cache & Scheduling",
    UID_REQUESTS: "LLM Requests",
    UID_COST: "LLM Cost & GPU",
}

VAR_DATASOURCE: Final = "datasource"
VAR_SQL_DATASOURCE: Final = "sqldatasource"
VAR_ENGINE: Final = "engine"
VAR_MODEL: Final = "model"
VAR_INSTANCE: Final = "instance"
DASHBOARD_VARIABLES: Final[tuple[str, ...]] = (VAR_ENGINE, VAR_MODEL, VAR_INSTANCE)


def dashboard_url(base: str, uid: str, variables: Mapping[str, str] | None = None, range_from: str = "now-1h") -> str:
    """``{base}/d/{uid}?from=…&var-engine=…``: a Grafana link with the template variables filled in."""
    params = [("from", range_from), ("to", "now")]
    params += [(f"var-{k}", v) for k, v in (variables or {}).items() if k in DASHBOARD_VARIABLES and v]
    return f"{base.rstrip('/')}/d/{uid}?{urlencode(params)}"
