"""SGLang's request traces → records: the span fixture written from SGLang's source, hand-built spans, and the
simulated SGLang's spans through the collector's mapping, checked against the simulator's own counts."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferwatch.collector.ingest.sources import SOURCES, map_export, sglang
from inferwatch.core import vocabulary as V
from inferwatch.simulator.base import SimSettings
from inferwatch.simulator.clock import VirtualClock, run_virtual
from inferwatch.simulator.engines.sglang import SglangSim
from inferwatch.simulator.engines.sglang import spans as sim_spans
from inferwatch.simulator.scheduler import EngineParams
from inferwatch.simulator.server import create_app
from tests.conftest import ROOT, in_process, served_in_thread
from tests.support.span_builders import T0, export, kvs, make_span

FIXTURE = ROOT / "tests" / "fixtures" / "otlp" / "sglang-44cedc2" / "spans.json"
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def fixture_export() -> ExportTraceServiceRequest:
    """``spans.json`` (decoded spans, as the vLLM capture's) encoded back into one OTLP export."""
    decoded: list[dict[str, Any]] = json.loads(FIXTURE.read_text())
    spans = []
    for d in decoded:
        s = Span(
            name=d["name"],
            kind=d["kind"],
            trace_id=bytes.fromhex(d["trace_id"]),
            span_id=bytes.fromhex(d["span_id"]),
            parent_span_id=bytes.fromhex(d["parent_span_id"]),
            start_time_unix_nano=d["start"],
            end_time_unix_nano=d["end"],
            attributes=kvs(d["attributes"]),
            status=Status(code=d["status"].get("code", 0)),
        )
        for e in d["events"]:
            s.events.add(name=e["name"], time_unix_nano=e["time"], attributes=kvs(e["attributes"]))
        for link in d["links"]:
            s.links.add(trace_id=bytes.fromhex(link["trace_id"]), span_id=bytes.fromhex(link["span_id"]))
        spans.append(s)
    resource, scope = decoded[0]["resource"], decoded[0]["scope"]
    assert all(d["resource"] == resource and d["scope"] == scope for d in decoded)
    return ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=kvs(resource)),
                scope_spans=[ScopeSpans(scope=InstrumentationScope(name=scope), spans=spans)],
            )
        ]
    )


# -- the fixture ---------------------------------------------------------------------------------------
def test_fixture_records_are_its_ground_truth() -> None:
    batch = map_export(fixture_export())
    assert batch.rejected == [] and batch.skipped == 17
    done, aborted = sorted(batch.records, key=lambda r: r.start_time)
    assert done.engine == aborted.engine == V.ENGINE_SGLANG
    assert done.request_id == "5f0c1d2e3a4b4c5d8e9fa0b1c2d3e4f5" and done.model == MODEL
    assert done.time_to_first_token == pytest.approx(0.0306) and not done.ttft_derived
    assert done.request_queue == pytest.approx(0.011)  # the prefill_waiting slice
    assert done.request_duration == pytest.approx(0.0954)
    assert done.request_prefill == pytest.approx(0.0294) and done.request_decode == pytest.approx(0.0648)
    assert (done.prompt_tokens, done.generation_tokens, done.prefix_cache_hit_tokens) == (27, 4, 16)
    assert done.time_per_output_token == pytest.approx(0.0648 / 3)
    assert done.finish_reason == V.OUTCOME_STOP and done.error is None
    assert done.max_tokens == 64 and done.temperature == pytest.approx(0.7)
    assert done.service == "sglang" and done.attributes[V.LABEL_ROLE] == V.ROLE_UNIFIED
    assert done.attributes["gen_ai.latency.time_in_model_inference"] == pytest.approx(0.0942)
    assert aborted.finish_reason == V.OUTCOME_ABORT and aborted.error == V.OUTCOME_ABORT
    assert aborted.time_to_first_token is None and aborted.request_queue is None
    assert aborted.request_duration == pytest.approx(0.4501) and aborted.generation_tokens == 0


def test_fixture_spans_are_claimed_before_the_generic_genai_source() -> None:
    names = [s.NAME for s in SOURCES]
    assert names.index(V.ENGINE_SGLANG) < names.index("genai")


