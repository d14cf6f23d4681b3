"""The headroom model (inferwatch/core/headroom.py) pinned on synthetic replicas whose answers are computed by
hand, every "unknown" path with its reason, and a first check against the shared serving model in virtual time.

The hand-computed engine: ``TPOT(N) = 0.01 + 0.001 N`` s, 11 output tokens per request, no queue wait and a prefill
of ``0.001 N0`` s at the current batch ``N0``, so ``TTFT(N) = 0.001 N`` and a request stays
``W(N) = 0.1 + 0.011 N`` s. Little's law gives ``rate(N) = N / W(N)``; each window's measured rate is that rate.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import statistics
from dataclasses import dataclass, replace

import pytest

from inferwatch.core import vocabulary as V
from inferwatch.core.headroom import (
    KV_LIMIT,
    BatchPoint,
    FitSettings,
    HeadroomSettings,
    Limit,
    QuantileRatio,
    ReplicaHeadroom,
    ReplicaKey,
    ReplicaWindow,
    SLOTarget,
    fit_tpot,
    headroom,
    replicas_needed,
)
from inferwatch.simulator.runtime import lognormal_int
from inferwatch.simulator.scheduler import EngineParams, Sequence, ServingModel

A, B, OUT, PROMPT = 0.01, 0.001, 11.0, 100.0
TTFT = V.TIME_TO_FIRST_TOKEN.key
TPOT = V.TIME_PER_OUTPUT_TOKEN.key
E2E = V.REQUEST_DURATION.key
TPOT_SLO = SLOTarget("tpot-50ms", TPOT, 0.99, 0.05)
TTFT_SLO = SLOTarget("ttft-20ms", TTFT, 0.99, 0.02)
KEY = ReplicaKey(V.ENGINE_VLLM, "m", "replica-0:9400")
NO_KV_MARGIN = HeadroomSettings(kv_fluctuation_z=0.0)


def rate_at(n: float) -> float:
    """Little's law on the hand-computed engine: ``N / (TTFT(N) + (O - 1) TPOT(N))``."""
    return n / (B * n + (OUT - 1) * (A + B * n))


def points(batches: tuple[float, ...] = (2, 4, 6, 8, 10)) -> tuple[BatchPoint, ...]:
    return tuple(BatchPoint(n, A + B * n) for n in batches)


