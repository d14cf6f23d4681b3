"""vLLM value semantics on the real 0.32.0 capture and on its derived variants."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.engines import vllm as vllm_engine
from inferwatch.exporters.mapping import TranslateContext, translate_text
from inferwatch.exporters.samples import Snapshot
from tests.conftest import ENGINE_FIXTURES

REAL = ENGINE_FIXTURES / "vllm" / "0.32.0-cpu"
LORA = ENGINE_FIXTURES / "vllm" / "0.32.0-cpu-lora"
FACTS = yaml.safe_load((REAL / "fixture.yaml").read_text())["facts"]


def translate(path: Path, model_override: str | None = None, extra_labels: dict[str, str] | None = None) -> Snapshot:
    ctx = TranslateContext(engine=V.ENGINE_VLLM, model_override=model_override, extra_labels=extra_labels or {})
    return translate_text(vllm_engine.ADAPTER, path.read_text(), ctx)


def source_value(path: Path, name: str, suffix: str = "") -> float:
    """A raw vLLM sample value, found through the adapter's own mapping row for ``name``."""
    from inferwatch.exporters.textparse import parse

    parsed = parse(path.read_text(), {name + suffix})
    return sum(v for _, v in parsed.get(name + suffix))


def row_source(metric: V.MetricSpec) -> str:
    return next(r.sources[0] for r in vllm_engine.ROWS if r.metric is metric)


def test_final_counters_equal_vllm() -> None:
    final = REAL / "metrics-final.txt"
    snap = translate(final)
    for metric in (V.PROMPT_TOKENS, V.GENERATION_TOKENS, V.PREEMPTIONS, V.PREFIX_CACHE_QUERIED_TOKENS):
        assert snap.value(metric) == source_value(final, row_source(metric)), metric.name
    assert snap.value(V.PROMPT_TOKENS) == FACTS["final"]["prompt_tokens"]
    assert snap.value(V.GENERATION_TOKENS) == FACTS["final"]["generation_tokens"]
    assert snap.value(V.PREEMPTIONS) == FACTS["final"]["preemptions"]


def test_outcomes_and_ttft_count() -> None:
    snap = translate(REAL / "metrics-final.txt")
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_LENGTH) == FACTS["final"]["outcome_length"]
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_STOP) == FACTS["final"]["outcome_stop"]
    assert snap.value(V.REQUESTS) == FACTS["final"]["finished_sequences"]
    ttft = snap.histogram(V.TIME_TO_FIRST_TOKEN)
    assert ttft is not None and ttft.inf == FACTS["final"]["ttft_count"]
    # Every canonical TTFT bound is also a vLLM bound: exact, and the buckets are the source's.
    assert V.TIME_TO_FIRST_TOKEN not in snap.inexact
    assert ttft.counts is not None and ttft.counts[ttft.bounds.index(2.5)] == 40.0
    assert ttft.counts[ttft.bounds.index(1.0)] == 22.0


def test_repetition_is_a_stop() -> None:
    text = (
        (REAL / "metrics-final.txt")
        .read_text()
        .replace(
            'finished_reason="repetition",model_name="tiny-llama"} 0.0',
            'finished_reason="repetition",model_name="tiny-llama"} 3.0',
        )
    )
    snap = translate_text(vllm_engine.ADAPTER, text, TranslateContext(engine=V.ENGINE_VLLM))
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_STOP) == FACTS["final"]["outcome_stop"] + 3


def test_gauges_under_load() -> None:
    snap = translate(REAL / "metrics-load-2.txt")
    facts = FACTS["load-2"]
    assert snap.value(V.REQUESTS_RUNNING) == facts["running"]
    assert snap.value(V.REQUESTS_WAITING) == facts["waiting"]
    assert snap.value(V.KV_CACHE_USAGE) == pytest.approx(facts["kv_usage"])
    assert snap.value(V.PREEMPTIONS) == facts["preemptions"]


