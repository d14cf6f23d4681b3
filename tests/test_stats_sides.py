"""One side at a time: where both the engine and ``inferwatch proxy`` send spans, each request is stored twice
(the engine's row and the proxy's, with ``service`` ``inferwatch-proxy``). The stats, the request list, the
diagnosis's example requests and the Requests dashboard's SQL count one side: the engine's by default, the
proxy's or a named service on request, both only when asked (``side=all``), and the answer says which.

Before, ``/api/v1/stats`` counted every proxied request twice and had no ``service`` filter, and the rollups
(keyed by engine, model and instance) could not answer one. Every plan is checked against a brute-force answer
on SQLite and on PostgreSQL, with rows below and above the rollups' watermark.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from inferwatch.collector.api.app import create_app
from inferwatch.collector.diagnosis.diagnoser import OnCall
from inferwatch.collector.diagnosis.report import Diagnosis, Finding
from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.stats import planner, rollup, windowing
from inferwatch.collector.store import db, inserts
from inferwatch.collector.store.record import RequestRecord
from inferwatch.core import vocabulary as V
from inferwatch.core.symptoms import Status, Symptom
from tests.conftest import migrated_engine, postgres_schema
from tests.support.old_schema import insert_at_revision
from tests.test_stats_rollups import NOW, answer, brute, make_rows

PROXY = V.PROXY_SERVICE


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with migrated_engine(request.param, tmp_path, "iw_sd") as eng:
        yield eng


def both_sides(n: int, seed: int = 5) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """``n`` requests as the engines stored them (services ``svc-a``, ``svc-b`` or none) and the same requests
    as the proxy stored them: same engine and model, the proxy's instance, longer latencies (the client's)."""
    engine_rows = make_rows(n, seed=seed)
    for i, r in enumerate(engine_rows):
        r.service = ("svc-a", "svc-b", None)[i % 3]
    proxy_rows = [
        dataclasses.replace(
            r,
            span_id=f"{n + i + 1:016x}",
            service=PROXY,
            instance=f"proxy{i % 2}",
            time_to_first_token=(r.time_to_first_token or 0) + 0.003,
            request_duration=(r.request_duration or 0) + 0.004,
            attributes={},
        )
        for i, r in enumerate(engine_rows)
    ]
    return engine_rows, proxy_rows


def test_every_plan_counts_one_side(engine: Engine) -> None:
    """Default: the engine side (every request once); ``side``/``service`` pick the other side or one service,
    exactly, from the rollups and value blocks as from the rows."""
    mine, proxied = both_sides(800)
    rows = [x for pair in zip(mine, proxied, strict=True) for x in pair]
    inserts.insert_records(engine, rows[:1300])
    rollup.catch_up(engine)
    inserts.insert_records(engine, rows[1300:])  # above the watermark: read raw
    since = NOW - timedelta(days=2)
    cases: list[tuple[windowing.StatsFilter, list[RequestRecord]]] = [
        (windowing.StatsFilter(), mine),
        (windowing.StatsFilter(side="proxy"), proxied),
        (windowing.StatsFilter(side="all"), rows),
        (windowing.StatsFilter(service=PROXY, side="all"), proxied),
        (windowing.StatsFilter(service="svc-a", side="all"), [r for r in mine if r.service == "svc-a"]),
        (windowing.StatsFilter(service="svc-a", side="proxy"), []),
        (windowing.StatsFilter(engine="eng1", side="engine"), [r for r in mine if r.engine == "eng1"]),
    ]
    for filters, expected_rows in cases:
        for group_by in ("none", "model"):
            expected = brute(expected_rows, since, None, group_by)
            for plan in ("values", "raw", "scan", "index", "walk", "sketch", None):
                got = planner.compute_stats(
                    engine=engine, window=timedelta(days=2), group_by=group_by, now=NOW,
                    filters=filters, plan=plan,
                )  # fmt: skip
                where = (filters, group_by, plan)
                assert got.side == filters.side and got.service == filters.service
                if plan == "sketch":
                    assert {k: v["requests"] for k, v in answer(got, group_by).items()} == {
                        k: v["requests"] for k, v in expected.items()
                    }, where
                    continue
                assert answer(got, group_by) == expected, where
                assert got.plan == ("values" if plan is None else plan), where  # no fallback: the rollups agree


def test_the_default_counts_each_proxied_request_once_over_http(tmp_path: Path) -> None:
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None)
    now = datetime.now(UTC)
    mine = [
        RequestRecord(
            trace_id=f"{i + 1:032x}",
            span_id=f"{i + 1:016x}",
            engine="vllm",
            model="m",
            instance="engine-0",
            service="vllm-server",
            start_time=now - timedelta(minutes=i, seconds=2),
            end_time=now - timedelta(minutes=i),
            time_to_first_token=0.01 * (i + 1),
            request_duration=2.0,
        )
        for i in range(40)
    ]
    proxied = [
        dataclasses.replace(r, span_id=f"{i + 1001:016x}", service=PROXY, instance="proxy-0")
        for i, r in enumerate(mine)
    ]
    with TestClient(create_app(settings)) as client:
        inserts.insert_records(client.app.state.collector.engine, [*mine, *proxied])  # type: ignore[attr-defined]
        get = client.get
        body = get("/api/v1/stats", params={"window": "3h", "group_by": "engine"}).json()
        assert [(g["engine"], g["requests"]) for g in body["data"]] == [("vllm", 40)]
        assert body["side"] == "engine" and body["service"] is None
        body = get("/api/v1/stats", params={"window": "3h", "service": PROXY}).json()
        assert body["data"][0]["requests"] == 40 and body["side"] == "all" and body["service"] == PROXY
        assert get("/api/v1/stats", params={"window": "3h", "side": "proxy"}).json()["data"][0]["requests"] == 40
        assert get("/api/v1/stats", params={"window": "3h", "side": "all"}).json()["data"][0]["requests"] == 80
        assert get("/api/v1/stats", params={"service": "nope"}).json()["data"] == []
        assert get("/api/v1/stats", params={"side": "both"}).status_code == 422
        assert get("/api/v1/stats", params={"service": "a\x00"}).status_code == 400

        page = get("/api/v1/requests", params={"limit": 100}).json()
        assert page["count"] == 40 and page["side"] == "engine"
        assert {r["service"] for r in page["data"]} == {"vllm-server"}
        page = get("/api/v1/requests", params={"service": PROXY, "limit": 100}).json()
        assert page["count"] == 40 and {r["instance"] for r in page["data"]} == {"proxy-0"}
        assert get("/api/v1/requests", params={"side": "proxy"}).json()["count"] == 40
        assert get("/api/v1/requests", params={"side": "all"}).json()["count"] == 80
        assert get("/api/v1/requests", params={"service": "vllm-server", "side": "proxy"}).json()["count"] == 0
        spec = client.get("/openapi.json").json()["paths"]
        for path in ("/api/v1/stats", "/api/v1/requests"):
            assert {"service", "side"} <= {p["name"] for p in spec[path]["get"]["parameters"]}, path


def _finding(engine: str, model: str) -> Finding:
    return Finding(
        symptom=Symptom.TTFT_SLOW,
        severity=Status.WARNING,
        engine=engine,
        model=model,
        instance="x",
        summary="",
        cause="",
        remedies=[],
        evidence=[],
        runbook="",
    )


def test_the_diagnosis_shows_each_request_once(engine: Engine) -> None:
    """Its example requests are the engine's rows; the proxy's stand in only where the engine sent none."""
    mine, proxied = both_sides(300)
    inserts.insert_records(engine, [*mine, *proxied])
    traced = _finding("eng0", "model0")
    untraced = _finding("proxied-only", "m")
    inserts.insert_records(
        engine,
        [dataclasses.replace(proxied[0], span_id="f" * 16, trace_id="f" * 32, engine="proxied-only", model="m")],
    )
    result = Diagnosis(window="5m", source="prometheus", targets=[], findings=[traced, untraced], upstream_queries=0)
    OnCall._examples(result, engine, NOW - timedelta(days=4), 5)
    examples = traced.example_requests
    assert len(examples) == 5 and {r.service for r in examples} <= {"svc-a", "svc-b", None}
    assert len({r.trace_id for r in examples}) == 5, "one request shown twice"
    assert [r.service for r in untraced.example_requests] == [PROXY]


def test_an_incidents_examples_show_each_request_once(engine: Engine) -> None:
    """The alert worker's enrichment picks an incident's example requests as the diagnosis does: the engine's
    rows, the proxy's only where the engine sent none (it took both sides, each request twice)."""
    from inferwatch.collector.incidents.enrich import _examples

    mine, proxied = both_sides(300)
    inserts.insert_records(engine, [*mine, *proxied])
    inserts.insert_records(
        engine,
        [dataclasses.replace(proxied[0], span_id="f" * 16, trace_id="f" * 32, engine="proxied-only", model="m")],
    )
    since = NOW - timedelta(days=4)
    found = _examples(engine, {V.LABEL_ENGINE: "eng0", V.LABEL_MODEL: "model0"}, "time_to_first_token", since)
    assert found and PROXY not in {r.service for r in found}
    assert len({r.trace_id for r in found}) == len(found), "one request shown twice"
    alone = _examples(engine, {V.LABEL_ENGINE: "proxied-only", V.LABEL_MODEL: "m"}, "time_to_first_token", since)
    assert [r.service for r in alone] == [PROXY]


