"""The read API at its edges, on SQLite and on PostgreSQL: inputs that used to answer 500 answer 400/404/422,
the stats windows hold the requests that finished in them, token sums of rows without tokens are null,
and a request id shared by several replicas is told apart by instance."""

from __future__ import annotations

import base64
import contextlib
import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from inferwatch.collector.api.app import create_app
from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.stats import listing, planner, rollup
from inferwatch.collector.store import inserts
from inferwatch.collector.store.record import RequestRecord
from tests.conftest import postgres_schema


@pytest.fixture(params=["sqlite", "postgresql"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestClient]:
    with contextlib.ExitStack() as stack:
        url = None if request.param == "sqlite" else stack.enter_context(postgres_schema("iw_edges"))
        settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None, database_url=url)
        yield stack.enter_context(TestClient(create_app(settings)))


def record(i: int, *, start: datetime, seconds: float = 1.0, **values: Any) -> RequestRecord:
    fields: dict[str, Any] = {
        "trace_id": f"{i + 1:032x}",
        "span_id": f"{i + 1:016x}",
        "engine": "vllm",
        "start_time": start,
        "end_time": start + timedelta(seconds=seconds),
        "request_id": f"req-{i}",
        "model": "m",
        "instance": "a",
        "time_to_first_token": 0.1,
        "request_duration": seconds,
    }
    fields.update(values)
    return RequestRecord(**fields)


def insert(c: TestClient, records: list[RequestRecord]) -> None:
    inserted, _ = inserts.insert_records(c.app.state.collector.engine, records)  # type: ignore[attr-defined]
    assert inserted == len(records)


def cursor_of(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


# --- inputs that answered 500 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path_id",
    ["9999999999999999999", "99999999999999999999999999999", "%C2%B2", "%D9%A3", "%00", "0", "-1", "x" * 2000],
)
def test_ids_that_match_nothing_are_404(client: TestClient, path_id: str) -> None:
    insert(client, [record(0, start=datetime.now(UTC))])
    r = client.get(f"/api/v1/requests/{path_id}")
    assert r.status_code == 404, r.text
    assert r.json()["detail"].startswith("no request")


def test_ids_still_found_by_row_id_request_id_and_span_id(client: TestClient) -> None:
    insert(client, [record(0, start=datetime.now(UTC))])
    row = client.get("/api/v1/requests").json()["data"][0]
    for key in (str(row["id"]), "req-0", row["span_id"], row["span_id"].upper()):
        assert client.get(f"/api/v1/requests/{key}").json()["span_id"] == row["span_id"]


@pytest.mark.parametrize(
    "cursor",
    [
        cursor_of(json.dumps({"o": 2**63})),
        cursor_of(json.dumps({"o": 2**62 + 1})),
        cursor_of(json.dumps({"o": 1e308})),
        cursor_of(json.dumps({"o": math.inf})),  # the JSON text Infinity
        cursor_of(json.dumps({"o": -1})),
        cursor_of(json.dumps({"o": True})),
        cursor_of(json.dumps({"o": "5"})),
        cursor_of(json.dumps({"o": 1.5})),
        cursor_of(json.dumps([1])),
        cursor_of("[" * 100_000 + "]" * 100_000)[:190],
        cursor_of("[" * 3000 + "]" * 3000),
        "not base64!",
        "A" * 5000,
    ],
)
def test_bad_cursors_are_400(client: TestClient, cursor: str) -> None:
    r = client.get("/api/v1/requests", params={"cursor": cursor})
    assert r.status_code == 400, r.text


def test_the_largest_cursor_offset_is_an_empty_page(client: TestClient) -> None:
    insert(client, [record(0, start=datetime.now(UTC))])
    r = client.get("/api/v1/requests", params={"cursor": listing.encode_cursor(listing.MAX_OFFSET)})
    assert r.status_code == 200 and r.json()["data"] == [] and r.json()["count"] == 1


