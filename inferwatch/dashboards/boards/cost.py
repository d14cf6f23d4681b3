"""LLM Cost & GPU: what the GPUs cost per token and per idle hour, and what each replica's GPUs do.

The cost panels read the cost recording rules of ``inferwatch generate alerts`` (an SLO file with a
``cost:`` section, docs/cost.md); the GPU panels read the ``llm_gpu_*`` series the exporter joins to each
replica, aggregated per replica as the GPU vocabulary says (``avg`` for ratios, ``sum`` for power, ``min``
for clocks, ``max`` for temperature and for "any GPU"). The tenant panel reads ``inferwatch proxy``'s
client counters.
"""

from __future__ import annotations

from inferwatch.core import links
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLOFile
from inferwatch.dashboards.panels import (
    NOTE,
    STAT,
    TABLE,
    TIMESERIES,
    UNIT_COUNT,
    UNIT_RATIO,
    UNIT_TOKENS_PER_S,
    DashboardSpec,
    Panel,
    Query,
    Row,
)
from inferwatch.dashboards.promql import (
    EMI,
    RATE_INTERVAL,
    describe,
    label_list,
    legend_format,
    prom_variables,
    selector,
)

UID = links.UID_COST
"""stable: Grafana upserts provisioned dashboards by uid."""

UNIT_USD = "currencyUSD"
UNIT_WATTS = "watt"
UNIT_HERTZ = "hertz"
UNIT_CELSIUS = "celsius"
COST_DOC = "docs/cost.md"
NO_COST = (
    "No cost series: the SLO file has no cost section, this Prometheus does not load the rules of "
    f"`inferwatch generate alerts`, or no replica has GPU series ({COST_DOC})."
)
NO_GPU = (
    "No GPU series for this selection: the exporter target has no GPU source (gpus:), or the source does "
    "not export this field (the profiling fields need DCGM profiling; clock events, throttle time and the "
    "power limit are opt-in fields of dcgm-exporter's counter list)."
)
NO_XID = "No XID: no GPU of the selection reported an XID error since its GPU source started."
NO_TENANT = "No client series: no request went through inferwatch proxy for this selection and time range."
REPLICA_GPU = (*EMI, V.LABEL_HOST, V.LABEL_GPU, V.LABEL_GPU_UUID, V.LABEL_XID)
"""the columns of the XID table: the replica, then which GPU and which code."""


def _record(name: str, service: str, *, replica: bool) -> str:
    """A cost record narrowed to this SLO file's service and the selection (the per-model records have no
    engine or instance)."""
    sel = selector(engine=replica, instance=replica)
    if service:
        sel = f'{{{V.SLO_SERVICE_LABEL}="{service}", {sel[1:]}'
    return f"{name}{sel}"


