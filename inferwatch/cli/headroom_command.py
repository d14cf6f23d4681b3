"""``inferwatch headroom``: how much more load each replica takes before its first SLO breaks.

The same answer as the collector's ``GET /api/v1/headroom`` (:meth:`OnCall.headroom`), from
Prometheus's history (``--prometheus``) or from the exporters scraped live for the window
(``--exporter``), printed to fit 80 columns, or as the API's JSON with ``--json``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.text import Text

from inferwatch.cli.common import fail
from inferwatch.cli.oncall import (
    EngineOpt,
    Exporter,
    InstanceOpt,
    JsonOpt,
    ModelOpt,
    Prometheus,
    SloOpt,
    TimeoutOpt,
    console,
    oncall_for,
    run_oncall,
    wrap,
)

if TYPE_CHECKING:
    from inferwatch.collector.diagnosis.headroom_report import HeadroomReport, ReplicaHeadroomOut


def _rate(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}/s"


def _ratio(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}x"


def _style(value: float | None, low: float) -> str:
    if value is None:
        return "dim"
    return "bold red" if value < 1 else "bold yellow" if value < low else "green"


def _limits(replica: ReplicaHeadroomOut, out: Console, evidence: bool) -> None:
    for lim in replica.limits:
        if lim.requests_per_second is not None:
            batch = f"batch {lim.concurrency:.3g}, " if lim.concurrency is not None else ""
            mark = " <- first" if lim.slo == replica.limiting_slo else ""
            wrap(out, f"{lim.slo}: breaks at {batch}{_rate(lim.requests_per_second)}{mark}", 4)
        else:
            wrap(out, f"{lim.slo}: unknown ({lim.reason})", 4, style="dim")
    fit = replica.fit
    if fit is not None and fit.reason is None and fit.intercept_seconds is not None:
        slope = fit.slope_seconds_per_request or 0.0
        wrap(
            out,
            f"TPOT = {fit.intercept_seconds * 1000:.3g} ms + {slope * 1000:.3g} ms x batch "
            f"({fit.points} points, batch {fit.batch_min:.3g} to {fit.batch_max:.3g})",
            4,
            style="dim",
        )
    for note in replica.notes:
        wrap(out, f"note: {note}", 4, style="yellow")
    if evidence:
        for name, query in replica.evidence.items():
            wrap(out, f"{name}: {query}", 4, style="dim")


def render(result: HeadroomReport, out: Console, low: float, evidence: bool = False) -> None:
    """The report: one block per replica, then replicas needed per model."""
    head = (
        f"inferwatch headroom: {result.source} ({result.upstream}), window {result.window}, "
        f"step {result.step_seconds:g} s, {len(result.replicas)} replica(s)"
    )
    wrap(out, head, 0, style="bold")
    if result.note:
        wrap(out, f"note: {result.note}", 0, style="yellow")
    if not result.replicas:
        out.print("No replica matched.")
        return
    for replica in result.replicas:
        out.print()
        role = "" if replica.role == "unified" else f" ({replica.role})"
        line = Text(f"{replica.engine} {replica.model}{role} @ {replica.instance}  ")
        line.append(_ratio(replica.headroom_ratio), style=_style(replica.headroom_ratio, low))
        out.print(line)
        if replica.headroom_ratio is None:
            wrap(out, f"unknown: {replica.reason}", 2, style="dim")
        else:
            wrap(
                out,
                f"load {_rate(replica.load_requests_per_second)} at batch {replica.current_concurrency or 0:.3g}; "
                f"capacity {_rate(replica.capacity_requests_per_second)} at batch "
                f"{replica.capacity_concurrency or 0:.3g}, limited by {replica.limiting_slo}",
                2,
            )
        _limits(replica, out, evidence)
    out.print()
    out.print(Text("replicas needed at the current load", style="bold"))
    for m in result.models:
        role = "" if m.role == "unified" else f" ({m.role})"
        if m.replicas_needed is None:
            wrap(out, f"{m.model}{role}: unknown ({m.reason})", 2, style="dim")
            continue
        style = "bold red" if m.replicas_needed > m.replicas else ""
        wrap(
            out,
            f"{m.model}{role}: {m.replicas_needed} (running {m.replicas}; load {_rate(m.load_requests_per_second)}, "
            f"about {_rate(m.capacity_requests_per_second)} per replica)",
            2,
            style=style,
        )


def headroom(
    prometheus: Prometheus = None,
    exporter: Exporter = None,
    engine: EngineOpt = None,
    model: ModelOpt = None,
    instance: InstanceOpt = None,
    window: Annotated[
        str | None,
        typer.Option(
            "--window",
            help="History to fit on (default: the SLO file's headroom.window, 30m; with --exporter only: 2m, "
            "scraped live, at most 10m).",
        ),
    ] = None,
    step: Annotated[
        str | None,
        typer.Option("--step", help="One (batch, TPOT) point of the fit (default: headroom.step; exporters: 15s)."),
    ] = None,
    timeout: TimeoutOpt = 5.0,
    slo: SloOpt = None,
    json_out: JsonOpt = False,
    evidence: Annotated[bool, typer.Option("--evidence", help="Show the query behind each input.")] = False,
    fail_below: Annotated[
        float | None,
        typer.Option("--fail-below", help="Exit 1 when a replica's headroom is below this ratio (for scripts)."),
    ] = None,
) -> None:
    """How much more load each replica takes before its first SLO breaks, and replicas needed per model.

    Fits time per output token against the running batch on the replica's own history, then finds
    the load at which each SLO of the SLO file (and the KV cache) breaks; the headroom is that load
    over the current one (below 1: over the edge). Unknown, with the reason, when the history cannot
    tell. docs/headroom.md states the model.
    """
    from inferwatch.collector.diagnosis.signals import Filters

    oncall = oncall_for("headroom", prometheus, exporter, timeout, 5.0, slo)
    err = Console(stderr=True, highlight=False)

    def progress(done: int, total: int) -> None:
        if err.is_terminal:
            err.print(f"\rscraping the exporters: {done}/{total}", end="")
            if done == total:
                err.print()

    if exporter and not prometheus:
        err.print(f"scraping the exporters for {window or '2m'} (Prometheus would answer at once)")
    result = run_oncall(oncall, lambda o: o.headroom(window, step, Filters(engine, model, instance), progress=progress))
    low = oncall.slos.headroom.low_ratio if oncall.slos else 1.25
    if json_out:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        render(result, console(), low, evidence)
    if fail_below is not None:
        if fail_below <= 0:
            raise fail("--fail-below must be a positive ratio, e.g. 1.25")
        if any(r.headroom_ratio is not None and r.headroom_ratio < fail_below for r in result.replicas):
            raise typer.Exit(1)
