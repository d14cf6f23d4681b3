"""The diagnosis without upstreams: queries, evaluation of signals, exporter-mode arithmetic."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from inferwatch.collector.diagnosis import exporter_scrape
from inferwatch.collector.diagnosis.evaluate import Settings, diagnose, remedy_text
from inferwatch.collector.diagnosis.prometheus import fleet_queries, selector, window_seconds
from inferwatch.collector.diagnosis.signals import Filters, Fleet, TargetKey
from inferwatch.core import vocabulary as V
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.symptoms import CATALOGUE, Signal, Status, Symptom, SymptomSpec
from tests.support.promql_check import expr_test

PROFILES = builtin_profiles()
VLLM = TargetKey(V.ENGINE_VLLM, "m", "10.0.0.1:9400")
TGI = TargetKey(V.ENGINE_TGI, "m", "10.0.0.2:9400")

HEALTHY: dict[Signal, float] = {
    Signal.REQUEST_RATE: 4.0,
    Signal.ERROR_RATIO: 0.0,
    Signal.ABORT_RATIO: 0.0,
    Signal.E2E_P99: 2.9,
    Signal.QUEUE_P99: 0.05,
    Signal.QUEUE_SHARE: 0.01,
    Signal.WAITING: 0.0,
    Signal.RUNNING: 6.0,
    Signal.KV_USAGE: 0.1,
    Signal.KV_CAPACITY: 16384,
    Signal.PREEMPTION_RATE: 0.0,
    Signal.PREEMPTIONS_PER_REQUEST: 0.0,
    Signal.TTFT_P99: 0.16,
    Signal.TTFT_QUEUE_SHARE: 0.05,
    Signal.PREFILL_P99: 0.05,
    Signal.PROMPT_TOKENS_MEAN: 200,
    Signal.PREFILL_DECODE_RATIO: 1.5,
    Signal.TPOT_P99: 0.01,
    Signal.GENERATION_RATE: 500,
}


def fleet_of(*targets: tuple[TargetKey, dict[Signal, float]]) -> Fleet:
    fleet = Fleet("prometheus", "10m", 600)
    for key, values in targets:
        target = fleet.target(key)
        for signal, value in values.items():
            target.put(signal, value, f"query of {signal.value}")
    return fleet


def statuses(fleet: Fleet, key: TargetKey = VLLM) -> dict[Symptom, Status]:
    result = diagnose(fleet, PROFILES)
    return next(
        t.status for t in result.targets if (t.engine, t.model, t.instance) == (key.engine, key.model, key.instance)
    )


def test_healthy_target_has_no_findings() -> None:
    result = diagnose(fleet_of((VLLM, HEALTHY)), PROFILES)
    assert result.findings == []
    gpu = {Symptom.GPU_THROTTLED, Symptom.GPU_ERRORS}  # no GPU series: unknown, saying how to add them
    status = result.targets[0].status
    assert {v for s, v in status.items() if s not in gpu} == {Status.OK}
    assert {status[s] for s in gpu} == {Status.UNKNOWN}
    assert all("gpus:" in result.targets[0].reasons[s] for s in gpu)


@pytest.mark.parametrize(
    ("change", "symptom", "severity"),
    [
        (
            {Signal.QUEUE_P99: 8.0, Signal.WAITING: 40.0, Signal.QUEUE_SHARE: 0.9},
            Symptom.LATENCY_P99_HIGH,
            Status.CRITICAL,
        ),
        ({Signal.QUEUE_P99: 2.0, Signal.WAITING: 3.0}, Symptom.LATENCY_P99_HIGH, Status.WARNING),
        ({Signal.PREEMPTION_RATE: 2.0, Signal.PREEMPTIONS_PER_REQUEST: 0.5}, Symptom.PREEMPTIONS, Status.CRITICAL),
        ({Signal.PREEMPTION_RATE: 0.01, Signal.PREEMPTIONS_PER_REQUEST: 0.01}, Symptom.PREEMPTIONS, Status.WARNING),
        ({Signal.TTFT_P99: 3.0, Signal.PREFILL_P99: 2.8}, Symptom.TTFT_SLOW, Status.CRITICAL),
        ({Signal.TPOT_P99: 0.15}, Symptom.TPOT_SLOW, Status.WARNING),
        ({Signal.ERROR_RATIO: 0.2}, Symptom.ERROR_RATE_HIGH, Status.CRITICAL),
        ({Signal.ABORT_RATIO: 0.1}, Symptom.STREAMS_ABORTED, Status.WARNING),
        ({Signal.KV_USAGE: 0.99, Signal.WAITING: 10.0}, Symptom.THROUGHPUT_LOW, Status.CRITICAL),
    ],
)
def test_each_symptom_and_only_it(change: dict[Signal, float], symptom: Symptom, severity: Status) -> None:
    result = diagnose(fleet_of((VLLM, {**HEALTHY, **change})), PROFILES)
    assert [(f.symptom, f.severity) for f in result.findings if f.severity is Status.CRITICAL] == (
        [(symptom, severity)] if severity is Status.CRITICAL else []
    )
    assert (symptom, severity) in [(f.symptom, f.severity) for f in result.findings]


def test_slow_tokens_behind_long_prefills_are_not_a_model_problem() -> None:
    """Decodes that share steps with long prompts' prefill are slow; the model is not too big."""
    long_prompts = {**HEALTHY, Signal.TPOT_P99: 0.4, Signal.PREFILL_DECODE_RATIO: 40.0, Signal.TTFT_P99: 1.2}
    got = statuses(fleet_of((VLLM, long_prompts)))
    assert got[Symptom.TPOT_SLOW] is Status.OK
    assert got[Symptom.TTFT_SLOW] is Status.CRITICAL


