"""The chargeback's cost (issue 34): per tenant, its generated tokens per model times the model's recorded USD
per million generated tokens, read from a real Prometheus (the record backfilled with ``promtool tsdb
create-blocks-from openmetrics``, as the cost rules would have written it).

By hand: model ``big`` at 2.0 USD/M and ``small`` at 0.5 USD/M over the hour. Tenant a: 300,000 generated
tokens of big and 200,000 of small -> 0.6 + 0.1 = 0.7 USD; tenant b: 100,000 of big -> 0.2 USD; a model with
no record (``unpriced``) is left out of the cost, with a note. Total 0.9 USD.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from inferwatch.collector.api.app import create_app
from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.store import inserts
from inferwatch.collector.store.record import RequestRecord
from inferwatch.core import vocabulary as V
from tests.support.prometheus_run import backfill, running

PROXY = "inferwatch-proxy"
PRICES = {"big": 2.0, "small": 0.5}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("usage-cost-prom")
    now = int(time.time())
    lines = []
    for model, price in PRICES.items():
        for t in range(now - 3600, now, 60):
            lines.append(f'{V.COST_PER_MILLION_GENERATION_RECORD}{{model="{model}",service="llm"}} {price} {t}')
    with running(tmp, data=backfill(tmp, "\n".join(lines) + "\n# EOF\n")) as base:
        yield base


def _row(i: int, tenant: str, model: str, tokens: int, at: datetime) -> RequestRecord:
    return RequestRecord(
        trace_id=f"{i + 1:032x}",
        span_id=f"{i + 1:016x}",
        engine=V.ENGINE_VLLM,
        model=model,
        service=PROXY,
        start_time=at,
        end_time=at + timedelta(seconds=1),
        generation_tokens=tokens,
        tenant=tenant,
    )


def test_usage_costs_each_tenant_by_its_tokens_per_model(prometheus: str, tmp_path: Path) -> None:
    settings = CollectorSettings(data_dir=tmp_path / "data", grpc_listen=None, prometheus_url=prometheus)
    base = datetime.now(UTC) - timedelta(minutes=30)
    rows = [
        _row(0, "a", "big", 300_000, base),
        _row(1, "a", "small", 200_000, base),
        _row(2, "b", "big", 100_000, base),
        _row(3, "c", "unpriced", 50_000, base),
    ]
    with TestClient(create_app(settings)) as c:
        inserts.insert_records(c.app.state.collector.engine, rows)  # type: ignore[attr-defined]
        since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
        body = c.get("/api/v1/usage", params={"group_by": "tenant", "since": since, "side": "all"}).json()
        csv = c.get("/api/v1/usage", params={"group_by": "tenant", "since": since, "side": "all", "format": "csv"})
    cost = {g["key"]: g["cost_usd"] for g in body["groups"]}
    assert cost == {"a": pytest.approx(0.7), "b": pytest.approx(0.2), "c": 0.0}, body
    assert body["total"]["cost_usd"] == pytest.approx(0.9)
    assert V.COST_PER_MILLION_GENERATION_RECORD in body["cost_note"]
    assert any("unpriced" in note for note in body["notes"]), body["notes"]
    assert "0.7" in csv.text


def test_usage_without_the_records_says_why(prometheus: str, tmp_path: Path) -> None:
    settings = CollectorSettings(data_dir=tmp_path / "data", grpc_listen=None, prometheus_url=prometheus)
    with TestClient(create_app(settings)) as c:
        long_ago = datetime.now(UTC) - timedelta(days=30)
        params = {"since": long_ago.isoformat(), "until": (long_ago + timedelta(hours=1)).isoformat()}
        body = c.get("/api/v1/usage", params=params).json()
    assert body["total"]["cost_usd"] is None
    assert "Prometheus has no" in body["cost_note"]