def _cost_panels(service: str) -> list[Panel | Row]:
    hourly = _record(V.COST_GPU_HOURLY_RECORD, service, replica=True)
    idle = _record(V.COST_IDLE_HOURLY_RECORD, service, replica=False)
    generation = _record(V.COST_PER_MILLION_GENERATION_RECORD, service, replica=False)
    goodput = _record(V.COST_GOODPUT_PER_MILLION_RECORD, service, replica=False)
    prompt = _record(V.COST_PER_MILLION_PROMPT_RECORD, service, replica=False)
    gpus = _record(V.GPU_COUNT_RECORD, service, replica=True)
    per_model_hourly = _record(V.COST_GPU_HOURLY_RECORD, service, replica=False)
    model = (V.LABEL_MODEL,)
    priced = (V.LABEL_POOL, V.LABEL_GPU_MODEL)
    gpu_signals = (V.GPU_UTILIZATION, V.GPU_POWER)
    return [
        Row("Cost"),
        Panel(
            "GPU cost per hour",
            f"What the selected replicas' GPUs cost per hour at the SLO file's prices ({V.COST_GPU_HOURLY_RECORD}): "
            "each GPU at its pool's price, else its model's, else the default.",
            UNIT_USD,
            (Query(f"sum({hourly})", "USD per hour", (), False, STAT),),
            STAT,
            8,
            4,
            signals=gpu_signals,
            idle=NO_COST,
        ),
        Panel(
            "Idle GPU cost per hour",
            f"The part of that cost spent while replicas ran no request ({V.COST_IDLE_HOURLY_RECORD}): each "
            "replica's hourly cost times the share of the window's samples at which it ran none.",
            UNIT_USD,
            (Query(f"sum({idle})", "idle USD per hour", (), False, STAT),),
            STAT,
            8,
            4,
            signals=(*gpu_signals, V.REQUESTS_RUNNING),
            idle=NO_COST,
        ),
        Panel(
            "Idle share of the GPU cost",
            "Idle GPU cost per hour over the GPU cost per hour of the selected models.",
            UNIT_RATIO,
            (Query(f"sum({idle}) / sum({per_model_hourly})", "idle", (), False, STAT),),
            STAT,
            8,
            4,
            signals=(*gpu_signals, V.REQUESTS_RUNNING),
            idle=NO_COST,
        ),
        Panel(
            "Cost per million generated tokens: all tokens vs good tokens",
            f"Per model, the GPUs' cost over the window per million generated tokens "
            f"({V.COST_PER_MILLION_GENERATION_RECORD}), and per million generated tokens of the requests that met "
            f"every latency SLO ({V.COST_GOODPUT_PER_MILLION_RECORD}; an estimate: the good share is the "
            "product of the latency SLOs' good ratios). Each is the whole cost over one kind of token, not a "
            "share of it.",
            UNIT_USD,
            (
                Query(generation, legend_format(model, "all tokens"), (), False),
                Query(goodput, legend_format(model, "good tokens"), (), False),
            ),
            TIMESERIES,
            12,
            8,
            signals=(*gpu_signals, V.GENERATION_TOKENS),
            idle=NO_COST,
        ),
        Panel(
            "Cost per million prompt tokens",
            f"Per model, the GPUs' whole cost over the window per million prompt tokens "
            f"({V.COST_PER_MILLION_PROMPT_RECORD}): "
            "the same bill as the generated-token cost, divided by the prompt tokens instead.",
            UNIT_USD,
            (Query(prompt, legend_format(model), (), False),),
            TIMESERIES,
            12,
            8,
            signals=(*gpu_signals, V.PROMPT_TOKENS),
            idle=NO_COST,
        ),
        Panel(
            "GPU cost per hour by pool",
            f"The selected replicas' GPU cost per hour by pool and GPU model ({V.COST_GPU_HOURLY_RECORD}); an "
            "empty pool is GPUs of no configured pool.",
            UNIT_USD,
            (Query(f"sum by ({label_list(priced)}) ({hourly})", legend_format(priced), (), False),),
            TIMESERIES,
            12,
            8,
            stacked=True,
            signals=gpu_signals,
            idle=NO_COST,
        ),
        Panel(
            "GPU cost per hour by model: total vs idle",
            f"Per model, the GPU cost per hour ({V.COST_GPU_HOURLY_RECORD}) and the part of it while its "
            f"replicas ran no request ({V.COST_IDLE_HOURLY_RECORD}).",
            UNIT_USD,
            (
                Query(
                    f"sum by ({V.LABEL_MODEL}) ({per_model_hourly})",
                    legend_format(model, "total"),
                    (),
                    False,
                ),
                Query(idle, legend_format(model, "idle"), (), False),
            ),
            TIMESERIES,
            12,
            8,
            signals=(*gpu_signals, V.REQUESTS_RUNNING),
            idle=NO_COST,
        ),
        Panel(
            "GPUs and cost per replica",
            f"Each replica's GPUs ({V.GPU_COUNT_RECORD}: one per GPU reporting its utilisation or power) and "
            f"their cost per hour ({V.COST_GPU_HOURLY_RECORD}), by pool and GPU model.",
            UNIT_COUNT,
            (
                Query(gpus, "GPUs", (), False, TABLE),
                Query(hourly, "USD per hour", (), False, TABLE),
            ),
            TABLE,
            24,
            7,
            column_units=(("USD per hour", UNIT_USD),),
            signals=gpu_signals,
            idle=NO_COST,
        ),
    ]


