"""Usage per tenant or model over a time range (``/api/v1/usage``): requests, tokens, SLO attainment, cost.

One grouped query over the rows that finished in the range (``end_time``'s index), the busiest groups first and
at most ``limit`` of them, and one ungrouped query for the total: the groups beyond the limit are the total less
the listed ones (every figure is a count or a sum, so the rest is exact), and nothing a client sends can make the
answer grow past ``limit`` groups.

**SLO attainment.** Each latency SLO (a column and a threshold: the SLO file's latency SLOs, or the query's
``slo_*``) applies to the rows its selector matches (``engine``, ``model`` and ``tenant`` are columns; an SLO that
selects on another label is left out, with a note) and that have the latency it reads (a non-streamed request has
no TTFT). A request meets it when the latency is at most the threshold: the ``le`` of the SLI's histogram. Per
group: per SLO, and over all (the requests some SLO applies to, and those that met every SLO that applies).

**Cost.** A request row holds no GPU time; the cost comes from Prometheus: per model, the rules' USD per million
generated tokens over the range (the model's GPUs' whole cost, at the SLO file's prices, over its generated
tokens: docs/cost.md). A group's cost is the sum over models of its generated tokens times that price: its share
of each model's GPUs by generated tokens. Without Prometheus or the records ``cost_usd`` is null and ``cost_note``
says why; tokens of a model without a record are left out of the cost, with a note.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Engine, and_, case, false, func, not_, or_, select
from sqlalchemy.sql.elements import ColumnElement

from inferwatch.collector.schemas import Side, SloCount, SloSource, Usage, UsageGroup, UsageGroupBy, UsageSlo
from inferwatch.collector.stats import sides
from inferwatch.collector.stats.listing import guarded
from inferwatch.collector.stats.rollup import failed_condition
from inferwatch.collector.store.tables import REQUEST_TABLE
from inferwatch.core import vocabulary as V
from inferwatch.core.schema import GENERATION_TOKENS, LATENCY_FIELDS, PROMPT_TOKENS
from inferwatch.core.slo import SLOFile

SELECTOR_COLUMNS: Final[dict[str, str]] = {V.LABEL_ENGINE: "engine", V.LABEL_MODEL: "model", V.LABEL_TENANT: "tenant"}
"""SLO selector labels that are request columns too (the rows an SLO applies to)."""
MAX_SLOS: Final = 32
"""Latency SLOs judged at most (two sums each in the query)."""


@dataclass(frozen=True)
class LatencySlo:
    name: str
    metric: str
    threshold: float
    selector: dict[str, str] = field(default_factory=dict)

    def schema(self) -> UsageSlo:
        return UsageSlo(name=self.name, metric=self.metric, threshold_seconds=self.threshold, selector=self.selector)


@dataclass
class Filters:
    """What the usage counts: the rows of ``side`` that finished in [since, until), of an engine and a model."""

    since: datetime
    until: datetime
    side: Side
    engine: str | None = None
    model: str | None = None

    def conditions(self) -> list[ColumnElement[bool]]:
        t = REQUEST_TABLE
        conds: list[ColumnElement[bool]] = [t.c.end_time >= self.since, t.c.end_time < self.until]
        side = sides.condition(self.side, t.c.service)
        if side is not None:
            conds.append(side)
        if self.engine is not None:
            conds.append(t.c.engine == self.engine)
        if self.model is not None:
            conds.append(t.c.model == self.model)
        return conds


def file_slos(slos: SLOFile | None) -> tuple[list[LatencySlo], list[str]]:
    """The latency SLOs of an SLO file that stored rows can be judged by, and notes on those left out."""
    out: list[LatencySlo] = []
    notes: list[str] = []
    for slo in slos.slos if slos is not None else ():
        latency = slo.indicator.latency
        if latency is None:
            continue
        others = sorted(set(slo.selector) - set(SELECTOR_COLUMNS))
        if others:
            notes.append(f"SLO {slo.name} left out: it selects on {', '.join(others)}, which requests do not store")
        elif latency.metric not in LATENCY_FIELDS:
            notes.append(f"SLO {slo.name} left out: requests do not store {latency.metric}")
        elif len(out) >= MAX_SLOS:
            notes.append(f"SLO {slo.name} left out: at most {MAX_SLOS} latency SLOs are judged")
        else:
            out.append(LatencySlo(slo.name, latency.metric, float(latency.threshold_seconds), dict(slo.selector)))
    return out, notes


def _applies(slo: LatencySlo) -> ColumnElement[bool]:
    t = REQUEST_TABLE
    conds: list[ColumnElement[bool]] = [t.c[slo.metric].is_not(None)]
    conds += [t.c[SELECTOR_COLUMNS[k]] == v for k, v in sorted(slo.selector.items())]
    return and_(*conds)


def _columns(slos: list[LatencySlo]) -> list[Any]:
    """requests, failed, prompt tokens, generation tokens, judged, met, then (judged, met) per SLO."""
    t = REQUEST_TABLE
    applies = [_applies(s) for s in slos]
    met = [and_(a, REQUEST_TABLE.c[s.metric] <= s.threshold) for s, a in zip(slos, applies, strict=True)]
    judged_any = or_(*applies) if applies else false()
    met_all = and_(judged_any, *(or_(not_(a), m) for a, m in zip(applies, met, strict=True)))
    cols: list[Any] = [
        func.count(),
        func.sum(case((failed_condition(), 1), else_=0)),
        func.sum(t.c[PROMPT_TOKENS]),
        func.sum(t.c[GENERATION_TOKENS]),
        func.sum(case((judged_any, 1), else_=0)),
        func.sum(case((met_all, 1), else_=0)),
    ]
    for a, m in zip(applies, met, strict=True):
        cols += [func.sum(case((a, 1), else_=0)), func.sum(case((m, 1), else_=0))]
    return cols


def _int(value: Any) -> int:
    return int(value or 0)


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


@dataclass
class _Counts:
    requests: int
    failed: int
    prompt: int | None
    generation: int | None
    judged: int
    met: int
    per_slo: list[tuple[int, int]]

    @classmethod
    def of(cls, values: tuple[Any, ...], slos: int) -> _Counts:
        requests, failed, prompt, generation, judged, met, *rest = values
        per_slo = [(_int(rest[2 * i]), _int(rest[2 * i + 1])) for i in range(slos)]
        return cls(
            _int(requests),
            _int(failed),
            None if prompt is None else int(prompt),
            None if generation is None else int(generation),
            _int(judged),
            _int(met),
            per_slo,
        )

    def minus(self, others: list[_Counts]) -> _Counts:
        def tokens(mine: int | None, theirs: list[int | None]) -> int | None:
            return None if mine is None else mine - sum(x or 0 for x in theirs)

        return _Counts(
            self.requests - sum(o.requests for o in others),
            self.failed - sum(o.failed for o in others),
            tokens(self.prompt, [o.prompt for o in others]),
            tokens(self.generation, [o.generation for o in others]),
            self.judged - sum(o.judged for o in others),
            self.met - sum(o.met for o in others),
            [
                (j - sum(o.per_slo[i][0] for o in others), m - sum(o.per_slo[i][1] for o in others))
                for i, (j, m) in enumerate(self.per_slo)
            ],
        )

    def group(self, key: str | None, slos: list[LatencySlo]) -> UsageGroup:
        return UsageGroup(
            key=key,
            requests=self.requests,
            failed=self.failed,
            prompt_tokens=self.prompt,
            generation_tokens=self.generation,
            slo_requests=self.judged,
            slo_met=self.met,
            slo_attainment=_share(self.met, self.judged),
            slos={
                s.name: SloCount(requests=j, met=m, attainment=_share(m, j))
                for s, (j, m) in zip(slos, self.per_slo, strict=True)
            },
            cost_usd=None,
        )


@guarded
def compute_usage(
    *,
    engine: Engine,
    group_by: UsageGroupBy,
    filters: Filters,
    slos: list[LatencySlo],
    slo_source: SloSource,
    limit: int,
    cost_note: str | None,
    notes: list[str] | None = None,
    prices: Mapping[str, float] | None = None,
) -> Usage:
    """The usage of the rows ``filters`` selects, by ``group_by``: at most ``limit`` groups, the rest summed;
    with ``prices`` (USD per million generated tokens per model), each group's cost."""
    t = REQUEST_TABLE
    key = t.c[group_by]
    conds = filters.conditions()
    cols = _columns(slos)
    grouped = (
        select(key, *cols)
        .where(*conds)
        .group_by(key)
        .order_by(func.count().desc(), key.asc().nulls_last())
        .limit(limit)
    )
    distinct = select(func.count()).select_from(select(key).where(*conds).group_by(key).subquery())
    with engine.connect() as conn:
        rows = [tuple(r) for r in conn.execute(grouped)]
        total = _Counts.of(tuple(conn.execute(select(*cols).where(*conds)).one()), len(slos))
        groups_total = int(conn.execute(distinct).scalar_one())
        by_model: list[tuple[Any, ...]] = []
        if prices is not None and rows:
            t_model, gen = t.c.model, func.sum(t.c[GENERATION_TOKENS])
            listed_keys = [r[0] for r in rows]
            per = select(key, t_model, gen).where(*conds, key.in_(listed_keys)).group_by(key, t_model)
            by_model = [(False, *r) for r in conn.execute(per)]
            by_model += [(True, None, *r) for r in conn.execute(select(t_model, gen).where(*conds).group_by(t_model))]
    listed = [(r[0], _Counts.of(r[1:], len(slos))) for r in rows]
    truncated = groups_total > len(listed)
    rest = total.minus([c for _, c in listed]) if truncated else None
    groups = [c.group(k, slos) for k, c in listed]
    rest_group = rest.group(None, slos) if rest is not None else None
    total_group = total.group(None, slos)
    if prices is not None:
        unpriced = _price(groups, rest_group, total_group, by_model, prices)
        if unpriced:
            notes = [*(notes or []), f"no cost record for model(s) {', '.join(unpriced)}: their tokens are not costed"]
    return Usage(
        group_by=group_by,
        since=filters.since,
        until=filters.until,
        side=filters.side,
        slo_source=slo_source,
        slos=[s.schema() for s in slos],
        groups=groups,
        groups_total=groups_total,
        truncated=truncated,
        rest=rest_group,
        total=total_group,
        cost_note=cost_note,
        notes=notes or [],
    )


def _price(
    groups: list[UsageGroup],
    rest: UsageGroup | None,
    total: UsageGroup,
    by_model: list[tuple[Any, ...]],
    prices: Mapping[str, float],
) -> list[str]:
    """Set each group's ``cost_usd`` (its generated tokens per model times the model's USD per million; rows of
    ``by_model``: (is the total, group key, model, tokens)); the rest is the total less the listed groups.
    Returns the models with tokens and no price (sorted, at most 20)."""
    cost: dict[Any, float] = {}
    whole = 0.0
    unpriced: set[str] = set()
    for is_total, key, model, tokens in by_model:
        price = prices.get(model) if model is not None else None
        if price is None:
            if tokens and is_total:
                unpriced.add(str(model))
            continue
        if is_total:
            whole += _int(tokens) * price / 1e6
        else:
            cost[key] = cost.get(key, 0.0) + _int(tokens) * price / 1e6
    for g in groups:
        g.cost_usd = round(cost.get(g.key, 0.0), 6)
    total.cost_usd = round(whole, 6)
    if rest is not None:
        rest.cost_usd = round(max(0.0, total.cost_usd - sum(g.cost_usd or 0.0 for g in groups)), 6)
    return sorted(unpriced)[:20]
