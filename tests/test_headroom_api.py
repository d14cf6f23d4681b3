"""``GET /api/v1/headroom``, ``inferwatch headroom`` and the ``capacity_exhausted`` finding, on a real Prometheus.

The replicas of tests/alerts/headroom.yaml (a replica at half its TPOT limit, one past the edge) are
backfilled into Prometheus with ``promtool tsdb create-blocks-from openmetrics``, their last sample
now, so the API reads 80 minutes of history at once; the exporter path is fed the same samples.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from inferwatch.cli import app
from inferwatch.collector.api.app import create_app
from inferwatch.collector.diagnosis.diagnoser import OnCall
from inferwatch.collector.diagnosis.headroom_report import HeadroomReport, capacity_findings
from inferwatch.collector.diagnosis.headroom_sources import History, from_exporters
from inferwatch.collector.diagnosis.report import Diagnosis, Finding
from inferwatch.collector.diagnosis.signals import Filters
from inferwatch.collector.settings import CollectorSettings
from inferwatch.core import vocabulary as V
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.headroom import headroom
from inferwatch.core.headroom_inputs import windows
from inferwatch.core.slo import load
from inferwatch.core.symptoms import Status, Symptom
from tests.alerts import make_headroom as S
from tests.conftest import ROOT
from tests.support.httpserver import serving
from tests.support.prometheus_run import backfill, running

SLOS = load(ROOT / "alerts" / "slos.yaml", V.Vocabulary())


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("headroom-prom")
    with running(tmp, data=backfill(tmp, S.openmetrics(time.time()))) as base:
        yield base


def _oncall_headroom(prometheus: str) -> HeadroomReport:
    async def run() -> HeadroomReport:
        on = OnCall(builtin_profiles(), SLOS, prometheus_url=prometheus)
        try:
            return await on.headroom(None, None, Filters())
        finally:
            await on.close()

    return asyncio.run(run())


def _by_model(result: HeadroomReport) -> dict[str, object]:
    return {r.model: r for r in result.replicas}


def _check(result: HeadroomReport) -> None:
    replicas = {r.model: r for r in result.replicas}
    half, over = replicas["llama-8b"], replicas["qwen-7b"]
    assert half.limiting_slo == over.limiting_slo == "tpot-100ms"
    assert half.headroom_ratio == pytest.approx(2.0, rel=0.03)
    assert half.capacity_concurrency == pytest.approx(40, rel=0.03)
    assert over.headroom_ratio == pytest.approx(0.957, abs=0.02)
    assert {m.model: m.replicas_needed for m in result.models} == {"llama-8b": 1, "qwen-7b": 2, "mistral-7b": 1}
    assert half.evidence["tpot_points"] and half.fit is not None and half.fit.reason is None


def test_headroom_from_prometheus_history(prometheus: str) -> None:
    result = _oncall_headroom(prometheus)
    assert result.source == "prometheus" and result.window == "30m" and result.step_seconds == 60
    _check(result)
    kv = {lim.slo: lim for lim in _by_model(result)["llama-8b"].limits}[V.HEADROOM_KV_LIMIT]  # type: ignore[attr-defined]
    assert kv.concurrency == pytest.approx(115.8, rel=0.03)
    # the evidence is the query each input came from
    assert V.TIME_PER_OUTPUT_TOKEN.name in _by_model(result)["llama-8b"].evidence["tpot_points"]  # type: ignore[attr-defined]


def test_api_answers_the_same_and_refuses_bad_windows(prometheus: str, tmp_path: Path) -> None:
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None, prometheus_url=prometheus)
    with TestClient(create_app(settings)) as client:
        r = client.get("/api/v1/headroom")
        assert r.status_code == 200, r.text
        _check(HeadroomReport.model_validate(r.json()))
        only = client.get("/api/v1/headroom", params={"model": "qwen-7b"}).json()
        assert [x["model"] for x in only["replicas"]] == ["qwen-7b"]
        assert client.get("/api/v1/headroom", params={"window": "3m", "step": "1m"}).status_code == 422
        assert client.get("/api/v1/headroom", params={"window": "thirty"}).status_code == 422


def test_diagnosis_says_scale_out_before_the_symptoms_it_causes(prometheus: str) -> None:
    async def run() -> object:
        on = OnCall(builtin_profiles(), SLOS, prometheus_url=prometheus)
        try:
            return await on.diagnose("10m", Filters())
        finally:
            await on.close()

    result = asyncio.run(run())
    findings = result.findings  # type: ignore[attr-defined]
    first = findings[0]
    assert first.symptom is Symptom.CAPACITY_EXHAUSTED and first.severity is Status.CRITICAL
    assert first.model == "qwen-7b" and "1 more replica of model qwen-7b" in first.summary
    assert "tpot-100ms" in first.summary
    assert all(f.model != "llama-8b" for f in findings if f.symptom is Symptom.CAPACITY_EXHAUSTED)
    assert [e.signal for e in first.evidence] == ["headroom_ratio", "replicas_needed"]
    assert first.runbook == V.ALERT_HEADROOM_LOW.lower()


def _finding(symptom: Symptom, model: str, severity: Status) -> Finding:
    return Finding(
        symptom=symptom,
        severity=severity,
        engine="vllm",
        model=model,
        instance=S.INSTANCE,
        summary=symptom.value,
        cause="",
        remedies=[],
        evidence=[],
        runbook="",
    )


def test_capacity_exhausted_outranks_the_symptoms_it_causes(prometheus: str) -> None:
    found = _oncall_headroom(prometheus)
    caused = _finding(Symptom.TPOT_SLOW, "qwen-7b", Status.CRITICAL)
    errors = _finding(Symptom.ERROR_RATE_HIGH, "qwen-7b", Status.CRITICAL)
    elsewhere = _finding(Symptom.TPOT_SLOW, "llama-8b", Status.CRITICAL)
    result = Diagnosis(
        window="10m", source="prometheus", targets=[], findings=[caused, errors, elsewhere], upstream_queries=0
    )
    capacity_findings(result, found, SLOS)
    assert [(f.symptom, f.model, f.severity) for f in result.findings] == [
        (Symptom.CAPACITY_EXHAUSTED, "qwen-7b", Status.CRITICAL),
        (Symptom.TPOT_SLOW, "qwen-7b", Status.WARNING),  # a consequence: scale out first
        (Symptom.ERROR_RATE_HIGH, "qwen-7b", Status.CRITICAL),  # not caused by capacity
        (Symptom.TPOT_SLOW, "llama-8b", Status.CRITICAL),  # another model
    ]
    assert "a consequence of capacity_exhausted" in result.findings[1].summary
    # a model at 1.0-1.25x headroom is a warning: scale out to keep the margin
    tight = found.model_copy(deep=True)
    for r in tight.replicas:
        r.headroom_ratio = 1.1
    for m in tight.models:
        m.replicas_needed, m.capacity_requests_per_second = 1, m.load_requests_per_second * 1.1
    warned = Diagnosis(window="10m", source="prometheus", targets=[], findings=[], upstream_queries=0)
    capacity_findings(warned, tight, SLOS)
    assert {(f.model, f.severity) for f in warned.findings} == {
        ("qwen-7b", Status.WARNING),
        ("llama-8b", Status.WARNING),
        ("mistral-7b", Status.WARNING),
    }
    assert "kept at 1.25x headroom" in warned.findings[0].summary


def test_cli_prints_each_replica_in_80_columns(prometheus: str) -> None:
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["headroom", "--prometheus", prometheus])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    text = result.output
    assert "vllm llama-8b @ 10.0.0.7:9400  2.0" in text and "qwen-7b: 2 (running 1" in text
    assert "tpot-100ms: breaks at batch 40" in text
    failing = CliRunner().invoke(app, ["headroom", "--prometheus", prometheus, "--fail-below", "1.25"])
    assert failing.exit_code == 1


def _pages() -> list[str]:
    """The scenario's samples as exporter pages, one per 15 s scrape."""
    series = S.document()["tests"][0]["input_series"]
    # the pages are served 60 times faster than they were scraped: rates scale and their ratios do not,
    # but seconds per second (Little's law's batch from end-to-end seconds) would not be a batch any more
    series = [item for item in series if not item["series"].startswith(V.REQUEST_DURATION.name)]
    expanded = [(item["series"], S.expand(item["values"])) for item in series]
    count = len(expanded[0][1])
    return ["\n".join(f"{name} {values[i]:.9g}" for name, values in expanded) + "\n" for i in range(count)]


def test_the_exporter_path_reads_the_same_replicas() -> None:
    pages = _pages()
    served = {"next": 30 * 4}  # start 30 minutes in (15 s scrapes)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages[min(served["next"], len(pages) - 1)].encode()
            served["next"] += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    # 49 scrapes 0.25 s apart stand for 12 minutes of 15 s scrapes: rates scale, ratios do not
    async def run(address: str) -> History:
        async with httpx.AsyncClient() as client:
            return await from_exporters(
                client, [f"http://{address}"], window_seconds=12.0, step_seconds=1.0, filters=Filters()
            )

    with serving(Handler) as address:
        history = asyncio.run(run(address))
    results = {w.key.model: headroom(w) for w in windows(history.snapshots, SLOS, 1.0)}
    assert results["llama-8b"].headroom_ratio == pytest.approx(2.0, rel=0.05), results["llama-8b"]
    assert results["qwen-7b"].headroom_ratio == pytest.approx(0.957, abs=0.04)
