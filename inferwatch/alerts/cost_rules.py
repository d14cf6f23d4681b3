"""What the GPUs cost, as Prometheus recording rules (pure functions): per replica per hour, and per model
per million tokens, per million good tokens and for the hours its GPUs ran nothing.

Built from the SLO file's ``cost:`` section (:class:`inferwatch.core.pricing.CostSettings`) and the GPU
series the exporter joins to each replica (``llm_gpu_*``: engine, model, instance, gpu_uuid, gpu_model,
pool). ``docs/cost.md`` states the formulas with a worked example. Three groups, evaluated every
``cost.step``; like every generated group, none reads a record of its own group
(:func:`inferwatch.alerts.generate.slo_rules` says why), so the per-model answers trail the raw series
by three steps:

1. the GPUs of each replica (:data:`V.GPU_COUNT_RECORD`): one per ``gpu_uuid`` that reports its
   utilisation or its power, by (engine, model, instance, pool, gpu_model);
2. their price per hour (:data:`V.COST_GPU_HOURLY_RECORD`);
3. per model: the cost per million generated and prompt tokens, per million generated tokens of the
   requests that met the latency SLOs, and the cost per hour of GPUs that ran no request.

**Prices in PromQL, which has no lookup table.** The hourly cost is one term per price, the GPU count of
the series that price matches times the price, joined by ``or`` in precedence order (``COUNT`` standing
for :data:`V.GPU_COUNT_RECORD`)::

    COUNT{pool="reserved"} * 3
    or COUNT{gpu_model="NVIDIA H100 80GB HBM3"} * 4
    or COUNT * 2

``or`` keeps every series of its left side and adds those of its right side whose labels are not
already there, so a pool's price wins over its GPUs' model price, and the default prices the rest: the
precedence is the order of the terms. The alternative, a price series per price
(``label_replace(vector(4), "gpu_model", ...)``) joined with ``* on (gpu_model) group_left``, needs
one join per label and the same ``or`` for the precedence, and ``label_replace`` expands ``$`` in the
label value it writes; a selector compares the value literally (only ``"`` and ``\\`` are escaped).

**Conventions.** Each per-million figure is the *all-in* cost of the model's GPUs divided by one kind of
token: the cost per million generated tokens and the cost per million prompt tokens each carry the
whole bill, they are not a split of it (add them and the GPUs are paid twice). Only the replicas with
GPU series count: tokens of a replica whose exporter has no GPU source are left out of the denominator
too. The cost over the window is the hourly cost sampled every ``step`` and averaged (a subquery), so a
replica that ran half the window costs half.
"""

from __future__ import annotations

from typing import Any

from inferwatch.core import vocabulary as V
from inferwatch.core.pricing import CostSettings
from inferwatch.core.slo import SLOFile, decimal_text

REPLICA = (V.LABEL_ENGINE, V.LABEL_MODEL, "instance")
"""One replica: Prometheus's ``instance`` is the exporter the replica and its GPUs are scraped through."""
PRICED = (*REPLICA, V.LABEL_POOL, V.LABEL_GPU_MODEL)
"""What a price depends on, kept on the per-replica records (a label the GPU source lacks stays empty)."""
PER_MILLION = 1_000_000
SECONDS_PER_HOUR = 3600


def promql_string(value: str) -> str:
    """``value`` as a PromQL double-quoted string literal (backslash and quote escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _matchers(labels: dict[str, str]) -> str:
    return "{" + ",".join(f"{k}={promql_string(v)}" for k, v in labels.items()) + "}"


def _indent(text: str, spaces: int = 2) -> str:
    """``text`` with every line indented (nested expressions stay readable in the generated file)."""
    return "\n".join(" " * spaces + line for line in text.splitlines())


def _record(name: str, expr: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"record": name, "expr": expr, "labels": labels}


def gpu_count() -> str:
    """GPUs per replica: each ``gpu_uuid`` that reports its utilisation or its power counts once (a
    source may lack either field; the group keeps one series per GPU)."""
    per_gpu = ", ".join((*PRICED, V.LABEL_GPU_UUID))
    series = f"{V.GPU_UTILIZATION.name} or {V.GPU_POWER.name}"
    return f"count by ({', '.join(PRICED)}) (\n  group by ({per_gpu}) ({series})\n)"


def hourly_cost(cost: CostSettings, service: dict[str, str]) -> str:
    """The replica's GPUs times their price, one term per price in precedence order (module docstring)."""
    terms = [
        f"{V.GPU_COUNT_RECORD}{_matchers({**service, label: value})} * {decimal_text(price)}"
        for label, value, price in cost.price_terms()
    ]
    terms.append(f"{V.GPU_COUNT_RECORD}{_matchers(service)} * {decimal_text(cost.gpu_hour_usd)}")
    return "\nor ".join(terms)


