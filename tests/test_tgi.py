"""TGI value semantics on the catalog-faithful v3.3.7 payload."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.engines import tgi as tgi_engine
from inferwatch.exporters.mapping import TranslateContext
from inferwatch.exporters.samples import Snapshot
from tests.conftest import ENGINE_FIXTURES

D = ENGINE_FIXTURES / "tgi" / "3.3.7"
META: dict[str, Any] = yaml.safe_load((D / "fixture.yaml").read_text())
F = META["facts"]


CAPACITY: int = META["options"]["max_batch_total_tokens"]


def translate(text: str | None = None, capacity: int | None = CAPACITY) -> Snapshot:
    ctx = TranslateContext(engine=V.ENGINE_TGI)
    ctx.facts = tgi_engine.parse_info(json.loads((D / "info.json").read_text()))
    session = tgi_engine.TgiSession(tgi_engine.ADAPTER, tgi_engine.TgiOptions(max_batch_total_tokens=capacity))
    return session.translate((D / "metrics.txt").read_text() if text is None else text, ctx)


def test_detected(registry: EngineRegistry) -> None:
    assert registry.detect((D / "metrics.txt").read_text()) is tgi_engine.ADAPTER


def test_model_from_info_and_outcomes() -> None:
    snap = translate()
    assert {dict(k)[V.LABEL_MODEL] for k in snap.values[V.REQUESTS]} == {F["model_id"]}
    by_err = F["requests_failed_by_err"]
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_STOP) == F["requests_success"]
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_ABORT) == by_err["dropped"]
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_ERROR) == by_err["overloaded"] + by_err["generation"]
    # validation failures (HTTP 422) never reached the engine: not counted, like vLLM's 400s
    assert snap.value(V.REQUESTS) == F["requests_finished"] - by_err["validation"]


def test_tokens_gauges_and_kv_proxy() -> None:
    snap = translate()
    assert snap.value(V.PROMPT_TOKENS) == F["input_length_sum"]
    assert snap.value(V.GENERATION_TOKENS) == F["generated_tokens_sum"]
    assert snap.value(V.REQUESTS_RUNNING) == F["running"]
    assert snap.value(V.REQUESTS_WAITING) == F["waiting"]
    assert snap.value(V.KV_CACHE_USAGE) == pytest.approx(F["kv_usage_proxy"])
    assert snap.value(V.KV_CACHE_CAPACITY) == CAPACITY
    assert "approximate" in snap.notes[V.KV_CACHE_USAGE]


def test_no_kv_without_configured_capacity() -> None:
    snap = translate(capacity=None)
    assert V.KV_CACHE_USAGE not in snap.metrics()
    assert V.KV_CACHE_CAPACITY not in snap.metrics()


def test_histograms_rebucketed_from_geometric_float_noise() -> None:
    snap = translate()
    dur = snap.histogram(V.REQUEST_DURATION)
    assert dur is not None and dur.inf == F["request_histogram_count"]
    assert dur.total == pytest.approx(F["request_duration_sum_seconds"])
    assert V.REQUEST_DURATION in snap.inexact  # TGI's 1.5x bounds never hit OTel's boundaries
    assert dur.counts is not None and dur.counts == sorted(dur.counts) and dur.counts[-1] <= dur.inf
    tpot = snap.histogram(V.TIME_PER_OUTPUT_TOKEN)
    assert tpot is not None and tpot.inf == F["request_histogram_count"]
    assert "includes the prefill" in snap.notes[V.TIME_PER_OUTPUT_TOKEN]


def test_no_ttft_invented() -> None:
    snap = translate()
    assert V.TIME_TO_FIRST_TOKEN not in snap.metrics()
    assert V.TIME_TO_FIRST_TOKEN.key in tgi_engine.ADAPTER.unsupported


def test_info_series() -> None:
    (key,) = translate().values[V.ENGINE_INFO]
    info = dict(key)
    assert info[V.LABEL_ENGINE_VERSION] == F["info_version"]
    assert info[V.LABEL_MAX_CONCURRENCY] == "128"


def test_family_order_does_not_matter() -> None:
    text = (D / "metrics.txt").read_text()
    blocks = [b for b in text.split("\n\n") if b.strip()]
    shuffled = "\n\n".join(reversed(blocks)) + "\n"
    a, b = translate(), translate(shuffled)
    assert a.values == b.values
    assert {m: {k: (h.counts, h.inf, h.total) for k, h in s.items()} for m, s in a.histograms.items()} == {
        m: {k: (h.counts, h.inf, h.total) for k, h in s.items()} for m, s in b.histograms.items()
    }


def test_fresh_server_empty_body() -> None:
    snap = translate("")
    assert snap.metrics() == {V.ENGINE_INFO, V.KV_CACHE_CAPACITY}
    assert snap.unmapped == []


def test_options_are_typed_and_validated() -> None:
    session = tgi_engine.ADAPTER.open({"max_batch_total_tokens": "16384"})  # as --engine-option gives it
    assert isinstance(session, tgi_engine.TgiSession)
    assert session.options.max_batch_total_tokens == 16384
    for bad, field in (({"max_batch_total_tokens": 0}, "max_batch_total_tokens"), ({"capacity": 1}, "capacity")):
        with pytest.raises(ValidationError) as exc:
            tgi_engine.ADAPTER.open(bad)
        assert [e["loc"] for e in exc.value.errors()] == [(field,)]


def test_empty_body_claimed_through_info(registry: EngineRegistry) -> None:
    info = json.loads((D / "info.json").read_text())
    assert registry.detect("") is None
    assert registry.detect_empty(lambda path, allow_404=False: json.dumps(info) if path == "/info" else "") is (
        tgi_engine.ADAPTER
    )
    assert registry.detect_empty(lambda path, allow_404=False: "{}") is None