def test_cache_config_info() -> None:
    snap = translate(REAL / "metrics-final.txt")
    assert snap.value(V.KV_CACHE_CAPACITY) == FACTS["final"]["kv_capacity_tokens"]
    (key,) = snap.values[V.ENGINE_INFO]
    info = dict(key)
    assert info[V.LABEL_BLOCK_SIZE] == "128"
    assert info[V.LABEL_PREFIX_CACHING] == V.TRUE
    assert info[V.LABEL_GPU_MEMORY_UTILIZATION] == "0.92"
    assert info[V.LABEL_DP_RANK] == "0"
    assert info[V.LABEL_MODEL] == "tiny-llama"


def test_no_unmapped_families_in_real_capture() -> None:
    for name in ("metrics-idle.txt", "metrics-final.txt"):
        assert translate(REAL / name).unmapped == []


def test_new_family_is_reported_unmapped() -> None:
    new = vllm_engine.PREFIX + "brand_new_gauge"
    text = (REAL / "metrics-final.txt").read_text() + (
        f'# HELP {new} new\n# TYPE {new} gauge\n{new}{{engine="0",model_name="tiny-llama"}} 1.0\n'
    )
    snap = translate_text(vllm_engine.ADAPTER, text, TranslateContext(engine=V.ENGINE_VLLM))
    assert snap.unmapped == [new]


def test_renamed_aliases() -> None:
    facts = yaml.safe_load((ENGINE_FIXTURES / "vllm" / "0.10-renamed" / "fixture.yaml").read_text())["facts"]
    snap = translate(ENGINE_FIXTURES / "vllm" / "0.10-renamed" / "metrics.txt")
    assert snap.value(V.KV_CACHE_USAGE) == facts["kv_usage"]
    assert V.KV_CACHE_USAGE in snap.metrics()
    assert snap.value(V.PREFIX_CACHE_QUERIED_TOKENS) == facts["prefix_cache_queries"]
    itl = snap.histogram(V.INTER_TOKEN_LATENCY)
    assert itl is not None and itl.inf == facts["itl_count"]
    assert V.TIME_PER_OUTPUT_TOKEN not in snap.metrics()  # per-request TPOT did not exist yet
    assert snap.unmapped == []


def test_current_name_wins_over_alias() -> None:
    text = (REAL / "metrics-load-2.txt").read_text()
    old = row_source(V.KV_CACHE_USAGE).replace("kv_cache", "gpu_cache")
    text += f'# TYPE {old} gauge\n{old}{{engine="0",model_name="tiny-llama"}} 0.99\n'
    snap = translate_text(vllm_engine.ADAPTER, text, TranslateContext(engine=V.ENGINE_VLLM))
    assert snap.value(V.KV_CACHE_USAGE) == pytest.approx(FACTS["load-2"]["kv_usage"])


def test_underscore_prefix() -> None:
    prefix = vllm_engine.PREFIX
    text = (REAL / "metrics-final.txt").read_text().replace(prefix, "vllm_")
    snap = translate_text(vllm_engine.ADAPTER, text, TranslateContext(engine=V.ENGINE_VLLM))
    assert snap.value(V.PROMPT_TOKENS) == FACTS["final"]["prompt_tokens"]
    assert snap.value(V.KV_CACHE_CAPACITY) == FACTS["final"]["kv_capacity_tokens"]


def test_multiprocess_dp_and_models(registry: EngineRegistry) -> None:
    d = ENGINE_FIXTURES / "vllm" / "0.33.0-mp-dp2"
    facts = yaml.safe_load((d / "fixture.yaml").read_text())["facts"]
    text = (d / "metrics.txt").read_text()
    assert registry.detect(text) is vllm_engine.ADAPTER
    snap = translate(d / "metrics.txt")
    per = facts["per_series"]
    for rank in facts["ranks"]:
        for model in facts["models"]:
            sel = {V.LABEL_DP_RANK: rank, V.LABEL_MODEL: model}
            assert snap.value(V.PROMPT_TOKENS, **sel) == per["prompt_tokens"]
            assert snap.value(V.PREEMPTIONS, **sel) == per["preemptions"]
            assert snap.value(V.KV_CACHE_CAPACITY, **sel) == per["kv_capacity_tokens"]
            h = snap.histogram(V.TIME_TO_FIRST_TOKEN, **sel)
            assert h is not None and h.inf == per["ttft_count"]
            assert h.total > 0  # _sum came before the buckets and was still read
    n = len(facts["ranks"]) * len(facts["models"])
    assert len(snap.values[V.ENGINE_INFO]) == n
    assert snap.value(V.GENERATION_TOKENS) == n * per["generation_tokens"]


