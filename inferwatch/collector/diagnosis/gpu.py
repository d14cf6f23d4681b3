"""The GPU's word in the diagnosis (pure: no I/O).

The GPUs beneath a replica (``llm_gpu_*``, joined to it by the exporter) give two findings of their own and
tell apart the causes of two engine symptoms (:mod:`inferwatch.core.causes`):

- ``gpu_throttled``: the share of the window a GPU held its clocks down (its most frequent throttling
  clock-event reason, or its throttle time), which GPU, power or thermal, for how long. Unknown when the
  source exports neither family (both are opt-in in dcgm-exporter), never guessed from the clock.
- ``gpu_errors``: the XID codes seen, on which GPU; critical for a code of ``V.GPU_XID_CRITICAL``.
- ``throughput_low``: a throttled GPU, a GPU idle while requests wait, or (the catalogue's own cause) a
  KV cache full on a busy GPU, tried in that order: throttling slows every step whatever else holds, an
  idle GPU means the batch is not what limits, and only then is the full cache the limit.
- ``tpot_slow``: a throttled GPU, a GPU idle between steps, a decode bound by memory bandwidth, or small
  batches with kernel overhead; the catalogue's remedies (the model is too big) stay the main ones.

Without GPU series the GPU findings are unknown and the two engine symptoms keep the catalogue's cause,
saying the GPU evidence is missing and how to add it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from inferwatch.collector.diagnosis import dcgm
from inferwatch.collector.diagnosis.evidence import Judgement, evidence, fmt, reading
from inferwatch.collector.diagnosis.report import Evidence
from inferwatch.collector.diagnosis.signals import GpuReading, Observation, TargetSignals
from inferwatch.core import vocabulary as V
from inferwatch.core.causes import (
    GPU_THRESHOLDS,
    GPU_THROTTLE_READING,
    GPU_THROTTLE_TIME_READING,
    GPU_XID_READING,
    Cause,
    GpuThresholds,
    cause,
    remedies,
    xid_meaning,
)
from inferwatch.core.symptoms import SIGNALS, Gate, Remedy, Signal, Status, Symptom, SymptomSpec, Threshold

MAX_READINGS = 8
"""per-GPU readings shown as evidence of one finding (the worst first)."""


@dataclass(frozen=True)
class Context:
    """What a GPU-aware judgement is given by the evaluation."""

    spec: SymptomSpec
    threshold: Threshold
    target: TargetSignals
    window_seconds: float
    unknown: str | None
    """why the catalogue's own signals cannot judge the symptom (``None``: they can)."""
    gates: tuple[tuple[Gate, bool | None, Evidence | None], ...]
    """each gate of the symptom, whether it holds (``None``: unknown), and its evidence."""
    thresholds: Callable[[Symptom], Threshold]
    """another symptom's threshold, overrides applied (throughput_low reads gpu_throttled's)."""
    gpu: GpuThresholds = GPU_THRESHOLDS


# -- the per-target GPU signals ------------------------------------------------------------------------------
def has_gpus(target: TargetSignals) -> bool:
    obs = target.get(Signal.GPU_COUNT)
    return obs is not None and obs.value > 0


def activity(target: TargetSignals, gpu: GpuThresholds = GPU_THRESHOLDS) -> tuple[Signal, Observation, float] | None:
    """The GPU's activity: engine activity (DCGM profiling) or, without it, NVML's utilisation; with the
    level at which it counts as saturated."""
    for signal, busy in (
        (Signal.GPU_ENGINE_ACTIVE, gpu.busy_activity),
        (Signal.GPU_UTILIZATION, gpu.busy_utilization),
    ):
        obs = target.get(signal)
        if obs is not None:
            return signal, obs, busy
    return None


def summarise(target: TargetSignals, *, throttle_query: str, xid_query: str) -> None:
    """The per-target figures of the per-GPU readings: the throttled share of the window (present when the
    source exports clock-event reasons or throttle time) and the GPUs with an XID (present with GPUs)."""
    readings = target.gpus
    shares = [r.value for r in readings.clock_events] + [min(r.value, 1.0) for r in readings.throttle_time]
    if shares:
        target.put(Signal.GPU_THROTTLED_SHARE, max(shares), throttle_query)
    if has_gpus(target) or readings.xids:
        critical = {r.gpu for r in readings.xids if r.what in V.GPU_XID_CRITICAL}
        other = {r.gpu for r in readings.xids if r.what not in V.GPU_XID_CRITICAL} - critical
        target.put(Signal.GPU_XID_CRITICAL, float(len(critical)), xid_query)
        target.put(Signal.GPU_XID_OTHER, float(len(other)), xid_query)


