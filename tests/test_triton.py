"""Triton + TensorRT-LLM backend: pivoted gauges, microsecond counters, ensemble filtering."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.engines import triton as triton_engine
from inferwatch.exporters.mapping import TranslateContext, translate_text
from inferwatch.exporters.samples import Snapshot
from tests.conftest import ENGINE_FIXTURES

D = ENGINE_FIXTURES / "triton" / "25.03-trtllm"
F: dict[str, Any] = yaml.safe_load((D / "fixture.yaml").read_text())["facts"]


def translate(model: str | None = None) -> Snapshot:
    ctx = TranslateContext(engine=V.ENGINE_TRITON, model_override=model)
    return translate_text(triton_engine.ADAPTER, (D / "metrics.txt").read_text(), ctx)


def test_detected(registry: EngineRegistry) -> None:
    assert registry.detect((D / "metrics.txt").read_text()) is triton_engine.ADAPTER


def test_pivoted_gauges() -> None:
    snap = translate()
    req = F["trt_llm_requests"]
    assert snap.value(V.REQUESTS_RUNNING) == req["scheduled"]
    assert snap.value(V.REQUESTS_WAITING) == req["waiting"]
    assert snap.value(V.REQUESTS_RUNNING) + snap.value(V.REQUESTS_WAITING) == req["active"]
    kv = F["kv_cache_blocks"]
    assert snap.value(V.KV_CACHE_USAGE) == pytest.approx(kv["used"] / kv["max"], abs=1e-6)
    assert snap.value(V.KV_CACHE_CAPACITY) == kv["max"] * kv["tokens_per"] == F["kv_cache_capacity_tokens"]
    assert snap.value(V.PREFIX_CACHE_HIT_TOKENS) == kv["reused"] * kv["tokens_per"]


def test_only_the_trtllm_model_counts_requests() -> None:
    snap = translate()
    models = {dict(k)[V.LABEL_MODEL] for k in snap.values[V.REQUESTS]}
    assert models == {"tensorrt_llm"}, "ensemble/preprocessing/postprocessing must not count as LLM requests"
    t = F["tensorrt_llm"]
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_STOP) == t["request_success"]
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_ABORT) == t["request_failure"]["CANCELED"]


def test_microseconds_to_seconds() -> None:
    snap = translate()
    t = F["tensorrt_llm"]
    dur = snap.histogram(V.REQUEST_DURATION)
    assert dur is not None
    assert dur.counts is None, "Triton has no buckets: sum and count only, never invented buckets"
    assert dur.inf == t["request_success"]
    assert dur.total == pytest.approx(t["request_duration_us_total"] / 1e6)
    queue = snap.histogram(V.REQUEST_QUEUE)
    assert queue is not None and queue.total == pytest.approx(t["queue_duration_us_total"] / 1e6)
    assert V.REQUEST_DURATION in snap.inexact


def test_first_response_ms_histogram() -> None:
    snap = translate()
    ttft = snap.histogram(V.TIME_TO_FIRST_TOKEN)
    assert ttft is not None
    t = F["tensorrt_llm"]
    assert ttft.inf == t["first_response_count"]
    assert ttft.total == pytest.approx(t["first_response_sum_ms"] / 1000)
    assert ttft.counts is not None
    # 100 ms and 500 ms are canonical TTFT boundaries (0.1 s, 0.5 s): taken exactly
    assert ttft.bounds.index(0.1) >= 0 and ttft.bounds.index(0.5) >= 0


def test_model_override_merges_everything() -> None:
    snap = translate(model="llama-3-8b")
    for spec in (V.REQUESTS, V.REQUESTS_RUNNING, V.KV_CACHE_USAGE):
        assert {dict(k)[V.LABEL_MODEL] for k in snap.values[spec]} == {"llama-3-8b"}
