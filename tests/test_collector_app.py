"""The collector end to end: OTLP/HTTP (protobuf, JSON, gzip), OTLP/gRPC from the official SDK
exporters, the bad-input answers, and the read API with exact percentiles and goodput."""

from __future__ import annotations

import contextlib
import gzip
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from inferwatch.collector.api.app import create_app
from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.store import record as R
from tests.conftest import ROOT, free_port, postgres_schema, served_in_thread

CAPTURE = ROOT / "tests" / "fixtures" / "otlp" / "vllm-0.32.0-cpu"
PB = "application/x-protobuf"


def bodies() -> list[bytes]:
    return [p.read_bytes() for p in sorted(CAPTURE.glob("*.pb"))]


def real_spans() -> list[dict[str, Any]]:
    return [s for s in json.loads((CAPTURE / "spans.json").read_text()) if s["name"] == "llm_request"]


@pytest.fixture
def settings(tmp_path: Path) -> CollectorSettings:
    return CollectorSettings(data_dir=tmp_path, grpc_listen=f"127.0.0.1:{free_port()}")


@pytest.fixture
def client(settings: CollectorSettings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


def flush(c: TestClient) -> None:
    assert c.app.state.collector.writer.flush(10.0)  # type: ignore[attr-defined]


def stored(c: TestClient) -> int:
    flush(c)
    return int(c.get("/api/v1/requests", params={"limit": 1}).json()["count"])


def test_real_vllm_bodies_stored_with_exact_values(client: TestClient) -> None:
    for body in bodies():
        r = client.post("/v1/traces", content=body, headers={"content-type": PB})
        assert r.status_code == 200
        resp = ExportTraceServiceResponse.FromString(r.content)
        assert resp.partial_success.rejected_spans == 0
    assert stored(client) == 39
    rows = client.get("/api/v1/requests", params={"limit": 100}).json()["data"]
    by_span = {row["span_id"]: row for row in rows}
    for span in real_spans():
        row = by_span[span["span_id"]]
        a = span["attributes"]
        assert row["trace_id"] == span["trace_id"]
        assert row["request_id"] == a["gen_ai.request.id"]
        assert row[R.TTFT] == a["gen_ai.latency.time_to_first_token"]
        assert row[R.E2E] == a["gen_ai.latency.e2e"]
        assert row[R.QUEUE] == a["gen_ai.latency.time_in_queue"]
        assert row[R.PREFILL] == a["gen_ai.latency.time_in_model_prefill"]
        assert row[R.DECODE] == a["gen_ai.latency.time_in_model_decode"]
        assert row[R.PROMPT_TOKENS] == a["gen_ai.usage.prompt_tokens"]
        assert row[R.GENERATION_TOKENS] == a["gen_ai.usage.completion_tokens"]
        assert row["engine"] == "vllm"
    metrics = client.get("/metrics").text
    assert "inferwatch_collector_spans_skipped_total 13.0" in metrics


def test_duplicates_store_once(client: TestClient) -> None:
    body = bodies()[5]
    for _ in range(3):
        assert client.post("/v1/traces", content=body, headers={"content-type": PB}).status_code == 200
    n = stored(client)
    assert n == len(ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans)
    assert "inferwatch_collector_duplicate_requests_total" in client.get("/metrics").text


def to_otlp_json(body: bytes) -> bytes:
    """The OTLP JSON encoding: protobuf JSON with hex trace/span ids."""
    doc = json_format.MessageToDict(ExportTraceServiceRequest.FromString(body))
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        import base64

                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(doc).encode()


def test_json_and_gzip(client: TestClient) -> None:
    body = bodies()[5]
    r = client.post("/v1/traces", content=to_otlp_json(body), headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    first = stored(client)
    assert first > 0
    r = client.post(
        "/v1/traces", content=gzip.compress(bodies()[6]), headers={"content-type": PB, "content-encoding": "gzip"}
    )
    assert r.status_code == 200
    assert stored(client) > first


@pytest.mark.parametrize(
    ("content", "headers", "status"),
    [
        (b"\xff\xfe not protobuf", {"content-type": PB}, 400),
        (b"{not json", {"content-type": "application/json"}, 400),
        (b"hello", {"content-type": "text/plain"}, 415),
        (b"x" * 64, {"content-type": PB, "content-encoding": "br"}, 415),
        (b"not gzip", {"content-type": PB, "content-encoding": "gzip"}, 400),
    ],
)
def test_bad_input_is_refused_and_nothing_stored(
    client: TestClient, content: bytes, headers: dict[str, str], status: int
) -> None:
    assert client.post("/v1/traces", content=content, headers=headers).status_code == status
    assert stored(client) == 0
    assert client.get("/healthz").status_code == 200


def test_size_limits_also_after_decompression(tmp_path: Path) -> None:
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None, max_body_bytes=64 * 1024)
    with TestClient(create_app(settings)) as c:
        big = b"\x00" * (65 * 1024)
        assert c.post("/v1/traces", content=big, headers={"content-type": PB}).status_code == 413
        bomb = gzip.compress(b"\x00" * (10 * 1024 * 1024))
        assert len(bomb) < 64 * 1024
        r = c.post("/v1/traces", content=bomb, headers={"content-type": PB, "content-encoding": "gzip"})
        assert r.status_code == 413


def test_queue_full_is_backpressure(tmp_path: Path) -> None:
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None, queue_limit=5)
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/traces", content=bodies()[5], headers={"content-type": PB})
        assert r.status_code in (429, 503) and r.headers["retry-after"]


