"""The generated alerting, checked with the real tools.

* ``promtool test rules`` on every unit-test file in ``tests/alerts/`` (one case per file);
* ``promtool check rules`` on the generated rules and ``amtool check-config`` on the generated
  Alertmanager configuration;
* ``amtool config routes test``: where a page, a ticket and an alert without severity go;
* a real Alertmanager for the inhibition rule (a page silences the tickets of its own SLO and model).

Three bugs of the first generated files are kept as regression tests (the shared-exporter and
1m-scrape files in ``tests/alerts/`` and ``test_a_page_does_not_inhibit_unrelated_tickets``).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferwatch.core import vocabulary as V
from tests.conftest import ROOT, free_port, require_tool

ALERT_TESTS = ROOT / "tests" / "alerts"
GENERATED = ROOT / "inferwatch" / "alerts" / "generated"
RULES = GENERATED / "rules.yml"
ALERTMANAGER = GENERATED / "alertmanager.yml"
RULE_FILES_FROM_TESTS = "../../alerts/generated/rules.yml"

RECEIVER_PAGE = "inferwatch-page"
RECEIVER_TICKET = "inferwatch-ticket"
RECEIVER_DEFAULT = "inferwatch-default"

BURN_TESTED_SLOS = ("ttft-500ms", "availability")  # a latency SLO and the errors SLO of alerts/slos.yaml

UNIT_TEST_FILES = sorted(ALERT_TESTS.glob("*.yaml"))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """Run a tool from the repository root (relative paths as in the docs); never raises on failure."""
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def assert_succeeds(*args: str) -> None:
    """The tool exits 0 and says SUCCESS."""
    result = run(*args)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "SUCCESS" in output, output


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def rule_alerts() -> list[dict[str, Any]]:
    return [r for g in load_yaml(RULES)["groups"] for r in g["rules"] if "alert" in r]


def unit_tests() -> list[dict[str, Any]]:
    return [t for path in UNIT_TEST_FILES for t in load_yaml(path)["tests"]]


# --- promtool ------------------------------------------------------------------------------------
def test_unit_test_files_exist_and_test_the_generated_rules() -> None:
    names = {p.name for p in UNIT_TEST_FILES}
    assert {"slo_recording.yaml", "slo_burn.yaml", "saturation.yaml"} <= names
    for path in UNIT_TEST_FILES:
        doc = load_yaml(path)
        assert doc["rule_files"] == [RULE_FILES_FROM_TESTS], path.name
        for test in doc["tests"]:
            # promtool 2.42 loads the series wrongly without an explicit interval.
            assert "interval" in test, f"{path.name}: {test.get('name')!r} has no interval"


@pytest.mark.parametrize("test_file", UNIT_TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests(test_file: Path) -> None:
    promtool = require_tool("promtool")
    assert_succeeds(promtool, "test", "rules", str(test_file.relative_to(ROOT)))


def test_every_alert_is_proven_to_fire() -> None:
    """Each alert name, and each burn-rate window pair, has a unit test where it fires."""
    fired: set[str] = set()
    burn_pairs: set[tuple[str, str, str]] = set()
    for test in unit_tests():
        for check in test.get("alert_rule_test", []):
            for alert in check.get("exp_alerts") or []:
                fired.add(check["alertname"])
                labels = alert["exp_labels"]
                if check["alertname"] == V.ALERT_SLO_BURN:
                    burn_pairs.add((labels[V.SLO_LABEL], labels[V.LONG_WINDOW_LABEL], labels[V.SHORT_WINDOW_LABEL]))
    alerts = rule_alerts()
    assert {a["alert"] for a in alerts} == fired
    assert {a["alert"] for a in alerts} == set(V.ALERTS)
    # every window pair, for a latency SLO and for the errors SLO
    expected_pairs = {
        (a["labels"][V.SLO_LABEL], a["labels"][V.LONG_WINDOW_LABEL], a["labels"][V.SHORT_WINDOW_LABEL])
        for a in alerts
        if a["alert"] == V.ALERT_SLO_BURN and a["labels"][V.SLO_LABEL] in BURN_TESTED_SLOS
    }
    assert len(expected_pairs) == 4 * len(BURN_TESTED_SLOS)
    assert burn_pairs == expected_pairs


def test_every_recording_rule_is_exercised() -> None:
    """Each recorded series name appears in a unit test (as a query or as fed input)."""
    text = "\n".join(p.read_text() for p in UNIT_TEST_FILES)
    records = {r["record"] for g in load_yaml(RULES)["groups"] for r in g["rules"] if "record" in r}
    assert records
    missing = sorted(r for r in records if r not in text)
    assert not missing, f"recording rules without a unit test: {missing}"


def test_promtool_check_rules() -> None:
    promtool = require_tool("promtool")
    assert_succeeds(promtool, "check", "rules", str(RULES.relative_to(ROOT)))


# --- amtool --------------------------------------------------------------------------------------
def test_amtool_check_config() -> None:
    amtool = require_tool("amtool")
    assert_succeeds(amtool, "check-config", str(ALERTMANAGER.relative_to(ROOT)))


def route(receiver: str, *labels: str) -> subprocess.CompletedProcess[str]:
    amtool = require_tool("amtool")
    return run(
        amtool,
        "config",
        "routes",
        "test",
        f"--config.file={ALERTMANAGER.relative_to(ROOT)}",
        f"--verify.receivers={receiver}",
        *labels,
    )


ROUTES = [
    pytest.param(
        RECEIVER_PAGE,
        (f"alertname={V.ALERT_SLO_BURN}", f"{V.SEVERITY_LABEL}={V.SEVERITY_PAGE}", f"{V.SLO_LABEL}=x", "model=m"),
        id="page",
    ),
    pytest.param(
        RECEIVER_TICKET,
        (f"alertname={V.ALERT_SLO_BURN}", f"{V.SEVERITY_LABEL}={V.SEVERITY_TICKET}", f"{V.SLO_LABEL}=x", "model=m"),
        id="ticket",
    ),
    pytest.param(RECEIVER_DEFAULT, ("alertname=Watchdog",), id="unlabelled"),
    pytest.param(RECEIVER_DEFAULT, ("alertname=Foo", f"{V.SEVERITY_LABEL}=critical"), id="unknown-severity"),
]


@pytest.mark.parametrize(("receiver", "labels"), ROUTES)
def test_amtool_routes(receiver: str, labels: tuple[str, ...]) -> None:
    result = route(receiver, *labels)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert result.stdout.split() == [receiver], output


def test_amtool_routes_verification_is_not_vacuous() -> None:
    """A page does not reach the ticket receiver: amtool's verification really fails."""
    result = route(RECEIVER_TICKET, f"{V.SEVERITY_LABEL}={V.SEVERITY_PAGE}", f"{V.SLO_LABEL}=x")
    assert result.returncode != 0, result.stdout + result.stderr