def window(n0: float, *slos: SLOTarget, **changes: object) -> ReplicaWindow:
    """The hand-computed engine at batch ``n0`` (ratio 1 for every quantile: the mean is the quantile)."""
    base = ReplicaWindow(
        key=KEY,
        slos=slos or (TPOT_SLO,),
        request_rate=rate_at(n0),
        running_mean=n0,
        prompt_tokens_mean=PROMPT,
        output_tokens_mean=OUT,
        queue_seconds_mean=0.0,
        prefill_seconds_per_token=B * n0 / PROMPT,
        tpot_points=points(),
        quantile_ratios=tuple(QuantileRatio(m, 0.99, 1.0) for m in (TTFT, TPOT, E2E)),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def limit(result: ReplicaHeadroom, slo: str) -> Limit:
    (found,) = [lim for lim in result.limits if lim.slo == slo]
    return found


# --- the fit ----------------------------------------------------------------------------------------------------


def test_fit_recovers_a_line() -> None:
    fit = fit_tpot(points())
    assert fit.ok and fit.points == 5
    assert fit.intercept == pytest.approx(A) and fit.slope == pytest.approx(B)
    assert fit.at(40) == pytest.approx(0.05)
    assert (fit.batch_min, fit.batch_max) == (2, 10)


def test_fit_drops_idle_and_broken_points() -> None:
    extra = (BatchPoint(0.0, 0.5), BatchPoint(3.0, math.nan), BatchPoint(5.0, 0.0))
    fit = fit_tpot(points() + extra)
    assert fit.points == 5 and fit.slope == pytest.approx(B)


@pytest.mark.parametrize(
    ("history", "reason"),
    [
        (points((2, 4, 6)), "3 TPOT-vs-batch points in the window; the fit needs 4"),
        (points((0.2, 0.4, 0.6, 0.8)), "the running batch only spanned 0.2 to 0.8 requests"),
        (points((10, 10.5, 11, 11.5)), "the running batch only spanned 10 to 11.5 requests"),
        (points((40, 41, 42, 43, 44)), "the running batch only spanned 40 to 44 requests"),
        (tuple(BatchPoint(n, 0.05 - B * n) for n in (2, 4, 6, 8)), "TPOT does not grow with the batch"),
        (
            tuple(BatchPoint(n, t) for n, t in ((2, 0.02), (4, 0.01), (6, 0.03), (8, 0.012), (10, 0.025))),
            "is not told apart from the noise",
        ),
    ],
    ids=[
        "too-few-points",
        "spread-under-one-request",
        "too-little-spread",
        "spread-small-for-the-batch",
        "slope-negative",
        "slope-noise",
    ],
)
def test_fit_refuses_what_it_cannot_support(history: tuple[BatchPoint, ...], reason: str) -> None:
    fit = fit_tpot(history)
    assert not fit.ok and fit.intercept is None and fit.slope is None
    assert fit.reason is not None and reason in fit.reason
    with pytest.raises(ValueError, match="no fit"):
        fit.at(1.0)


def test_fit_settings_decide_the_spread() -> None:
    history = points((10, 10.5, 11, 11.5))
    assert fit_tpot(history, FitSettings(min_batch_spread=1.0, min_relative_spread=0.1)).ok


# --- the limits, by hand ----------------------------------------------------------------------------------------


def test_a_linear_tpot_engine_breaks_where_the_line_meets_the_threshold() -> None:
    # 0.01 + 0.001 N = 0.05  ->  N = 40;  rate(40) = 40 / 0.54
    result = headroom(window(10.0))
    tpot = limit(result, TPOT_SLO.name)
    assert tpot.concurrency == pytest.approx(40.0)
    assert tpot.requests_per_second == pytest.approx(40 / 0.54)
    assert result.limiting_slo == TPOT_SLO.name
    assert result.capacity_concurrency == pytest.approx(40.0)
    assert result.capacity_requests_per_second == pytest.approx(40 / 0.54)
    # current: rate(10) = 10 / 0.21; headroom = (40 / 0.54) / (10 / 0.21) = 8.4 / 5.4
    assert result.current_requests_per_second == pytest.approx(10 / 0.21)
    assert result.headroom_ratio == pytest.approx(8.4 / 5.4)
    assert result.reason is None and result.notes == ("capacity leaves out the unknown limits: kv_cache",)


def test_half_the_limit_reads_two_and_over_the_edge_reads_below_one() -> None:
    # rate(6.25) = 6.25 / 0.16875 is exactly half of rate(40) = 40 / 0.54
    assert headroom(window(6.25)).headroom_ratio == pytest.approx(2.0)
    over = headroom(window(50.0))  # rate(50) = 50 / 0.65 > 40 / 0.54
    assert over.headroom_ratio == pytest.approx((40 / 0.54) / (50 / 0.65))
    assert over.headroom_ratio is not None and over.headroom_ratio < 1


def test_the_quantile_ratio_tightens_the_threshold() -> None:
    # TPOT p99 twice its mean: the mean may reach 0.025 s  ->  N = 15
    ratios = (QuantileRatio(TPOT, 0.99, 2.0),)
    assert limit(headroom(window(10.0, quantile_ratios=ratios)), TPOT_SLO.name).concurrency == pytest.approx(15.0)
    # a ratio measured at another quantile is not this SLO's: the mean is used, and the note says so
    other = headroom(window(10.0, quantile_ratios=(QuantileRatio(TPOT, 0.9, 2.0),)))
    assert limit(other, TPOT_SLO.name).concurrency == pytest.approx(40.0)
    assert any("0.99-quantile-to-mean ratio of time_per_output_token" in n for n in other.notes)


def test_a_ttft_limited_engine() -> None:
    # TTFT(N) = 0.001 N = 0.02  ->  N = 20, before TPOT's 40
    result = headroom(window(10.0, TPOT_SLO, TTFT_SLO))
    assert limit(result, TTFT_SLO.name).concurrency == pytest.approx(20.0)
    assert limit(result, TPOT_SLO.name).concurrency == pytest.approx(40.0)
    assert result.limiting_slo == TTFT_SLO.name
    assert result.capacity_requests_per_second == pytest.approx(20 / 0.32)


def test_the_queue_wait_grows_like_a_step() -> None:
    # q = 0.02 s at N0 = 10 (TPOT 0.02 s), no prefill: TTFT(N) = 0.02 (0.01 + 0.001 N) / 0.02 + 0.001 (N - 10) = 0.002 N
    result = headroom(window(10.0, TTFT_SLO, queue_seconds_mean=0.02, prefill_seconds_per_token=0.0))
    assert limit(result, TTFT_SLO.name).concurrency == pytest.approx(10.0)
    assert result.headroom_ratio == pytest.approx(1.0)


def test_the_concurrency_cap_bounds_ttft_not_tpot() -> None:
    result = headroom(window(10.0, TPOT_SLO, TTFT_SLO, max_concurrency=15.0))
    assert limit(result, TTFT_SLO.name).concurrency == pytest.approx(15.0)
    assert limit(result, TPOT_SLO.name).concurrency == pytest.approx(40.0)
    # E2E(N) = 0.1 + 0.011 N never reaches 5 s below the cap: the queue beyond it breaks it
    e2e = SLOTarget("e2e-5s", E2E, 0.99, 5.0)
    assert limit(headroom(window(10.0, e2e, max_concurrency=15.0)), "e2e-5s").concurrency == pytest.approx(15.0)


def test_end_to_end_latency() -> None:
    # E2E(N) = 0.1 + 0.011 N = 0.32  ->  N = 20
    e2e = SLOTarget("e2e-320ms", E2E, 0.99, 0.32)
    assert limit(headroom(window(10.0, e2e)), "e2e-320ms").concurrency == pytest.approx(20.0)


def test_a_kv_limited_engine() -> None:
    # 10 000 tokens, half used by 10 running requests: 500 tokens each, full at 20 requests (before TPOT's 40)
    kv = {"kv_capacity_tokens": 10_000.0, "kv_usage_mean": 0.5}
    result = headroom(window(10.0, **kv), NO_KV_MARGIN)
    assert limit(result, KV_LIMIT).concurrency == pytest.approx(20.0)
    assert result.limiting_slo == KV_LIMIT
    assert result.capacity_requests_per_second == pytest.approx(20 / 0.32)
    # with the default margin of z = 3 standard deviations of the running count, whose variance over its
    # mean is D = 1 + (b / a) N for the residence R(N) = a + b N = 0.1 + 0.011 N (a Poisson count's is 1):
    # 500 (N + 3 sqrt(N (1 + 0.11 N))) = 10 000
    n = limit(headroom(window(10.0, **kv)), KV_LIMIT).concurrency
    assert n is not None and 500 * (n + 3 * math.sqrt(n * (1 + 0.11 * n))) == pytest.approx(10_000)
    assert n == pytest.approx(8.2, abs=0.05)
    # without a fit there is no residence curve: a Poisson count, N + 3 sqrt(N) = 20
    refused = limit(headroom(window(10.0, tpot_points=(), **kv)), KV_LIMIT).concurrency
    assert refused == pytest.approx(((-3 + math.sqrt(89)) / 2) ** 2)


def test_already_broken_reads_zero() -> None:
    result = headroom(window(10.0, SLOTarget("tpot-5ms", TPOT, 0.99, 0.005)))
    assert limit(result, "tpot-5ms").concurrency == 0.0
    assert result.headroom_ratio == 0.0


def test_queue_growth_counts_as_load() -> None:
    served = rate_at(6.25)
    result = headroom(window(6.25, waiting_growth_per_second=served))
    assert result.current_requests_per_second == pytest.approx(2 * served)
    assert result.headroom_ratio == pytest.approx(1.0)


# --- unknown, never guessed -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"request_rate": 0.0}, "no traffic in the window"),
        ({"running_mean": 0.0}, "no traffic in the window"),
        ({"request_rate": None}, "no request rate or running batch in the window"),
    ],
)
def test_no_traffic_is_unknown(changes: dict[str, object], reason: str) -> None:
    result = headroom(window(10.0, TPOT_SLO, TTFT_SLO, **changes))
    assert result.reason == reason
    assert result.headroom_ratio is None and result.capacity_requests_per_second is None
    assert result.limiting_slo is None and result.capacity_concurrency is None
    assert [lim.slo for lim in result.limits] == [TPOT_SLO.name, TTFT_SLO.name, KV_LIMIT]
    assert all(lim.reason == reason and lim.concurrency is None for lim in result.limits)


