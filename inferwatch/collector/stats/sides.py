"""Which side of a request a stored row tells: the engine's own span, or ``inferwatch proxy``'s.

Where both the engine and ``inferwatch proxy`` send spans, every proxied request is stored twice: the engine's
row and the proxy's (the client's view: the proxy's instance, its ``service.name``
:data:`~inferwatch.core.vocabulary.PROXY_SERVICE`, longer latencies). Adding the two would count each request
twice, so the reads count one side at a time (:data:`~inferwatch.collector.schemas.Side`): ``engine`` (every row
whose service is not the proxy's, a row without a service included), ``proxy``, or ``all`` when asked.

The side is told by ``service`` alone: it is a column of the request table and a key of the rollups and value
blocks, so the fast stats plans stay exact under the filter. A proxy run with another ``--service-name`` is
counted on the engine side (ask for its rows by ``service``).
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import ColumnElement, or_

from inferwatch.collector.schemas import Side
from inferwatch.core import vocabulary as V

SIDES: Final[tuple[Side, ...]] = ("engine", "proxy", "all")
DEFAULT_SIDE: Final[Side] = "engine"
EXAMPLE_SIDES: Final[tuple[Side, ...]] = ("engine", "proxy")
"""where example requests (a finding's, an incident's) come from, in order: the first side that has some, never
both (the same request would be shown twice)."""
PARAM: Final = "side_service"
"""the name of the bound parameter that :func:`sql` refers to (its value: :data:`PARAMS`)."""
PARAMS: Final[dict[str, str]] = {PARAM: V.PROXY_SERVICE}


def effective(side: Side | None, service: str | None) -> Side:
    """The side a read counts when asked for ``side`` (None: not given) and ``service``: a named service
    alone is counted whatever its side; else the engine side."""
    if side is not None:
        return side
    return "all" if service is not None else DEFAULT_SIDE


def condition(side: Side, service: Any) -> ColumnElement[bool] | None:
    """``side`` as a condition on a ``service`` column (None for ``all``)."""
    if side == "engine":
        return or_(service.is_(None), service != V.PROXY_SERVICE)
    if side == "proxy":
        return service == V.PROXY_SERVICE  # type: ignore[no-any-return]
    return None


def sql(side: Side, placeholder: str) -> str | None:
    """``side`` as SQL text on the ``service`` column, the proxy's service bound as ``placeholder`` (e.g.
    ``%(side_service)s`` or ``:side_service``; its value in :data:`PARAMS`); None for ``all``."""
    if side == "engine":
        return f"(service IS NULL OR service <> {placeholder})"
    if side == "proxy":
        return f"service = {placeholder}"
    return None


def keeps(side: Side, service: str | None) -> bool:
    """Whether ``side`` counts a row (or a rollup series) of ``service``."""
    if side == "all":
        return True
    return (service == V.PROXY_SERVICE) == (side == "proxy")
