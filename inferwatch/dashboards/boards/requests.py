"""LLM Requests: the collector's stored requests (SQL on PostgreSQL) beside the histogram estimates."""

from __future__ import annotations

from inferwatch.core import links
from inferwatch.core import vocabulary as V
from inferwatch.core.schema import DECODE, E2E, GENERATION_TOKENS, PREFILL, PROMPT_TOKENS, QUEUE, TPOT, TTFT
from inferwatch.core.schema import REQUEST_TABLE as TABLE_NAME
from inferwatch.dashboards.panels import (
    NOTE,
    POSTGRES_TYPE,
    POSTGRES_UID,
    TABLE,
    TIMESERIES,
    UNIT_NONE,
    UNIT_SECONDS,
    DashboardSpec,
    Panel,
    Query,
    Row,
    SqlQuery,
    Variable,
)
from inferwatch.dashboards.promql import (
    EM,
    RANGE,
    VAR_ENGINE,
    VAR_MODEL,
    VAR_SQL_DATASOURCE,
    describe,
    legend_format,
    percentile_queries,
    prom_variables,
    quantile,
)

UID = links.UID_REQUESTS
"""stable: Grafana upserts provisioned dashboards by uid."""


SLOWEST_LIMIT = 50


ENGINE_SIDE_NOTE = (
    "The engines' own rows: where inferwatch proxy sends spans too, its rows (the client's view of the same "
    f"requests, service {V.PROXY_SERVICE}) are left out, so each request counts once."
)


def sql_filter() -> str:
    """Time range, the engine/model variables (anchored regexes like Prometheus') and the engine side: the
    proxy's rows of the same requests are not added to the engine's (the collector's ``side=engine``)."""
    return (
        "$__timeFilter(start_time)"
        f" AND engine ~ '^(${{{VAR_ENGINE}:regex}})$'"
        f" AND coalesce(model, '') ~ '^(${{{VAR_MODEL}:regex}})$'"
        f" AND coalesce(service, '') <> '{V.PROXY_SERVICE}'"
    )


def slowest_sql() -> str:
    cols = (
        'start_time AS "time"',
        "engine",
        "model",
        "instance",
        "request_id",
        E2E,
        TTFT,
        QUEUE,
        PREFILL,
        DECODE,
        TPOT,
        PROMPT_TOKENS,
        GENERATION_TOKENS,
        "finish_reason",
        "trace_id",
    )
    return (
        "SELECT " + ", ".join(cols) + f"\nFROM {TABLE_NAME}\nWHERE {sql_filter()}\n"
        f"ORDER BY {E2E} DESC NULLS LAST\nLIMIT {SLOWEST_LIMIT}"
    )


def exact_p99_sql() -> str:
    return (
        f"SELECT engine, model, percentile_disc(0.99) WITHIN GROUP (ORDER BY {TTFT}) AS p99_{TTFT}, "
        f"count(*) AS requests\nFROM {TABLE_NAME}\nWHERE {sql_filter()} AND {TTFT} IS NOT NULL\n"
        "GROUP BY engine, model\nORDER BY engine, model"
    )


def exact_p99_series_sql() -> str:
    return (
        "SELECT $__timeGroupAlias(start_time, $__interval), engine || ' ' || coalesce(model, '') AS metric, "
        f"percentile_disc(0.99) WITHIN GROUP (ORDER BY {TTFT}) AS p99\nFROM {TABLE_NAME}\n"
        f"WHERE {sql_filter()} AND {TTFT} IS NOT NULL\nGROUP BY 1, 2\nORDER BY 1"
    )


def board() -> DashboardSpec:
    """The slowest stored requests and exact (SQL) beside estimated (histogram) P99 TTFT."""
    latency_units = tuple((c, UNIT_SECONDS) for c in (E2E, TTFT, QUEUE, PREFILL, DECODE, TPOT, f"p99_{TTFT}"))
    panels: list[Panel | Row] = [
        Row("Slowest requests"),
        Panel(
            "Slowest requests",
            f"The {SLOWEST_LIMIT} slowest requests in the time range (by end-to-end duration) from the collector's "
            f"{TABLE_NAME} table, with their queue, prefill and decode breakdown. {ENGINE_SIDE_NOTE}",
            UNIT_NONE,
            (),
            TABLE,
            24,
            10,
            sql=(SqlQuery(slowest_sql()),),
            column_units=latency_units,
        ),
        Row("Exact vs estimated P99 TTFT"),
        Panel(
            "P99 TTFT exact (from rows)",
            "P99 time to first token over the time range computed from the stored requests with percentile_disc: "
            f"exact, unlike the histogram estimate beside it. {ENGINE_SIDE_NOTE}",
            UNIT_SECONDS,
            (),
            TABLE,
            12,
            6,
            sql=(SqlQuery(exact_p99_sql()),),
            column_units=latency_units,
        ),
        Panel(
            "P99 TTFT estimated (histogram)",
            describe(
                "P99 time to first token over the time range estimated by histogram_quantile: linear interpolation "
                "inside a bucket, so it may differ from the exact value by up to the bucket's width",
                V.TIME_TO_FIRST_TOKEN,
            ),
            UNIT_SECONDS,
            (
                Query(
                    quantile(V.TIME_TO_FIRST_TOKEN, 0.99, window=RANGE),
                    legend_format(EM),
                    (V.TIME_TO_FIRST_TOKEN,),
                    True,
                    TABLE,
                ),
            ),
            TABLE,
            12,
            6,
        ),
        Panel(
            "P99 TTFT exact over time",
            f"P99 time to first token per time interval from the stored requests (percentile_disc). {ENGINE_SIDE_NOTE}",
            UNIT_SECONDS,
            (),
            TIMESERIES,
            12,
            8,
            sql=(SqlQuery(exact_p99_series_sql(), "time_series"),),
        ),
        Panel(
            "P99 TTFT estimated over time",
            describe("histogram_quantile(0.99) of the time to first token per engine and model", V.TIME_TO_FIRST_TOKEN),
            UNIT_SECONDS,
            percentile_queries(V.TIME_TO_FIRST_TOKEN, (0.99,)),
            TIMESERIES,
            12,
            8,
        ),
    ]
    variables = (
        *prom_variables(),
        Variable(VAR_SQL_DATASOURCE, "PostgreSQL", "datasource", POSTGRES_TYPE, POSTGRES_UID, False, False),
    )
    return DashboardSpec(
        UID,
        links.DASHBOARD_TITLES[UID],
        f"Individual requests stored by the collector (PostgreSQL) beside the metrics. {NOTE}",
        variables,
        tuple(panels),
    )