def _throttle_of(item: GpuReading, from_events: bool) -> tuple[str, str]:
    """(cause, what held it): ``("power", "power_cap")`` from a clock-event reason, ``("thermal", "throttle
    time")`` from the violation counters."""
    if from_events:
        return V.GPU_THROTTLE_CAUSES.get(item.what, item.what), item.what
    return item.what, "throttle time"


def _throttle_readings(target: TargetSignals) -> list[tuple[GpuReading, str, str]]:
    """Every per-GPU throttle reading with its cause, the worst first."""
    out = [(r, *_throttle_of(r, True)) for r in target.gpus.clock_events]
    out += [(r, *_throttle_of(r, False)) for r in target.gpus.throttle_time]
    return sorted(out, key=lambda x: (-min(x[0].value, 1.0), x[0].gpu, x[2]))


def _throttle_evidence(target: TargetSignals) -> list[Evidence | None]:
    shown = [x for x in _throttle_readings(target) if x[0].value > 0][:MAX_READINGS]
    return [
        reading(GPU_THROTTLE_READING, f"{cause} ({what}): share of the window", r, "ratio")
        if what != "throttle time"
        else reading(GPU_THROTTLE_TIME_READING, f"{cause}: throttled seconds per second", r, "ratio")
        for r, cause, what in shown
    ]


def _limit(threshold: Threshold, status: Status) -> float:
    return threshold.critical if status is Status.CRITICAL else threshold.warning


