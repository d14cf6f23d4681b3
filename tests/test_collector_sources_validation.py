"""Span → request mapping of what no engine should send: bad input rejected (never raised), a failing source,
impossible times and values, text PostgreSQL cannot hold, exact timestamps; the helpers, and the identity
(model and service) of spans that do not name them. The sources one by one: ``tests/test_collector_sources.py``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from inferwatch.collector.ingest import sources
from inferwatch.collector.ingest.sources import MappedBatch, map_export, vllm
from inferwatch.collector.ingest.sources.shared import ExportIndex, SpanView, any_value, resource_info, timestamp
from inferwatch.collector.store import record as R
from tests.conftest import ROOT
from tests.support.span_builders import EPOCH, T0, export, kvs, make_span, sid, value, vllm_attrs


# -- bad input -----------------------------------------------------------------------------------------
def test_bad_input_is_rejected_never_raised() -> None:
    spans = [
        make_span("llm_request", vllm_attrs(), trace=b"\x01\x02\x03"),
        make_span("llm_request", vllm_attrs(), span=bytes(8)),
        make_span("llm_request", vllm_attrs(), trace=bytes(16), span=sid(3)),
        make_span("llm_request", {}, span=sid(4)),
        make_span("llm_request", {**vllm_attrs(), "gen_ai.latency.e2e": "fast"}, span=sid(5)),
        make_span("llm_request", {**vllm_attrs(), "gen_ai.usage.completion_tokens": 2.5}, span=sid(6)),
        make_span("llm_request", vllm_attrs(), span=sid(7), start=T0, end=T0 - 1),
        make_span("llm_request", vllm_attrs(), span=sid(8), start=0),
        make_span("llm_request", {**vllm_attrs(), "gen_ai.usage.completion_tokens": "--5"}, span=sid(10)),
        make_span("llm_request", vllm_attrs(), span=sid(11), end=2**64 - 1),  # ends in 2554
        make_span("llm_request", vllm_attrs(), span=sid(9)),  # the one good span
    ]
    others = [
        make_span("GET /health", {"http.route": "/health", "http.request.method": "GET"}, span=sid(20)),
        make_span("POST /v1/chat/completions", {"http.response.status_code": 200}, span=sid(21)),
        make_span("Load weights", {"code.function": "load_weights"}, span=sid(22)),
    ]
    batch = map_export(export(("vllm.tracing.otel", {}, spans), ("opentelemetry.instrumentation.fastapi", {}, others)))
    assert batch.rejected == [
        "vllm: bad trace id",
        "vllm: bad span id",
        "vllm: bad trace id",
        "vllm: llm_request span without gen_ai.request.id",
        "vllm: gen_ai.latency.e2e is not a number",
        "vllm: gen_ai.usage.completion_tokens is not an integer",
        "vllm: span ends before it starts",
        "vllm: span without start or end time",
        "vllm: gen_ai.usage.completion_tokens is not an integer",
        "vllm: span time more than a day in the future",
    ]
    assert [r.span_id for r in batch.records] == [sid(9).hex()]
    assert batch.skipped == 3
    # an llm_request without attributes from another scope is vLLM's too (nothing else could map it)
    lone = map_export(export(("unknown", {}, [make_span("llm_request")])))
    assert lone.rejected == ["vllm: llm_request span without gen_ai.request.id"]
    assert map_export(ExportTraceServiceRequest()) == MappedBatch([], 0, [])


def test_a_failing_source_becomes_a_rejection(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(view: SpanView) -> R.RequestRecord | None:
        raise RuntimeError(view.name)

    monkeypatch.setattr(vllm, "to_record", boom)
    batch = map_export(export(("vllm.tracing.otel", {}, [make_span("llm_request", vllm_attrs())])))
    assert batch.rejected == ["vllm: unexpected RuntimeError"] and batch.records == []
    assert [s.NAME for s in sources.SOURCES] == ["vllm", "tgi", "trtllm", "sglang", "genai"]


# -- helpers -------------------------------------------------------------------------------------------
def test_value_and_resource_helpers() -> None:
    assert any_value(value({"a": [1, 2.5, "x", True], "b": b"\x00\x01"})) == {"a": [1, 2.5, "x", True], "b": "AAE="}
    assert any_value(AnyValue()) is None
    assert (
        resource_info(Resource(attributes=kvs({"service.name": "s", "host.name": "h", "process.pid": 42}))).instance
        == "h/42"
    )
    assert resource_info(Resource(attributes=kvs({"process.pid": 42}))).instance == "42"
    info = resource_info(Resource(attributes=kvs({"service.instance.id": "i-1", "host.name": "h"})))
    assert (info.service, info.instance) == (None, "i-1")
    assert resource_info(Resource()).instance is None
    assert timestamp(1_795_976_244_955_801_088) == datetime(2026, 11, 29, 18, 17, 24, 955801, tzinfo=UTC)
    view = SpanView(make_span("x", {"k": 1}), "scope", resource_info(Resource()), ExportIndex())
    assert view.attrs == {"k": 1} and view.duration == 2.0315


def test_every_source_module_is_dispatched() -> None:
    modules = {p.stem for p in (ROOT / "inferwatch" / "collector" / "ingest" / "sources").glob("*.py")} - {
        "__init__",
        "shared",
    }
    dispatched = {s.__name__.rsplit(".", 1)[-1] for s in sources.SOURCES if isinstance(s, ModuleType)}
    assert dispatched == modules and len(sources.SOURCES) == len(modules)


# -- validation of mapped records ----------------------------------------------------------------------
def test_impossible_times_and_values_are_rejected() -> None:
    now = timestamp(T0)
    day = 86_400 * 10**9
    y1999 = int((datetime(1999, 12, 31, tzinfo=UTC) - EPOCH).total_seconds()) * 10**9
    spans = [
        make_span("llm_request", vllm_attrs(), span=sid(1), start=1, end=2),
        make_span("llm_request", vllm_attrs(), span=sid(2), start=y1999, end=y1999 + 1),
        make_span("llm_request", vllm_attrs(), span=sid(3), start=T0 + 2 * day, end=T0 + 2 * day + 1),
        make_span("llm_request", {**vllm_attrs(), "gen_ai.latency.time_to_first_token": -0.1}, span=sid(4)),
        make_span("llm_request", {**vllm_attrs(), "gen_ai.latency.time_in_model_decode": -1}, span=sid(5)),
        make_span("llm_request", {**vllm_attrs(), "gen_ai.usage.prompt_tokens": str(2**63)}, span=sid(6)),
        make_span("llm_request", {**vllm_attrs(), "gen_ai.request.max_tokens": -1}, span=sid(7)),
        make_span("llm_request", {**vllm_attrs(), "gen_ai.request.n": 2**31}, span=sid(8)),
        make_span("llm_request", {**vllm_attrs(), "gen_ai.latency.e2e": float("inf")}, span=sid(9)),
        make_span("llm_request", {**vllm_attrs(), "gen_ai.usage.prompt_tokens": 2**63 - 1}, span=sid(10)),
        make_span("llm_request", vllm_attrs(), span=sid(11)),
    ]
    batch = map_export(export(("vllm.tracing.otel", {}, spans)), now=now)
    assert batch.rejected == [
        "vllm: span starts before 2000",
        "vllm: span starts before 2000",
        "vllm: span time more than a day in the future",
        "vllm: time_to_first_token is negative",
        "vllm: request_decode is negative",
        "vllm: prompt_tokens out of range",
        "vllm: max_tokens out of range",
        "vllm: n out of range",
        "vllm: gen_ai.latency.e2e is not finite",
    ]
    assert [r.span_id for r in batch.records] == [sid(10).hex(), sid(11).hex()]
    # a sender's clock half a day ahead is accepted
    skewed = make_span("llm_request", vllm_attrs(), span=sid(12), start=T0 + day // 2, end=T0 + day // 2 + 1)
    assert map_export(export(("vllm.tracing.otel", {}, [skewed])), now=now).rejected == []


def test_text_postgres_cannot_hold_is_made_storable() -> None:
    attrs = {**vllm_attrs(), "gen_ai.request.id": "a\x00b", "k\x00": ["x\x00", float("nan"), {"d": float("-inf")}]}
    (rec,) = map_export(
        export(("vllm.tracing.otel", {"service.name": "s\x00"}, [make_span("llm_request", attrs)]))
    ).records
    assert rec.request_id == "a\ufffdb" and rec.service == "s\ufffd"
    assert rec.attributes == {"k\ufffd": ["x\ufffd", "NaN", {"d": "-Infinity"}]}
    clean = {**vllm_attrs(), "ok": [1.5, "y"]}
    (plain,) = map_export(export(("vllm.tracing.otel", {}, [make_span("llm_request", clean)]))).records
    assert plain.attributes == {"ok": [1.5, "y"]}
    # flat attributes (the fast path): a NUL in a value or a key, a non-finite number, each made storable
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"v": "a\x00"}, {"v": "a\ufffd"}),
        ({"k\x00": 1}, {"k\ufffd": 1}),
        ({"f": float("inf"), "b": True, "n": 3}, {"f": "Infinity", "b": True, "n": 3}),
    ]
    for flat, stored in cases:
        span = make_span("llm_request", {**vllm_attrs(), **flat})
        (rec,) = map_export(export(("vllm.tracing.otel", {}, [span]))).records
        assert rec.attributes == stored


def test_timestamps_are_exact_microseconds() -> None:
    """The float path of :func:`timestamp` gives what integer arithmetic gives (the microseconds of the
    nanoseconds, truncated) at random times and on both sides of microsecond and second boundaries, from
    1970 up to where it hands over to the integer arithmetic, and past that."""
    import random

    rng = random.Random(7)
    limit = 2**32 * 10**9
    times = [rng.randrange(limit) for _ in range(200_000)]
    for base in (0, 946_684_800 * 10**9, T0, limit - 10**6, limit):
        times += [base + d for d in (*range(0, 3_000, 7), 999, 1_000, 1_001, 10**9 - 1, 10**9, 10**9 + 1)]
    times += [limit * 2 + 123_456_789, 253_402_300_799 * 10**9 + 999_999_999]  # 2242, the last second of 9999
    for ns in times:
        assert timestamp(ns) == EPOCH + timedelta(microseconds=ns // 1000), ns


# -- identity: the model and service of spans that do not name them ---------------------------------------
def test_identity_names_the_model_and_service() -> None:
    identity = sources.Identity(
        service_models={"vllm-a": "model-a", "team-x": "model-x"}, model_from="deploy", service_from="deploy"
    )
    groups = [
        ("vllm.tracing.otel", {"service.name": "vllm-a"}, [make_span("llm_request", vllm_attrs(), span=sid(1))]),
        (
            "vllm.tracing.otel",
            {"service.name": "unknown_service:python3", "deploy": "team-x"},
            [make_span("llm_request", vllm_attrs(), span=sid(2))],
        ),
        (
            "vllm.tracing.otel",
            {"service.name": "vllm-b", "gen_ai.request.model": "own"},
            [make_span("llm_request", vllm_attrs(), span=sid(3))],
        ),
        (
            "vllm.tracing.otel",
            {"service.name": "vllm-c"},
            [make_span("llm_request", {**vllm_attrs(), "gen_ai.response.model": "span-model"}, span=sid(4))],
        ),
        ("vllm.tracing.otel", {}, [make_span("llm_request", vllm_attrs(), span=sid(5))]),
        ("vllm.tracing.otel", {"deploy": "d-7"}, [make_span("llm_request", vllm_attrs(), span=sid(6))]),
    ]
    request = export(*groups)
    sources.apply_identity(request, identity)
    got = {r.span_id: (r.service, r.model) for r in map_export(request).records}
    assert got == {
        sid(1).hex(): ("vllm-a", "model-a"),  # service.name -> model
        sid(2).hex(): ("team-x", "model-x"),  # the placeholder replaced, then mapped
        sid(3).hex(): ("vllm-b", "own"),  # the resource's own model attribute wins
        sid(4).hex(): ("vllm-c", "span-model"),  # the span's wins over everything
        sid(5).hex(): (None, None),  # nothing to go by
        sid(6).hex(): ("d-7", "d-7"),  # no service.name: both from the attribute
    }
    untouched = export(*groups)
    sources.apply_identity(untouched, sources.Identity())
    assert untouched == export(*groups)  # nothing configured: the export is not touched
