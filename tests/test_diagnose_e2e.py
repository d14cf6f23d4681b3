"""The diagnosis end to end: simulated engines in each load profile, their exporters, a real Prometheus.

Six simulated vLLM engines run one profile each (and a simulated TGI runs steady), each with an
inferwatch exporter; Debian's Prometheus scrapes them every second with the generated rules loaded.
Each profile must yield its finding for its own target and no other critical one, through
Prometheus and through the exporters alone, over the API as in the library. Every process is
stopped at the end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from inferwatch.alerts.generate import generate as generate_alerts
from inferwatch.collector.api.app import create_app
from inferwatch.collector.diagnosis.diagnoser import OnCall
from inferwatch.collector.diagnosis.report import Diagnosis
from inferwatch.collector.diagnosis.signals import Filters
from inferwatch.collector.settings import CollectorSettings
from inferwatch.core import resources
from inferwatch.core import vocabulary as V
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.slo import load
from inferwatch.core.symptoms import Status, Symptom
from tests.conftest import ROOT, free_port, require_tool
from tests.support.stack import Processes, exporter_cmd, prometheus_cmd, simulator_cmd, write_prometheus_config

EXPECTED: dict[str, Symptom | None] = {
    "steady": None,
    "kv-pressure": Symptom.PREEMPTIONS,
    "queue-buildup": Symptom.LATENCY_P99_HIGH,
    "long-prompts": Symptom.TTFT_SLOW,
    "slow-decode": Symptom.TPOT_SLOW,
    "errors": Symptom.ERROR_RATE_HIGH,
}
SPEED = 2.0
WARM_UP_S = 35
WINDOW = "30s"
TGI_MODEL = "tgi-steady"


@dataclass
class Fleet:
    prometheus: str
    exporters: dict[str, str]
    """profile (or the TGI model) -> exporter host:port (the ``instance``)."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    prometheus_bin = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("diagnose")
    spec = load(resources.default_slo_path(), V.Vocabulary())
    # the period SLI's group runs every 5 minutes in production: at once here, so the SLO status has it
    spec = spec.model_copy(update={"alerts": spec.alerts.model_copy(update={"period_rules_interval": "5s"})})
    (tmp / "rules.yml").write_text(generate_alerts(spec, V.Vocabulary())["rules.yml"])
    procs = Processes(tmp / "logs", cwd=ROOT)
    exporters: dict[str, str] = {}
    try:
        members = [(V.ENGINE_VLLM, profile) for profile in EXPECTED] + [(V.ENGINE_TGI, TGI_MODEL)]
        for seed, (engine, name) in enumerate(members):
            sp, ep = free_port(), free_port()
            profile = name if engine == V.ENGINE_VLLM else "steady"
            procs.spawn(f"{name}-sim", simulator_cmd(engine, sp, model=name, profile=profile, seed=seed, speed=SPEED))
            options = {"max_batch_total_tokens": 16384} if engine == V.ENGINE_TGI else None
            exporters[name] = f"127.0.0.1:{ep}"
            procs.spawn(f"{name}-exporter", exporter_cmd(engine, f"http://127.0.0.1:{sp}", exporters[name], options))
        prom_port = free_port()
        write_prometheus_config(tmp / "prometheus.yml", {"inferwatch": list(exporters.values())}, [tmp / "rules.yml"])
        procs.spawn("prometheus", prometheus_cmd(prometheus_bin, tmp / "prometheus.yml", tmp / "data", prom_port))
        base = f"http://127.0.0.1:{prom_port}"
        procs.wait_http("prometheus", f"{base}/-/ready")
        for name, address in exporters.items():
            procs.wait_http(f"{name}-exporter", f"http://{address}/metrics")
        time.sleep(WARM_UP_S)
        yield Fleet(base, exporters)
    finally:
        procs.close()


def check_profiles(result: Diagnosis, fleet: Fleet) -> None:
    problems = []
    for profile, expected in EXPECTED.items():
        instance = fleet.exporters[profile]
        mine = [f for f in result.findings if f.instance == instance]
        critical = {f.symptom for f in mine if f.severity is Status.CRITICAL}
        found = {f.symptom for f in mine}
        if expected is None and mine:
            problems.append(f"{profile}: expected no finding, got {[f.summary for f in mine]}")
        if expected is not None and expected not in found:
            problems.append(f"{profile}: no {expected.value} finding; got {[f.summary for f in mine]}")
        if critical - {expected}:
            problems.append(f"{profile}: other critical findings {sorted(critical - {expected})}")
    assert not problems, "\n".join(problems)


def tgi_is_unknown_where_it_exposes_nothing(result: Diagnosis, fleet: Fleet) -> None:
    target = next(t for t in result.targets if t.instance == fleet.exporters[TGI_MODEL])
    assert target.engine == V.ENGINE_TGI
    assert target.status[Symptom.TTFT_SLOW] is Status.UNKNOWN
    assert "time-to-first-token" in target.reasons[Symptom.TTFT_SLOW]
    assert target.status[Symptom.PREEMPTIONS] is Status.UNKNOWN
    assert "preemptions" in target.reasons[Symptom.PREEMPTIONS]


def oncall(**kwargs: object) -> OnCall:
    return OnCall(profiles=builtin_profiles(), slos=load(resources.default_slo_path(), V.Vocabulary()), **kwargs)  # type: ignore[arg-type]