def _window(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


# -- gpu_throttled ------------------------------------------------------------------------------------------
def _throttled(ctx: Context) -> Judgement:
    t = ctx.target
    if not has_gpus(t):
        return Judgement(Status.UNKNOWN, reason=dcgm.NO_GPU)
    share = t.get(Signal.GPU_THROTTLED_SHARE)
    if share is None:
        return Judgement(Status.UNKNOWN, reason=dcgm.CANNOT_TELL_THROTTLE)
    status = ctx.threshold.status(share.value)
    worst = _throttle_readings(t)
    item, why, what = worst[0] if worst else (None, "", "")
    gpus = sorted({r.gpu for r, _, _ in worst if r.value > ctx.threshold.warning})

    def summary(final: Status) -> str:
        held = min(share.value, 1.0) * ctx.window_seconds
        where = item.gpu if item is not None else "a GPU of the replica"
        return (
            f"{ctx.spec.title}: {where} throttled by {why} ({what}) {fmt(share.value, 'ratio')} of the window, "
            f"about {_window(held)} (> {fmt(_limit(ctx.threshold, final), 'ratio')})"
        )

    def shown(final: Status) -> list[Evidence | None]:
        head = evidence(t, Signal.GPU_THROTTLED_SHARE, f"> {_limit(ctx.threshold, final):g}")
        return [head, *_throttle_evidence(t), *(evidence(t, s, None) for s in ctx.spec.evidence)]

    return Judgement(
        status,
        summary=summary,
        evidence=shown,
        cause=f"{ctx.spec.cause} (here: {why}, on {', '.join(gpus) or 'a GPU of the replica'})",
        remedies=_cause_first(ctx.spec.remedies, why),
    )


def _cause_first(remedies: tuple[Remedy, ...], why: str) -> tuple[Remedy, ...]:
    """The throttle remedies with the one for this cause first (they start ``power:`` and ``thermal:``)."""
    first = [r for r in remedies if r.text.startswith(why + ":")]
    return (*first, *(r for r in remedies if r not in first))


# -- gpu_errors ---------------------------------------------------------------------------------------------
def _errors(ctx: Context) -> Judgement:
    t = ctx.target
    critical, other = t.get(Signal.GPU_XID_CRITICAL), t.get(Signal.GPU_XID_OTHER)
    if critical is None or other is None:
        return Judgement(Status.UNKNOWN, reason=dcgm.NO_GPU)
    status = ctx.threshold.status(critical.value)
    if status is Status.OK and other.value > 0:
        status = Status.WARNING
    seen = sorted(t.gpus.xids, key=lambda r: (r.what not in V.GPU_XID_CRITICAL, r.gpu, r.what))

    def words(r: GpuReading) -> str:
        mark = "critical: " if r.what in V.GPU_XID_CRITICAL else ""
        return f"XID {r.what} ({mark}{xid_meaning(r.what)})"

    def summary(final: Status) -> str:
        listed = "; ".join(f"{r.gpu} {words(r)}" for r in seen[:3])
        more = f"; and {len(seen) - 3} more" if len(seen) > 3 else ""
        return f"{ctx.spec.title}: {listed}{more}"

    def shown(final: Status) -> list[Evidence | None]:
        head = evidence(t, Signal.GPU_XID_CRITICAL, f"> {ctx.threshold.critical:g}")
        per_gpu = [reading(GPU_XID_READING, words(r), r, "") for r in seen[:MAX_READINGS]]
        return [head, *per_gpu, *(evidence(t, s, None) for s in ctx.spec.evidence)]

    return Judgement(status, summary=summary, evidence=shown, cause=ctx.spec.cause, remedies=ctx.spec.remedies)


# -- throughput_low -----------------------------------------------------------------------------------------
def _throughput(ctx: Context) -> Judgement:
    t, g = ctx.target, ctx.gpu
    kv, share, act = t.get(Signal.KV_USAGE), t.get(Signal.GPU_THROTTLED_SHARE), activity(t, g)
    gate_unknown = any(held is None for _, held, _ in ctx.gates)
    if ctx.unknown is not None and (gate_unknown or (act is None and share is None)):
        return Judgement(Status.UNKNOWN, reason=ctx.unknown)
    if any(held is False for _, held, _ in ctx.gates):
        return Judgement(Status.OK)
    gates = [ev for _, _, ev in ctx.gates]
    waiting = t.get(Signal.WAITING)
    waits = f"{waiting.value:.3g} requests wait" if waiting is not None else "requests wait"
    engine = [Signal.RUNNING, Signal.MAX_CONCURRENCY, Signal.KV_USAGE, Signal.GENERATION_RATE, Signal.KV_CAPACITY]
    gpu_signals = [Signal.GPU_ENGINE_ACTIVE, Signal.GPU_UTILIZATION, Signal.GPU_THROTTLED_SHARE, Signal.GPU_COUNT]
    tail = [evidence(t, s, None) for s in (*engine, *gpu_signals)]
    throttled = ctx.thresholds(Symptom.GPU_THROTTLED)

    if share is not None and share.value > throttled.warning:
        spec = cause(Symptom.THROUGHPUT_LOW, Cause.GPU_THROTTLED)
        worst = _throttle_readings(t)
        where, why = (worst[0][0].gpu, worst[0][1]) if worst else ("a GPU of the replica", "")

        def throttle_summary(final: Status) -> str:
            limit = fmt(_limit(throttled, final), "ratio")
            return (
                f"{ctx.spec.title}: {where} was throttled ({why}) {fmt(share.value, 'ratio')} of the window "
                f"(> {limit}) while {waits}"
            )

        def throttle_evidence(final: Status) -> list[Evidence | None]:
            head = evidence(t, Signal.GPU_THROTTLED_SHARE, f"> {_limit(throttled, final):g}")
            return [head, *_throttle_evidence(t), *gates, *tail]

        return Judgement(
            throttled.status(share.value),
            summary=throttle_summary,
            evidence=throttle_evidence,
            cause=spec.cause,
            remedies=_cause_first(remedies(spec), why),
            likely_cause=spec.id,
        )

    if act is not None and act[1].value < g.idle_activity:
        signal, obs, _ = act
        spec = cause(Symptom.THROUGHPUT_LOW, Cause.OUTSIDE_GPU)
        status = Status.CRITICAL if obs.value < g.idle_critical else Status.WARNING

        def idle_limit(final: Status) -> float:
            return g.idle_critical if final is Status.CRITICAL else g.idle_activity

        def idle_summary(final: Status) -> str:
            return (
                f"{ctx.spec.title}: {SIGNALS[signal].description} {fmt(obs.value, 'ratio')} < "
                f"{fmt(idle_limit(final), 'ratio')} while {waits}: the bottleneck is outside the GPU"
            )

        def idle_evidence(final: Status) -> list[Evidence | None]:
            return [evidence(t, signal, f"< {idle_limit(final):g}"), *gates, *tail]

        return Judgement(
            status,
            summary=idle_summary,
            evidence=idle_evidence,
            cause=spec.cause,
            remedies=remedies(spec),
            likely_cause=spec.id,
        )

    if kv is None:
        return Judgement(
            Status.UNKNOWN, reason=ctx.unknown or f"no data in the window for {SIGNALS[Signal.KV_USAGE].description}"
        )
    spec = cause(Symptom.THROUGHPUT_LOW, Cause.GPU_SATURATED)
    seen = act is not None or share is not None
    busy = ""
    if act is not None:
        signal, obs, level = act
        saturated = obs.value >= level
        busy = (
            f"; the GPU is saturated too ({SIGNALS[signal].description} {fmt(obs.value, 'ratio')})"
            if saturated
            else f"; {SIGNALS[signal].description} {fmt(obs.value, 'ratio')}: memory, not compute, caps the batch"
        )

    def full_summary(final: Status) -> str:
        limit = fmt(_limit(ctx.threshold, final), "ratio")
        return f"{ctx.spec.title}: {SIGNALS[Signal.KV_USAGE].description} {fmt(kv.value, 'ratio')} > {limit}{busy}"

    def full_evidence(final: Status) -> list[Evidence | None]:
        head = evidence(t, Signal.KV_USAGE, f"> {_limit(ctx.threshold, final):g}")
        level = [evidence(t, act[0], f">= {act[2]:g} (saturated)" if act[1].value >= act[2] else None)] if act else []
        return [head, *gates, *level, *tail]

    return Judgement(
        ctx.threshold.status(kv.value),
        summary=full_summary,
        evidence=full_evidence,
        cause=spec.cause if seen else f"{ctx.spec.cause}; {dcgm.NO_GPU_EVIDENCE}",
        remedies=remedies(spec),
        likely_cause=spec.id if seen else None,
    )


# -- tpot_slow ----------------------------------------------------------------------------------------------
def refine_tpot(
    judged: Judgement,
    target: TargetSignals,
    thresholds: Callable[[Symptom], Threshold],
    g: GpuThresholds = GPU_THRESHOLDS,
) -> Judgement:
    """A slow-token finding with the GPU's word on how the decode is bound (its likely cause and remedies)."""
    if judged.status not in (Status.WARNING, Status.CRITICAL):
        return judged
    share, act = target.get(Signal.GPU_THROTTLED_SHARE), activity(target, g)
    dram, tensor, sm = (target.get(s) for s in (Signal.GPU_DRAM_ACTIVE, Signal.GPU_TENSOR_ACTIVE, Signal.GPU_SM_ACTIVE))
    judged.extra = [
        evidence(target, s, None)
        for s in (
            Signal.GPU_DRAM_ACTIVE,
            Signal.GPU_TENSOR_ACTIVE,
            Signal.GPU_SM_ACTIVE,
            Signal.GPU_ENGINE_ACTIVE,
            Signal.GPU_UTILIZATION,
            Signal.GPU_THROTTLED_SHARE,
            Signal.GPU_SM_CLOCK,
        )
    ]
    found: Cause | None = None
    if share is not None and share.value > thresholds(Symptom.GPU_THROTTLED).warning:
        found = Cause.GPU_THROTTLED
    elif act is not None and act[1].value < g.idle_activity:
        found = Cause.OUTSIDE_GPU
    elif dram is not None and tensor is not None and dram.value >= g.dram_bound and tensor.value < dram.value:
        found = Cause.MEMORY_BANDWIDTH
    elif act is not None and dram is not None and tensor is not None:
        low = [obs.value < g.low_activity for obs in (dram, tensor, sm) if obs is not None]
        if all(low):
            found = Cause.SMALL_BATCHES
    if found is None:
        if act is None and share is None:
            judged.cause = f"{judged.cause}; {dcgm.NO_GPU_EVIDENCE}"
        elif dram is None or tensor is None:
            judged.cause = f"{judged.cause}; {dcgm.NO_PROFILING}"
        return judged
    spec = cause(Symptom.TPOT_SLOW, found)
    judged.cause = spec.cause
    judged.remedies = remedies(spec)
    if found is Cause.GPU_THROTTLED:
        worst = _throttle_readings(target)
        judged.remedies = _cause_first(judged.remedies, worst[0][1] if worst else "")
    judged.likely_cause = found
    return judged


JUDGES: dict[Symptom, Callable[[Context], Judgement]] = {
    Symptom.GPU_THROTTLED: _throttled,
    Symptom.GPU_ERRORS: _errors,
    Symptom.THROUGHPUT_LOW: _throughput,
}
"""The symptoms the GPU judges (the others are judged from the catalogue's threshold and gates)."""
