"""``inferwatch diagnose``, ``checklist``, ``capacity`` and ``slos``: the on-call answers in the terminal.

The same code as the collector's ``/api/v1`` answers (:class:`~inferwatch.collector.diagnosis.diagnoser.OnCall`),
read from Prometheus (``--prometheus``) or straight from the exporters (``--exporter``), printed as a
report that fits an 80-column terminal, or as the API's JSON with ``--json``.
"""

from __future__ import annotations

import asyncio
import re
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from inferwatch.cli.common import fail, load_settings, needs_extra
from inferwatch.core import resources

if TYPE_CHECKING:
    from inferwatch.collector.diagnosis.burn import SloReport
    from inferwatch.collector.diagnosis.diagnoser import OnCall
    from inferwatch.collector.diagnosis.report import Capacity, Checklist, Diagnosis, TargetStatus

T = TypeVar("T")
WIDTH_MAX = 100

Prometheus = Annotated[
    str | None, typer.Option("--prometheus", help="Prometheus URL (with the generated rules loaded).")
]
Exporter = Annotated[
    list[str] | None,
    typer.Option("--exporter", help="Exporter URL to scrape when there is no Prometheus (repeatable)."),
]
EngineOpt = Annotated[str | None, typer.Option("--engine", help="Only this engine.")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Only this model.")]
InstanceOpt = Annotated[str | None, typer.Option("--instance", help="Only this instance (exporter host:port).")]
WindowOpt = Annotated[str, typer.Option("--window", help="Look-back window for Prometheus, e.g. 10m.")]
IntervalOpt = Annotated[
    float, typer.Option("--interval", help="Seconds between the two exporter scrapes (exporters only).")
]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for each upstream query.")]
SloOpt = Annotated[Path | None, typer.Option("--slo", help="SLO file (default: the SLOs that ship with inferwatch).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the API's JSON answer instead of the report.")]


def console() -> Console:
    out = Console(highlight=False, soft_wrap=True)
    if not out.is_terminal:
        out = Console(highlight=False, soft_wrap=True, width=80)
    return out


def _width(out: Console) -> int:
    return max(60, min(out.width, WIDTH_MAX))


def oncall_for(
    command: str,
    prometheus: str | None,
    exporters: list[str] | None,
    timeout: float,
    interval: float,
    slo: Path | None,
) -> OnCall:
    with needs_extra("collector", command):  # the collector's diagnosis answers
        from inferwatch.collector.diagnosis.diagnoser import OnCall
        from inferwatch.collector.diagnosis.exporter_scrape import exporter_urls
    from inferwatch.core.engines import builtin_profiles
    from inferwatch.core.slo import SLOFileError, load

    try:
        spec = load(slo or resources.default_slo_path(), load_settings().vocabulary())
        urls = exporter_urls(exporters or [])
    except (SLOFileError, ValueError) as exc:
        raise fail(str(exc)) from None
    if prometheus is not None and not prometheus.startswith(("http://", "https://")):
        raise fail(f"--prometheus must be an http(s) URL, got {prometheus!r}")
    return OnCall(
        profiles=builtin_profiles(),
        slos=spec,
        prometheus_url=prometheus.rstrip("/") if prometheus else None,
        exporter_urls=urls,
        timeout=timeout,
        interval=interval,
    )


def run_oncall(oncall: OnCall, work: Callable[[OnCall], Awaitable[T]]) -> T:
    from inferwatch.collector.diagnosis.diagnoser import NotConfigured
    from inferwatch.collector.diagnosis.signals import UpstreamError
    from inferwatch.core.capacity import CapacityError
    from inferwatch.core.engines.launch import LaunchError

    async def main() -> T:
        try:
            return await work(oncall)
        finally:
            await oncall.close()

    try:
        return asyncio.run(main())
    except (UpstreamError, NotConfigured, LaunchError, CapacityError) as exc:
        raise fail(str(exc)) from None
    except ValueError as exc:
        raise fail(str(exc)) from None


def wrap(out: Console, text: str, indent: int, first: str = "", style: str = "") -> None:
    width = _width(out)
    lines = textwrap.wrap(
        text,
        width=width,
        initial_indent=" " * indent + first,
        subsequent_indent=" " * (indent + len(first)),
        break_long_words=True,
        break_on_hyphens=False,
    ) or [" " * indent + first]
    for line in lines:
        out.print(Text(line, style=style))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


SEVERITY_STYLE = {"critical": "bold red", "warning": "bold yellow", "ok": "green", "unknown": "dim"}
GPU_COLUMN = "gpu"
SHORT = {
    "latency_p99_high": "latency",
    "throughput_low": "thruput",
    "preemptions": "preempt",
    "ttft_slow": "ttft",
    "tpot_slow": "tpot",
    "error_rate_high": "errors",
    "streams_aborted": "aborts",
    "gpu_throttled": GPU_COLUMN,
    "gpu_errors": GPU_COLUMN,
}
"""each symptom's column in the target table; the GPU findings share one (the worse of the two)."""
NAME_MIN = 16
STATUS_SHORT = {"critical": "CRIT", "warning": "warn", "ok": "ok", "unknown": "?"}


def _fmt_value(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value:.1%}"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    shown = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return f"{shown} {unit}".rstrip()


def render_diagnosis(result: Diagnosis, out: Console) -> None:
    from inferwatch.core.causes import GPU_READINGS

    source = (
        f"{result.source}, window {result.window}, {len(result.targets)} targets, {result.upstream_queries} queries"
    )
    wrap(out, f"inferwatch diagnose: {source}", 0, style="bold")
    if result.note:
        wrap(out, f"note: {result.note}", 0, style="yellow")
    if not result.targets:
        out.print("No target matched.")
        return
    out.print()
    if not result.findings:
        out.print(Text("No findings: every judged symptom is ok.", style="green"))
    for finding in result.findings:
        where = f"{finding.engine} / {finding.model} @ {finding.instance}"
        head = f"{finding.severity.upper():8} {finding.symptom.value}  {where}"
        wrap(out, head, 0, style=SEVERITY_STYLE[finding.severity.value])
        wrap(out, finding.summary, 2)
        wrap(out, finding.cause, 2, "Cause:    ")
        for i, ev in enumerate(finding.evidence):
            label = "Evidence: " if i == 0 else "          "
            condition = f" ({ev.threshold})" if ev.threshold else ""
            # a signal by its name; one GPU's reading (which GPU, which reason or XID) by its words
            what = ev.description if ev.signal in GPU_READINGS else ev.signal
            wrap(out, f"{what} = {_fmt_value(ev.value, ev.unit)}{condition}", 2, label)
            wrap(out, ev.query, 14, style="dim")
        for i, remedy in enumerate(finding.remedies):
            wrap(out, remedy, 2, "Remedy:   " if i == 0 else "          ", style="cyan" if i == 0 else "")
        wrap(out, f"alerts/runbooks.md#{finding.runbook}", 2, "Runbook:  ")
        for req in finding.example_requests:
            phases = _phases(req)
            e2e = req.request_duration
            shown = f"{req.request_id or req.trace_id[:16]}: e2e {e2e:.2f} s ({phases})" if e2e else req.trace_id
            wrap(out, shown, 2, "Example:  ")
        out.print()
    _target_table(result, out)


def _phases(req: object) -> str:
    phases = getattr(req, "phases", None)
    if phases is None:
        return ""
    parts = []
    for name in ("queue", "prefill", "decode", "other"):
        phase = getattr(phases, name, None)
        share = getattr(phase, "share", None)
        if share is not None:
            parts.append(f"{name} {share:.0%}")
    return ", ".join(parts)


def _target_table(result: Diagnosis, out: Console) -> None:
    from inferwatch.core.symptoms import SEVERITY_ORDER, Status, Symptom

    def status_of(target: TargetStatus, column: str) -> str:
        shown = [target.status.get(Symptom(s), Status.UNKNOWN) for s, c in SHORT.items() if c == column]
        return min(shown, key=lambda v: SEVERITY_ORDER[v]).value

    columns = list(dict.fromkeys(SHORT.values()))
    if all(status_of(t, GPU_COLUMN) == Status.UNKNOWN for t in result.targets):
        columns.remove(GPU_COLUMN)  # no target has GPU series: the reason below says how to add them
    width = _width(out)
    name_width = max(NAME_MIN, width - 8 * len(columns) - 1)
    header = "target".ljust(name_width) + "".join(c.rjust(8) for c in columns)
    out.print(Text(header, style="bold"))
    for target in result.targets:
        name = f"{target.engine} {target.model} @{target.instance}"
        if len(name) > name_width - 1:
            name = name[: name_width - 2] + "…"
        line = Text(name.ljust(name_width))
        for column in columns:
            status = status_of(target, column)
            line.append(STATUS_SHORT[status].rjust(8), style=SEVERITY_STYLE[status])
        out.print(line)
    unknown: dict[tuple[str, str], list[str]] = {}  # (column, why) -> engines
    for target in result.targets:
        for symptom, why in target.reasons.items():
            engines = unknown.setdefault((SHORT[symptom.value], why), [])
            if target.engine not in engines:
                engines.append(target.engine)
    if unknown:
        out.print()
        out.print(Text("? = unknown: the engine does not expose the signal, or there was no data", style="dim"))
        for (column, why), engines in unknown.items():
            if column == GPU_COLUMN:  # a deployment's, not an engine's: once for every engine
                wrap(out, f"{', '.join(engines)} {column}: {why}", 2, style="dim")
            else:
                for engine in engines:
                    wrap(out, f"{engine} {column}: {why}", 2, style="dim")


Fail = Literal["never", "warning", "critical"]


def diagnose(
    prometheus: Prometheus = None,
    exporter: Exporter = None,
    engine: EngineOpt = None,
    model: ModelOpt = None,
    instance: InstanceOpt = None,
    window: WindowOpt = "10m",
    interval: IntervalOpt = 5.0,
    timeout: TimeoutOpt = 5.0,
    slo: SloOpt = None,
    json_out: JsonOpt = False,
    fail_on: Annotated[
        Fail, typer.Option("--fail-on", help="Exit 1 when a finding is this severe or more (for scripts).")
    ] = "never",
) -> None:
    """Symptom → cause → remedy for every engine: what is wrong, where, the evidence, what to change.

    Reads Prometheus (--prometheus; the exact PromQL of every figure is shown) or, without one,
    scrapes the exporters twice a few seconds apart (--exporter, repeatable). A symptom an engine
    cannot show (TGI has no TTFT metric) is unknown, never guessed.
    """
    from inferwatch.collector.diagnosis.signals import Filters

    oncall = oncall_for("diagnose", prometheus, exporter, timeout, interval, slo)
    result = run_oncall(oncall, lambda o: o.diagnose(window, Filters(engine, model, instance)))
    if json_out:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        render_diagnosis(result, console())
    severities = {f.severity.value for f in result.findings}
    if (fail_on == "critical" and "critical" in severities) or (fail_on == "warning" and severities):
        raise typer.Exit(1)


def render_checklist(result: Checklist, out: Console) -> None:
    wrap(out, f"inferwatch checklist: {result.source}, {_plural(len(result.targets), 'target')}", 0, style="bold")
    if result.note:
        wrap(out, f"note: {result.note}", 0, style="yellow")
    style = {"pass": "green", "fail": "bold red", "unknown": "dim"}
    for target in result.targets:
        out.print()
        wrap(out, f"{target.engine} / {target.model} @ {target.instance}", 0, style="bold")
        for item in target.items:
            mark = {"pass": "PASS", "fail": "FAIL", "unknown": " ?  "}[item.verdict.value]
            line = Text("  ")
            line.append(mark, style=style[item.verdict.value])
            line.append(f"  {item.question}")
            out.print(line)
            for evidence in item.evidence:
                wrap(out, evidence, 8, style="dim")
            if item.remedy:
                wrap(out, item.remedy, 8, "→ ", style="cyan")


def checklist(
    prometheus: Prometheus = None,
    exporter: Exporter = None,
    launch: Annotated[
        str | None,
        typer.Option(
            "--launch",
            help='The engine\'s launch command line, e.g. "vllm serve MODEL --max-num-seqs 512" (absent flags '
            "count at the engine's defaults).",
        ),
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU model (e.g. H100), to judge the quantization.")] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="The model's config.json, to judge the tensor-parallel split.")
    ] = None,
    engine: EngineOpt = None,
    model: ModelOpt = None,
    instance: InstanceOpt = None,
    window: WindowOpt = "10m",
    interval: IntervalOpt = 5.0,
    timeout: TimeoutOpt = 5.0,
    json_out: JsonOpt = False,
) -> None:
    """The tuning checklist: pass, fail or unknown per target, with evidence and the remedy.

    From what the engines expose (--prometheus or --exporter) and from the launch line (--launch),
    or from the launch line alone.
    """
    from inferwatch.collector.diagnosis.signals import Filters
    from inferwatch.core.capacity import CapacityError, load_config

    if launch is None and prometheus is None and not exporter:
        raise fail("give --launch, --prometheus or --exporter")
    shape = None
    if config is not None:
        try:
            shape = load_config(config)
        except CapacityError as exc:
            raise fail(str(exc)) from None
    oncall = oncall_for("checklist", prometheus, exporter, timeout, interval, None)
    filters = Filters(engine, model, instance)
    result = run_oncall(oncall, lambda o: o.checklist(window, filters, launch=launch, gpu=gpu, shape=shape))
    if json_out:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        render_checklist(result, console())


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b?|b)?\s*$", re.I)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "ki": 2**10, "kib": 2**10, "m": 1e6, "mb": 1e6, "mi": 2**20,
          "mib": 2**20, "g": 1e9, "gb": 1e9, "gi": 2**30, "gib": 2**30, "t": 1e12, "tb": 1e12, "ti": 2**40,
          "tib": 2**40}  # fmt: skip


