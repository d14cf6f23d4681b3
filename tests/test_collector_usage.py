"""``/api/v1/usage``: requests, tokens, SLO attainment and cost per tenant or model over stored rows, as JSON and
CSV, on SQLite and PostgreSQL; every figure checked against a brute-force count of the same rows. And the
``tenant`` column: its migration, and the proxy's span attribute stored in it.

Rows are inserted directly (the ingest path is ``tests/test_collector_app.py``'s); the app reads them through
``TestClient``. The end to end, from API keys through ``inferwatch proxy`` to these rows:
``tests/test_proxy_tenants_e2e.py``.
"""

from __future__ import annotations

import csv
import io
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, inspect, text

from inferwatch.collector.api.app import create_app
from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.stats import usage
from inferwatch.collector.store import db, inserts
from inferwatch.collector.store.record import RequestRecord
from inferwatch.core import resources
from inferwatch.core import vocabulary as V
from inferwatch.core.config import InferwatchSettings
from inferwatch.core.slo import load
from tests.conftest import migrated_engine
from tests.test_collector_openapi import assert_documented

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
PROXY = V.PROXY_SERVICE
HOSTILE = '=HYPERLINK("http://x")'


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with migrated_engine(request.param, tmp_path, "iw_usage") as eng:
        yield eng


@pytest.fixture
def client(engine: Engine, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(CollectorSettings(data_dir=tmp_path / "data", grpc_listen=None), engine=engine)) as c:
        yield c


def make_rows(n: int, seed: int = 7) -> list[RequestRecord]:
    """``n`` proxied requests over the day before NOW from 12 tenants (a hostile one among them) on two models,
    some without TTFT (not streamed), some failed, some without usage; and as many engine rows (no tenant)."""
    rng = random.Random(seed)
    tenants = [f"{i:016x}" for i in range(11)] + [HOSTILE]
    rows: list[RequestRecord] = []
    for i in range(n):
        end = NOW - timedelta(seconds=rng.uniform(1, 86_000))
        e2e = rng.uniform(0.2, 30)
        ttft = rng.choice([None, rng.uniform(0.01, 1.2)])
        tenant = tenants[min(int(rng.expovariate(0.35)), len(tenants) - 1)]
        proxied = RequestRecord(
            trace_id=f"{i + 1:032x}",
            span_id=f"{i + 1:016x}",
            engine="vllm",
            start_time=end - timedelta(seconds=e2e),
            end_time=end,
            model=rng.choice(["llama", "qwen"]),
            service=PROXY,
            time_to_first_token=ttft,
            time_per_output_token=rng.choice([None, rng.uniform(0.01, 0.2)]),
            request_duration=e2e,
            prompt_tokens=rng.choice([None, rng.randint(1, 4000)]),
            generation_tokens=rng.randint(1, 500),
            finish_reason=rng.choice(["stop", "length", "abort", "stop"]),
            error="http 500" if rng.random() < 0.05 else None,
            tenant=tenant,
        )
        mirror = RequestRecord(
            trace_id=proxied.trace_id,
            span_id=f"{n + i + 1:016x}",
            engine="vllm",
            start_time=proxied.start_time,
            end_time=end,
            model=proxied.model,
            service="vllm",
            request_duration=e2e - 0.01,
            generation_tokens=proxied.generation_tokens,
        )
        rows += [proxied, mirror]
    return rows


def brute(rows: list[RequestRecord], key: str, slos: list[usage.LatencySlo]) -> dict[Any, dict[str, Any]]:
    """What the usage must say, counted in Python."""
    out: dict[Any, dict[str, Any]] = {}
    for r in rows:
        g = out.setdefault(
            getattr(r, key),
            {"requests": 0, "failed": 0, "prompt": None, "generation": None, "judged": 0, "met": 0,
             "slos": {s.name: [0, 0] for s in slos}},
        )  # fmt: skip
        g["requests"] += 1
        g["failed"] += r.finish_reason in ("error", "abort") or r.error is not None
        for field, name in (("prompt_tokens", "prompt"), ("generation_tokens", "generation")):
            if getattr(r, field) is not None:
                g[name] = (g[name] or 0) + getattr(r, field)
        applies = [s for s in slos if getattr(r, s.metric) is not None]
        for s in applies:
            g["slos"][s.name][0] += 1
            g["slos"][s.name][1] += getattr(r, s.metric) <= s.threshold
        if applies:
            g["judged"] += 1
            g["met"] += all(getattr(r, s.metric) <= s.threshold for s in applies)
    return out