def test_the_requests_dashboard_counts_the_engine_side() -> None:
    """Its SQL, run on PostgreSQL with Grafana's macros expanded: each request once."""
    from inferwatch.dashboards.boards import requests as board

    mine, proxied = both_sides(200)
    expand = {
        r"\$__timeFilter\(start_time\)": "true",
        r"\$\{[a-z_]+:regex\}": ".*",
        r"\$__timeGroupAlias\(start_time, \$__interval\)": "date_trunc('hour', start_time) AS time",
    }
    with postgres_schema("iw_sd") as url:
        eng = db.make_engine(url)
        db.ensure_schema(eng)
        inserts.insert_records(eng, [*mine, *proxied])
        sqls = [board.slowest_sql(), board.exact_p99_sql(), board.exact_p99_series_sql()]
        with eng.connect() as conn:
            results: list[list[Any]] = []
            for sql in sqls:
                for pattern, repl in expand.items():
                    sql = re.sub(pattern, repl, sql)
                results.append(list(conn.execute(text(sql)).mappings()))
        eng.dispose()
    slowest, p99 = results[0], results[1]
    assert {r["instance"] for r in slowest}.isdisjoint({"proxy0", "proxy1"})
    assert sum(r["requests"] for r in p99) == len(mine)


def test_no_prometheus_query_adds_the_proxy_to_the_engine() -> None:
    """The proxy's metrics have names of their own (``llm_client_*``), never the engine's: a query adds the two
    sides only if it names both. The queries that name both add neither: the Engine dashboard's gap (client
    minus engine), the diagnosis's abort share (the client's share, spread over the engine's targets by
    ``0 * ...``, or else the engine's own) and its latency, rate and error signals (the engine's own, or else
    the client's where the engine measures none, spread the same way)."""
    from inferwatch.collector.diagnosis.prometheus import fleet_queries
    from inferwatch.collector.diagnosis.signals import Filters
    from inferwatch.core.slo import load
    from inferwatch.dashboards.registry import all_queries
    from tests.conftest import ROOT

    vocab = V.Vocabulary()
    assert not {m.name for m in V.CLIENT_METRICS} & {m.name for m in V.CANONICAL_METRICS}
    exprs = [
        (uid, title, q.expr)
        for uid, title, q in all_queries(load(ROOT / "inferwatch" / "alerts" / "slos.yaml", vocab), vocab)
    ]
    exprs += [("diagnosis", str(signal), e) for signal, e in fleet_queries("5m", Filters()).items()]
    suffix = r"(_bucket|_sum|_count)?\b"
    both = {}
    for uid, title, expr in exprs:
        assert "__name__" not in expr, (uid, title)
        for key, client in V.CLIENT_COUNTERPARTS.items():
            engine_name = next(m.name for m in V.CANONICAL_METRICS if m.key == key)
            if re.search(re.escape(client.name) + suffix, expr) and re.search(
                r"(?<!client_)" + re.escape(engine_name.removeprefix("llm_")) + suffix, expr
            ):
                both[(uid, title)] = expr
    gap = next(e for (uid, _), e in both.items() if uid != "diagnosis")
    assert ") - sum by" in gap
    diagnosis = {title: e for (uid, title), e in both.items() if uid == "diagnosis"}
    # each is one side or else the other (``or``), the proxy's spread over the engine's targets by ``0 * ...``
    assert {"abort_ratio", "ttft_p99", "tpot_p99", "e2e_p99", "request_rate", "error_ratio"} <= diagnosis.keys()
    assert all(") or " in e and "group_right () (0 * " in e for e in diagnosis.values()), diagnosis
    assert len(both) == len(diagnosis) + 1, sorted(both)