def test_every_generated_alert_routes_by_its_severity() -> None:
    receivers = {V.SEVERITY_PAGE: RECEIVER_PAGE, V.SEVERITY_TICKET: RECEIVER_TICKET}
    seen: set[tuple[str, str]] = set()
    for alert in rule_alerts():
        labels = alert["labels"]
        key = (alert["alert"], labels[V.SEVERITY_LABEL])
        if key in seen:
            continue
        seen.add(key)
        result = route(
            receivers[labels[V.SEVERITY_LABEL]], f"alertname={alert['alert']}", *(f"{k}={v}" for k, v in labels.items())
        )
        assert result.returncode == 0, f"{key}: {result.stdout}{result.stderr}"


# --- a real Alertmanager: inhibition -------------------------------------------------------------
@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of an Alertmanager running the generated configuration (module-scoped, stopped after)."""
    binary = require_tool("prometheus-alertmanager")
    data = tmp_path_factory.mktemp("alertmanager")
    log = data / "alertmanager.log"
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={ALERTMANAGER}",
                f"--storage.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",  # no gossip: a single, private instance
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"alertmanager did not start (exit code {proc.poll()}):\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _alert(name: str, severity: str, **labels: str) -> dict[str, Any]:
    return {"labels": {"alertname": name, V.SEVERITY_LABEL: severity, **labels}}


def _states(url: str, alerts: list[dict[str, Any]], settled: dict[str, str]) -> dict[str, str]:
    """Post ``alerts`` and return ``{alertname/instance: state}`` once the ``settled`` alert is suppressed.

    The inhibitor ingests alerts asynchronously, in order: waiting for the last posted source to take
    effect means every earlier one has been seen too.
    """
    httpx.post(f"{url}/api/v2/alerts", json=alerts, timeout=5).raise_for_status()
    deadline = time.monotonic() + 10
    while True:
        got = httpx.get(f"{url}/api/v2/alerts", timeout=5).json()
        states = {f"{a['labels']['alertname']}/{a['labels'].get('instance', '')}": a["status"]["state"] for a in got}
        key = f"{settled['alertname']}/{settled.get('instance', '')}"
        if states.get(key) == "suppressed" or time.monotonic() > deadline:
            return states
        time.sleep(0.1)


SLO_LABELS = {V.SLO_LABEL: "ttft-500ms", "model": "m"}


def test_a_page_inhibits_the_tickets_of_its_own_slo_and_model(alertmanager: str) -> None:
    ticket = _alert(V.ALERT_SLO_BURN, V.SEVERITY_TICKET, **SLO_LABELS, instance="slo-ticket")
    other_slo = _alert(V.ALERT_SLO_BURN, V.SEVERITY_TICKET, **{**SLO_LABELS, V.SLO_LABEL: "availability"}, instance="a")
    other_model = _alert(V.ALERT_SLO_BURN, V.SEVERITY_TICKET, **{**SLO_LABELS, "model": "n"}, instance="n")
    page = _alert(V.ALERT_SLO_BURN, V.SEVERITY_PAGE, **SLO_LABELS, instance="slo-page")
    states = _states(alertmanager, [ticket, other_slo, other_model, page], ticket["labels"])
    assert states[f"{V.ALERT_SLO_BURN}/slo-ticket"] == "suppressed", states
    assert states[f"{V.ALERT_SLO_BURN}/slo-page"] == "active", states
    assert states[f"{V.ALERT_SLO_BURN}/a"] == "active", states
    assert states[f"{V.ALERT_SLO_BURN}/n"] == "active", states


def test_a_page_does_not_inhibit_unrelated_tickets(alertmanager: str) -> None:
    # a target down on one exporter must not hide an engine without metrics on another exporter,
    target_down = _alert(V.ALERT_EXPORTER_TARGET_DOWN, V.SEVERITY_PAGE, engine="vllm", target="v", instance="x:1")
    absent = _alert(V.ALERT_ENGINE_METRICS_ABSENT, V.SEVERITY_TICKET, engine="tgi", target="t", instance="y:1")
    # nor must preemptions on one replica hide a full KV cache on another replica of the model.
    preempting = _alert(V.ALERT_PREEMPTIONS_SUSTAINED, V.SEVERITY_PAGE, engine="vllm", model="k", instance="x:2")
    kv_full = _alert(V.ALERT_KV_SATURATED, V.SEVERITY_TICKET, engine="vllm", model="k", instance="y:2")
    # (the SLO pair is the synchronisation point: its ticket is suppressed once every page was seen;
    # a model of its own, so that the pages of other tests cannot suppress it earlier)
    sync = {**SLO_LABELS, "model": "sync"}
    ticket = _alert(V.ALERT_SLO_BURN, V.SEVERITY_TICKET, **sync, instance="sync-ticket")
    page = _alert(V.ALERT_SLO_BURN, V.SEVERITY_PAGE, **sync, instance="sync-page")
    states = _states(alertmanager, [absent, kv_full, ticket, target_down, preempting, page], ticket["labels"])
    assert states[f"{V.ALERT_SLO_BURN}/sync-ticket"] == "suppressed", states
    assert states[f"{V.ALERT_ENGINE_METRICS_ABSENT}/y:1"] == "active", states
    assert states[f"{V.ALERT_KV_SATURATED}/y:2"] == "active", states


def test_two_slo_files_with_the_same_slo_name_do_not_collide(tmp_path: Path) -> None:
    """Two teams, one Prometheus: both name an SLO ``ttft-500ms``. Every series and alert carries its
    file's ``service``, so the ratios, the budget (whose join would otherwise be many-to-many) and
    the alerts stay apart."""
    from inferwatch.alerts.generate import generate
    from inferwatch.core.slo import parse

    promtool = require_tool("promtool")
    vocab = V.Vocabulary()
    for service in ("chat", "code"):
        spec = parse(
            f"service: {service}\nslos:\n  - name: ttft-500ms\n    objective: 99\n"
            f"    indicator: {{latency: {{metric: time_to_first_token, threshold_seconds: 0.5}}}}\n"
            f"    selector: {{model: {service}-model}}\n    group_by: [model]\n",
            f"{service}.yaml",
            vocab,
        )
        (tmp_path / f"{service}.yml").write_text(generate(spec, vocab)["rules.yml"])
    count, bucket = f"{V.TIME_TO_FIRST_TOKEN.name}_count", f"{V.TIME_TO_FIRST_TOKEN.name}_bucket"
    series = [
        # chat: 600 req/min, 480 within 0.5 s (20 % slow); code: 600 req/min, all fast
        (f'{count}{{model="chat-model",instance="a:9400"}}', "0+600x70"),
        (f'{bucket}{{model="chat-model",instance="a:9400",le="0.5"}}', "0+480x70"),
        (f'{count}{{model="code-model",instance="b:9400"}}', "0+600x70"),
        (f'{bucket}{{model="code-model",instance="b:9400",le="0.5"}}', "0+600x70"),
    ]

    def sample(record: str, service: str, model: str, value: float) -> dict[str, Any]:
        labels = f'{V.SLO_SERVICE_LABEL}="{service}",{V.SLO_LABEL}="ttft-500ms",{V.LABEL_MODEL}="{model}"'
        return {"labels": f"{record}{{{labels}}}", "value": value}

    ratio5m = V.slo_error_ratio("5m")
    test = {
        "rule_files": ["chat.yml", "code.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": [
                    {
                        "expr": ratio5m,
                        "eval_time": "70m",
                        "exp_samples": [
                            sample(ratio5m, "chat", "chat-model", 0.2),
                            sample(ratio5m, "code", "code-model", 0),
                        ],
                    },
                    {
                        "expr": f"round({V.SLO_BUDGET_REMAINING_RECORD}, 0.001)",
                        "eval_time": "70m",
                        "exp_samples": [
                            # round() drops the name: the labels alone
                            sample("", "chat", "chat-model", -19),
                            sample("", "code", "code-model", 1),
                        ],
                    },
                    {
                        # all four burn alerts, for chat only
                        "expr": f"count by ({V.SLO_SERVICE_LABEL}, {V.SLO_LABEL}) "
                        f'(ALERTS{{alertname="{V.ALERT_SLO_BURN}"}})',
                        "eval_time": "70m",
                        "exp_samples": [
                            {"labels": f'{{{V.SLO_SERVICE_LABEL}="chat",{V.SLO_LABEL}="ttft-500ms"}}', "value": 4}
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "two_services.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", "two_services.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_an_slo_measured_at_the_proxy_reads_the_client_series(tmp_path: Path) -> None:
    """TGI has no TTFT histogram; ``measured_at: proxy`` makes a TTFT SLO for it from what inferwatch
    proxy measured (llm_client_*), and an availability SLO from the proxy's outcomes; the engine's
    series of the same model do not count."""
    from inferwatch.alerts.generate import generate
    from inferwatch.core.slo import parse

    promtool = require_tool("promtool")
    vocab = V.Vocabulary()
    spec = parse(
        "service: chat\nslos:\n"
        "  - name: ttft-500ms\n    objective: 99\n"
        "    indicator: {latency: {metric: time_to_first_token, threshold_seconds: 0.5, measured_at: proxy}}\n"
        "    group_by: [model]\n"
        "  - name: availability\n    objective: 99.9\n    indicator: {errors: {measured_at: proxy}}\n"
        "    group_by: [model]\n",
        "chat.yaml",
        vocab,
    )
    (tmp_path / "chat.yml").write_text(generate(spec, vocab)["rules.yml"])
    client, engine = V.CLIENT_TIME_TO_FIRST_TOKEN.name, V.TIME_TO_FIRST_TOKEN.name
    requests = V.CLIENT_REQUESTS.name
    series = [
        # at the proxy: 600 req/min, 480 within 0.5 s; 60 of them errors
        (f'{client}_count{{engine="tgi",model="m"}}', "0+600x10"),
        (f'{client}_bucket{{engine="tgi",model="m",le="0.5"}}', "0+480x10"),
        (f'{requests}{{engine="tgi",model="m",outcome="stop"}}', "0+540x10"),
        (f'{requests}{{engine="tgi",model="m",outcome="error"}}', "0+60x10"),
        # an engine-side TTFT of the same model (all fast) is not read
        (f'{engine}_count{{engine="vllm",model="m"}}', "0+600x10"),
        (f'{engine}_bucket{{engine="vllm",model="m",le="0.5"}}', "0+600x10"),
    ]
    ratio = V.slo_error_ratio("5m")

    def sample(slo: str, value: float) -> dict[str, Any]:
        return {"labels": f'{ratio}{{service="chat",slo="{slo}",model="m"}}', "value": value}

    test = {
        "rule_files": ["chat.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": [
                    {
                        "expr": ratio,
                        "eval_time": "10m",
                        "exp_samples": [sample("ttft-500ms", 0.2), sample("availability", 0.1)],
                    }
                ],
            }
        ],
    }
    (tmp_path / "proxy.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", "proxy.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    info = [r for g in yaml.safe_load(generate(spec, vocab)["rules.yml"])["groups"] for r in g["rules"]]
    metrics = {r["labels"]["metric"] for r in info if r.get("record") == V.SLO_INFO_RECORD}
    assert metrics == {client, requests}


def test_measured_at_proxy_needs_a_latency_the_proxy_measures() -> None:
    from inferwatch.core.slo import SLOFileError, parse

    with pytest.raises(SLOFileError, match="the proxy does not measure 'request_queue'"):
        parse(
            "slos:\n  - name: q\n    objective: 99\n"
            "    indicator: {latency: {metric: request_queue, threshold_seconds: 1.0, measured_at: proxy}}\n",
            "bad.yaml",
            V.Vocabulary(),
        )