def parse_size(text: str, option: str) -> float:
    """``80GiB``, ``80GB``, ``26e9`` -> bytes; the error names the option."""
    m = _SIZE.match(text)
    if not m:
        try:
            return float(text)
        except ValueError:
            raise fail(f"{option}: expected a size such as 80GiB or 26GB, got {text!r}") from None
    return float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]


def _bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,.0f} B"


def _total(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} B = {value / 1e9:,.1f} GB ({_bytes(value)})"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def render_capacity(result: Capacity, out: Console) -> None:
    plan = result.plan
    if plan is not None:
        out.print(Text("KV-cache plan (2 × layers × KV heads × head dim × tokens × bytes per element)", style="bold"))
        rows = [
            ("KV cache dtype", f"{plan.kv_dtype} ({plan.bytes_per_element:g} bytes per element)"),
            ("KV bytes per token", f"{plan.kv_bytes_per_token:,.0f} B ({_bytes(plan.kv_bytes_per_token)})"),
            ("  per GPU", f"{plan.kv_bytes_per_token_per_gpu:,.0f} B"),
            ("KV per sequence", f"{_bytes(plan.kv_bytes_per_sequence)} at the maximum length"),
            ("KV for the batch", _total(plan.kv_bytes_for_batch)),
            ("weights", f"{_bytes(plan.weights_bytes)}{' (estimated)' if plan.weights_estimated else ''}"),
            ("KV budget per GPU", _bytes(plan.kv_budget_bytes_per_gpu)),
            ("KV tokens that fit", "-" if plan.kv_tokens is None else f"{plan.kv_tokens:,}"),
            (
                "sequences at max length",
                "-" if plan.max_sequences_at_max_len is None else f"{plan.max_sequences_at_max_len:,}",
            ),
            (
                "sequences at the average",
                "-" if plan.max_sequences_at_average is None else f"{plan.max_sequences_at_average:,}",
            ),
        ]
        for name, value in rows:
            out.print(f"  {name:<26}{value}")
        for note in plan.notes:
            wrap(out, note, 2, "note: ", style="yellow")
    for obs in result.observed:
        out.print()
        wrap(out, f"{obs.engine} / {obs.model} @ {obs.instance}", 0, style="bold")
        wrap(out, obs.summary, 2)
    if result.note:
        wrap(out, f"note: {result.note}", 0, style="yellow")