def _also(sel: str, reasons: str) -> str:
    """``sel`` narrowed to the clock-event ``reasons`` (a regex alternation)."""
    return f'{sel[:-1]}, {V.LABEL_REASON}=~"{reasons}"}}'


def _per_replica(metric: V.MetricSpec, agg: str, **matchers: str) -> str:
    return f"{agg} by ({label_list(EMI)}) ({metric.name}{selector(matchers=matchers)})"


def _gpu_panels() -> list[Panel | Row]:
    legend = legend_format(EMI)
    by_reason = (*EMI, V.LABEL_REASON)
    throttling = "|".join(sorted(V.GPU_THROTTLE_CAUSES))
    events = f"max by ({label_list(by_reason)}) ({V.GPU_CLOCK_EVENT.name}{_also(selector(), throttling)})"
    throttled = f"max by ({label_list(by_reason)}) (rate({V.GPU_THROTTLE_TIME.name}{selector()}[{RATE_INTERVAL}]))"
    xid = f"max by ({label_list(REPLICA_GPU)}) ({V.GPU_XID.name}{selector()})"
    return [
        Row("GPUs per replica"),
        Panel(
            "GPU engine activity",
            describe(
                "Per replica, the mean over its GPUs of the engine's activity (DCGM profiling), or of the "
                "utilisation where the source has no profiling",
                V.GPU_ENGINE_ACTIVE,
                V.GPU_UTILIZATION,
            ),
            UNIT_RATIO,
            (
                Query(
                    f"{_per_replica(V.GPU_ENGINE_ACTIVE, 'avg')} or {_per_replica(V.GPU_UTILIZATION, 'avg')}",
                    legend,
                    (V.GPU_ENGINE_ACTIVE, V.GPU_UTILIZATION),
                    True,
                    any_of=True,
                ),
            ),
            TIMESERIES,
            12,
            8,
            min=0,
            max=1,
            idle=NO_GPU,
        ),
        Panel(
            "Tensor and DRAM activity",
            describe(
                "Per replica, the mean over its GPUs of tensor-core and memory-interface activity: DRAM high with "
                "tensor low is a decode bound by memory bandwidth",
                V.GPU_TENSOR_ACTIVE,
                V.GPU_DRAM_ACTIVE,
            ),
            UNIT_RATIO,
            (
                Query(_per_replica(V.GPU_TENSOR_ACTIVE, "avg"), f"{legend} tensor", (V.GPU_TENSOR_ACTIVE,), True),
                Query(_per_replica(V.GPU_DRAM_ACTIVE, "avg"), f"{legend} DRAM", (V.GPU_DRAM_ACTIVE,), True),
            ),
            TIMESERIES,
            12,
            8,
            min=0,
            max=1,
            idle=NO_GPU,
        ),
        Panel(
            "Power vs limit",
            describe(
                "Per replica, the power its GPUs draw and their summed power limit", V.GPU_POWER, V.GPU_POWER_LIMIT
            ),
            UNIT_WATTS,
            (
                Query(_per_replica(V.GPU_POWER, "sum"), f"{legend} draw", (V.GPU_POWER,), True),
                Query(_per_replica(V.GPU_POWER_LIMIT, "sum"), f"{legend} limit", (V.GPU_POWER_LIMIT,), True),
            ),
            TIMESERIES,
            8,
            8,
            idle=NO_GPU,
        ),
        Panel(
            "SM clock (slowest GPU)",
            describe("Per replica, the SM clock of its slowest GPU: a drop under load is throttling", V.GPU_SM_CLOCK),
            UNIT_HERTZ,
            (Query(_per_replica(V.GPU_SM_CLOCK, "min"), legend, (V.GPU_SM_CLOCK,), True),),
            TIMESERIES,
            8,
            8,
            idle=NO_GPU,
        ),
        Panel(
            "Temperature (hottest GPU)",
            describe("Per replica, the temperature of its hottest GPU", V.GPU_TEMPERATURE),
            UNIT_CELSIUS,
            (Query(_per_replica(V.GPU_TEMPERATURE, "max"), legend, (V.GPU_TEMPERATURE,), True),),
            TIMESERIES,
            8,
            8,
            idle=NO_GPU,
        ),
        Panel(
            "Throttling reasons",
            describe(
                f"Per replica and reason, 1 while a throttling clock-event reason is set on any of its GPUs "
                f"({', '.join(sorted(V.GPU_THROTTLE_CAUSES))}), and the share of time its clocks were held "
                f"down by {V.GPU_THROTTLE_POWER} or {V.GPU_THROTTLE_THERMAL} ({V.ALERT_GPU_THROTTLED} fires on "
                "either for 5 minutes)",
                V.GPU_CLOCK_EVENT,
                V.GPU_THROTTLE_TIME,
            ),
            UNIT_RATIO,
            (
                Query(events, legend_format(by_reason), (V.GPU_CLOCK_EVENT,), True),
                Query(throttled, legend_format(by_reason, "time share"), (V.GPU_THROTTLE_TIME,), True),
            ),
            TIMESERIES,
            12,
            8,
            min=0,
            max=1,
            idle=NO_GPU,
        ),
        Panel(
            "XID errors",
            describe(
                f"The last XID of each GPU that reported one since its source started; {V.ALERT_GPU_ERRORS} "
                f"pages for {', '.join(V.GPU_XID_CRITICAL)}",
                V.GPU_XID,
            ),
            UNIT_COUNT,
            (Query(xid, legend_format(REPLICA_GPU), (V.GPU_XID,), True, TABLE),),
            TABLE,
            12,
            8,
            idle=NO_XID,
        ),
    ]