class _PerModel:
    """PromQL of the per-model records over one SLO file's window and step."""

    def __init__(self, spec: SLOFile, cost: CostSettings) -> None:
        self.spec = spec
        self.window = cost.window
        self.step = cost.step
        self.service = {V.SLO_SERVICE_LABEL: spec.service}
        self.cost = f"{V.COST_GPU_HOURLY_RECORD}{_matchers(self.service)}"

    def cost_over_window(self) -> str:
        """The model's hourly cost averaged over the window: dollars spent in it / its hours."""
        return f"avg_over_time(\n  sum by ({V.LABEL_MODEL}) ({self.cost})[{self.window}:{self.step}]\n)"

    def tokens_per_hour(self, tokens: V.MetricSpec) -> str:
        """Tokens an hour of the model's priced replicas (those with a cost series), over the window."""
        on = f"on ({', '.join(REPLICA)})"
        priced = f"rate({tokens.name}[{self.window}])\nand {on}\n{self.cost}"
        return f"sum by ({V.LABEL_MODEL}) (\n{_indent(priced)}\n) * {SECONDS_PER_HOUR}"

    def per_million(self, tokens: V.MetricSpec) -> str:
        """Cost per million ``tokens``; a model that made no such token in the window has no series."""
        return f"{self.cost_over_window()}\n/\n(\n{_indent(self.tokens_per_hour(tokens))} > 0\n)\n* {PER_MILLION}"

    def good_fraction(self) -> str | None:
        """Estimated share of requests that met every latency SLO of the file grouped by model.

        Engines do not count tokens per good request, so the good share comes from the SLOs' recorded
        error ratios over the window, as if their failures were independent: the product of ``1 - ratio``
        over the latency SLOs, written ``exp(sum(ln(1 - ratio)))`` (PromQL has no product aggregation;
        ``ln(0)`` is ``-Inf`` and ``exp`` of it 0, so an SLO missed by every request gives 0). The true
        share lies between ``1 - sum(ratio)`` (failures never overlap) and ``min(1 - ratio)`` (every
        failure of one SLO fails the others too); the product is between the two. An SLO whose series
        the model lacks (an engine without that histogram) counts as met. An SLO grouped by more than
        the model (``[model, instance]``) is averaged over its groups, unweighted. None when no latency
        SLO is grouped by model: there is nothing to attribute to a model."""
        names = [s.name for s in self.spec.slos if s.indicator.latency is not None and V.LABEL_MODEL in s.group_by]
        if not names:
            return None
        service = f"{V.SLO_SERVICE_LABEL}={promql_string(self.spec.service)}"
        sel = f'{{{service},{V.SLO_LABEL}=~"{"|".join(names)}"}}'
        ratio = f"avg by ({V.LABEL_MODEL}, {V.SLO_LABEL}) ({V.slo_error_ratio(self.window)}{sel})"
        return f"exp(\n  sum by ({V.LABEL_MODEL}) (\n    ln(1 - {ratio})\n  )\n)"

    def goodput(self, good: str) -> str:
        """Cost per million generated tokens of the requests that met the latency SLOs (estimated)."""
        tokens = _indent(f"(\n{_indent(self.tokens_per_hour(V.GENERATION_TOKENS))} > 0\n)\n*\n{good}")
        return f"{self.cost_over_window()}\n/\n(\n{tokens}\n)\n* {PER_MILLION}"

    def idle(self) -> str:
        """Per model, the hourly cost of each replica times the share of the window it ran no request.

        The share is the fraction of the window's ``step`` samples at which the replica's running
        requests (summed over data-parallel ranks) were 0, not whether it was idle for the whole window:
        a replica that served one request an hour would otherwise count as busy, and one idle for 59
        minutes of 60 would cost nothing idle. Sampled every ``step``: a replica busy in bursts shorter
        than the step may be caught at rest or at work by chance; over a window of many steps the
        share is an estimate of its idle time."""
        running = f"sum by ({', '.join(REPLICA)}) ({V.REQUESTS_RUNNING.name})"
        idle_share = f"avg_over_time(\n    ({running} == bool 0)[{self.window}:{self.step}]\n  )"
        on = f"on ({', '.join(REPLICA)}) group_left ()"
        return f"sum by ({V.LABEL_MODEL}) (\n  {self.cost}\n  * {on}\n  {idle_share}\n)"


def cost_groups(spec: SLOFile) -> list[dict[str, Any]]:
    """The three cost rule groups (module docstring), ``inferwatch-cost-<service>-<n>-<what>``; none
    without a ``cost:`` section."""
    cost = spec.cost
    if cost is None:
        return []
    service = {V.SLO_SERVICE_LABEL: spec.service}
    m = _PerModel(spec, cost)
    per_model = [
        _record(V.COST_PER_MILLION_GENERATION_RECORD, m.per_million(V.GENERATION_TOKENS), service),
        _record(V.COST_PER_MILLION_PROMPT_RECORD, m.per_million(V.PROMPT_TOKENS), service),
    ]
    good = m.good_fraction()
    if good is not None:
        per_model.append(_record(V.COST_GOODPUT_PER_MILLION_RECORD, m.goodput(good), service))
    per_model.append(_record(V.COST_IDLE_HOURLY_RECORD, m.idle(), service))
    levels = [
        ("1-gpus", [_record(V.GPU_COUNT_RECORD, gpu_count(), service)]),
        ("2-hourly", [_record(V.COST_GPU_HOURLY_RECORD, hourly_cost(cost, service), service)]),
        ("3-per-model", per_model),
    ]
    return [
        {"name": f"inferwatch-cost-{spec.service}-{name}", "interval": cost.step, "rules": rules}
        for name, rules in levels
    ]