def test_an_export_waits_for_room_before_it_is_decoded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under overload an export waits for room in the write queue before a worker decodes it; after the
    admission wait it goes on as any other (stored here: the real queue has room)."""
    from inferwatch.collector.api.routes import traces

    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None)
    app = create_app(settings)
    with TestClient(app) as c:
        ingestor = app.state.collector.ingestor
        events: list[str] = []
        full = iter([True, True, True])  # no room three times, then room
        prepare = ingestor.prepare

        def has_room() -> bool:
            room = not next(full, False)
            events.append(f"room={room}")
            return room

        def spy(*args: Any) -> Any:
            events.append("prepare")
            return prepare(*args)

        monkeypatch.setattr(ingestor, "has_room", has_room)
        monkeypatch.setattr(ingestor, "prepare", spy)
        assert c.post("/v1/traces", content=bodies()[5], headers={"content-type": PB}).status_code == 200
        assert events == ["room=False", "room=False", "room=False", "room=True", "prepare"]
        events.clear()
        monkeypatch.setattr(ingestor, "has_room", lambda: False)  # never room: decoded after the wait
        monkeypatch.setattr(traces, "ADMISSION_WAIT_S", 0.05)
        assert c.post("/v1/traces", content=bodies()[6], headers={"content-type": PB}).status_code == 200
        assert events == ["prepare"]
        flush(c)
        sent = [ExportTraceServiceRequest.FromString(b) for b in bodies()[5:7]]
        spans = [s for r in sent for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
        assert stored(c) == sum(s.name == "llm_request" for s in spans) > 0


def test_official_sdk_exporters_http_and_grpc(settings: CollectorSettings) -> None:
    """The same spans through opentelemetry-exporter-otlp-proto-http and -grpc, as vLLM sends them."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind

    app = create_app(settings)
    with served_in_thread(app) as url:
        for name, exporter in (
            ("http", HttpExporter(endpoint=f"{url}/v1/traces")),
            ("grpc", GrpcExporter(endpoint=settings.grpc_listen, insecure=True)),
        ):
            provider = TracerProvider(resource=Resource.create({"service.name": f"sdk-{name}"}))
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            tracer = provider.get_tracer("vllm.tracing.otel")
            for span in real_spans()[:5]:
                s = tracer.start_span(
                    "llm_request", kind=SpanKind.SERVER, start_time=span["start"], attributes=span["attributes"]
                )
                s.end(end_time=span["end"])
            provider.shutdown()
        assert app.state.collector.writer.flush(10.0)
        r = httpx.get(f"{url}/api/v1/requests", params={"limit": 100}).json()
        services = sorted({row["service"] for row in r["data"]})
        assert r["count"] == 10 and services == ["sdk-grpc", "sdk-http"]
        only = httpx.get(f"{url}/api/v1/requests", params={"limit": 100, "service": "sdk-grpc"}).json()
        assert only["count"] == 5 and {row["service"] for row in only["data"]} == {"sdk-grpc"}
        for row in r["data"]:
            assert row[R.TTFT] in {s["attributes"]["gen_ai.latency.time_to_first_token"] for s in real_spans()}