def test_a_refused_fit_leaves_everything_unknown_and_says_why() -> None:
    result = headroom(window(10.0, tpot_points=points((10, 10.5, 11, 11.5))))
    assert result.headroom_ratio is None and result.limiting_slo is None
    assert result.reason is not None and "no TPOT fit: the running batch only spanned" in result.reason
    assert result.fit is not None and not result.fit.ok
    empty = headroom(window(10.0, tpot_points=()))
    assert empty.reason is not None and "0 TPOT-vs-batch points" in empty.reason


def test_the_kv_limit_alone_is_unknown_without_capacity() -> None:
    result = headroom(window(10.0, kv_usage_mean=0.5))
    assert limit(result, KV_LIMIT).reason == "the engine does not expose its KV cache capacity"
    assert result.limiting_slo == TPOT_SLO.name and result.headroom_ratio == pytest.approx(8.4 / 5.4)
    assert "capacity leaves out the unknown limits: kv_cache" in result.notes
    no_usage = headroom(window(10.0, kv_capacity_tokens=10_000.0))
    assert limit(no_usage, KV_LIMIT).reason == "no KV cache usage in the window"


def test_ttft_needs_its_inputs_and_rates_need_ttft() -> None:
    result = headroom(window(10.0, TPOT_SLO, TTFT_SLO, queue_seconds_mean=None))
    assert limit(result, TTFT_SLO.name).reason == (
        "needs the mean queue wait, the mean prompt length and the prefill time per prompt token"
    )
    tpot = limit(result, TPOT_SLO.name)
    assert tpot.concurrency == pytest.approx(40.0) and tpot.requests_per_second is None
    assert result.headroom_ratio is None