def capacity(
    config: Annotated[Path | None, typer.Argument(help="The model's config.json (or its directory).")] = None,
    layers: Annotated[int | None, typer.Option(help="Transformer layers (instead of config.json).")] = None,
    kv_heads: Annotated[int | None, typer.Option(help="KV heads (GQA groups).")] = None,
    head_dim: Annotated[int | None, typer.Option(help="Head dimension.")] = None,
    dtype: Annotated[str, typer.Option(help="The weights' dtype (with --layers).")] = "float16",
    kv_dtype: Annotated[str | None, typer.Option(help="KV cache dtype, e.g. fp8 (default: the weights').")] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Context length (prompt + output).")] = None,
    gpu_memory: Annotated[str | None, typer.Option(help="Memory of one GPU, e.g. 80GiB.")] = None,
    gpu_memory_utilization: Annotated[float, typer.Option(help="Share the engine may use.")] = 0.9,
    tensor_parallel_size: Annotated[int, typer.Option(help="GPUs the model is sharded over.")] = 1,
    weights: Annotated[
        str | None, typer.Option(help="Size of all the weights, e.g. 26GB (default: estimated).")
    ] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = 16,
    average_tokens: Annotated[int | None, typer.Option(help="Prompt + output of a typical request.")] = None,
    batch: Annotated[int | None, typer.Option(help="Sequences of --max-model-len to size the cache for.")] = None,
    prometheus: Prometheus = None,
    exporter: Exporter = None,
    engine: EngineOpt = None,
    model: ModelOpt = None,
    instance: InstanceOpt = None,
    window: WindowOpt = "10m",
    json_out: JsonOpt = False,
) -> None:
    """KV-cache capacity: bytes per token, the tokens and sequences that fit, and the observed cache.

    KV bytes = 2 × layers × KV heads × head dim × sequence length × batch × bytes per element. With
    --prometheus or --exporter, each target's observed capacity, usage and preemptions are shown too,
    with how many sequences of this window's mean length its cache holds before preempting.
    """
    from inferwatch.collector.diagnosis.signals import Filters
    from inferwatch.core.capacity import CapacityError, ModelShape, Plan, load_config

    plan = None
    try:
        if config is not None:
            shape = load_config(config)
        elif layers is not None and kv_heads is not None and head_dim is not None:
            shape = ModelShape(layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype)
        elif any(v is not None for v in (layers, kv_heads, head_dim)):
            raise fail("give all of --layers, --kv-heads and --head-dim (or a config.json)")
        else:
            shape = None
        if shape is not None:
            plan = Plan(
                shape=shape,
                kv_dtype=kv_dtype,
                max_model_len=max_model_len,
                gpu_memory_bytes=parse_size(gpu_memory, "--gpu-memory") if gpu_memory else None,
                gpu_memory_utilization=gpu_memory_utilization,
                tensor_parallel_size=tensor_parallel_size,
                weights_bytes=parse_size(weights, "--weights") if weights else None,
                block_size=block_size,
                average_sequence_tokens=average_tokens,
                batch=batch,
            )
    except CapacityError as exc:
        raise fail(str(exc)) from None
    if plan is None and prometheus is None and not exporter:
        raise fail("give a config.json (or --layers, --kv-heads, --head-dim), or a target (--prometheus/--exporter)")
    oncall = oncall_for("capacity", prometheus, exporter, 5.0, 5.0, None)
    result = run_oncall(oncall, lambda o: o.capacity(plan, window, Filters(engine, model, instance)))
    if json_out:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        render_capacity(result, console())