def _tenant_panels() -> list[Panel | Row]:
    by = (V.LABEL_MODEL, V.LABEL_TENANT)
    sel = selector(instance=False)
    queries = tuple(
        Query(
            f"sum by ({label_list(by)}) (rate({metric.name}{sel}[{RATE_INTERVAL}]))",
            legend_format(by, kind),
            (metric,),
            False,
        )
        for metric, kind in ((V.CLIENT_GENERATION_TOKENS, "generated"), (V.CLIENT_PROMPT_TOKENS, "prompt"))
    )
    return [
        Row("Tenants"),
        Panel(
            "Client tokens per second by tenant",
            describe(
                "Tokens per second of the requests through inferwatch proxy, by model and tenant (the busiest "
                f"tenants by name, the rest as {V.TENANT_OTHER!r}, requests without a key as {V.TENANT_ANONYMOUS!r}): "
                "a tenant's share of a model's tokens is its share of the model's cost per token",
                V.CLIENT_GENERATION_TOKENS,
                V.CLIENT_PROMPT_TOKENS,
            ),
            UNIT_TOKENS_PER_S,
            queries,
            TIMESERIES,
            24,
            8,
            idle=NO_TENANT,
        ),
    ]


def board(spec: SLOFile | None) -> DashboardSpec:
    """The cost rows (from the records of ``spec``'s service, any service without one), the GPUs per
    replica and the tenants."""
    service = spec.service if spec is not None else ""
    panels = [*_cost_panels(service), *_gpu_panels(), *_tenant_panels()]
    return DashboardSpec(
        UID,
        links.DASHBOARD_TITLES[UID],
        f"GPU cost per token, per good token and per idle hour; each replica's GPUs; tokens by tenant. {NOTE}",
        prom_variables(),
        tuple(panels),
        ("inferwatch", "llm", "cost", "gpu"),
    )