def test_missing_output_length_is_unknown() -> None:
    result = headroom(window(10.0, output_tokens_mean=None))
    assert limit(result, TPOT_SLO.name).reason == "no mean output length in the window"


def test_metrics_the_model_does_not_cover() -> None:
    queue = SLOTarget("queue-1s", V.REQUEST_QUEUE.key, 0.99, 1.0)
    result = headroom(window(10.0, TPOT_SLO, queue))
    assert limit(result, "queue-1s").reason == "the headroom model does not cover request_queue"
    assert result.limiting_slo == TPOT_SLO.name


def test_roles_of_a_split_deployment() -> None:
    # a prefill replica holds a request for its TTFT only: at N0 = 10, 10 / 0.01 s = 1000 requests per second
    prefill = headroom(window(10.0, TPOT_SLO, TTFT_SLO, key=replace(KEY, role=V.ROLE_PREFILL), request_rate=1000.0))
    assert limit(prefill, TPOT_SLO.name).reason == (
        "a prefill replica does not decode; time_per_output_token is its decode replicas' limit"
    )
    assert prefill.limiting_slo == TTFT_SLO.name
    assert prefill.notes == ("capacity leaves out the unknown limits: kv_cache",)  # not the other role's SLO
    # rate(N) = 1000 (N / 0.001 N) / (10 / 0.01) = 1000 whatever the batch: TTFT breaks at N = 20, at the same rate
    assert limit(prefill, TTFT_SLO.name).concurrency == pytest.approx(20.0)
    assert limit(prefill, TTFT_SLO.name).requests_per_second == pytest.approx(1000.0)
    decode = headroom(window(10.0, TPOT_SLO, TTFT_SLO, key=replace(KEY, role=V.ROLE_DECODE)))
    assert "a decode replica does not prefill" in (limit(decode, TTFT_SLO.name).reason or "")
    # a decode replica holds a request for (O - 1) TPOT(N): rate(40) / rate(10) = (40 / 0.5) / (10 / 0.2)
    assert decode.headroom_ratio == pytest.approx((40 / 0.5) / (10 / 0.2))


def test_littles_law_disagreement_is_noted() -> None:
    result = headroom(window(10.0, request_rate=rate_at(10.0) * 3))
    assert any("Little's law disagrees with the measured rate by 0.33x" in n for n in result.notes)
    assert result.headroom_ratio == pytest.approx(8.4 / 5.4)  # anchored on the measured rate: the ratio holds


# --- replicas needed --------------------------------------------------------------------------------------------


