"""End to end: each profile moves the canonical output (through the real exporter mapping) as it should.

The simulated engines run on a virtual clock: the test moves simulated time, no wall-clock sleeps.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import builtin_registry
from inferwatch.exporters.mapping import TranslateContext, translate_text
from inferwatch.exporters.samples import Snapshot
from inferwatch.simulator.base import SimSettings
from inferwatch.simulator.clock import VirtualClock
from inferwatch.simulator.server import create_app, default_params
from tests.conftest import in_process

SIM_SECONDS = 40.0
METRICS_PATH = {"trtllm": "/prometheus/metrics"}


def run_profile(profile: str, engine: str = "vllm", switch_to: str | None = None) -> tuple[Snapshot, Snapshot]:
    """Run ``profile`` for SIM_SECONDS (and optionally switch); return the canonical snapshots."""
    params = default_params(engine)
    s = SimSettings(engine=engine, model="m", profile=profile, seed=3, params=params)
    adapter = builtin_registry().get(engine)

    path = METRICS_PATH.get(engine, "/metrics")
    ctx = TranslateContext(engine=engine)
    session = adapter.open(adapter.own_options({"max_batch_total_tokens": params.num_blocks * params.block_size}))

    def canon(text: str) -> Snapshot:
        return translate_text(adapter, text, ctx, session.extend)

    async def main() -> tuple[Snapshot, Snapshot]:
        clock = VirtualClock()
        app = create_app(s, clock=clock)
        async with in_process(app, timeout=5) as client:
            await clock.advance(SIM_SECONDS)
            first = canon((await client.get(path)).text)
            if switch_to:
                r = await client.post("/simulator/profile", json={"profile": switch_to})
                assert r.status_code == 200
            await clock.advance(SIM_SECONDS)
            return first, canon((await client.get(path)).text)

    return asyncio.run(main())


def mean(h: Any) -> float:
    return float(h.total / h.inf) if h is not None and h.inf else 0.0


@pytest.fixture(scope="module")
def steady() -> Snapshot:
    return run_profile("steady")[1]


def test_steady_is_healthy(steady: Snapshot) -> None:
    assert steady.value(V.REQUESTS) > 50
    assert steady.value(V.PREEMPTIONS) == 0
    assert steady.value(V.REQUESTS, outcome=V.OUTCOME_ERROR) == 0
    assert steady.value(V.KV_CACHE_USAGE) < 0.9


def test_kv_pressure_preempts() -> None:
    first, later = run_profile("kv-pressure")
    assert later.value(V.PREEMPTIONS) > first.value(V.PREEMPTIONS) > 0
    assert later.value(V.KV_CACHE_USAGE) > 0.85
    assert later.value(V.REQUESTS_WAITING) > 0


def test_queue_buildup_grows_the_queue(steady: Snapshot) -> None:
    first, later = run_profile("queue-buildup")
    assert later.value(V.REQUESTS_WAITING) > first.value(V.REQUESTS_WAITING) > 10
    assert mean(later.histogram(V.REQUEST_QUEUE)) > 5 * mean(steady.histogram(V.REQUEST_QUEUE)) + 0.1


def test_long_prompts_raise_ttft(steady: Snapshot) -> None:
    _, later = run_profile("long-prompts")
    assert mean(later.histogram(V.TIME_TO_FIRST_TOKEN)) > 3 * mean(steady.histogram(V.TIME_TO_FIRST_TOKEN))


def test_slow_decode_raises_tpot(steady: Snapshot) -> None:
    _, later = run_profile("slow-decode")
    assert mean(later.histogram(V.TIME_PER_OUTPUT_TOKEN)) > 2 * mean(steady.histogram(V.TIME_PER_OUTPUT_TOKEN))


def test_errors_fail_a_share() -> None:
    _, later = run_profile("errors")
    share = later.value(V.REQUESTS, outcome=V.OUTCOME_ERROR) / later.value(V.REQUESTS)
    assert 0.05 < share < 0.3


def test_prefix_heavy_hits_the_cache(steady: Snapshot) -> None:
    _, later = run_profile("prefix-heavy")
    ratio = later.value(V.PREFIX_CACHE_HIT_TOKENS) / later.value(V.PREFIX_CACHE_QUERIED_TOKENS)
    assert ratio > 0.5
    assert steady.value(V.PREFIX_CACHE_HIT_TOKENS) == 0


def test_switching_profile_at_runtime_resolves() -> None:
    """kv-pressure, then back to steady: preemptions stop climbing once the backlog drains."""
    first, later = run_profile("kv-pressure", switch_to="steady")
    assert first.value(V.PREEMPTIONS) > 0
    assert later.value(V.REQUESTS) > first.value(V.REQUESTS)


@pytest.mark.parametrize("engine", ["tgi", "trtllm", "triton"])
def test_every_engine_moves_under_pressure(engine: str) -> None:
    """Through each engine's own dialect and the exporter: traffic flows, and kv-pressure fills the cache."""
    first, later = run_profile("kv-pressure", engine=engine)
    assert later.value(V.REQUESTS) > first.value(V.REQUESTS) > 0
    assert later.value(V.GENERATION_TOKENS) > first.value(V.GENERATION_TOKENS)
    assert max(first.value(V.KV_CACHE_USAGE), later.value(V.KV_CACHE_USAGE)) > 0.5
