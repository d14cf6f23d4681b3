"""The headroom model's inputs from snapshots of canonical series (inferwatch/core/headroom_inputs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.core import vocabulary as V
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.headroom import ReplicaKey, ReplicaWindow
from inferwatch.core.headroom_inputs import Snapshot, increase, windows
from inferwatch.core.slo import load

ROOT = Path(__file__).resolve().parent.parent
SLOS = load(ROOT / "alerts" / "slos.yaml", V.Vocabulary())


def _history(engine: str, *, e2e: bool = True, prefill: bool = True, tpot: bool = True) -> list[Snapshot]:
    """A replica serving 4 requests a second, each 2.5 s end to end of which 0.5 s queued (2 in service by
    Little's law) while the running gauge, sampled between steps, reads 1.5; 20 snapshots 5 s apart."""
    key = ReplicaKey(engine, "m", "i")
    snaps = []
    for i in range(20):
        snap = Snapshot(5.0 * i)
        done = 20.0 * i  # 4 a second
        values = {
            V.REQUESTS.name: done,
            V.PROMPT_TOKENS.name: 100 * done,
            V.GENERATION_TOKENS.name: 50 * done,
            f"{V.REQUEST_QUEUE.name}_sum": 0.5 * done,
            f"{V.REQUEST_QUEUE.name}_count": done,
            f"{V.TIME_TO_FIRST_TOKEN.name}_sum": 0.7 * done,
            f"{V.TIME_TO_FIRST_TOKEN.name}_count": done,
            V.REQUESTS_RUNNING.name: 1.0 if i % 2 else 2.0,
            V.REQUESTS_WAITING.name: 0.0,
            V.KV_CACHE_USAGE.name: 0.3,
            V.KV_CACHE_CAPACITY.name: 1000.0,
        }
        if e2e:
            values |= {f"{V.REQUEST_DURATION.name}_sum": 2.5 * done, f"{V.REQUEST_DURATION.name}_count": done}
        if prefill:
            values |= {f"{V.REQUEST_PREFILL.name}_sum": 0.1 * done, f"{V.REQUEST_PREFILL.name}_count": done}
        spec = V.TIME_PER_OUTPUT_TOKEN if tpot else V.INTER_TOKEN_LATENCY
        values |= {f"{spec.name}_sum": 0.04 * done, f"{spec.name}_count": done}
        for name, value in values.items():
            snap.add(key, name, value, {})
        snap.add(key, V.ENGINE_INFO.name, 1.0, {V.LABEL_MAX_CONCURRENCY: "8"})
        snaps.append(snap)
    return snaps


def _one(snaps: list[Snapshot], profiles: bool = True) -> ReplicaWindow:
    (found,) = windows(snaps, SLOS, 20.0, builtin_profiles() if profiles else None)
    return found


def test_the_batch_is_littles_law_and_the_kv_per_request_is_read_against_the_gauge() -> None:
    w = _one(_history(V.ENGINE_TGI))
    assert w.running_mean == pytest.approx(8.0)  # (2.5 - 0.5) s x 4 a second
    assert w.running_gauge_mean == pytest.approx(1.5)
    assert w.request_rate == pytest.approx(4.0)
    assert [p.batch for p in w.tpot_points] == pytest.approx([8.0] * len(w.tpot_points))
    assert len(w.tpot_points) == 4  # 95 s in sub-windows of 20 s
    without = _one(_history(V.ENGINE_TGI, e2e=False))
    assert without.running_mean == pytest.approx(1.5) and without.running_gauge_mean == pytest.approx(1.5)


def test_fallbacks_for_engines_without_a_prefill_or_tpot_histogram() -> None:
    w = _one(_history(V.ENGINE_SGLANG, prefill=False, tpot=False))
    # prefill = mean TTFT - mean queue = 0.2 s per request, over 100 prompt tokens
    assert w.prefill_seconds_per_token == pytest.approx(0.002)
    assert [p.tpot_seconds for p in w.tpot_points] == pytest.approx([0.04] * 4)  # the inter-token latency


def test_the_profile_says_whether_max_concurrency_caps_the_batch() -> None:
    # vLLM's max_concurrency is the KV cache's room for full-length requests, not a batch cap
    assert _one(_history(V.ENGINE_VLLM)).max_concurrency is None
    assert _one(_history(V.ENGINE_VLLM), profiles=False).max_concurrency == 8.0
    assert _one(_history(V.ENGINE_TGI)).max_concurrency == 8.0


def test_a_counter_that_drops_restarted() -> None:
    assert increase([10.0, 15.0, 3.0, 5.0]) == 5.0 + 3.0 + 2.0
    assert increase([None, 4.0]) is None