@pytest.mark.parametrize(
    "value",
    ["9999-12-31T23:59:59-12:00", "0001-01-01T00:00:00+14:00", "2024-13-01", "yesterday", "2024-01-01\x00", "9" * 100],
)
@pytest.mark.parametrize("name", ["since", "until"])
def test_times_outside_utc_range_are_400(client: TestClient, name: str, value: str) -> None:
    r = client.get("/api/v1/requests", params={name: value})
    assert r.status_code == 400, r.text
    assert name in r.json()["detail"]


@pytest.mark.parametrize("value", ["9999-12-31T23:59:59", "0001-01-01T00:00:00Z", "2024-05-01T12:00:00+14:00"])
def test_extreme_but_valid_times(client: TestClient, value: str) -> None:
    assert client.get("/api/v1/requests", params={"since": value}).status_code == 200
    assert client.get("/api/v1/requests", params={"until": value}).status_code == 200


@pytest.mark.parametrize(
    "params",
    [
        {"window": "999999w"},
        {"window": f"{planner.MAX_WINDOW.days + 1}d"},
        {"window": "0s", "slo_ttft": "1"},
        {"window": "0s"},
        {"window": "0.0000001s"},  # rounds to 0 microseconds
        {"window": "9" * 400 + "s"},
        {"window": "1e9s"},
        {"window": "\x00"},
    ],
)
def test_bad_stats_windows_are_400(client: TestClient, params: dict[str, str]) -> None:
    r = client.get("/api/v1/stats", params=params)
    assert r.status_code == 400, r.text


@pytest.mark.parametrize("slo", ["inf", "nan", "-inf", "1e999"])
def test_non_finite_slos_and_thresholds_are_422(client: TestClient, slo: str) -> None:
    assert client.get("/api/v1/stats", params={"slo_ttft": slo}).status_code == 422
    assert client.get("/api/v1/requests", params={"min_ttft": slo}).status_code == 422


def test_the_longest_window_answers(client: TestClient) -> None:
    insert(client, [record(0, start=datetime.now(UTC) - timedelta(minutes=1))])
    r = client.get("/api/v1/stats", params={"window": f"{planner.MAX_WINDOW.days}d", "slo_ttft": 1})
    assert r.status_code == 200 and r.json()["data"][0]["requests"] == 1


@pytest.mark.parametrize("name", ["engine", "model", "instance", "finish_reason"])
def test_nul_in_a_filter_is_400(client: TestClient, name: str) -> None:
    insert(client, [record(0, start=datetime.now(UTC))])
    r = client.get("/api/v1/requests", params={name: "vllm\x00"})
    assert r.status_code == 400, r.text
    assert name in r.json()["detail"] and "NUL" in r.json()["detail"]
    assert client.get("/api/v1/requests/req-0", params={"instance": "a\x00"}).status_code == 404


# --- stats: the requests that finished in the window --------------------------------------------------------------


def test_stats_windows_hold_the_requests_that_finished_in_them(client: TestClient) -> None:
    now = datetime.now(UTC)
    fast = [
        record(i, start=now - timedelta(minutes=5), seconds=1.0, time_to_first_token=0.1 * (i + 1)) for i in range(9)
    ]
    # started before the 10-minute window, finished in it: its slowness belongs to this window
    slow = record(50, start=now - timedelta(minutes=20), seconds=19 * 60, time_to_first_token=600.0)
    # started and finished before the window
    old = record(60, start=now - timedelta(minutes=40), seconds=60, time_to_first_token=900.0)
    insert(client, [*fast, slow, old])
    entry = client.get("/api/v1/stats", params={"window": "10m"}).json()["data"][0]
    assert entry["requests"] == 10
    ttft = entry["time_to_first_token"]
    assert ttft["count"] == 10
    assert ttft["p99"] == 600.0  # the slow request is the window's p99 (a window of start times left it out)
    assert ttft["p50"] == pytest.approx(0.5)
    # a window holding only the slow request: its percentiles are the slow request's, not blank
    only = client.get("/api/v1/stats", params={"window": "2m"}).json()["data"]
    assert only[0]["requests"] == 1 and only[0]["time_to_first_token"]["p99"] == 600.0
    everything = client.get("/api/v1/stats", params={"window": "1h", "group_by": "engine"}).json()["data"]
    assert everything[0]["requests"] == 11 and everything[0]["time_to_first_token"]["p99"] == 900.0


