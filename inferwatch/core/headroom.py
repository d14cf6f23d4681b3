"""Headroom: how much more load a replica takes before one of its SLOs breaks (pure, deterministic).

Inputs (:class:`ReplicaWindow`) are window aggregates of one replica (engine, model, instance, role);
``docs/headroom.md`` says which canonical series each comes from. Write ``N`` for the mean running
batch (concurrency), ``N0`` and ``λ0`` for the current ones, ``P`` and ``O`` for the mean prompt and
output tokens per request, ``s`` for the prefill seconds per prompt token, ``q`` for the mean queue wait.

1. TPOT in the batch: ``TPOT(N) = a + b N``, fitted by least squares on the engine's own history
   (:mod:`inferwatch.core.headroom_fit`); ``T0 = TPOT(N0)``.
2. TTFT in the batch: ``TTFT(N) = q TPOT(N) / T0 + P s + b (N - N0)``. Below the concurrency cap the
   queue wait is the rest of the step in flight, which grows like a step; the prompt's own prefill step
   grows by ``b`` per extra running request. Above the engine's cap (``max_concurrency``) a queue forms
   and grows without bound, so the TTFT limit is at most the cap.
3. E2E: ``TTFT(N) + (O - 1) TPOT(N)``.
4. An SLO ``(metric, quantile, threshold)`` breaks where the modelled mean reaches
   ``threshold / r``, ``r`` being the measured quantile-to-mean ratio of that metric (``1`` when it is
   not given, noted). Each latency is affine in ``N``, so the breaking concurrency is closed form.
5. KV cache: each running request holds ``h = kv_usage x capacity / N0`` tokens; with ``N`` requests
   running, their number fluctuates like a Poisson count (standard deviation ``sqrt(N)``), so the first
   preemption comes where ``h (N + z sqrt(N)) = capacity`` (``z`` = 2 by default).
6. Concurrency to rate by Little's law: ``g(N) = N / (TTFT(N) + (O - 1) TPOT(N))``, anchored on the
   measured rate: ``λ(N) = λ0 g(N) / g(N0)`` (systematic errors of the curves cancel at the anchor).
7. Capacity = the limit with the lowest rate (``limiting_slo``); ``headroom_ratio = λ(limit) / λ0``;
   per model, ``replicas_needed = ceil(total rate / mean capacity per replica)``.

Whatever the inputs cannot support is ``None`` with a reason, never a guess: no traffic, a refused
fit, no KV capacity (the KV limit alone is then unknown), a metric the model does not cover.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from inferwatch.core import vocabulary as V
from inferwatch.core.headroom_fit import BatchPoint, FitSettings, LinearFit, fit_tpot

__all__ = [
    "KV_LIMIT",
    "BatchPoint",
    "FitSettings",
    "HeadroomSettings",
    "Limit",
    "LinearFit",
    "QuantileRatio",
    "ReplicaHeadroom",
    "ReplicaKey",
    "ReplicaWindow",
    "ReplicasNeeded",
    "SLOTarget",
    "fit_tpot",
    "headroom",
    "replicas_needed",
]

KV_LIMIT = "kv_cache"
"""``limiting_slo`` when the KV cache runs out (the first preemption) before any SLO breaks."""
TTFT = V.TIME_TO_FIRST_TOKEN.key
TPOT = V.TIME_PER_OUTPUT_TOKEN.key
E2E = V.REQUEST_DURATION.key
MODELLED = (TTFT, TPOT, E2E)
_EPSILON = 1e-9


@dataclass(frozen=True, order=True)
class ReplicaKey:
    engine: str
    model: str
    instance: str
    role: str = V.ROLE_UNIFIED


@dataclass(frozen=True)
class SLOTarget:
    """One latency SLO of the replica: its name, metric key, quantile (objective / 100) and threshold."""

    name: str
    metric: str
    quantile: float
    threshold_seconds: float


@dataclass(frozen=True)
class QuantileRatio:
    """The measured ``quantile`` of ``metric`` over its mean, in the window (e.g. TPOT p99 / mean TPOT)."""

    metric: str
    quantile: float
    ratio: float


@dataclass(frozen=True)
class ReplicaWindow:
    """One replica's aggregates over the window (``None``: not measured)."""

    key: ReplicaKey
    slos: tuple[SLOTarget, ...]
    request_rate: float | None = None
    running_mean: float | None = None
    """the mean number of requests in service (Little's law: end-to-end minus queue seconds per second,
    else the running gauge's mean)."""
    running_gauge_mean: float | None = None
    """the running gauge's mean, sampled when the KV usage is (between engine steps): their ratio is the KV
    held per running request (``None``: ``running_mean``)."""
    waiting_growth_per_second: float | None = None
    prompt_tokens_mean: float | None = None
    output_tokens_mean: float | None = None
    queue_seconds_mean: float | None = None
    prefill_seconds_per_token: float | None = None
    tpot_points: tuple[BatchPoint, ...] = ()
    kv_usage_mean: float | None = None
    kv_capacity_tokens: float | None = None
    max_concurrency: float | None = None
    quantile_ratios: tuple[QuantileRatio, ...] = ()
    residence_seconds_mean: float | None = None
    """mean seconds a finished request spent in service (end to end minus queue): the residence time when
    the engine has no TTFT curve (TGI)."""