def test_model_override_and_extra_labels() -> None:
    snap = translate(REAL / "metrics-final.txt", model_override="llama-3-8b", extra_labels={"replica": "a"})
    for key in snap.values[V.PROMPT_TOKENS]:
        d = dict(key)
        assert d[V.LABEL_MODEL] == "llama-3-8b" and d["replica"] == "a"


def test_slo_threshold_on_a_vllm_boundary_is_exact() -> None:
    """An SLO threshold added to the layout is exact where vLLM has that boundary (e2e 2.0 s)."""
    vocab = V.Vocabulary().with_boundaries(V.REQUEST_DURATION, [2.0])
    ctx = TranslateContext(engine=V.ENGINE_VLLM, vocabulary=vocab)
    snap = translate_text(vllm_engine.ADAPTER, (REAL / "metrics-final.txt").read_text(), ctx)
    h = snap.histogram(V.REQUEST_DURATION)
    assert h is not None and h.counts is not None
    assert h.counts[h.bounds.index(2.0)] == 39.0  # vLLM's own le="2.0" bucket
    assert h.counts[h.bounds.index(1.28)] == 8.0  # not a vLLM bound: the count at le="1.0", never more


def test_lora_newest_series_becomes_one_gauge_per_adapter() -> None:
    """vLLM keeps every (max_lora, running, waiting) tuple it ever reported, valued with the time it was
    last current (vllm.md §1.4): only the newest counts; its comma lists become one series per adapter.
    The real capture (--max-loras 1, two adapters under load): load-2's newest tuple names chat-lora,
    the final one (after the load) no adapter."""
    facts = yaml.safe_load((LORA / "fixture.yaml").read_text())["facts"]
    snap = translate(LORA / "metrics-load-2.txt")
    active = {dict(key)[V.LABEL_LORA_ADAPTER] for key in snap.values.get(V.LORA_ADAPTER_ACTIVE, {})}
    newest = facts["load-2"]["lora_newest"]
    assert active == set(newest["running"]) | set(newest["waiting"]) == {"chat-lora"}
    assert snap.value(V.LORA_ADAPTERS_MAX) == facts["max_lora"] == 1
    final = translate(LORA / "metrics-final.txt")
    assert V.LORA_ADAPTER_ACTIVE not in final.values and final.value(V.LORA_ADAPTERS_MAX) == 1
    # without the family (no --enable-lora): no LoRA series at all
    plain = translate(REAL / "metrics-final.txt")
    assert V.LORA_ADAPTER_ACTIVE not in plain.values and V.LORA_ADAPTERS_MAX not in plain.values


def test_lora_lists_are_joined_into_one_series_per_adapter(tmp_path: Path) -> None:
    info, (running, waiting) = vllm_engine.LORA_INFO, vllm_engine.LORA_LISTS
    lines = [
        f"# TYPE {info} gauge",
        f'{info}{{max_lora="2",{running}="old-lora",{waiting}="old-lora"}} 1.7e9',
        f'{info}{{max_lora="2",{running}="sql-lora,chat-lora",{waiting}="chat-lora,code-lora"}} 1.8e9',
    ]
    payload = tmp_path / "lora.txt"
    payload.write_text((REAL / "metrics-final.txt").read_text() + "\n".join(lines) + "\n")
    snap = translate(payload)
    keys = snap.values.get(V.LORA_ADAPTER_ACTIVE, {})
    assert sorted(dict(k)[V.LABEL_LORA_ADAPTER] for k in keys) == ["chat-lora", "code-lora", "sql-lora"]
    assert {dict(k)[V.LABEL_MODEL] for k in keys} == {"tiny-llama"}