# -- hand-built spans ----------------------------------------------------------------------------------
ROOT_ATTRS = {
    "rid": "0123456789abcdef0123456789abcdef",
    "module": "sglang::request",
    "gen_ai.usage.prompt_tokens": 40,
    "gen_ai.usage.completion_tokens": 1,
    "gen_ai.response.finish_reasons": '["length"]',
}


def test_prefill_role_root_alone_without_e2e() -> None:
    root = make_span("prefill Req 01234567", ROOT_ATTRS, end=T0 + 250_000_000)
    (rec,) = map_export(export(("some.other.scope", {}, [root]))).records
    assert rec.engine == V.ENGINE_SGLANG and rec.attributes[V.LABEL_ROLE] == V.ROLE_PREFILL
    assert rec.request_id == ROOT_ATTRS["rid"]  # no gen_ai.request.id: the rid
    assert rec.request_duration == pytest.approx(0.25)  # no gen_ai.latency.e2e: the span's duration
    assert rec.request_queue is None and rec.finish_reason == V.OUTCOME_LENGTH and rec.model is None


def test_children_and_non_requests_are_skipped_and_bad_roots_rejected() -> None:
    thread = make_span("Scheduler [TP 0] (host:00000000 | pid:1)", {"tp_rank": 0}, span=b"\x02" * 8, parent=b"\x01" * 8)
    stage = make_span("prefill_waiting", span=b"\x03" * 8, parent=b"\x02" * 8, end=T0 + 5_000_000)
    no_rid = make_span(" Req 76543210", {"module": "sglang::request"}, span=b"\x04" * 8)
    bad_reason = make_span(
        "decode Req 89abcdef", {**ROOT_ATTRS, "gen_ai.response.finish_reasons": "not json"}, span=b"\x01" * 8
    )
    batch = map_export(export((sglang.SCOPE, {"service.name": "sglang"}, [thread, stage, no_rid, bad_reason])))
    # no_rid lacks rid: not a root, but SGLang's scope claims it and skips it
    assert batch.skipped == 3 and batch.rejected == []
    (rec,) = batch.records
    assert rec.finish_reason is None and rec.request_queue == pytest.approx(0.005)
    assert rec.attributes[V.LABEL_ROLE] == V.ROLE_DECODE
    wrong_type = make_span(" Req 01234567", {**ROOT_ATTRS, "gen_ai.usage.prompt_tokens": "many"})
    rejected = map_export(export((sglang.SCOPE, {}, [wrong_type]))).rejected
    assert rejected == ["sglang: gen_ai.usage.prompt_tokens is not an integer"]


def test_not_sglang() -> None:
    other = make_span("Req 01234567", {"rid": "x", "module": "sglang::request"})  # no leading role/space
    lookalike = make_span(" Req 01234567", {"rid": "x", "module": "other::request"})
    assert not sglang.claims(next(iter(_views(other)))) and not sglang.claims(next(iter(_views(lookalike))))


def _views(span: Span) -> Any:
    from inferwatch.collector.ingest.sources import views

    return views(export(("x", {}, [span])))