def test_ttft_from_queueing_is_not_a_prompt_problem() -> None:
    """A slow first token spent waiting in the queue is the backlog's, not the prompts'."""
    queued = {
        **HEALTHY,
        Signal.TTFT_P99: 9.0,
        Signal.QUEUE_P99: 8.5,
        Signal.WAITING: 30.0,
        Signal.TTFT_QUEUE_SHARE: 0.9,
    }
    got = statuses(fleet_of((VLLM, queued)))
    assert got[Symptom.TTFT_SLOW] is Status.OK
    assert got[Symptom.LATENCY_P99_HIGH] is Status.CRITICAL


def test_a_consequence_is_at_most_a_warning() -> None:
    pressure = {
        **HEALTHY,
        Signal.PREEMPTION_RATE: 12.0,
        Signal.PREEMPTIONS_PER_REQUEST: 1.4,
        Signal.KV_USAGE: 0.99,
        Signal.WAITING: 900.0,
        Signal.QUEUE_P99: 10.0,
    }
    result = diagnose(fleet_of((VLLM, pressure)), PROFILES)
    assert [f.symptom for f in result.findings if f.severity is Status.CRITICAL] == [Symptom.PREEMPTIONS]
    latency = next(f for f in result.findings if f.symptom is Symptom.LATENCY_P99_HIGH)
    assert latency.severity is Status.WARNING and "consequence of preemptions" in latency.summary
    assert result.findings[0].symptom is Symptom.PREEMPTIONS  # most severe first


def test_evidence_carries_the_query_and_remedies_the_engine_knob() -> None:
    result = diagnose(
        fleet_of((VLLM, {**HEALTHY, Signal.PREEMPTION_RATE: 1, Signal.PREEMPTIONS_PER_REQUEST: 1})), PROFILES
    )
    finding = result.findings[0]
    assert finding.evidence[0].signal == Signal.PREEMPTIONS_PER_REQUEST.value
    assert finding.evidence[0].query == "query of preemptions_per_request"
    assert finding.evidence[0].threshold == "> 0.05"
    assert any("--max-num-seqs" in r for r in finding.remedies)
    assert any("--kv-cache-dtype fp8" in r for r in finding.remedies)
    assert finding.runbook


def test_missing_signal_is_unknown_with_the_reason_never_guessed() -> None:
    tgi: dict[Signal, float] = {
        k: v
        for k, v in HEALTHY.items()
        if k not in (Signal.TTFT_P99, Signal.PREEMPTION_RATE, Signal.PREEMPTIONS_PER_REQUEST)
    }
    result = diagnose(fleet_of((TGI, tgi)), PROFILES)
    target = result.targets[0]
    assert target.status[Symptom.TTFT_SLOW] is Status.UNKNOWN
    assert target.status[Symptom.PREEMPTIONS] is Status.UNKNOWN
    assert target.reasons[Symptom.TTFT_SLOW]  # the coverage matrix's reason, or "no data"
    assert result.findings == []


def test_slo_thresholds_and_overrides() -> None:
    spec = next(s for s in CATALOGUE if s.id is Symptom.TPOT_SLOW)
    assert Settings(slo_thresholds={V.TIME_PER_OUTPUT_TOKEN.key: 0.05}).threshold(spec).critical == 0.1
    assert Settings(overrides={Symptom.TPOT_SLOW: (1.0, 2.0)}).threshold(spec).warning == 1.0
    fleet = fleet_of((VLLM, {**HEALTHY, Signal.TPOT_P99: 0.07}))
    assert diagnose(fleet, PROFILES).findings == []
    tight = diagnose(fleet, PROFILES, Settings(slo_thresholds={V.TIME_PER_OUTPUT_TOKEN.key: 0.05}))
    assert [f.symptom for f in tight.findings] == [Symptom.TPOT_SLOW]