@pytest.mark.parametrize("plan", ["values", "raw", "scan", "index", "walk", None])
@pytest.mark.parametrize("rolled_up", [True, False])
def test_compute_stats_by_end_time_on_every_plan(
    client: TestClient, plan: planner.Plan | None, rolled_up: bool
) -> None:
    """The store function itself, with a fixed clock, on each plan, with the rows in the rollups or not yet:
    the requests that straddle the window's start count by their end time."""
    engine = client.app.state.collector.engine  # type: ignore[attr-defined]
    t0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    rows = [record(i, start=t0 + timedelta(seconds=i), seconds=1.0, time_to_first_token=float(i)) for i in range(100)]
    rows.append(record(500, start=t0 - timedelta(hours=2), seconds=2 * 3600 + 50, time_to_first_token=1e4))
    insert(client, rows)
    if rolled_up:
        rollup.catch_up(engine)
    now = t0 + timedelta(seconds=101)
    stats = planner.compute_stats(engine=engine, window=timedelta(seconds=60), now=now, plan=plan)
    # a small window: its value blocks (rolled up or not: then all its rows are above the watermark, read raw)
    assert stats.plan == ("values" if plan is None else plan)
    (entry,) = stats.data
    # finished at or after now - 60 s = t0 + 41 s: rows 40..99 (each ends 1 s after it starts) and the long one
    assert entry.requests == 61
    assert entry.time_to_first_token.p99 == 1e4
    assert entry.time_to_first_token.p50 == 70.0  # nearest rank 31 of 61 over 40..99 and 1e4


def test_token_sums_are_null_when_no_request_reports_tokens(client: TestClient) -> None:
    now = datetime.now(UTC)
    insert(client, [record(i, start=now - timedelta(minutes=1)) for i in range(3)])
    entry = client.get("/api/v1/stats", params={"window": "1h"}).json()["data"][0]
    assert entry["prompt_tokens"] is None and entry["generation_tokens"] is None
    insert(client, [record(10, start=now - timedelta(minutes=1), prompt_tokens=7, generation_tokens=0)])
    entry = client.get("/api/v1/stats", params={"window": "1h"}).json()["data"][0]
    assert entry["prompt_tokens"] == 7 and entry["generation_tokens"] == 0


# --- request ids across replicas -------------------------------------------------------------------------------------


def test_a_request_id_on_several_replicas_is_told_apart_by_instance(client: TestClient) -> None:
    now = datetime.now(UTC)
    insert(
        client,
        [
            record(0, start=now, request_id="cmpl-1", instance="replica-a"),
            record(1, start=now, request_id="cmpl-1", instance="replica-b"),
            record(2, start=now, request_id="cmpl-2", instance="replica-a", n=2),
            record(3, start=now, request_id="cmpl-2", instance="replica-a", n=2),
        ],
    )
    both = client.get("/api/v1/requests/cmpl-1").json()
    assert both["count"] == 2 and both["instances"] == ["replica-a", "replica-b"]
    assert [row["instance"] for row in both["data"]] == ["replica-a", "replica-b"]
    one = client.get("/api/v1/requests/cmpl-1", params={"instance": "replica-b"}).json()
    assert one["instance"] == "replica-b" and one["span_id"] == f"{2:016x}" and "phases" in one
    assert client.get("/api/v1/requests/cmpl-1", params={"instance": "replica-c"}).status_code == 404
    samples = client.get("/api/v1/requests/cmpl-2").json()
    assert samples["count"] == 2 and samples["instances"] == ["replica-a"]
