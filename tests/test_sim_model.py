"""Invariants of the serving model, driven in virtual time (fast and seeded), and the virtual clock itself."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch.simulator.base import SimSettings, SimulatedEngine
from inferwatch.simulator.clock import VirtualClock, run_virtual
from inferwatch.simulator.profiles import PROFILES
from inferwatch.simulator.runtime import EngineLoop, lognormal_int
from inferwatch.simulator.scheduler import EngineParams, Finish, Sequence, ServingModel, StepReport


def run(
    params: EngineParams, arrivals: list[tuple[float, int, int, int]], until: float = 600.0
) -> tuple[ServingModel, list[Sequence], list[StepReport]]:
    """Feed (time, prompt, max_tokens, output) arrivals; step until everything finished."""
    model = ServingModel(params, random.Random(1))
    seqs: list[Sequence] = []
    reports: list[StepReport] = []
    pending = sorted(arrivals)
    now = 0.0
    i = 0
    while (i < len(pending) or not model.idle) and now < until:
        while i < len(pending) and pending[i][0] <= now:
            t, prompt, max_tokens, output = pending[i]
            s = Sequence(f"r{i}", prompt, max_tokens, output, arrival=t)
            model.add(s)
            seqs.append(s)
            i += 1
        report = model.plan(now)
        if report is None:
            now = pending[i][0]
            continue
        done = model.complete()
        reports.append(done)
        assert 0 <= model.free_blocks <= params.num_blocks, "KV blocks over-allocated"
        held = sum(s.blocks for s in model.running)
        assert held == model.used_blocks, "blocks held by running sequences must equal used blocks"
        assert all(s.blocks == 0 for s in model.waiting), "waiting sequences hold no KV"
        now = done.end
    return model, seqs, reports


def poisson(rng: random.Random, rps: float, n: int, prompt: int, output: int) -> list[tuple[float, int, int, int]]:
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(rps)
        p = lognormal_int(rng, prompt, 0.5, 4, 2000)
        o = lognormal_int(rng, output, 0.5, 1, 2000)
        out.append((t, p, 1024, o))
    return out


def test_tokens_conserved_and_everything_finishes() -> None:
    params = EngineParams(num_blocks=256, max_num_seqs=16)
    arrivals = poisson(random.Random(3), 8.0, 200, 200, 100)
    model, seqs, reports = run(params, arrivals)
    assert model.idle
    assert all(s.finish in (Finish.STOP, Finish.LENGTH) for s in seqs)
    for s in seqs:
        assert s.generated == min(s.limit, params.max_model_len - s.prompt_tokens)
        assert len(s.token_times) == s.generated
        assert s.token_times == sorted(s.token_times)
        assert s.arrival <= (s.first_scheduled or 0) <= (s.first_token or 0) <= (s.finished_at or 0)
    assert sum(len(r.new_tokens) for r in reports) == sum(s.generated for s in seqs)
    assert model.free_blocks == params.num_blocks


def test_preemption_only_when_blocks_run_out() -> None:
    roomy = EngineParams(num_blocks=100_000, max_num_seqs=32)
    tight = EngineParams(num_blocks=120, max_num_seqs=32)
    arrivals = poisson(random.Random(5), 20.0, 150, 300, 400)
    model, _, reports = run(roomy, arrivals)
    assert model.preemptions_total == 0
    model, seqs, reports = run(tight, arrivals)
    assert model.preemptions_total > 0
    assert sum(len(r.preempted) for r in reports) == model.preemptions_total
    assert sum(s.preemptions for s in seqs) == model.preemptions_total


def test_max_num_seqs_and_budget_respected() -> None:
    params = EngineParams(num_blocks=10_000, max_num_seqs=8, max_num_batched_tokens=512)
    _, _, reports = run(params, poisson(random.Random(7), 30.0, 120, 600, 50))
    for r in reports:
        assert r.running <= params.max_num_seqs
        assert r.prefill_tokens + r.decode_seqs <= params.max_num_batched_tokens
    # chunked prefill: a 600-token prompt does not fit one 512-token step
    assert any(r.prefill_tokens + r.decode_seqs == params.max_num_batched_tokens for r in reports)


def test_littles_law_for_the_queue() -> None:
    """Mean waiting ≈ arrival rate × mean queue time (over a long, stable run)."""
    params = EngineParams(num_blocks=2048, max_num_seqs=8)
    rate = 6.0
    _, seqs, reports = run(params, poisson(random.Random(11), rate, 600, 150, 80), until=10_000)
    horizon = reports[-1].end - reports[0].start
    # time-average of the queue length, weighting each step by its duration
    mean_waiting = sum(r.waiting * r.duration for r in reports) / horizon
    mean_queue_time = sum(s.queue_time for s in seqs) / len(seqs)
    lam = len(seqs) / horizon
    assert mean_waiting == pytest.approx(lam * mean_queue_time, rel=0.25, abs=0.3)
    assert rate * 0.5 < lam < rate * 1.5


def test_prefix_cache_hits_skip_prefill() -> None:
    params = EngineParams(num_blocks=4096)
    model = ServingModel(params)
    a = Sequence("a", 800, 4, 4, arrival=0.0, prefix_key="sys", prefix_tokens=700)
    b = Sequence("b", 820, 4, 4, arrival=0.0, prefix_key="sys", prefix_tokens=700)
    model.add(a)
    now = 0.0
    while not model.idle:
        r = model.plan(now)
        assert r is not None
        now = model.complete().end
    model.add(b)
    hits = 0
    while not model.idle:
        r = model.plan(now)
        assert r is not None
        hits += r.prefix_hits
        now = model.complete().end
    assert a.cached_tokens == 0
    assert b.cached_tokens == hits == 688  # 700 rounded down to full 16-token blocks


def test_errors_and_aborts() -> None:
    params = EngineParams(error_rate=1.0)
    model = ServingModel(params)
    s = Sequence("e", 10, 5, 5, arrival=0.0)
    model.add(s)
    r = model.plan(0.0)
    assert r is not None
    model.complete()
    assert s.finish is Finish.ERROR and model.free_blocks == params.num_blocks
    model = ServingModel(EngineParams())
    s = Sequence("x", 10, 50, 50, arrival=0.0)
    model.add(s)
    model.plan(0.0)
    model.complete()
    model.abort(s, 1.0)
    assert s.finish is Finish.ABORT and model.idle and model.free_blocks == model.params.num_blocks
    with pytest.raises(ValueError, match="max_model_len"):
        model.add(Sequence("big", 10_000, 5, 5, arrival=0.0))


@settings(max_examples=25, deadline=None)
@given(
    blocks=st.integers(min_value=40, max_value=400),
    seqs=st.integers(min_value=1, max_value=64),
    seed=st.integers(min_value=0, max_value=10_000),
)
def test_invariants_hold_for_any_capacity(blocks: int, seqs: int, seed: int) -> None:
    params = EngineParams(num_blocks=blocks, max_num_seqs=seqs, max_model_len=512)
    rng = random.Random(seed)
    arrivals = [(rng.uniform(0, 5), rng.randint(1, 400), rng.randint(1, 100), rng.randint(1, 100)) for _ in range(40)]
    model, out, _ = run(params, arrivals, until=5_000)
    assert model.idle
    assert all(s.finish in (Finish.STOP, Finish.LENGTH) for s in out)


def test_profiles_are_well_formed() -> None:
    for name, p in PROFILES.items():
        assert p.name == name and p.rps >= 0 and p.description


# -- the virtual clock, and the engine loop and load generator on it ------------------------------------
def test_virtual_clock_fires_timers_in_order() -> None:
    fired: list[tuple[str, float]] = []

    async def main() -> None:
        clock = VirtualClock(start=100.0)

        async def sleeper(name: str, t: float) -> None:
            await clock.sleep_until(t)
            fired.append((name, clock.now()))

        tasks = [asyncio.create_task(sleeper(n, t)) for n, t in (("c", 103.0), ("a", 101.0), ("b", 103.0))]
        await clock.advance(2.5)
        assert fired == [("a", 101.0)] and clock.now() == 102.5 and clock.timers == 2
        await clock.advance(10)
        assert fired == [("a", 101.0), ("c", 103.0), ("b", 103.0)]  # ties in the order they were set
        assert clock.now() == 112.5 and clock.timers == 0
        await asyncio.gather(*tasks)
        with pytest.raises(ValueError, match="backwards"):
            await clock.advance(-1)

    asyncio.run(main())


def test_virtual_clock_run_moves_time_until_done() -> None:
    async def main() -> None:
        clock = VirtualClock(start=0.0)

        async def work() -> float:
            await clock.sleep(3.0)
            await clock.sleep(0.5)
            return clock.now()

        assert await clock.run(work()) == 3.5
        with pytest.raises(TimeoutError):
            await clock.run(clock.sleep(100.0), limit=10.0)
        with pytest.raises(RuntimeError, match="nothing left"):
            await clock.run(asyncio.Event().wait())  # waits on something that never comes

        async def nested() -> None:
            await clock.advance(1.0)

        with pytest.raises(RuntimeError, match="do not nest"):
            await clock.run(nested())

    asyncio.run(main())


def test_engine_loop_on_the_virtual_clock_matches_the_model_stepped_by_hand() -> None:
    """The loop plans each step when the previous one ends (or at the arrival that wakes it): the same schedule
    as :func:`run`, token for token."""
    params = EngineParams(num_blocks=200, max_num_seqs=8)
    arrivals = poisson(random.Random(13), 10.0, 80, 200, 60)
    _, by_hand, _ = run(params, arrivals)

    async def main(clock: VirtualClock) -> list[Sequence]:
        loop = EngineLoop(ServingModel(params, random.Random(1)), clock)
        loop.start()
        seqs: list[Sequence] = []
        for i, (t, prompt, max_tokens, output) in enumerate(sorted(arrivals)):
            await clock.sleep_until(t)
            seqs.append(Sequence(f"r{i}", prompt, max_tokens, output, arrival=clock.now()))
            loop.submit(seqs[-1])
        while not loop.model.idle:
            await clock.sleep(1.0)
        await loop.stop()
        return seqs

    on_clock = run_virtual(main, start=0.0)
    assert [s.token_times for s in on_clock] == [s.token_times for s in by_hand]
    assert [s.finish for s in on_clock] == [s.finish for s in by_hand]


def test_load_generator_follows_the_profile_and_stops_at_rate_zero() -> None:
    async def main(clock: VirtualClock) -> None:
        engine = SimulatedEngine(SimSettings(engine="vllm", profile="steady", seed=5), clock=clock)
        await engine.start()
        await clock.sleep(100.0)
        sent = engine.load.sent
        assert 300 < sent < 500  # Poisson arrivals at the profile's 4 requests/s
        engine.set_profile("steady", rps=0)
        await clock.sleep(50.0)
        assert engine.load.sent <= sent + 1 and engine.load._task is not None and engine.load._task.done()
        engine.set_profile("kv-pressure")
        await clock.sleep(10.0)
        assert engine.load.sent > sent + 50
        await engine.stop()

    run_virtual(main)