def test_replicas_needed_per_model() -> None:
    at_half = [headroom(window(6.25, key=replace(KEY, instance=f"r{i}"))) for i in range(3)]
    over = [headroom(window(50.0, key=ReplicaKey(V.ENGINE_VLLM, "big", f"r{i}"))) for i in range(3)]
    idle = headroom(window(10.0, key=ReplicaKey(V.ENGINE_VLLM, "idle", "r0"), request_rate=0.0))
    found = {(n.model, n.role): n for n in replicas_needed([*over, *at_half, idle])}
    # 3 replicas at half their capacity carry 1.5 replicas' worth: 2
    m = found[("m", V.ROLE_UNIFIED)]
    assert (m.replicas, m.replicas_needed, m.reason) == (3, 2, None)
    assert m.requests_per_second == pytest.approx(3 * rate_at(6.25))
    assert m.capacity_requests_per_second == pytest.approx(40 / 0.54)
    # 3 replicas over the edge carry 3 x (50 / 0.65) / (40 / 0.54) = 3.12 replicas' worth: 4
    assert found[("big", V.ROLE_UNIFIED)].replicas_needed == 4
    gone = found[("idle", V.ROLE_UNIFIED)]
    assert gone.replicas_needed is None and gone.reason == "no replica of idle (unified) has a known capacity"


def test_replicas_needed_exactly_at_capacity_is_not_rounded_up() -> None:
    at_limit = [headroom(window(40.0, key=replace(KEY, instance=f"r{i}"))) for i in range(2)]
    assert at_limit[0].headroom_ratio == pytest.approx(1.0)
    assert [n.replicas_needed for n in replicas_needed(at_limit)] == [2]


def test_replicas_needed_when_the_slo_breaks_at_any_load() -> None:
    broken = headroom(window(10.0, SLOTarget("tpot-5ms", TPOT, 0.99, 0.005)))
    (needed,) = replicas_needed([broken])
    assert needed.replicas_needed is None and needed.reason == "the capacity is zero: the SLO breaks at any load"


def test_pure_and_frozen() -> None:
    w = window(10.0, TPOT_SLO, TTFT_SLO, kv_capacity_tokens=10_000.0, kv_usage_mean=0.5)
    assert headroom(w) == headroom(w)
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.request_rate = 1.0  # type: ignore[misc]


# --- against the shared serving model, in virtual time ----------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One load step of the serving model: the window aggregates, and the TPOT p99 it showed."""

    window: ReplicaWindow
    tpot_p99: float
    preemptions: int


