"""The collector's OpenAPI document: every route's success body has a schema, the error answers are
documented, and the bodies the collector really sends are the documented models."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from fastapi.testclient import TestClient
from google.rpc import status_pb2
from pydantic import BaseModel, ValidationError

from inferwatch.collector import schemas
from inferwatch.collector.api.app import create_app
from inferwatch.collector.ingest.otlp import JSON, PROTOBUF
from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.stats import listing, windowing
from inferwatch.collector.store.tables import REQUEST_TABLE
from inferwatch.core.schema import E2E, QUEUE, TPOT, TTFT
from tests.conftest import ROOT
from tests.test_collector_app import to_otlp_json

CAPTURE = ROOT / "tests" / "fixtures" / "otlp" / "vllm-0.32.0-cpu"
OTLP_ERRORS = {400, 401, 408, 413, 415, 429, 503}
ERRORS: dict[tuple[str, str], set[int]] = {
    ("post", "/v1/traces"): OTLP_ERRORS,
    ("get", "/readyz"): {503},
    ("get", "/api/v1/requests"): {400, 401, 422, 503},
    ("get", "/api/v1/requests/{request_id}"): {401, 404, 422, 503},
    ("get", "/api/v1/stats"): {400, 401, 422, 503},
    ("get", "/api/v1/usage"): {400, 401, 422, 503},
    ("get", "/api/v1/diagnose"): {401, 422, 503},
    ("get", "/api/v1/checklist"): {401, 422, 503},
    ("get", "/api/v1/capacity"): {401, 422, 503},
    ("get", "/api/v1/headroom"): {401, 422, 503},
    ("get", "/api/v1/slos"): {401, 503},
    ("post", "/api/v1/alerts/webhook"): {400, 401, 413, 422, 503},
    ("get", "/api/v1/incidents"): {400, 401, 422, 503},
    ("get", "/api/v1/incidents/{incident_id}"): {401, 404, 422, 503},
    ("get", "/incidents/{incident_id}"): {401, 404, 422, 503},
}
"""The error statuses each operation must document (beyond these, none)."""


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(CollectorSettings(data_dir=tmp_path, grpc_listen=None))) as c:
        yield c


@pytest.fixture
def document(client: TestClient) -> dict[str, Any]:
    r = client.get("/openapi.json")
    assert r.status_code == 200
    doc: dict[str, Any] = r.json()
    return doc


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    resolved: dict[str, Any] = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return resolved


def model_names(schema: dict[str, Any]) -> list[str]:
    """The component names a response schema refers to (one, or the members of an ``anyOf``)."""
    if "$ref" in schema:
        return [schema["$ref"].rsplit("/", 1)[1]]
    return [name for member in schema.get("anyOf", []) for name in model_names(member)]


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield method, path, op


def test_every_route_is_documented(document: dict[str, Any]) -> None:
    operations_ = {(method, path) for method, path, _ in operations(document)}
    assert operations_ == set(ERRORS) | {("get", "/metrics"), ("get", "/healthz")}


def test_every_success_response_has_a_schema(document: dict[str, Any]) -> None:
    for method, path, op in operations(document):
        ok = {status: r for status, r in op["responses"].items() if status.startswith("2")}
        assert list(ok) == ["200"], (method, path)
        content = ok["200"].get("content")
        assert content, (method, path)
        for media, body in content.items():
            schema = body.get("schema") or {}
            assert schema, (method, path, media)
            if media == "application/json":
                members = [resolve(document, {"$ref": f"#/components/schemas/{n}"}) for n in model_names(schema)]
                assert members and all(m.get("properties") for m in members), (method, path)
    assert set(document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain; version=0.0.4"}
    traces = document["paths"]["/v1/traces"]["post"]
    assert set(traces["responses"]["200"]["content"]) == {PROTOBUF, JSON}
    assert set(traces["requestBody"]["content"]) == {PROTOBUF, JSON}


def test_error_responses_are_documented(document: dict[str, Any]) -> None:
    for (method, path), expected in ERRORS.items():
        responses = document["paths"][path][method]["responses"]
        errors = {int(status) for status in responses if not status.startswith("2")}
        assert errors == expected, (method, path)
        for status in expected:
            content = responses[str(status)]["content"]
            assert content["application/json"]["schema"], (method, path, status)
            names = model_names(content["application/json"]["schema"])
            if path == "/v1/traces" and status in OTLP_ERRORS:
                assert names == ["RpcStatus"] and PROTOBUF in content
                if status in (429, 503):
                    assert "Retry-After" in responses[str(status)]["headers"]
                if status == 401:
                    assert "WWW-Authenticate" in responses[str(status)]["headers"]
            elif status == 422:
                assert names == ["HTTPValidationError"]
            elif status == 503 and path == "/readyz":
                assert names == ["Readiness"]
            else:
                assert names == ["ErrorBody"], (method, path, status)
    for method, path in (("post", "/v1/traces"), ("get", "/api/v1/stats")):
        assert document["paths"][path][method]["security"] == [{"HTTPBearer": []}]


def documented_model(document: dict[str, Any], method: str, path: str, status: int) -> list[type[BaseModel]]:
    schema = document["paths"][path][method]["responses"][str(status)]["content"]["application/json"]["schema"]
    models = [getattr(schemas, name, None) for name in model_names(schema)]
    assert models and all(isinstance(m, type) and issubclass(m, BaseModel) for m in models), (path, status)
    return [m for m in models if m is not None]


def assert_documented(document: dict[str, Any], method: str, path: str, r: Any) -> None:
    """The JSON body of ``r`` is exactly one of the models documented for its status (nothing more, nothing less)."""
    assert str(r.status_code) in document["paths"][path][method]["responses"], (path, r.status_code)
    body = r.json()
    mismatches = []
    for model in documented_model(document, method, path, r.status_code):
        try:
            parsed = model.model_validate(body)
        except ValidationError as exc:
            mismatches.append(str(exc))
            continue
        if parsed.model_dump(mode="json", by_alias=True, exclude_unset=True) == body:
            return
        mismatches.append(f"{model.__name__} drops or changes keys")
    pytest.fail(f"{path} {r.status_code}: {mismatches}")


def test_bodies_are_the_documented_models(client: TestClient, document: dict[str, Any]) -> None:
    for body in sorted(CAPTURE.glob("*.pb")):
        r = client.post("/v1/traces", content=body.read_bytes(), headers={"content-type": PROTOBUF})
        assert r.status_code == 200 and r.headers["content-type"] == PROTOBUF
    assert client.app.state.collector.writer.flush(10.0)  # type: ignore[attr-defined]
    r = client.post("/v1/traces", content=b"{}", headers={"content-type": JSON})
    assert r.status_code == 200 and r.json() == {}
    assert_documented(document, "post", "/v1/traces", r)

    page = client.get("/api/v1/requests", params={"limit": 100})
    assert_documented(document, "get", "/api/v1/requests", page)
    rows = page.json()["data"]
    assert len(rows) == 39 and set(rows[0]) == set(REQUEST_TABLE.c.keys())
    shared = next(row["request_id"] for row in rows if sum(x["request_id"] == row["request_id"] for x in rows) > 1)
    path = "/api/v1/requests/{request_id}"
    for key in (str(rows[0]["id"]), rows[1]["span_id"], shared):
        assert_documented(document, "get", path, client.get(f"/api/v1/requests/{key}"))
    assert "data" in client.get(f"/api/v1/requests/{shared}").json()
    assert_documented(document, "get", path, client.get("/api/v1/requests/nope"))

    slos: dict[str, str | float] = {"slo_ttft": 1.0, "slo_tpot": 0.05, "slo_e2e": 2.0, "slo_queue": 0.1}
    for params in ({"window": "3650d"}, {"window": "3650d", "group_by": "model", **slos}, {"window": "1s"}):
        r = client.get("/api/v1/stats", params=params)
        assert r.status_code == 200
        assert_documented(document, "get", "/api/v1/stats", r)
    bad: list[tuple[str, dict[str, str]]] = [
        ("/api/v1/stats", {"window": "forever"}),
        ("/api/v1/stats", {"group_by": "nope"}),
        ("/api/v1/requests", {"cursor": "!!"}),
        ("/api/v1/requests", {"since": "yesterday"}),
        ("/api/v1/requests", {"limit": "0"}),
    ]
    for url, query in bad:
        r = client.get(url, params=query)
        assert r.status_code in (400, 422)
        if r.status_code == 400:
            assert_documented(document, "get", url, r)
    for url in ("/healthz", "/readyz"):
        assert_documented(document, "get", url, client.get(url))
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")  # as documented, not JSON


def test_otlp_errors_are_documented_in_both_encodings(tmp_path: Path, document: dict[str, Any]) -> None:
    """Each OTLP/HTTP error answers a google.rpc.Status in the request's encoding, 401 included."""
    settings = CollectorSettings(  # a data directory of its own: the document's collector holds tmp_path's
        data_dir=tmp_path / "limits", grpc_listen=None, max_body_bytes=64 * 1024, queue_limit=1, ingest_tokens=["in"]
    )
    spans = (CAPTURE / "0006.pb").read_bytes()  # several llm_request spans: more than the queue holds
    bomb = gzip.compress(b"\x00" * (1 << 20))
    truncated = gzip.compress(b"{}")[:-3]
    cases: list[tuple[bytes, str, str | None, int]] = [
        (b"\xff\xfe", PROTOBUF, None, 400),
        (b'{"resourceSpans": "x"}', JSON, None, 400),
        (b"[" * 60_000, JSON, None, 400),
        (truncated, JSON, "gzip", 400),
        (gzip.compress(b"{}") + b"trailing", JSON, "gzip", 400),
        (b"{}", JSON, None, 401),
        (spans, PROTOBUF, None, 401),
        (b"{not json", JSON, None, 400),
        (b"hello", "text/plain", None, 415),
        (b"{}", JSON, "br", 415),
        (bomb, PROTOBUF, "gzip", 413),
        (bomb, JSON, "gzip", 413),
        (spans, PROTOBUF, None, 429),
        (to_otlp_json(spans), JSON, None, 429),
    ]
    with TestClient(create_app(settings)) as c:
        for content, media, encoding, status in cases:
            headers = (
                {"content-type": media} if status == 401 else {"content-type": media, "authorization": "Bearer in"}
            )
            if encoding:
                headers["content-encoding"] = encoding
            r = c.post("/v1/traces", content=content, headers=headers)
            assert r.status_code == status, (media, encoding)
            if status == 429:
                assert r.headers["retry-after"]
            if status == 401:
                assert r.headers["www-authenticate"] == "Bearer"
            if media == JSON:
                assert r.headers["content-type"] == JSON
                assert_documented(document, "post", "/v1/traces", r)
            else:
                assert r.headers["content-type"] == PROTOBUF
                assert status_pb2.Status.FromString(r.content).message


def test_schemas_follow_the_store() -> None:
    """The response models spell the store's names: row fields are the columns, stats fields the stat columns."""
    assert list(schemas.RequestRow.model_fields) == list(REQUEST_TABLE.c.keys())
    assert set(get_args(listing.SortField)) <= set(REQUEST_TABLE.c.keys())
    assert windowing.STAT_FIELDS == (TTFT, TPOT, E2E, QUEUE)
    assert set(windowing.STAT_FIELDS) <= set(schemas.StatsGroup.model_fields)
    assert {f"p{round(q * 100)}" for q in windowing.PERCENTILES} | {"count", "exact", "relative_error"} == set(
        schemas.FieldStats.model_fields
    )
    groups = set(get_args(schemas.GroupBy)) - {"none"}
    assert groups <= set(schemas.StatsGroup.model_fields) & set(REQUEST_TABLE.c.keys())