def test_read_api_filters_sort_cursor_and_phases(client: TestClient) -> None:
    for body in bodies():
        client.post("/v1/traces", content=body, headers={"content-type": PB})
    flush(client)
    spans = real_spans()
    slowest = max(spans, key=lambda s: s["attributes"]["gen_ai.latency.time_to_first_token"])
    r = client.get("/api/v1/requests", params={"sort": R.TTFT, "limit": 5}).json()
    assert r["count"] == 39 and len(r["data"]) == 5
    assert r["data"][0]["span_id"] == slowest["span_id"]
    seen = [row["id"] for row in r["data"]]
    while r["next_cursor"]:
        r = client.get("/api/v1/requests", params={"sort": R.TTFT, "limit": 5, "cursor": r["next_cursor"]}).json()
        seen += [row["id"] for row in r["data"]]
    assert len(seen) == len(set(seen)) == 39
    threshold = 1.0
    r = client.get("/api/v1/requests", params={"min_ttft": threshold, "limit": 100}).json()
    assert r["count"] == sum(1 for s in spans if s["attributes"]["gen_ai.latency.time_to_first_token"] >= threshold)
    one = client.get(f"/api/v1/requests/{slowest['span_id']}").json()
    phases = one["phases"]
    e2e = slowest["attributes"]["gen_ai.latency.e2e"]
    assert phases["queue"]["share"] == pytest.approx(slowest["attributes"]["gen_ai.latency.time_in_queue"] / e2e)
    assert client.get("/api/v1/requests/nope").status_code == 404
    assert client.get("/api/v1/requests", params={"cursor": "!!"}).status_code == 400


def nearest_rank(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def test_stats_exact_percentiles_and_goodput(client: TestClient) -> None:
    for body in bodies():
        client.post("/v1/traces", content=body, headers={"content-type": PB})
    flush(client)
    spans = real_spans()
    ttfts = [s["attributes"]["gen_ai.latency.time_to_first_token"] for s in spans]
    r = client.get("/api/v1/stats", params={"window": "3650d", "slo_ttft": 1.0, "slo_e2e": 1.5}).json()
    (entry,) = r["data"]
    assert entry["requests"] == 39
    for q in (0.5, 0.9, 0.95, 0.99):
        assert entry[R.TTFT][f"p{round(q * 100)}"] == nearest_rank(ttfts, q)
    good = sum(
        1
        for s in spans
        if s["attributes"]["gen_ai.latency.time_to_first_token"] <= 1.0 and s["attributes"]["gen_ai.latency.e2e"] <= 1.5
    )
    assert entry["goodput"]["good_requests"] == good
    assert entry["goodput"]["share"] == pytest.approx(good / 39)
    by_engine = client.get("/api/v1/stats", params={"window": "3650d", "group_by": "engine"}).json()
    assert [g["engine"] for g in by_engine["data"]] == ["vllm"]
    assert client.get("/api/v1/stats", params={"window": "forever"}).status_code == 400


def test_tokens_and_exposure(tmp_path: Path) -> None:
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None, ingest_tokens=["in"], read_tokens=["out"])
    with TestClient(create_app(settings)) as c:
        body = bodies()[6]
        assert c.post("/v1/traces", content=body, headers={"content-type": PB}).status_code == 401
        ok = c.post("/v1/traces", content=body, headers={"content-type": PB, "authorization": "Bearer in"})
        assert ok.status_code == 200
        assert c.get("/api/v1/requests").status_code == 401
        assert c.get("/api/v1/requests", headers={"authorization": "Bearer in"}).status_code == 401
        assert c.get("/api/v1/requests", headers={"authorization": "Bearer out"}).status_code == 200
    from inferwatch.core.config import ConfigError

    with pytest.raises(ConfigError, match="refusing"):
        CollectorSettings(data_dir=tmp_path, listen="0.0.0.0:4318").check_exposure()
    CollectorSettings(data_dir=tmp_path, listen="0.0.0.0:4318", insecure=True).check_exposure()