def as_brute(group: dict[str, Any]) -> dict[str, Any]:
    return {
        "requests": group["requests"],
        "failed": group["failed"],
        "prompt": group["prompt_tokens"],
        "generation": group["generation_tokens"],
        "judged": group["slo_requests"],
        "met": group["slo_met"],
        "slos": {name: [c["requests"], c["met"]] for name, c in group["slos"].items()},
    }


def default_slos() -> list[usage.LatencySlo]:
    slos, notes = usage.file_slos(load(resources.default_slo_path(), InferwatchSettings().vocabulary()))
    assert [s.name for s in slos] == ["ttft-500ms", "tpot-100ms", "e2e-20s"] and not notes
    return slos


RANGE = {"since": (NOW - timedelta(days=1)).isoformat(), "until": NOW.isoformat()}


def test_usage_by_tenant_and_model_as_json(client: TestClient, engine: Engine) -> None:
    rows = make_rows(600)
    assert inserts.insert_records(engine, rows) == (1200, 0)
    proxied = [r for r in rows if r.service == PROXY]
    slos = default_slos()
    r = client.get("/api/v1/usage", params={"group_by": "tenant", **RANGE})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert (body["group_by"], body["side"], body["slo_source"], body["truncated"]) == ("tenant", "proxy", "file", False)
    assert [s["name"] for s in body["slos"]] == [s.name for s in slos]
    expected = brute(proxied, "tenant", slos)
    assert {g["key"]: as_brute(g) for g in body["groups"]} == expected
    assert body["groups_total"] == len(expected) == 12
    requests = [g["requests"] for g in body["groups"]]
    assert requests == sorted(requests, reverse=True)  # the busiest first
    assert as_brute(body["total"]) == brute(proxied, "service", slos)[PROXY]
    some = body["groups"][0]
    assert some["slo_attainment"] == some["slo_met"] / some["slo_requests"]
    assert some["cost_usd"] is None and body["cost_note"]  # why: test_cost_note_and_slos_left_out
    document = client.get("/openapi.json").json()
    assert_documented(document, "get", "/api/v1/usage", r)  # the body is the documented model, exactly
    assert set(document["paths"]["/api/v1/usage"]["get"]["responses"]["200"]["content"]) == {
        "application/json",
        "text/csv",
    }
    assert_documented(document, "get", "/api/v1/usage", client.get("/api/v1/usage", params={"since": "x"}))
    # by model: the engine side by default (as /stats), the proxy's on request
    for side, side_rows in (("engine", [r for r in rows if r.service != PROXY]), ("proxy", proxied)):
        params = {"group_by": "model", **RANGE} | ({"side": side} if side == "proxy" else {})
        body = client.get("/api/v1/usage", params=params).json()
        assert body["side"] == side
        assert {g["key"]: as_brute(g) for g in body["groups"]} == brute(side_rows, "model", slos)
    # the engines' rows have no tenant: one group, key null
    body = client.get("/api/v1/usage", params={"side": "engine", **RANGE}).json()
    assert [(g["key"], g["requests"]) for g in body["groups"]] == [(None, 600)]
    # a narrower range, one model, SLOs given in the query instead of the file's
    since = NOW - timedelta(hours=6)
    params = {"since": since.isoformat(), "until": NOW.isoformat(), "model": "qwen", "slo_ttft": "0.5"}
    body = client.get("/api/v1/usage", params=params).json()
    chosen = [r for r in proxied if r.model == "qwen" and r.end_time >= since]
    query_slos = [usage.LatencySlo("time_to_first_token", "time_to_first_token", 0.5)]
    assert body["slo_source"] == "query"
    assert {g["key"]: as_brute(g) for g in body["groups"]} == brute(chosen, "tenant", query_slos)


