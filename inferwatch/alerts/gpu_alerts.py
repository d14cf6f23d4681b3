"""The GPU alerts (throttled GPUs, critical XID errors) and their runbooks (pure functions).

They join the saturation and health alerts of :func:`inferwatch.alerts.generate.saturation_alerts`, which
builds each rule (labels, severity, runbook link) the same way for all of them. They read the GPU series
the exporter joins to each replica (``llm_gpu_*``). A family the GPU source does not export is absent,
not zero, so neither alert fires without it: the clock-event reasons, the throttle-time counters and
XIDs are opt-in fields of dcgm-exporter's counter list, and a GPU that never had an XID has no series.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLOFile

Rule = Callable[[str, str, str, str, str], dict[str, Any]]
"""(alert, expr, for, summary, description) -> the rule, as the saturation alerts build theirs."""

THROTTLE_RATE_WINDOW = "5m"
"""the window of the throttle-time rate (several of the GPU source's 30 s samples)."""
SEVERITIES: dict[str, str] = {V.ALERT_GPU_THROTTLED: V.SEVERITY_TICKET, V.ALERT_GPU_ERRORS: V.SEVERITY_PAGE}
"""Throttling costs speed, not requests: a ticket. A critical XID takes a GPU, and often its replica, out of
service until someone resets or replaces it: a page (``alerts.severities`` may change either)."""
WHERE = "{{ $labels.engine }} {{ $labels.model }} on {{ $labels.instance }}"


def _by_cause() -> dict[str, list[str]]:
    """cause (power, thermal) -> the clock-event reasons that mean it."""
    out: dict[str, list[str]] = {}
    for reason, cause in V.GPU_THROTTLE_CAUSES.items():
        out.setdefault(cause, []).append(reason)
    return {cause: sorted(reasons) for cause, reasons in sorted(out.items())}


def throttled_expr(min_ratio: float) -> str:
    """Per replica, host and cause (``reason`` = power or thermal): 1 while a throttling clock-event reason
    of any of its GPUs is set, else the largest share of the last 5 minutes a GPU's clocks were held down
    (above ``min_ratio``). The reasons are folded into their cause before the GPUs are (two reasons of
    one GPU must not give two series of one label set)."""
    event, reason = V.GPU_CLOCK_EVENT.name, V.LABEL_REASON
    parts = [
        f'label_replace(\n    max without ({reason}) ({event}{{{reason}=~"{"|".join(reasons)}"}}),\n'
        f'    "{reason}", "{cause}", "", ""\n  ) == 1'
        for cause, reasons in _by_cause().items()
    ]
    parts.append(f"rate({V.GPU_THROTTLE_TIME.name}[{THROTTLE_RATE_WINDOW}]) > {min_ratio:g}")
    return f"max without ({V.LABEL_GPU}, {V.LABEL_GPU_UUID}) (\n  " + "\n  or\n  ".join(parts) + "\n)"


def errors_expr() -> str:
    """Each GPU whose last XID is one of :data:`V.GPU_XID_CRITICAL`."""
    return f'{V.GPU_XID.name}{{{V.LABEL_XID}=~"{"|".join(V.GPU_XID_CRITICAL)}"}}'


def xid_meaning() -> str:
    """An alert template saying what the alert's XID code means (:data:`V.GPU_XID_CRITICAL`)."""
    branches = [
        f'{"if" if i == 0 else "else if"} eq $labels.{V.LABEL_XID} "{code}" }}}}{meaning}'
        for i, (code, meaning) in enumerate(V.GPU_XID_CRITICAL.items())
    ]
    return "{{ " + "{{ ".join(branches) + "{{ end }}"


def gpu_alerts(spec: SLOFile, rule: Rule) -> list[dict[str, Any]]:
    """The two GPU alerts, built by the saturation alerts' ``rule``."""
    a = spec.alerts
    gpu = "{{ $labels.gpu }} ({{ $labels.gpu_uuid }})"
    return [
        rule(
            V.ALERT_GPU_THROTTLED,
            throttled_expr(a.gpu_throttle_min_ratio),
            a.gpu_throttled_for,
            "A GPU of a replica is throttled.",
            f"A GPU of {WHERE} (host {{{{ $labels.host }}}}) has had its clocks held down by "
            f"{{{{ $labels.reason }}}} for {a.gpu_throttled_for}: {{{{ $value | humanizePercentage }}}} of the time "
            f"over {THROTTLE_RATE_WINDOW} (100% while a clock-event reason is set). A throttled GPU prefills and "
            "decodes slower: TTFT and TPOT rise at the same load. Power: the draw is at the board's limit; "
            "thermal: the GPU is too hot (cooling, airflow).",
        ),
        rule(
            V.ALERT_GPU_ERRORS,
            errors_expr(),
            a.gpu_errors_for,
            "A GPU of a replica reported a critical XID error.",
            f"GPU {gpu} of {WHERE} (host {{{{ $labels.host }}}}) reported XID {{{{ $labels.xid }}}}: "
            f"{xid_meaning()}. The series ({V.GPU_XID.name} = {{{{ $value }}}}) stays until the GPU source "
            "restarts. Drain the replica, then reset or replace the GPU.",
        ),
    ]


RUNBOOK: dict[str, tuple[str, str, str]] = {
    V.ALERT_GPU_THROTTLED: (
        "A GPU of the replica has had its clocks held down for the alert's `for:` (5m): by power "
        f"(`reason=power`: {', '.join(_by_cause()[V.GPU_THROTTLE_POWER])}; the draw reached the board's "
        "power limit, or the board or the system asserted a slowdown) or by temperature (`reason=thermal`: "
        f"{', '.join(_by_cause()[V.GPU_THROTTLE_THERMAL])}). The cause comes from the clock-event reasons "
        f"(`{V.GPU_CLOCK_EVENT.name}`) when the GPU source exports them, else from the throttle-time counters "
        f"(`{V.GPU_THROTTLE_TIME.name}`, over 10 % of the last 5 minutes by default: "
        "`alerts.gpu_throttle_min_ratio`). A throttled GPU serves slower: TTFT and TPOT rise at the same load "
        "and the replica's headroom shrinks. Without either field (opt-in in dcgm-exporter's counter list) the "
        "alert cannot fire.",
        "The LLM Cost & GPU dashboard: power against its limit, SM clock, temperature and the throttling panel "
        f"of the replica. `{V.GPU_CLOCK_EVENT.name} == 1` lists the reasons set now; "
        f"`rate({V.GPU_THROTTLE_TIME.name}[5m])` the share of time held down, by cause. On the host, "
        "`nvidia-smi -q -d PERFORMANCE` names the active clock-event reasons.",
        "Power: a draw at the limit under a steady heavy load is how some boards run (the clocks trade "
        "against the cap); raise the power limit (`nvidia-smi -pl`) where the board and the rack allow it, or "
        "size the replicas for the throttled speed. `hw_slowdown` and `hw_power_brake` are signals from the "
        "board or the system (power supply, an external brake): the node needs attention. Thermal: check the "
        "cooling (fans, inlet temperature, airflow, a hot neighbour) and move the replica off the node until "
        "it is fixed.",
    ),
    V.ALERT_GPU_ERRORS: (
        "The driver reported an XID error of the critical list for a GPU of the replica: "
        + "; ".join(f"{code}: {meaning}" for code, meaning in V.GPU_XID_CRITICAL.items())
        + f". `{V.GPU_XID.name}` holds the last XID since the GPU source started: the alert keeps firing "
        "after the GPU was reset, until the source restarts. Other XIDs (a program's own faults) do not fire it.",
        f"`{V.GPU_XID.name}` of the replica names the GPU (`gpu`, `gpu_uuid`, `host`) and the code. On the host, "
        "`journalctl -k | grep -i xid` (or `dmesg`) shows the driver's message and its time; "
        "`nvidia-smi -q -d ECC,ROW_REMAPPER` the memory errors and pending row remaps.",
        "Drain the replica (stop routing to it), then reset the GPU (`nvidia-smi -r`, with no process on it) or "
        "reboot the node. 63 and 64: a reset applies the row remap; replace the board if remapping failed or "
        "errors recur (92 too). 79 (fallen off the bus) and 74 (NVLink): the node needs attention (power, "
        "seating, cabling). Restart the GPU source afterwards so that the XID series, and the alert, clear.",
    ),
}
"""What each GPU alert means, how to confirm it and what to do (the runbook's three parts)."""