def test_readyz(client: TestClient) -> None:
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["database"] == "ok"
    assert "/api/v1/stats" in client.get("/openapi.json").json()["paths"]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_store_real_bodies_on_each_backend(backend: str, tmp_path: Path) -> None:
    """The collector app end to end on SQLite and on the local PostgreSQL (fresh schema)."""
    with contextlib.ExitStack() as stack:
        url = None if backend == "sqlite" else stack.enter_context(postgres_schema("iw_app"))
        settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None, database_url=url)
        c = stack.enter_context(TestClient(create_app(settings)))
        for body in bodies():
            assert c.post("/v1/traces", content=body, headers={"content-type": PB}).status_code == 200
        assert stored(c) == 39
        entry = c.get("/api/v1/stats", params={"window": "3650d"}).json()["data"][0]
        ttfts = [s["attributes"]["gen_ai.latency.time_to_first_token"] for s in real_spans()]
        assert entry[R.TTFT]["p99"] == nearest_rank(ttfts, 0.99)
        assert c.get("/readyz").status_code == 200
        collector = c.app.state.collector  # type: ignore[attr-defined]
        if backend == "sqlite":
            assert collector.stats_reader is collector.engine
            return
        # PostgreSQL: the stats reads' own pool, whose statements stay prepared through the other reads' rollbacks
        assert collector.stats_reader is not collector.engine
        assert c.get("/api/v1/requests", params={"limit": 5}).status_code == 200
        again = c.get("/api/v1/stats", params={"window": "3650d"}).json()["data"][0]
        assert again == entry
        for _ in range(6):  # psycopg would prepare a statement run 5 times: on the stats engine only ours are
            c.get("/api/v1/stats", params={"window": "1h", "group_by": "model"})
        with collector.stats_reader.connect() as conn:  # newest first: the connection the stats reads used
            assert conn.default_isolation_level == "REPEATABLE READ"
            prepared = conn.exec_driver_sql(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            ).all()
        assert {("rollup_state" in s, "request_values" in s) for s, _, _ in prepared} == {(True, False), (False, True)}
        assert all(generic > 0 and custom == 0 for _, generic, custom in prepared), prepared  # planned once


def test_db_upgrade_command(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from inferwatch.cli import app

    result = CliRunner().invoke(app, ["db", "upgrade", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "database at revision" in result.stderr
    assert (tmp_path / "inferwatch.db").exists()


def test_lora_adapter_per_request_from_simulated_tgi(client: TestClient) -> None:
    """TGI names each request's adapter (``parameters.adapter_id``, or the OpenAI ``model``) in its
    handler span; the collector stores it and the read API filters by it."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from tests.test_collector_sources import run_sim

    async def fn(c: httpx.AsyncClient) -> list[int]:
        out = []
        for adapter in ("sql-lora", "sql-lora", "chat-lora", None):
            params: dict[str, object] = {"max_new_tokens": 3}
            if adapter:
                params["adapter_id"] = adapter
            out.append((await c.post("/generate", json={"inputs": "hi", "parameters": params})).status_code)
        chat = {"model": "chat-lora", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        out.append((await c.post("/v1/chat/completions", json=chat)).status_code)
        return out

    statuses, spans = run_sim("tgi", fn)
    assert statuses == [200] * 5
    r = client.post("/v1/traces", content=encode_spans(spans).SerializeToString(), headers={"content-type": PB})
    assert r.status_code == 200, r.text
    flush(client)

    def adapters(**params: str) -> list[str | None]:
        page = client.get("/api/v1/requests", params={"limit": 100, **params}).json()
        return sorted((row["lora_adapter"] for row in page["data"]), key=str)

    assert adapters() == [None, "chat-lora", "chat-lora", "sql-lora", "sql-lora"]
    assert adapters(lora_adapter="sql-lora") == ["sql-lora", "sql-lora"]
    assert adapters(lora_adapter="chat-lora") == ["chat-lora", "chat-lora"]
    assert adapters(lora_adapter="none-such") == []