def test_usage_as_csv_with_the_rest_beyond_the_limit(client: TestClient, engine: Engine) -> None:
    rows = make_rows(300, seed=3)
    inserts.insert_records(engine, rows)
    proxied = [r for r in rows if r.service == PROXY]
    slos = default_slos()
    as_json = client.get("/api/v1/usage", params={**RANGE, "limit": 3}).json()
    assert as_json["truncated"] and len(as_json["groups"]) == 3 and as_json["groups_total"] == 12
    listed = {g["key"] for g in as_json["groups"]}
    expected_rest = brute([r for r in proxied if r.tenant not in listed], "service", slos)[PROXY]
    assert as_brute(as_json["rest"]) == expected_rest
    for r in (
        client.get("/api/v1/usage", params={**RANGE, "limit": 3, "format": "csv"}),
        client.get("/api/v1/usage", params={**RANGE, "limit": 3}, headers={"Accept": "text/csv, */*;q=0.1"}),
    ):
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/csv; charset=utf-8"
        assert r.headers["content-disposition"].startswith('attachment; filename="usage-tenant-')
        table = list(csv.DictReader(io.StringIO(r.text)))
        assert [t["row"] for t in table] == ["group", "group", "group", "rest", "total"]
        assert list(table[0]) == [
            "row", "tenant", "requests", "failed", "prompt_tokens", "generation_tokens", "slo_requests", "slo_met",
            "slo_attainment", "slo:ttft-500ms", "slo:tpot-100ms", "slo:e2e-20s", "cost_usd",
        ]  # fmt: skip
        for line, group in zip(table, [*as_json["groups"], as_json["rest"], as_json["total"]], strict=True):
            assert int(line["requests"]) == group["requests"]
            assert int(line["generation_tokens"]) == group["generation_tokens"]
            assert float(line["slo_attainment"]) == pytest.approx(group["slo_attainment"])
            assert float(line["slo:ttft-500ms"]) == pytest.approx(group["slos"]["ttft-500ms"]["attainment"])
            assert line["cost_usd"] == ""
        assert sum(int(t["requests"]) for t in table[:4]) == int(table[4]["requests"]) == 300
    # a tenant a spreadsheet would run as a formula is written as text
    whole = client.get("/api/v1/usage", params={**RANGE, "format": "csv"}).text
    assert "'" + HOSTILE.replace('"', '""') in whole and "\n" + HOSTILE not in whole and "," + HOSTILE not in whole
    assert (
        client.get("/api/v1/usage", params=RANGE, headers={"Accept": "text/csv;q=0"})
        .headers["content-type"]
        .startswith("application/json")
    )
    assert client.get("/api/v1/usage", params={**RANGE, "format": "json"}, headers={"Accept": "text/csv"}).json()


def test_usage_refuses_what_it_cannot_answer(client: TestClient) -> None:
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"since": NOW.isoformat(), "until": (NOW - timedelta(hours=1)).isoformat()}, 400, "after since"),
        ({"since": (NOW - timedelta(days=367)).isoformat(), "until": NOW.isoformat()}, 400, "at most 366 days"),
        ({"since": "yesterday"}, 400, "ISO 8601"),
        ({"until": "9" * 100}, 400, "ISO 8601"),
        ({"until": "0001-01-01T01:00:00"}, 400, "since must be given"),
        ({"since": "0001-01-01T00:00:00", "until": "0001-01-02T00:00:00"}, 200, ""),
        ({"model": "a\x00b"}, 400, "NUL"),
        ({"engine": "x" * 300}, 400, "at most 256"),
        ({"group_by": "instance"}, 422, ""),
        ({"limit": "0"}, 422, ""),
        ({"limit": "10001"}, 422, ""),
        ({"format": "xml"}, 422, ""),
        ({"side": "both"}, 422, ""),
        ({"slo_ttft": "-1"}, 422, ""),
    ]
    for params, status, message in cases:
        r = client.get("/api/v1/usage", params=params)
        assert r.status_code == status, (params, r.text)
        assert status == 200 or message in str(r.json()["detail"]), (params, r.text)
    r = client.get("/api/v1/usage")  # the default range: the last day, empty here
    assert r.status_code == 200
    body = r.json()
    assert body["groups"] == [] and body["total"]["requests"] == 0 and body["total"]["slo_attainment"] is None
    assert datetime.fromisoformat(body["until"]) - datetime.fromisoformat(body["since"]) == timedelta(days=1)