@dataclass(frozen=True)
class HeadroomSettings:
    fit: FitSettings = field(default_factory=FitSettings)
    kv_fluctuation_z: float = 3.0
    """standard deviations of the running count kept free in the KV cache (0: the mean fills it)."""
    min_running: float = 0.05
    """below this mean running batch the replica has no traffic to learn from."""


@dataclass(frozen=True)
class Limit:
    """Where one SLO (or the KV cache) breaks, or why that is unknown."""

    slo: str
    metric: str
    concurrency: float | None
    requests_per_second: float | None
    reason: str | None = None


@dataclass(frozen=True)
class ReplicaHeadroom:
    key: ReplicaKey
    current_requests_per_second: float | None
    current_concurrency: float | None
    limits: tuple[Limit, ...]
    limiting_slo: str | None
    capacity_concurrency: float | None
    capacity_requests_per_second: float | None
    headroom_ratio: float | None
    fit: LinearFit | None
    reason: str | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReplicasNeeded:
    model: str
    role: str
    replicas: int
    requests_per_second: float
    capacity_requests_per_second: float | None
    """mean capacity of the replicas whose capacity is known."""
    replicas_needed: int | None
    reason: str | None = None


@dataclass(frozen=True)
class _Affine:
    """``intercept + slope x N``."""

    intercept: float
    slope: float

    def at(self, n: float) -> float:
        return self.intercept + self.slope * n

    def __add__(self, other: _Affine) -> _Affine:
        return _Affine(self.intercept + other.intercept, self.slope + other.slope)

    def scaled(self, k: float) -> _Affine:
        return _Affine(self.intercept * k, self.slope * k)

    def reaches(self, target: float) -> float | None:
        """The ``N >= 0`` where it reaches ``target`` (0 when it already does; ``None`` when it never does)."""
        if self.intercept >= target:
            return 0.0
        if self.slope <= 0:
            return None
        return (target - self.intercept) / self.slope