def test_remedy_text_in_each_engines_terms() -> None:
    spec: SymptomSpec = next(s for s in CATALOGUE if s.id is Symptom.PREEMPTIONS)
    concurrency = spec.remedies[0]
    assert "--max-num-seqs" in remedy_text(concurrency, PROFILES[V.ENGINE_VLLM])
    assert "--max-batch-size" in remedy_text(concurrency, PROFILES[V.ENGINE_TGI])
    assert "--max_batch_size" in remedy_text(concurrency, PROFILES[V.ENGINE_TRTLLM])
    assert remedy_text(concurrency, None) == concurrency.text


def test_query_count_does_not_depend_on_filters_and_queries_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    plain = fleet_queries("10m", Filters())
    narrow = fleet_queries("1h", Filters(engine=V.ENGINE_VLLM, model='we"ird', instance="h:1"))
    assert len(plain) == len(narrow)
    assert 'model="we\\"ird"' in narrow[Signal.TPOT_P99]
    rules = {
        "groups": [
            {
                "name": "diagnose",
                "rules": [{"record": f"diagnose:{i}", "expr": q} for i, q in enumerate(narrow.values())],
            }
        ]
    }
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_window_and_selector() -> None:
    assert window_seconds("10m") == 600
    assert window_seconds("2h") == 7200
    for bad in ("0s", "10", "1y", "-5m", "9999d"):
        with pytest.raises(ValueError, match="window"):
            window_seconds(bad)
    assert selector(Filters()) == ""


def _exposition(requests: dict[str, float], preemptions: float, waiting: float, ttft: list[tuple[str, float]]) -> str:
    lines = []
    labels = f'{V.LABEL_ENGINE}="{V.ENGINE_VLLM}",{V.LABEL_MODEL}="m"'
    lines.append(f"# TYPE {V.REQUESTS.name} counter")
    for outcome, count in requests.items():
        lines.append(f'{V.REQUESTS.name}{{{labels},{V.LABEL_OUTCOME}="{outcome}"}} {count}')
    lines.append(f"# TYPE {V.PREEMPTIONS.name} counter")
    lines.append(f"{V.PREEMPTIONS.name}{{{labels}}} {preemptions}")
    lines.append(f"# TYPE {V.REQUESTS_WAITING.name} gauge")
    lines.append(f"{V.REQUESTS_WAITING.name}{{{labels}}} {waiting}")
    lines.append(f"# TYPE {V.REQUESTS_RUNNING.name} gauge")
    lines.append(f"{V.REQUESTS_RUNNING.name}{{{labels}}} 4")
    lines.append(f"# TYPE {V.TIME_TO_FIRST_TOKEN.name} histogram")
    for le, count in ttft:
        lines.append(f'{V.TIME_TO_FIRST_TOKEN.name}_bucket{{{labels},le="{le}"}} {count}')
    lines.append(f"{V.TIME_TO_FIRST_TOKEN.name}_count{{{labels}}} {ttft[-1][1]}")
    lines.append(f"{V.TIME_TO_FIRST_TOKEN.name}_sum{{{labels}}} 1.0")
    return "\n".join(lines) + "\n"


def test_exporter_mode_rates_and_quantiles_from_two_scrapes() -> None:
    a = exporter_scrape._parse(
        _exposition({"stop": 100, "error": 0}, 10, 2, [("0.5", 50), ("1.0", 100), ("+Inf", 100)]), "h:9400", 0.0
    )
    b = exporter_scrape._parse(
        _exposition({"stop": 180, "error": 20}, 30, 4, [("0.5", 50), ("1.0", 150), ("+Inf", 200)]), "h:9400", 10.0
    )
    fleet = Fleet("exporters", "10s", 10.0)
    exporter_scrape._signals("http://h:9400/metrics", a, b, fleet)
    target = fleet.targets[TargetKey(V.ENGINE_VLLM, "m", "h:9400")]
    got = {s: o.value for s, o in target.values.items()}
    assert got[Signal.REQUEST_RATE] == 10.0
    assert got[Signal.ERROR_RATIO] == 0.2
    assert got[Signal.PREEMPTION_RATE] == 2.0
    assert got[Signal.PREEMPTIONS_PER_REQUEST] == 0.2
    assert got[Signal.WAITING] == 3.0
    # 100 new observations: 50 in (0.5, 1.0], 50 in (1.0, +Inf]: p99 is the highest finite bound
    assert got[Signal.TTFT_P99] == 1.0
    assert "-> 30" in target.values[Signal.PREEMPTION_RATE].query