def render_slos(result: SloReport, out: Console) -> None:
    wrap(out, f"inferwatch slos: {result.source}, {result.upstream_queries} queries", 0, style="bold")
    for slo in result.slos:
        out.print()
        wrap(out, f"{slo.name}: {slo.description} (objective {slo.objective:.2%} over {slo.period})", 0, style="bold")
        if not slo.groups:
            out.print(Text("  no data yet", style="dim"))
        for group in slo.groups:
            who = ", ".join(f"{k}={v}" for k, v in group.labels.items()) or "all"
            sli = "-" if group.sli is None else f"{group.sli:.3%}"
            left = "-" if group.budget_remaining is None else f"{group.budget_remaining:.1%}"
            style = "bold red" if group.budget_remaining is not None and group.budget_remaining < 0 else ""
            wrap(out, f"{who}: SLI {sli}, budget left {left}", 2, style=style)
            burns = "  ".join(f"{w} {'-' if b is None else f'{b:.1f}×'}" for w, b in group.burn_rates.items())
            wrap(out, f"burn rate: {burns}", 4, style="dim")
        for alert in slo.firing:
            wrap(out, f"FIRING {alert.severity} ({alert.long_window}/{alert.short_window})", 2, style="bold red")


def slos(
    prometheus: Annotated[str, typer.Option("--prometheus", help="Prometheus URL with the generated rules.")],
    slo: SloOpt = None,
    timeout: TimeoutOpt = 5.0,
    json_out: JsonOpt = False,
) -> None:
    """SLO status: SLI over the period, error budget left, burn rate per alert window, firing burn alerts."""
    oncall = oncall_for("slos", prometheus, None, timeout, 5.0, slo)
    result = run_oncall(oncall, lambda o: o.slo_status())
    if json_out:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        render_slos(result, console())


def register(app: typer.Typer) -> None:
    for command in (diagnose, checklist, capacity, slos):
        app.command()(command)