def test_upgrading_folds_every_row_again_by_service(tmp_path: Path) -> None:
    """A store rolled up at revision 0006 (no service in the rollups): migration 0007 empties the rollups, the
    blocks and the watermark; the job folds every row again, and each side is exact from them."""
    eng = db.make_engine(db.default_url(tmp_path))
    db.upgrade(eng, "0006")
    mine, proxied = both_sides(600, seed=9)
    insert_at_revision(eng, [*mine, *proxied])
    with eng.begin() as conn:  # what 0006's job left: a watermark past every row, rollups and blocks without service
        conn.execute(
            text("INSERT INTO rollup_state (name, folded_id, updated_at) VALUES (:n, 1200, :t)"),
            {"n": rollup.STATE_NAME, "t": NOW.replace(tzinfo=None)},
        )
        conn.execute(
            text("INSERT INTO request_values (period_seconds, period_start, series, counts, vals) VALUES "
                 "(60, :t, '[[\"eng0\", \"model0\", \"inst000\"]]', x'', x'')"),
            {"t": NOW.replace(tzinfo=None)},
        )  # fmt: skip
    db.upgrade(eng)
    with eng.connect() as conn:
        assert rollup.watermark(conn) == 0
        assert conn.execute(text("SELECT count(*) FROM request_rollups")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM request_values")).scalar_one() == 0
    assert rollup.catch_up(eng) == 1200
    since = NOW - timedelta(days=3)
    for side, rows in (("engine", mine), ("proxy", proxied)):
        for plan in ("values", "index"):
            got = planner.compute_stats(
                engine=eng, window=timedelta(days=3), group_by="model", now=NOW, plan=plan,
                filters=windowing.StatsFilter(side=side),  # type: ignore[arg-type]
            )  # fmt: skip
            assert answer(got, "model") == brute(rows, since, None, "model"), (side, plan)
    eng.dispose()