def test_exporter_urls() -> None:
    assert exporter_scrape.metrics_url("http://h:9400") == "http://h:9400/metrics"
    assert exporter_scrape.metrics_url("http://h:9400/custom") == "http://h:9400/custom"
    with pytest.raises(ValueError, match="exporter URL"):
        exporter_scrape.metrics_url("h:9400")


def test_preemptions_are_seen_while_no_request_has_finished_yet() -> None:
    """Under load a real CPU vLLM finished nothing in the first seconds, yet preempted: still diagnosed."""
    a = exporter_scrape._parse(_exposition({"stop": 5}, 10, 8, [("+Inf", 5)]), "h:9400", 0.0)
    b = exporter_scrape._parse(_exposition({"stop": 5}, 30, 9, [("+Inf", 5)]), "h:9400", 6.0)
    fleet = Fleet("exporters", "6s", 6.0)
    exporter_scrape._signals("http://h:9400/metrics", a, b, fleet)
    result = diagnose(fleet, PROFILES)
    assert [(f.symptom, f.severity) for f in result.findings] == [(Symptom.PREEMPTIONS, Status.CRITICAL)]


def test_docs_cover_every_symptom() -> None:
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "diagnostics.md").read_text()
    for spec in CATALOGUE:
        assert f"### `{spec.id.value}`" in text, spec.id


def test_on_call_routes_need_the_read_token(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from inferwatch.collector.api.app import create_app
    from inferwatch.collector.settings import CollectorSettings

    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None, read_tokens=["r"], ingest_tokens=["i"])
    with TestClient(create_app(settings)) as client:
        for path in ("/api/v1/diagnose", "/api/v1/checklist", "/api/v1/capacity", "/api/v1/slos"):
            assert client.get(path).status_code == 401, path
            assert client.get(path, headers={"Authorization": "Bearer i"}).status_code == 401, path
        # with the token: nothing configured to read signals from
        answer = client.get("/api/v1/diagnose", headers={"Authorization": "Bearer r"})
        assert answer.status_code == 503 and "--prometheus-url" in answer.json()["detail"]
        capacity = client.get(
            "/api/v1/capacity",
            params={"layers": 2, "kv_heads": 2, "head_dim": 32},
            headers={"Authorization": "Bearer r"},
        )
        assert capacity.status_code == 200 and capacity.json()["plan"]["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 2
        half = client.get("/api/v1/capacity", params={"layers": 2}, headers={"Authorization": "Bearer r"})
        assert half.status_code == 422 and half.json()["detail"][0]["loc"] == ["query", "kv_heads"]


def test_the_abort_ratio_comes_from_the_proxy_where_one_stands_in_front(promtool: str, tmp_path: Path) -> None:
    """The proxy sees the client go away; engines report aborts late or not at all. Its share, by
    engine and model, lands on every target of that engine and model; elsewhere the engine's own."""
    client, engine = V.CLIENT_REQUESTS.name, V.REQUESTS.name
    series = [
        # tgi/m behind a proxy: the proxy saw 60 of 600 requests a minute aborted (0.1); the two TGI
        # replicas report no abort at all
        (f'{client}{{engine="tgi",model="m",instance="proxy:9500",outcome="stop"}}', "0+540x10"),
        (f'{client}{{engine="tgi",model="m",instance="proxy:9500",outcome="abort"}}', "0+60x10"),
        (f'{engine}{{engine="tgi",model="m",instance="a:9400",outcome="stop"}}', "0+300x10"),
        (f'{engine}{{engine="tgi",model="m",instance="b:9400",outcome="stop"}}', "0+300x10"),
        # vllm/m without a proxy: its own 30 of 600 (0.05)
        (f'{engine}{{engine="vllm",model="m",instance="c:9400",outcome="stop"}}', "0+570x10"),
        (f'{engine}{{engine="vllm",model="m",instance="c:9400",outcome="abort"}}', "0+30x10"),
    ]
    expr = fleet_queries("5m", Filters())[Signal.ABORT_RATIO]

    def row(eng: str, instance: str, value: float) -> dict[str, object]:
        return {"labels": f'{{engine="{eng}",model="m",instance="{instance}"}}', "value": value}

    expr_test(
        promtool,
        tmp_path,
        expr,
        series,
        [row("tgi", "a:9400", 0.1), row("tgi", "b:9400", 0.1), row("vllm", "c:9400", 0.05)],
    )