def test_prometheus_mode(fleet: Fleet) -> None:
    async def run() -> Diagnosis:
        on = oncall(prometheus_url=fleet.prometheus)
        try:
            return await on.diagnose(WINDOW, Filters())
        finally:
            await on.close()

    result = asyncio.run(run())
    assert result.source == "prometheus"
    check_profiles(result, fleet)
    tgi_is_unknown_where_it_exposes_nothing(result, fleet)
    assert len(result.targets) == len(EXPECTED) + 1
    preemptions = next(f for f in result.findings if f.symptom is Symptom.PREEMPTIONS)
    assert preemptions.evidence[0].query.startswith("sum by (engine, model, instance) (increase(")
    assert any("--max-num-seqs" in r for r in preemptions.remedies)


def test_exporter_mode_without_prometheus(fleet: Fleet) -> None:
    async def run() -> Diagnosis:
        on = oncall(exporter_urls=[f"http://{a}" for a in fleet.exporters.values()], interval=10.0)
        try:
            return await on.diagnose("10m", Filters())
        finally:
            await on.close()

    result = asyncio.run(run())
    assert result.source == "exporters"
    check_profiles(result, fleet)
    tgi_is_unknown_where_it_exposes_nothing(result, fleet)


def test_api_diagnose_checklist_capacity_slos(fleet: Fleet, tmp_path: Path) -> None:
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None, prometheus_url=fleet.prometheus)
    with TestClient(create_app(settings)) as client:
        r = client.get("/api/v1/diagnose", params={"window": WINDOW})
        assert r.status_code == 200, r.text
        check_profiles(Diagnosis.model_validate(r.json()), fleet)
        narrow = client.get("/api/v1/diagnose", params={"window": WINDOW, "model": "kv-pressure"}).json()
        assert [t["model"] for t in narrow["targets"]] == ["kv-pressure"]
        nothing = client.get("/api/v1/diagnose", params={"window": WINDOW, "engine": "nope"})
        assert nothing.status_code == 200 and nothing.json()["targets"] == [] and nothing.json()["findings"] == []

        checklist = client.get("/api/v1/checklist", params={"window": WINDOW, "model": "kv-pressure"}).json()
        items = {i["check"]: i for i in checklist["targets"][0]["items"]}
        assert items["concurrency_limit"]["verdict"] == "fail"  # it preempts
        assert items["prefix_caching"]["verdict"] == "pass"  # vLLM's cache_config_info says so

        capacity = client.get(
            "/api/v1/capacity",
            params={"layers": 40, "kv_heads": 40, "head_dim": 128, "max_model_len": 2048, "model": "kv-pressure"},
        ).json()
        assert capacity["plan"]["kv_bytes_per_token"] == 819200
        observed = capacity["observed"][0]
        assert observed["kv_capacity_tokens"] == 16384 and observed["supported_concurrency"] > 0

        slos = client.get("/api/v1/slos")
        assert slos.status_code == 200, slos.text
        names = [s["name"] for s in slos.json()["slos"]]
        assert names == ["ttft-500ms", "tpot-100ms", "e2e-20s", "availability"]
        availability = slos.json()["slos"][3]
        errors_model = next(g for g in availability["groups"] if g["labels"] == {"model": "errors"})
        assert errors_model["error_ratio"] > 0.05 and errors_model["burn_rates"]["5m"] > 14.4


def test_faults_and_bad_input(fleet: Fleet, tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None, prometheus_url=closed, upstream_timeout_seconds=2)
    with TestClient(create_app(settings)) as client:
        r = client.get("/api/v1/diagnose")
        assert r.status_code == 503 and closed in r.json()["detail"]
        assert client.get("/api/v1/slos").status_code == 503
        bad = client.get("/api/v1/diagnose", params={"window": "ten minutes"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "window"]
        launch = client.get("/api/v1/checklist", params={"launch": "vllm serve m --max-num-seqs many"})
        assert launch.status_code == 422 and "--max-num-seqs" in launch.json()["detail"][0]["msg"]
    fallback = CollectorSettings(
        data_dir=tmp_path,
        grpc_listen=None,
        prometheus_url=closed,
        exporters=[f"http://{fleet.exporters['steady']}"],
        upstream_timeout_seconds=2,
        exporter_interval_seconds=2,
    )
    with TestClient(create_app(fallback)) as client:
        r = client.get("/api/v1/diagnose")
        assert r.status_code == 200, r.text
        assert r.json()["source"] == "exporters" and closed in r.json()["note"]


def test_the_terminal_report(fleet: Fleet) -> None:
    from typer.testing import CliRunner

    from inferwatch.cli import app

    runner = CliRunner(env={"COLUMNS": "80"})
    result = runner.invoke(app, ["diagnose", "--prometheus", fleet.prometheus, "--window", WINDOW])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "CRITICAL preemptions  vllm / kv-pressure" in out
    assert "CRITICAL latency_p99_high  vllm / queue-buildup" in out
    assert "Remedy:   lower the concurrency limit (vLLM: --max-num-seqs)" in out
    assert "increase(" in out  # the PromQL evidence
    assert "tgi ttft: TGI has no time-to-first-token metric" in out
    failing = runner.invoke(
        app, ["diagnose", "--prometheus", fleet.prometheus, "--window", WINDOW, "--fail-on", "critical"]
    )
    assert failing.exit_code == 1
    as_json = runner.invoke(app, ["diagnose", "--prometheus", fleet.prometheus, "--window", WINDOW, "--json"])
    check_profiles(Diagnosis.model_validate_json(as_json.stdout), fleet)
    slos = runner.invoke(app, ["slos", "--prometheus", fleet.prometheus])
    assert slos.exit_code == 0, slos.output
    assert "availability" in slos.stdout and "burn rate" in slos.stdout
