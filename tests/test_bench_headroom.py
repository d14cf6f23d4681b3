"""bench/headroom.py's pure helpers on synthetic data: one step's figures, the knee, the peers, the error table."""

from __future__ import annotations

import pytest

from bench.headroom import EngineResult, error_table, preemption_count
from bench.headroom_figures import (
    PEERS,
    StepFigures,
    Thresholds,
    error,
    find_knee,
    first_trigger,
    step_figures,
    within,
)
from inferwatch.core import vocabulary as V
from inferwatch.core.headroom import ReplicaHeadroom, ReplicaKey
from inferwatch.core.headroom_inputs import Snapshot

KEY = ReplicaKey(V.ENGINE_VLLM, "m", "127.0.0.1:9400")
LIMITS = Thresholds(ttft_seconds=0.5, tpot_seconds=0.1)


def snap(at: float, requests: float, waiting: float, kv: float, ttft: dict[float, float]) -> Snapshot:
    s = Snapshot(at)
    s.add(KEY, V.REQUESTS.name, requests, {})
    s.add(KEY, V.REQUESTS_RUNNING.name, 4.0, {})
    s.add(KEY, V.REQUESTS_WAITING.name, waiting, {})
    s.add(KEY, V.KV_CACHE_USAGE.name, kv, {})
    for le, count in ttft.items():
        s.add(KEY, f"{V.TIME_TO_FIRST_TOKEN.name}_bucket", count, {V.LABEL_LE: repr(le)})
    return s


def step(
    load: float, ttft: float | None = 0.2, tpot: float | None = 0.02, pre: float = 0.0, **kw: float
) -> StepFigures:
    queue, kv = kw.get("queue", 0.0), kw.get("kv", 0.1)
    return StepFigures(load, load, ttft, tpot, pre, queue, kw.get("queue_max", queue), kv, kw.get("kv_max", kv))


def test_step_figures_read_the_increases_over_the_step() -> None:
    # 100 requests in 10 s; TTFT: 0 -> 99 below 0.25 s and 1 between 0.25 and 0.5 s, over the step only
    first = snap(0.0, 1000.0, 2.0, 0.2, {0.25: 500.0, 0.5: 500.0, float("inf"): 500.0})
    mid = snap(5.0, 1050.0, 6.0, 0.6, {0.25: 550.0, 0.5: 550.0, float("inf"): 550.0})
    last = snap(10.0, 1100.0, 4.0, 0.4, {0.25: 599.0, 0.5: 600.0, float("inf"): 600.0})
    fig = step_figures(10.0, [first, mid, last], KEY, [3.0, 3.0, 5.0])
    assert fig.served == pytest.approx(10.0)
    assert fig.ttft_p99 == pytest.approx(0.25)  # rank 99 of 100 lands at the top of the first bucket
    assert fig.tpot_p99 is None
    assert fig.preemptions == 2.0
    assert fig.queue_mean == pytest.approx(4.0) and fig.queue_max == 6.0
    assert fig.kv_mean == pytest.approx(0.4) and fig.kv_max == 0.6


def test_the_knee_interpolates_a_latency_crossing() -> None:
    steps = [step(2.0), step(4.0, ttft=0.3), step(6.0, ttft=0.7)]
    knee = find_knee(steps, LIMITS)
    assert knee.load == pytest.approx(5.0) and (knee.below, knee.above) == (4.0, 6.0)
    assert knee.broken_by == ("ttft",)


def test_a_preemption_puts_the_knee_mid_bracket_and_the_earliest_crossing_wins() -> None:
    assert find_knee([step(2.0), step(4.0, pre=3.0)], LIMITS).load == pytest.approx(3.0)
    # TPOT crosses a quarter of the way in, before the preemption's midpoint
    knee = find_knee([step(2.0, tpot=0.05), step(4.0, tpot=0.25, pre=1.0)], LIMITS)
    assert knee.load == pytest.approx(2.5) and knee.broken_by == ("tpot", "preemption")


def test_no_knee_says_why() -> None:
    assert find_knee([step(2.0), step(4.0)], LIMITS).reason == "the SLO held over the whole ramp"
    low = find_knee([step(2.0, ttft=0.9)], LIMITS)
    assert low.load is None and low.reason == "the SLO already breaks at the lowest load of the ramp"
    # an unmeasured latency (TGI's TTFT) does not break anything
    assert find_knee([step(2.0, ttft=None), step(4.0, ttft=None, pre=1.0)], LIMITS).load == pytest.approx(3.0)


def test_peer_triggers_on_the_max_and_on_the_mean() -> None:
    steps = [step(2.0, queue=1.0, queue_max=5.0), step(4.0, queue=5.0, kv=0.5), step(6.0, kv=0.85)]
    queue, llm_d = PEERS
    assert first_trigger(steps, queue, "max") == 2.0
    assert first_trigger(steps, queue, "mean") == 4.0
    assert first_trigger([step(2.0, kv=0.5, kv_max=0.8)], llm_d, "max") == 2.0
    assert first_trigger([step(2.0, kv=0.5, kv_max=0.8)], queue, "max") is None


def test_error_and_tolerance() -> None:
    assert error(12.0, 10.0) == pytest.approx(0.2)
    assert within(error(12.0, 10.0), 0.2) and not within(error(12.1, 10.0), 0.2)
    assert error(None, 10.0) is None and not within(None, 0.2)


def _headroom(capacity: float | None, reason: str | None = None) -> ReplicaHeadroom:
    return ReplicaHeadroom(KEY, 1.0, 1.0, (), "kv_cache", 4.0, capacity, None, None, reason)


def test_the_error_table_names_every_miss() -> None:
    knee = find_knee([step(8.0), step(12.0, pre=1.0)], LIMITS)  # 10 rps
    ok = EngineResult("vllm", [], knee, "engine", {0.3: _headroom(11.0), 0.5: _headroom(13.0), 0.7: None})
    tgi = EngineResult("tgi", [], knee, "simulator", {f: _headroom(None, "no TTFT") for f in (0.3, 0.5, 0.7)})
    tgi.not_measurable = "TGI exposes no TTFT"
    unknown = EngineResult("sglang", [], knee, "simulator", {f: _headroom(None, "no fit") for f in (0.3, 0.5, 0.7)})
    lines, misses, unmeasurable = error_table([ok, tgi, unknown], 0.2)
    assert "vllm      30%     11.00    +10%" in lines[2]
    assert misses == [
        "vllm at 50%: miss: error +30%",
        "vllm at 70%: miss: no replica in the window",
        "sglang at 30%: miss: unknown: no fit",
        "sglang at 50%: miss: unknown: no fit",
        "sglang at 70%: miss: unknown: no fit",
    ]
    assert unmeasurable == [
        "tgi at 30%: not measurable: TGI exposes no TTFT",
        "tgi at 50%: not measurable: TGI exposes no TTFT",
        "tgi at 70%: not measurable: TGI exposes no TTFT",
    ]


def test_preemptions_are_read_from_the_canonical_page() -> None:
    page = f'{V.PREEMPTIONS.name}{{engine="vllm",model="m"}} 3\n{V.PREEMPTIONS.name}{{engine="vllm",model="n"}} 2\n'
    assert preemption_count(page) == 5.0
    assert preemption_count(f'{V.REQUESTS_RUNNING.name}{{engine="tgi",model="m"}} 1\n') is None