@dataclass(frozen=True)
class _Curves:
    """The fitted latency curves of one replica, anchored on its current load."""

    tpot: _Affine
    ttft: _Affine | None
    outputs: float
    n0: float
    rate0: float
    role: str
    first_token: float | None = None
    """without a TTFT curve: the measured residence minus its decode part, held constant (a prefill and
    queue share that does not grow with the batch: optimistic, noted)."""

    def latency(self, metric: str) -> _Affine | None:
        if metric == TPOT:
            return self.tpot
        if self.ttft is None:
            return None
        if metric == TTFT:
            return self.ttft
        return self.ttft + self.tpot.scaled(max(self.outputs - 1, 0.0))

    def residence(self, n: float) -> float | None:
        """Seconds a request spends in the replica at batch ``n`` (Little's law's W)."""
        decode = max(self.outputs - 1, 0.0) * self.tpot.at(n)
        if self.role == V.ROLE_DECODE:
            return decode
        if self.ttft is None:
            if self.first_token is None or self.role != V.ROLE_UNIFIED:
                return None
            return self.first_token + decode
        return self.ttft.at(n) + (0.0 if self.role == V.ROLE_PREFILL else decode)

    def rate(self, n: float) -> float | None:
        """Requests per second at batch ``n``: ``λ0 g(n) / g(N0)`` with ``g(n) = n / W(n)``."""
        if n <= 0:
            return 0.0
        w, w0 = self.residence(n), self.residence(self.n0)
        if w is None or w0 is None or w <= 0 or w0 <= 0:
            return None
        return self.rate0 * (n / w) / (self.n0 / w0)


def _load(window: ReplicaWindow, settings: HeadroomSettings) -> tuple[float, float, float] | str:
    """The served rate, the arrival rate (served + queue growth) and the batch, or why there is no traffic."""
    rate, running = window.request_rate, window.running_mean
    if rate is None or running is None:
        return "no request rate or running batch in the window"
    if rate <= 0 or running < settings.min_running:
        return "no traffic in the window"
    return rate, rate + max(window.waiting_growth_per_second or 0.0, 0.0), running


def _ttft_curve(window: ReplicaWindow, fit: LinearFit, n0: float) -> _Affine | str:
    """``TTFT(N) = q TPOT(N) / T0 + P s + b (N - N0)``, or why it is unknown."""
    assert fit.intercept is not None and fit.slope is not None
    a, b = fit.intercept, fit.slope
    q, p, s = window.queue_seconds_mean, window.prompt_tokens_mean, window.prefill_seconds_per_token
    if q is None or p is None or s is None:
        return "needs the mean queue wait, the mean prompt length and the prefill time per prompt token"
    t0 = a + b * n0
    if t0 <= 0:
        return "the fitted TPOT at the current batch is not positive"
    return _Affine(q * a / t0 + p * s - b * n0, q * b / t0 + b)


def _curves(window: ReplicaWindow, fit: LinearFit, rate0: float, n0: float) -> tuple[_Curves | None, str | None]:
    if not fit.ok or fit.intercept is None or fit.slope is None:
        return None, f"no TPOT fit: {fit.reason}"
    if window.output_tokens_mean is None:
        return None, "no mean output length in the window"
    ttft = _ttft_curve(window, fit, n0)
    first_token = None
    if isinstance(ttft, str) and window.residence_seconds_mean is not None:
        decode0 = max(window.output_tokens_mean - 1, 0.0) * fit.at(n0)
        first_token = max(window.residence_seconds_mean - decode0, 0.0)
    curves = _Curves(
        tpot=_Affine(fit.intercept, fit.slope),
        ttft=ttft if isinstance(ttft, _Affine) else None,
        outputs=window.output_tokens_mean,
        n0=n0,
        rate0=rate0,
        role=window.key.role,
        first_token=first_token,
    )
    return curves, ttft if isinstance(ttft, str) else None


def _ratio(window: ReplicaWindow, slo: SLOTarget) -> float | None:
    for r in window.quantile_ratios:
        if r.metric == slo.metric and math.isclose(r.quantile, slo.quantile) and r.ratio > 0:
            return r.ratio
    return None


def _not_served(slo: SLOTarget, role: str) -> str | None:
    if role == V.ROLE_PREFILL and slo.metric != TTFT:
        return f"a {role} replica does not decode; {slo.metric} is its decode replicas' limit"
    if role == V.ROLE_DECODE and slo.metric != TPOT:
        return f"a {role} replica does not prefill; {slo.metric} is its prefill replicas' limit"
    return None


