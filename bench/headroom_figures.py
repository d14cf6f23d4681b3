"""The pure half of ``bench/headroom.py``: one load step's figures, the knee, the peers' triggers, the errors.

Everything here reads :class:`~inferwatch.core.headroom_inputs.Snapshot` lists (the canonical pages the
exporter served, scraped during one load step) and does no I/O, so ``tests/test_bench_headroom.py`` runs it
on synthetic snapshots.

- A step's TTFT p99 and TPOT p99 are ``histogram_quantile(0.99, …)`` of the engine's own canonical
  histograms' bucket increases over the step (what the SLO reads), its preemptions the increase of
  the canonical preemption counter (or, for an engine whose dialect does not count them, the simulator's own
  count, marked as such).
- The knee is the first step at which any of the three breaks. Between the last good step and the first
  broken one, a latency crossing is interpolated linearly on that latency's p99; a preemption (a count, not
  a curve) is placed at the bracket's midpoint.
- A peer trigger holds in a step when the queue (or the KV use) reaches its threshold at some scrape of the
  step (``max``: what a KEDA poll at that moment would have seen) or on the step's mean (``mean``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from inferwatch.core import vocabulary as V
from inferwatch.core.headroom import ReplicaKey
from inferwatch.core.headroom_inputs import Snapshot, increase
from inferwatch.core.quantile import histogram_quantile

QUANTILE = 0.99
QUEUE_TRIGGER = 5.0
"""vLLM production-stack's KEDA trigger: vLLM's waiting-requests gauge (the canonical one here) at 5 or more."""
KV_TRIGGER = 0.80
"""llm-d's saturation: KV use at 0.80 or more (or the queue at 5 or more)."""


@dataclass(frozen=True)
class Thresholds:
    """The SLO thresholds the knee is measured against (seconds)."""

    ttft_seconds: float
    tpot_seconds: float


@dataclass(frozen=True)
class StepFigures:
    """One load step, measured over its window."""

    load: float
    """offered load, requests per (simulated) second."""
    served: float | None
    ttft_p99: float | None
    tpot_p99: float | None
    preemptions: float | None
    queue_mean: float | None
    queue_max: float | None
    kv_mean: float | None
    kv_max: float | None

    def broken(self, limits: Thresholds) -> list[str]:
        """What breaks in this step (empty: the SLOs hold)."""
        out = []
        if self.ttft_p99 is not None and self.ttft_p99 > limits.ttft_seconds:
            out.append("ttft")
        if self.tpot_p99 is not None and self.tpot_p99 > limits.tpot_seconds:
            out.append("tpot")
        if self.preemptions is not None and self.preemptions > 0:
            out.append("preemption")
        return out


def _buckets(snaps: Sequence[Snapshot], key: ReplicaKey, name: str) -> list[tuple[float, float]]:
    first = snaps[0].buckets.get((key, name))
    last = snaps[-1].buckets.get((key, name))
    if last is None:
        return []
    base = first or {}
    return sorted((le, last[le] - base.get(le, 0.0)) for le in last)


def _series(snaps: Sequence[Snapshot], key: ReplicaKey, name: str) -> list[float]:
    return [v for v in (s.value(key, name) for s in snaps) if v is not None]


def step_figures(
    load: float, snaps: Sequence[Snapshot], key: ReplicaKey, preemptions: Sequence[float | None]
) -> StepFigures:
    """The step's figures from its snapshots; ``preemptions`` is the preemption counter at each snapshot."""
    span = snaps[-1].at - snaps[0].at
    done = increase([s.value(key, V.REQUESTS.name) for s in snaps])
    queue = _series(snaps, key, V.REQUESTS_WAITING.name)
    kv = _series(snaps, key, V.KV_CACHE_USAGE.name)
    return StepFigures(
        load=load,
        served=done / span if done is not None and span > 0 else None,
        ttft_p99=histogram_quantile(QUANTILE, _buckets(snaps, key, V.TIME_TO_FIRST_TOKEN.name)),
        tpot_p99=histogram_quantile(QUANTILE, _buckets(snaps, key, V.TIME_PER_OUTPUT_TOKEN.name)),
        preemptions=increase(preemptions),
        queue_mean=math.fsum(queue) / len(queue) if queue else None,
        queue_max=max(queue) if queue else None,
        kv_mean=math.fsum(kv) / len(kv) if kv else None,
        kv_max=max(kv) if kv else None,
    )


@dataclass(frozen=True)
class Knee:
    """Where the SLO first broke: the interpolated load, the bracket of steps, and what broke."""

    load: float | None
    below: float | None
    above: float | None
    broken_by: tuple[str, ...]
    reason: str | None = None


def _crossing(lo: float, hi: float, v_lo: float | None, v_hi: float | None, limit: float) -> float:
    if v_lo is None or v_hi is None or v_hi <= v_lo:
        return (lo + hi) / 2
    return lo + (hi - lo) * max(0.0, min(1.0, (limit - v_lo) / (v_hi - v_lo)))


def find_knee(steps: Sequence[StepFigures], limits: Thresholds) -> Knee:
    """The first load at which the SLO breaks (see the module docstring for the interpolation)."""
    ordered = sorted(steps, key=lambda s: s.load)
    for i, step in enumerate(ordered):
        broken = step.broken(limits)
        if not broken:
            continue
        if i == 0:
            return Knee(None, None, step.load, tuple(broken), "the SLO already breaks at the lowest load of the ramp")
        prev = ordered[i - 1]
        candidates = []
        if "ttft" in broken:
            candidates.append(_crossing(prev.load, step.load, prev.ttft_p99, step.ttft_p99, limits.ttft_seconds))
        if "tpot" in broken:
            candidates.append(_crossing(prev.load, step.load, prev.tpot_p99, step.tpot_p99, limits.tpot_seconds))
        if "preemption" in broken:
            candidates.append((prev.load + step.load) / 2)
        return Knee(min(candidates), prev.load, step.load, tuple(broken))
    top = ordered[-1].load if ordered else None
    return Knee(None, top, None, (), "the SLO held over the whole ramp")


@dataclass(frozen=True)
class PeerRule:
    name: str
    holds: Callable[[float | None, float | None], bool]
    """``holds(queue, kv)``."""


def _ge(value: float | None, threshold: float) -> bool:
    return value is not None and value >= threshold


PEERS = (
    PeerRule("production-stack: queue >= 5", lambda q, kv: _ge(q, QUEUE_TRIGGER)),
    PeerRule("llm-d: KV >= 0.80 or queue >= 5", lambda q, kv: _ge(q, QUEUE_TRIGGER) or _ge(kv, KV_TRIGGER)),
)


def first_trigger(steps: Sequence[StepFigures], rule: PeerRule, on: str) -> float | None:
    """The lowest load at which ``rule`` holds on the step's ``max`` or ``mean`` (``None``: never on the ramp)."""
    for step in sorted(steps, key=lambda s: s.load):
        q, kv = (step.queue_max, step.kv_max) if on == "max" else (step.queue_mean, step.kv_mean)
        if rule.holds(q, kv):
            return step.load
    return None


def error(predicted: float | None, measured: float | None) -> float | None:
    """``predicted / measured - 1`` (``None`` when either is unknown)."""
    if predicted is None or measured is None or measured <= 0:
        return None
    return predicted / measured - 1


def within(err: float | None, tolerance: float) -> bool:
    return err is not None and abs(err) <= tolerance + 1e-12
