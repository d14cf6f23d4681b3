"""PromQL building blocks and template variables of the dashboards.

Every metric name comes from :mod:`inferwatch.core.vocabulary`; every query reads canonical series
only, so one dashboard serves every engine alike. Conventions:

* template variables ``$engine``, ``$model``, ``$instance`` are regex matchers (``engine=~"$engine"``)
  whose "All" value is ``.*``;
* rates use ``[$__rate_interval]`` (``[$__range]`` only for a single value over the whole time range);
* percentiles are ``histogram_quantile`` over the canonical buckets, summed ``by (le, engine, model)``;
  means are the rate of the sum over the rate of the count (exact).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from inferwatch.core import links
from inferwatch.core import vocabulary as V
from inferwatch.dashboards.panels import PROMETHEUS_TYPE, PROMETHEUS_UID, Query, Variable

# template variables
VAR_DATASOURCE = links.VAR_DATASOURCE
VAR_SQL_DATASOURCE = links.VAR_SQL_DATASOURCE
VAR_ENGINE = links.VAR_ENGINE
VAR_MODEL = links.VAR_MODEL
VAR_INSTANCE = links.VAR_INSTANCE
INSTANCE_LABEL = "instance"
ALL_VALUE = ".*"

RATE_INTERVAL = "$__rate_interval"
RANGE = "$__range"
QUANTILES = (0.5, 0.9, 0.95, 0.99)
QUANTILES_TITLE = "p50/p90/p95/p99 and mean"
"""the title suffix of a panel of :func:`distribution_queries`."""
SIGNAL_LABEL = "signal"
"""a label the dashboards add (``label_replace``) to tell the histograms of one table apart."""

EM = (V.LABEL_ENGINE, V.LABEL_MODEL)
EMI = (V.LABEL_ENGINE, V.LABEL_MODEL, INSTANCE_LABEL)
EMIR = (*EMI, V.LABEL_DP_RANK, V.LABEL_ROLE)
"""per instance, data-parallel rank and prefill/decode role (engines without them: per instance)."""


def selector(
    *,
    engine: bool = True,
    model: bool = True,
    instance: bool = True,
    matchers: Mapping[str, str] | None = None,
    present: Iterable[str] = (),
    excluded: Mapping[str, str] | None = None,
) -> str:
    """``{engine=~"$engine", model=~"$model", instance=~"$instance"}`` plus exact matchers, ``label!=""``
    for every label that must be ``present`` and ``label!="value"`` for every ``excluded`` value."""
    parts = []
    if engine:
        parts.append(f'{V.LABEL_ENGINE}=~"${VAR_ENGINE}"')
    if model:
        parts.append(f'{V.LABEL_MODEL}=~"${VAR_MODEL}"')
    if instance:
        parts.append(f'{INSTANCE_LABEL}=~"${VAR_INSTANCE}"')
    parts += [f'{k}="{v}"' for k, v in (matchers or {}).items()]
    parts += [f'{k}!=""' for k in present]
    parts += [f'{k}!="{v}"' for k, v in (excluded or {}).items()]
    return "{" + ", ".join(parts) + "}"


def label_list(labels: Iterable[str]) -> str:
    """The labels of a ``by (...)`` clause."""
    return ", ".join(labels)


def legend_format(labels: Iterable[str], suffix: str = "") -> str:
    """``{{engine}} {{model}} suffix``."""
    text = " ".join("{{" + label + "}}" for label in labels)
    return f"{text} {suffix}".strip()


def rate(metric: V.MetricSpec, suffix: str = "", window: str = RATE_INTERVAL, **extra: str) -> str:
    return f"rate({metric.name}{suffix}{selector(matchers=extra)}[{window}])"


def sum_rate(metric: V.MetricSpec, by: tuple[str, ...] = EM, **extra: str) -> str:
    return f"sum by ({label_list(by)}) ({rate(metric, **extra)})"


def increase(metric: V.MetricSpec, suffix: str = "", **extra: str) -> str:
    """The increase over the whole time range (``[$__range]``, for instant queries only)."""
    return f"increase({metric.name}{suffix}{selector(matchers=extra)}[{RANGE}])"


def sum_increase(metric: V.MetricSpec, by: tuple[str, ...] = EM, **extra: str) -> str:
    return f"sum by ({label_list(by)}) ({increase(metric, **extra)})"


def positive(expr: str) -> str:
    """``(expr > 0)``: a denominator without its zero series (idle series drop out instead of NaN)."""
    return f"({expr} > 0)"


def mean(metric: V.MetricSpec, by: tuple[str, ...] = EM, window: str = RATE_INTERVAL) -> str:
    """The mean observation of a histogram: rate of its sum over rate of its count (over the whole
    time range with ``window=RANGE``)."""
    groups = label_list(by)
    if window == RANGE:
        total, count = increase(metric, "_sum"), increase(metric, "_count")
    else:
        total, count = rate(metric, "_sum"), rate(metric, "_count")
    return f"sum by ({groups}) ({total}) / {positive(f'sum by ({groups}) ({count})')}"


def tagged(expr: str, value: str) -> str:
    """``expr`` with the label :data:`SIGNAL_LABEL` set to ``value``."""
    return f'label_replace({expr}, "{SIGNAL_LABEL}", "{value}", "", "")'


def share(part: str, whole: str, over: Iterable[str]) -> str:
    """``part / whole`` where ``part`` has the extra labels ``over`` (each part's share of its whole)."""
    return f"{part} / ignoring ({label_list(over)}) group_left () {positive(whole)}"


def quantile(metric: V.MetricSpec, q: float, by: tuple[str, ...] = EM, window: str = RATE_INTERVAL) -> str:
    """``histogram_quantile`` over the canonical buckets; ``>= 0`` drops NaN (no observation in the window,
    or a histogram without finite buckets), so that an empty panel says why instead of drawing nothing."""
    inner = f"increase({metric.name}_bucket{selector()}[{window}])" if window == RANGE else rate(metric, "_bucket")
    return f"histogram_quantile({q}, sum by ({label_list((V.LABEL_LE, *by))}) ({inner})) >= 0"


def bucket_rates(metric: V.MetricSpec) -> str:
    """Observations per second in each bucket over the selection, for a heatmap. Instances whose histogram
    has no finite bucket (sum and count only) are left out rather than drawn as one ``+Inf`` band."""
    finite = f"rate({metric.name}_bucket{selector(excluded={V.LABEL_LE: V.format_le(math.inf)})}[{RATE_INTERVAL}])"
    return f"sum by ({V.LABEL_LE}) ({rate(metric, '_bucket')} and on ({label_list(EMI)}) {finite})"


def percentile_queries(
    metric: V.MetricSpec, quantiles: Iterable[float] = QUANTILES, name: str = "", by: tuple[str, ...] = EM
) -> tuple[Query, ...]:
    return tuple(
        Query(quantile(metric, q, by), legend_format(by, f"{name} p{round(q * 100)}".strip()), (metric,), True)
        for q in quantiles
    )


def distribution_queries(metric: V.MetricSpec, name: str = "", by: tuple[str, ...] = EM) -> tuple[Query, ...]:
    """The :data:`QUANTILES` percentiles and the mean of a histogram (titles end in :data:`QUANTILES_TITLE`)."""
    legend = legend_format(by, f"{name} mean".strip())
    return (*percentile_queries(metric, QUANTILES, name, by), Query(mean(metric, by), legend, (metric,), True))


def gauge(metric: V.MetricSpec, agg: str = "sum", by: tuple[str, ...] = EM, present: Iterable[str] = ()) -> str:
    return f"{agg} by ({label_list(by)}) ({metric.name}{selector(present=present)})"


def instance_count(metric: V.MetricSpec, by: tuple[str, ...] = EM, window: str = "") -> str:
    """How many instances report ``metric`` per ``by`` group (data-parallel ranks count once); with a
    ``window``, every instance seen in it."""
    series = f"{metric.name}{selector()}"
    if window:
        series = f"last_over_time({series}[{window}])"
    return f"count by ({label_list(by)}) (group by ({label_list((*by, INSTANCE_LABEL))}) ({series}))"


def describe(what: str, *metrics: V.MetricSpec) -> str:
    """A panel description: what it shows, then the help text of every canonical metric it reads."""
    parts = [what.rstrip(".") + "."]
    parts += [f"{m.name}: {m.help}" for m in metrics]
    return " ".join(parts)


def datasource_variable() -> Variable:
    """The Prometheus datasource picker."""
    return Variable(VAR_DATASOURCE, "Prometheus", "datasource", PROMETHEUS_TYPE, PROMETHEUS_UID, False, False)


def prom_variables(*, instance: bool = True) -> tuple[Variable, ...]:
    """The datasource, then ``$engine``, ``$model`` (and ``$instance``), each narrowed by the ones before."""
    base = V.REQUESTS_RUNNING.name
    out = [
        datasource_variable(),
        Variable(VAR_ENGINE, "Engine", "query", f"label_values({base}, {V.LABEL_ENGINE})"),
        Variable(
            VAR_MODEL, "Model", "query", f'label_values({base}{{{V.LABEL_ENGINE}=~"${VAR_ENGINE}"}}, {V.LABEL_MODEL})'
        ),
    ]
    if instance:
        out.append(
            Variable(
                VAR_INSTANCE,
                "Instance",
                "query",
                f'label_values({base}{{{V.LABEL_ENGINE}=~"${VAR_ENGINE}", {V.LABEL_MODEL}=~"${VAR_MODEL}"}}, '
                f"{INSTANCE_LABEL})",
            )
        )
    return tuple(out)