def _slo_concurrency(
    window: ReplicaWindow, slo: SLOTarget, curves: _Curves | None, why: str | None
) -> tuple[float | None, str | None]:
    """The batch at which ``slo`` breaks, or why it is unknown."""
    if slo.metric not in MODELLED:
        return None, f"the headroom model does not cover {slo.metric}"
    role_reason = _not_served(slo, window.key.role)
    if role_reason is not None:
        return None, role_reason
    curve = curves.latency(slo.metric) if curves is not None else None
    if curve is None:
        return None, why or "unknown"
    n = curve.reaches(slo.threshold_seconds / (_ratio(window, slo) or 1.0))
    cap = window.max_concurrency if slo.metric != TPOT else None
    # an engine's "max concurrency" is not always its batch cap (vLLM's is the KV cache's room for
    # full-length requests): one the replica already runs above is not a cap
    if cap is not None and cap > 0 and curves is not None and cap >= curves.n0:
        n = cap if n is None else min(n, cap)
    if n is None:
        return None, f"{slo.metric} does not grow with the batch and the engine reveals no concurrency cap"
    return n, None


def _kv_concurrency(
    window: ReplicaWindow, n0: float, z: float, curves: _Curves | None
) -> tuple[float | None, str | None]:
    """``N`` where the held KV, ``h (N + z sqrt(D N))``, fills the capacity, or why it is unknown.

    ``D`` is the running count's variance over its mean. A Poisson count has ``D = 1``; here each extra
    running request lengthens every request's stay, so a fluctuation decays more slowly and the count
    strays further: ``D = 1 / (1 - e)``, ``e`` being the elasticity of the residence time in the batch,
    ``N R'(N) / R(N) = b N / (a + b N)`` with the residence curve ``R = a + b N``. Then
    ``D = 1 + (b / a) N``, and the condition is a quadratic in ``N``:
    ``(1 - z^2 b / a) N^2 - (2 Q + z^2) N + Q^2 = 0`` with ``Q = capacity / h``."""
    capacity, usage = window.kv_capacity_tokens, window.kv_usage_mean
    if capacity is None or capacity <= 0:
        return None, "the engine does not expose its KV cache capacity"
    if usage is None or usage <= 0:
        return None, "no KV cache usage in the window"
    held = usage * capacity / (window.running_gauge_mean or n0)
    q = capacity / held
    growth = 0.0
    if curves is not None:
        r0, r1 = curves.residence(0.0), curves.residence(1.0)
        if r0 is not None and r1 is not None and r0 > 0:
            growth = max(r1 - r0, 0.0) / r0
    a, b, c = 1 - z * z * growth, 2 * q + z * z, q * q
    return 2 * c / (b + math.sqrt(b * b - 4 * a * c)), None  # the smaller root, stable for any a


def _limit(
    slo: str, metric: str, found: tuple[float | None, str | None], curves: _Curves | None, why: str | None
) -> Limit:
    n, reason = found
    if n is None:
        return Limit(slo, metric, None, None, reason)
    rate = curves.rate(n) if curves is not None else None
    if rate is None:
        return Limit(slo, metric, n, None, why or "the request rate at that batch is unknown")
    return Limit(slo, metric, n, rate)


def _notes(window: ReplicaWindow, curves: _Curves | None) -> tuple[str, ...]:
    missing: dict[float, list[str]] = {}
    for s in window.slos:
        if s.metric in MODELLED and _ratio(window, s) is None and _not_served(s, window.key.role) is None:
            metrics = missing.setdefault(s.quantile, [])
            if s.metric not in metrics:
                metrics.append(s.metric)
    notes = []
    for quantile, metrics in missing.items():
        held = "its mean is held to the threshold" if len(metrics) == 1 else "their means are held to the thresholds"
        notes.append(f"no {quantile:g}-quantile-to-mean ratio of {', '.join(metrics)}: {held} (optimistic)")
    if curves is not None and curves.ttft is None and curves.first_token is not None:
        notes.append(
            "no TTFT curve: the time before the first token is the measured residence's non-decode part, "
            "held constant as the batch grows (optimistic)"
        )
    if curves is not None:
        w0 = curves.residence(curves.n0)
        if w0 is not None and w0 > 0:
            implied = curves.n0 / w0
            if not 0.5 <= implied / curves.rate0 <= 2:
                notes.append(
                    f"Little's law disagrees with the measured rate by {implied / curves.rate0:.2f}x: "
                    "the latency curves may not describe this replica"
                )
    return tuple(notes)


