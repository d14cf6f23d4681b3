"""The headroom rules and the API's model agree on the replicas of tests/alerts/headroom.yaml.

promtool runs that file against the generated rules (tests/test_alert_rules.py); here the same
series, scraped every 15 s, go through the API's path (snapshots -> windows -> the model), which must
give the hand-computed answers the promtool checks hold the rules to.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from inferwatch.core import vocabulary as V
from inferwatch.core.headroom import ReplicaKey, headroom, replicas_needed
from inferwatch.core.headroom_inputs import Snapshot, windows
from inferwatch.core.slo import load
from tests.alerts import make_headroom as S

ROOT = Path(__file__).resolve().parent.parent
SLOS = ROOT / "alerts" / "slos.yaml"


def test_the_promtool_file_is_what_the_scenario_writes() -> None:
    assert yaml.safe_load(S.OUT.read_text()) == yaml.safe_load(yaml.safe_dump(S.document(), sort_keys=False))


def _snapshots(samples: int) -> list[Snapshot]:
    """The scenario's replicas as the exporter would show them, every 15 s."""
    snaps = []
    totals: dict[tuple[str, str], float] = {}
    tpot = V.TIME_PER_OUTPUT_TOKEN.name
    for i in range(samples):
        snap = Snapshot(float(i * S.SCRAPE))
        for model, (low, high) in S.REPLICAS.items():
            key = ReplicaKey("vllm", model, S.INSTANCE)
            n = float(low if (i // S.REGIME) % 2 == 0 else high)
            rate = n / S.residence(n) * S.SCRAPE
            increments = {
                V.REQUESTS.name: rate,
                V.PROMPT_TOKENS.name: rate * S.PROMPT,
                V.GENERATION_TOKENS.name: rate * S.OUTPUTS,
                f"{tpot}_sum": rate * (S.A + S.B * n),
                f"{tpot}_count": rate,
                f"{V.REQUEST_QUEUE.name}_sum": 0.0,
                f"{V.REQUEST_QUEUE.name}_count": rate,
            }
            if model != S.NO_TTFT:
                increments[f"{V.REQUEST_PREFILL.name}_sum"] = rate * S.PROMPT * S.PREFILL_PER_TOKEN
                increments[f"{V.REQUEST_PREFILL.name}_count"] = rate
            if model in S.WITH_E2E:
                increments[f"{V.REQUEST_DURATION.name}_sum"] = rate * S.residence(n)
                increments[f"{V.REQUEST_DURATION.name}_count"] = rate
            for name, inc in increments.items():
                # promtool's series start at 0 and grow from the second sample
                totals[(model, name)] = totals.get((model, name), -inc) + inc
                snap.add(key, name, totals[(model, name)], {})
            snap.add(key, V.REQUESTS_RUNNING.name, n, {})
            snap.add(key, V.REQUESTS_WAITING.name, 0.0, {})
            if model == "llama-8b":
                snap.add(key, V.KV_CACHE_USAGE.name, S.KV_USAGE, {})
                snap.add(key, V.KV_CACHE_CAPACITY.name, float(S.KV_CAPACITY), {})
        snaps.append(snap)
    return snaps


@pytest.fixture(scope="module")
def answers() -> dict[str, object]:
    spec = load(SLOS, V.Vocabulary())
    window_samples = 30 * 60 // S.SCRAPE
    snaps = _snapshots(70 * 60 // S.SCRAPE + 1)[-window_samples - 1 :]
    results = [headroom(w) for w in windows(snaps, spec, 60.0)]
    return {"by_model": {r.key.model: r for r in results}, "needed": replicas_needed(results)}


def test_the_api_model_reads_the_half_loaded_replica_as_two(answers: dict[str, object]) -> None:
    by_model = answers["by_model"]
    assert isinstance(by_model, dict)
    half = by_model["llama-8b"]
    assert half.limiting_slo == "tpot-100ms"
    assert half.headroom_ratio == pytest.approx(2.0, rel=0.03)
    assert half.capacity_concurrency == pytest.approx(40, rel=0.03)
    assert half.fit.slope == pytest.approx(S.B, rel=0.03)
    limits = {lim.slo: lim for lim in half.limits}
    assert limits[V.HEADROOM_KV_LIMIT].concurrency == pytest.approx(115.8, rel=0.03)
    assert limits["ttft-500ms"].concurrency == pytest.approx(130, rel=0.03)


def test_the_api_model_reads_the_overloaded_replica_under_one(answers: dict[str, object]) -> None:
    by_model = answers["by_model"]
    assert isinstance(by_model, dict)
    over = by_model["qwen-7b"]
    assert over.limiting_slo == "tpot-100ms"
    assert over.headroom_ratio == pytest.approx(0.957, abs=0.02)
    assert {lim.slo: lim for lim in over.limits}[V.HEADROOM_KV_LIMIT].reason is not None  # no KV series


def test_replicas_needed_match_the_rules(answers: dict[str, object]) -> None:
    needed = answers["needed"]
    assert isinstance(needed, tuple)
    assert {n.model: n.replicas_needed for n in needed} == {"llama-8b": 1, "qwen-7b": 2, "mistral-7b": 1}


def test_without_a_ttft_curve_the_measured_residence_carries_littles_law(answers: dict[str, object]) -> None:
    by_model = answers["by_model"]
    assert isinstance(by_model, dict)
    tgi_like = by_model[S.NO_TTFT]
    assert tgi_like.headroom_ratio == pytest.approx(2.10, rel=0.03)
    limits = {lim.slo: lim for lim in tgi_like.limits}
    assert limits["ttft-500ms"].concurrency is None and "prefill" in (limits["ttft-500ms"].reason or "")
    assert any("no TTFT curve" in note for note in tgi_like.notes)