def test_cost_note_and_slos_left_out(tmp_path: Path) -> None:
    slo_file = tmp_path / "slos.yaml"
    slo_file.write_text(
        "slos:\n"
        "  - name: ttft-tenant\n    objective: 99\n"
        "    indicator: {latency: {metric: time_to_first_token, threshold_seconds: 0.5}}\n"
        "    selector: {tenant: 00000000000000a1}\n"
        "  - name: ttft-pool\n    objective: 99\n"
        "    indicator: {latency: {metric: time_to_first_token, threshold_seconds: 0.5}}\n"
        "    selector: {pool: big}\n"
        "  - name: availability\n    objective: 99.9\n    indicator: {errors: {}}\n"
    )
    without = CollectorSettings(data_dir=tmp_path / "without", grpc_listen=None, slo_file=slo_file)
    with TestClient(create_app(without)) as c:
        note = c.get("/api/v1/usage").json()["cost_note"]
        assert "no Prometheus (--prometheus-url)" in note
    slo_file.write_text(slo_file.read_text() + "cost:\n  gpu_hour_usd: 2.5\n")
    settings = CollectorSettings(data_dir=tmp_path / "data", grpc_listen=None, slo_file=slo_file)
    with TestClient(create_app(settings)) as c:
        base = datetime.now(UTC) - timedelta(minutes=5)
        rows = [
            RequestRecord(
                trace_id=f"{i + 1:032x}", span_id=f"{i + 1:016x}", engine="vllm", start_time=base,
                end_time=base + timedelta(seconds=1), service=PROXY, time_to_first_token=0.2 + 0.2 * i,
                tenant=["00000000000000a1", "00000000000000b2"][i % 2],
            )
            for i in range(4)
        ]  # fmt: skip
        inserts.insert_records(c.app.state.collector.engine, rows)  # type: ignore[attr-defined]
        body = c.get("/api/v1/usage").json()
    assert V.COST_PER_MILLION_GENERATION_RECORD in body["cost_note"] and body["total"]["cost_usd"] is None
    assert [s["name"] for s in body["slos"]] == ["ttft-tenant"]
    assert body["notes"] == ["SLO ttft-pool left out: it selects on pool, which requests do not store"]
    groups = {g["key"]: g for g in body["groups"]}
    # the SLO selects one tenant: its requests are judged (0.2 and 0.6 s: one met), the other's are not
    assert (groups["00000000000000a1"]["slo_requests"], groups["00000000000000a1"]["slo_met"]) == (2, 1)
    assert groups["00000000000000b2"]["slo_requests"] == 0 and groups["00000000000000b2"]["slo_attainment"] is None


def test_the_tenant_column_migration(tmp_path: Path) -> None:
    """0008 adds a nullable ``tenant`` to stored requests (the rows kept, NULL) and takes it away on downgrade."""
    engine = db.make_engine(db.default_url(tmp_path))
    try:
        db.upgrade(engine, "0007")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO inference_requests (trace_id, span_id, engine, start_time, end_time, ttft_derived, "
                    "attributes, received_at) VALUES ('a', 'b', 'vllm', '2026-01-01 00:00:00.000000', "
                    "'2026-01-01 00:00:01.000000', 0, '{}', '2026-01-01 00:00:01.000000')"
                )
            )
        assert "tenant" not in {c["name"] for c in inspect(engine).get_columns("inference_requests")}
        db.upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT span_id, tenant FROM inference_requests")).all() == [("b", None)]
        db.downgrade(engine, "0007")
        assert "tenant" not in {c["name"] for c in inspect(engine).get_columns("inference_requests")}
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM inference_requests")).scalar() == 1
    finally:
        engine.dispose()