def _unknown(window: ReplicaWindow, reason: str, fit: LinearFit | None) -> ReplicaHeadroom:
    limits = tuple(Limit(s.name, s.metric, None, None, reason) for s in window.slos)
    kv = Limit(KV_LIMIT, KV_LIMIT, None, None, reason)
    return ReplicaHeadroom(window.key, None, None, (*limits, kv), None, None, None, None, fit, reason=reason)


def headroom(window: ReplicaWindow, settings: HeadroomSettings = HeadroomSettings()) -> ReplicaHeadroom:
    """The replica's limits, the one reached first, its capacity and its headroom (see the module docstring)."""
    load = _load(window, settings)
    fit = fit_tpot(window.tpot_points, settings.fit) if window.tpot_points else None
    if isinstance(load, str):
        return _unknown(window, load, fit)
    served, arrivals, n0 = load
    fit = fit or fit_tpot((), settings.fit)
    curves, why = _curves(window, fit, served, n0)
    limits = [_limit(s.name, s.metric, _slo_concurrency(window, s, curves, why), curves, why) for s in window.slos]
    limits.append(
        _limit(KV_LIMIT, KV_LIMIT, _kv_concurrency(window, n0, settings.kv_fluctuation_z, curves), curves, why)
    )
    known = [lim for lim in limits if lim.requests_per_second is not None]
    notes = _notes(window, curves)
    if not known:
        reasons = sorted({lim.reason or "" for lim in limits})
        return ReplicaHeadroom(
            window.key, arrivals, n0, tuple(limits), None, None, None, None, fit, "; ".join(reasons), notes
        )
    first = min(known, key=lambda lim: lim.requests_per_second or 0.0)
    capacity = first.requests_per_second or 0.0
    other_role = {s.name for s in window.slos if _not_served(s, window.key.role) is not None}
    unknown = [lim.slo for lim in limits if lim.requests_per_second is None and lim.slo not in other_role]
    if unknown:
        notes = (*notes, f"capacity leaves out the unknown limits: {', '.join(unknown)}")
    return ReplicaHeadroom(
        window.key,
        arrivals,
        n0,
        tuple(limits),
        first.slo,
        first.concurrency,
        capacity,
        capacity / arrivals,
        fit,
        None,
        notes,
    )


def _group(results: Iterable[ReplicaHeadroom]) -> dict[tuple[str, str], list[ReplicaHeadroom]]:
    groups: dict[tuple[str, str], list[ReplicaHeadroom]] = {}
    for r in sorted(results, key=lambda r: r.key):
        groups.setdefault((r.key.model, r.key.role), []).append(r)
    return groups


def _needed(model: str, role: str, replicas: Sequence[ReplicaHeadroom]) -> ReplicasNeeded:
    total = math.fsum(r.current_requests_per_second or 0.0 for r in replicas)
    capacities = [r.capacity_requests_per_second for r in replicas if r.capacity_requests_per_second is not None]
    if not capacities:
        return ReplicasNeeded(
            model, role, len(replicas), total, None, None, f"no replica of {model} ({role}) has a known capacity"
        )
    per = math.fsum(capacities) / len(capacities)
    if per <= 0:
        reason = "the capacity is zero: the SLO breaks at any load"
        return ReplicasNeeded(model, role, len(replicas), total, per, None, reason)
    return ReplicasNeeded(model, role, len(replicas), total, per, max(1, math.ceil(total / per - _EPSILON)))


def replicas_needed(results: Iterable[ReplicaHeadroom]) -> tuple[ReplicasNeeded, ...]:
    """Per model (and role): replicas of the mean known capacity that carry the model's total current load."""
    return tuple(_needed(model, role, group) for (model, role), group in _group(results).items())