def drive(
    params: EngineParams, rate: float, seed: int, slo: SLOTarget, duration: float = 60.0, output: int = 60
) -> Measured:
    """Poisson arrivals at ``rate`` for ``duration`` virtual seconds (prompts of 200 tokens and outputs of ``output``
    on average); aggregates over all but the first 10 s."""
    rng = random.Random(seed)
    model = ServingModel(params, random.Random(1))
    arrivals: list[Sequence] = []
    t = rng.expovariate(rate)
    while t < duration:
        prompt, out = lognormal_int(rng, 200, 0.5, 4, 2000), lognormal_int(rng, output, 0.5, 2, 4 * output)
        arrivals.append(Sequence(f"r{len(arrivals)}", prompt, 1024, out, arrival=t))
        t += rng.expovariate(rate)
    warm, sub = 10.0, 10.0
    busy: dict[int, float] = {}
    kv_area = 0.0
    now, i = 0.0, 0
    while now < duration:
        while i < len(arrivals) and arrivals[i].arrival <= now:
            model.add(arrivals[i])
            i += 1
        if model.plan(now) is None:
            if i >= len(arrivals):
                break
            now = arrivals[i].arrival
            continue
        step = model.complete()
        if step.start >= warm:
            busy[int(step.start // sub)] = busy.get(int(step.start // sub), 0.0) + len(model.running) * step.duration
            kv_area += model.kv_usage * step.duration
        now = step.end
    done = [s for s in arrivals if s.finished_at is not None and warm <= s.arrival and s.finished_at <= duration]
    tpots = sorted(s.tpot for s in done if s.generated > 1)
    history = []
    for k, area in busy.items():
        finished = [s.tpot for s in done if s.generated > 1 and k * sub <= (s.finished_at or 0) < (k + 1) * sub]
        if finished:
            history.append(BatchPoint(area / sub, statistics.fmean(finished)))
    span = duration - warm
    p99 = tpots[int(0.99 * (len(tpots) - 1))]
    w = ReplicaWindow(
        key=KEY,
        slos=(slo,),
        request_rate=len(done) / span,
        running_mean=sum(busy.values()) / span,
        prompt_tokens_mean=statistics.fmean(s.prompt_tokens for s in done),
        output_tokens_mean=statistics.fmean(s.generated for s in done),
        queue_seconds_mean=statistics.fmean(s.queue_time for s in done),
        prefill_seconds_per_token=sum(s.prefill_time for s in done) / sum(s.prompt_tokens for s in done),
        tpot_points=tuple(history),
        kv_usage_mean=kv_area / span,
        kv_capacity_tokens=float(params.num_blocks * params.block_size),
        max_concurrency=float(params.max_num_seqs),
        quantile_ratios=(QuantileRatio(TPOT, 0.99, p99 / statistics.fmean(tpots)),),
    )
    return Measured(w, p99, model.preemptions_total)


def test_the_prediction_at_half_the_knee_lands_near_the_serving_models_knee() -> None:
    """A first signal for bench/headroom.py: the knee (the rate where TPOT p99 crosses 50 ms) measured on the
    simulators' serving model, and the capacity the model predicts from a replica at half of it, within ±25 %."""
    params = EngineParams(block_size=16, num_blocks=4096, max_num_seqs=256, step_per_decode_seq=0.001)
    slo = SLOTarget("tpot-50ms", TPOT, 0.99, 0.05)
    ramp = [(rate, drive(params, rate, 7, slo).tpot_p99) for rate in (5.0, 6.0, 7.0, 8.0, 9.0, 10.0)]
    (lo, p_lo), (hi, p_hi) = next((a, b) for a, b in itertools.pairwise(ramp) if a[1] <= 0.05 < b[1])
    knee = lo + (hi - lo) * (0.05 - p_lo) / (p_hi - p_lo)
    half = knee / 2
    # the replica's own history: the ramp up to half the knee, then the window at half the knee
    history = [
        p for rate in (0.2 * knee, 0.3 * knee, 0.4 * knee) for p in drive(params, rate, 11, slo).window.tpot_points
    ]
    now = drive(params, half, 99, slo).window
    result = headroom(replace(now, tpot_points=(*history, *now.tpot_points)))
    assert result.limiting_slo == slo.name, result
    assert result.capacity_requests_per_second is not None
    error = result.capacity_requests_per_second / knee - 1
    assert abs(error) <= 0.25, (
        f"knee {knee:.2f} rps, predicted {result.capacity_requests_per_second:.2f} ({error:+.0%})"
    )
    assert result.headroom_ratio == pytest.approx(result.capacity_requests_per_second / now.request_rate)  # type: ignore[operator]


def test_the_kv_limit_lands_near_the_serving_models_first_preemption() -> None:
    """The KV cache of 8192 tokens with outputs of 300 tokens: the first preemption comes long before TPOT breaks;
    the model, told at about half that load, places the KV limit within ±25 % of it."""
    params = EngineParams(block_size=16, num_blocks=512, max_num_seqs=256)
    slo = SLOTarget("tpot-100ms", TPOT, 0.99, 0.1)
    ramp = [(rate, drive(params, rate, 7, slo, 120.0, 300).preemptions) for rate in (4.0, 4.25, 4.5)]
    assert ramp[0][1] == 0 and ramp[-1][1] > 0
    lo, hi = next((a[0], b[0]) for a, b in itertools.pairwise(ramp) if a[1] == 0 < b[1])
    knee = (lo + hi) / 2
    history = [p for rate in (1.0, 1.5) for p in drive(params, rate, 11, slo, 120.0, 300).window.tpot_points]
    now = drive(params, 2.0, 99, slo, 120.0, 300).window
    result = headroom(replace(now, tpot_points=(*history, *now.tpot_points)))
    assert result.limiting_slo == KV_LIMIT, result
    assert result.capacity_requests_per_second is not None
    error = result.capacity_requests_per_second / knee - 1
    assert abs(error) <= 0.25, (
        f"first preemption at {knee:.2f} rps, predicted {result.capacity_requests_per_second:.2f}"
    )