# -- the simulator -------------------------------------------------------------------------------------
def test_simulated_sglang_spans_agree_with_its_counts() -> None:
    exporter = InMemorySpanExporter()
    settings = SimSettings(
        engine=V.ENGINE_SGLANG,
        model=MODEL,
        load=0,
        seed=3,
        params=EngineParams(block_size=1, num_blocks=2048, max_model_len=1024),
    )

    async def main(clock: VirtualClock) -> tuple[list[dict[str, Any]], SglangSim]:
        app = create_app(settings, span_exporter=exporter, clock=clock)
        headers = {"traceparent": "00-d0904930f2249171694f2c1df1472cee-2f1c3a4b5d6e7f80-01"}
        async with in_process(app) as c:
            metas = []
            r = await c.post("/generate", json={"text": "alpha " * 60, "sampling_params": {"max_new_tokens": 7}})
            metas.append(r.json()["meta_info"])
            r = await c.post(
                "/generate",
                json={"text": "beta " * 30, "sampling_params": {"max_new_tokens": 5}, "stream": True},
                headers=headers,
            )
            last = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")][-1]
            metas.append(last["meta_info"])
            r = await c.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi " * 9}], "max_tokens": 4}
            )
            body = r.json()
            metas.append(
                {
                    "prompt_tokens": body["usage"]["prompt_tokens"],
                    "completion_tokens": body["usage"]["completion_tokens"],
                    "id": body["id"],
                }
            )
            sim: SglangSim = app.state.sim
            return metas, sim

    metas, sim = run_virtual(main)
    spans = exporter.get_finished_spans()
    batch = map_export(encode_spans(spans))
    assert batch.rejected == [] and len(batch.records) == 3 and batch.skipped == len(spans) - 3
    records = {r.request_id: r for r in batch.records}
    for meta in metas:
        rec = records[meta["id"]]
        assert rec.model == MODEL and rec.service == sim_spans.SERVICE_NAME
        assert (rec.prompt_tokens, rec.generation_tokens) == (meta["prompt_tokens"], meta["completion_tokens"])
        if "e2e_latency" in meta:
            assert rec.request_duration == pytest.approx(meta["e2e_latency"], abs=1e-6)
    m = sim.metrics
    assert sum(r.time_to_first_token or 0 for r in batch.records) == pytest.approx(m.ttft.sum_of(), abs=1e-6)
    assert sum(r.request_queue or 0 for r in batch.records) == pytest.approx(m.queue_time.sum_of(), abs=1e-6)
    assert sum(r.request_duration or 0 for r in batch.records) == pytest.approx(m.e2e.sum_of(), abs=1e-6)
    assert sum(r.prompt_tokens or 0 for r in batch.records) == m.prompt_tokens.total()
    assert sum(r.generation_tokens or 0 for r in batch.records) == m.generation_tokens.total()
    traced = [r for r in batch.records if r.trace_id == "d0904930f2249171694f2c1df1472cee"]
    assert len(traced) == 1  # the incoming traceparent is the root's parent
    assert all(r.trace_id.startswith("0" * 16) for r in batch.records if r not in traced)  # 64-bit ids


def test_simulated_retractions_are_events_and_counts() -> None:
    exporter = InMemorySpanExporter()
    settings = SimSettings(
        engine=V.ENGINE_SGLANG,
        load=0,
        seed=5,
        params=EngineParams(block_size=1, num_blocks=300, max_model_len=256, max_num_seqs=8),
    )

    async def main(clock: VirtualClock) -> SglangSim:
        import asyncio

        app = create_app(settings, span_exporter=exporter, clock=clock)
        async with in_process(app) as c:
            body = {"text": "gamma " * 30, "sampling_params": {"max_new_tokens": 120, "ignore_eos": True}}
            await asyncio.gather(*(c.post("/generate", json=body) for _ in range(6)))
            sim: SglangSim = app.state.sim
            return sim

    sim = run_virtual(main)
    retracted = sim.metrics.fam("num_retracted_requests_total").total()
    assert retracted > 0
    events = [e for s in exporter.get_finished_spans() for e in s.events if e.name == "retract"]
    assert len(events) == retracted == sim.metrics.retractions.sum_of()
    batch = map_export(encode_spans(exporter.get_finished_spans()))
    assert len(batch.records) == 6 and all(r.generation_tokens == 120 for r in batch.records)


def test_simulated_abort_gives_an_abort_record() -> None:
    """A client that leaves a stream: the root span says ``abort`` and the scheduler thread span fails."""
    exporter = InMemorySpanExporter()
    app = create_app(SimSettings(engine=V.ENGINE_SGLANG, load=0, speed=20.0), span_exporter=exporter)
    sim: SglangSim = app.state.sim
    with served_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        body = {"text": "leave early", "sampling_params": {"max_new_tokens": 300, "ignore_eos": True}, "stream": True}
        with c.stream("POST", "/generate", json=body) as r:
            next(r.iter_lines())
        deadline = time.monotonic() + 20
        while sim.metrics.aborted.total() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    spans = exporter.get_finished_spans()
    (thread,) = [s for s in spans if s.name.startswith(sim_spans.SCHEDULER_LABEL)]
    assert not thread.status.is_ok and dict(thread.attributes or {})["type"] == "abort"
    (rec,) = map_export(encode_spans(spans)).records
    assert rec.finish_reason == V.OUTCOME_ABORT and rec.error == V.OUTCOME_ABORT
    assert rec.time_to_first_token is not None and 0 < (rec.generation_tokens or 0) < 300
