"""The SLO generator: goldens, validation errors that name line and field, burn factors, CLI."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from inferwatch.alerts.generate import covers_window, generate
from inferwatch.cli import app
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import BURN_PAIRS, SLOFileError, burn_factor, load, parse
from tests.conftest import ROOT

SLOS = ROOT / "inferwatch" / "alerts" / "slos.yaml"
GENERATED = ROOT / "inferwatch" / "alerts" / "generated"


def test_goldens_regenerate_byte_for_byte(update_goldens: bool) -> None:
    files = generate(load(SLOS, V.Vocabulary()), V.Vocabulary(), source=SLOS.name)
    assert set(files) == {"rules.yml", "alertmanager.yml", "runbooks.md"}
    for name, content in files.items():
        path = GENERATED / name
        if update_goldens:
            path.write_text(content)
        assert path.read_text() == content, f"{path} is stale: run `make goldens`"
        assert "do not edit" in content.splitlines()[0]


def test_deterministic() -> None:
    spec = load(SLOS, V.Vocabulary())
    assert generate(spec, V.Vocabulary()) == generate(spec, V.Vocabulary())


def test_every_alert_has_severity_summary_description_runbook() -> None:
    rules = yaml.safe_load(generate(load(SLOS, V.Vocabulary()), V.Vocabulary())["rules.yml"])
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    names = {a["alert"] for a in alerts}
    assert names == set(V.ALERTS)
    runbook = (GENERATED / "runbooks.md").read_text()
    for a in alerts:
        assert a["labels"][V.SEVERITY_LABEL] in (V.SEVERITY_PAGE, V.SEVERITY_TICKET)
        summary = a["annotations"]["summary"]
        assert summary[0].isupper() and summary.endswith(".") and "{{" not in summary
        assert "$value" in a["annotations"]["description"]
        anchor = a["annotations"]["runbook_url"].split("#", 1)[1]
        assert f'<a id="{anchor}"></a>' in runbook
    burns = [a for a in alerts if a["alert"] == V.ALERT_SLO_BURN]
    assert len(burns) == 4 * 4
    assert all(
        set(a["labels"])
        == {V.SLO_SERVICE_LABEL, V.SLO_LABEL, V.SEVERITY_LABEL, V.LONG_WINDOW_LABEL, V.SHORT_WINDOW_LABEL}
        for a in burns
    )


def test_burn_factors_are_the_workbook_table_scaled_by_period() -> None:
    spec = load(SLOS, V.Vocabulary()).slos[0]
    assert [burn_factor(p, spec) for p in BURN_PAIRS] == [Decimal("14.4"), Decimal(6), Decimal(3), Decimal(1)]
    scaled = spec.model_copy(update={"period": "28d"})
    assert [burn_factor(p, scaled) for p in BURN_PAIRS] == [
        Decimal("13.44"),
        Decimal("5.6"),
        Decimal("2.8"),
        Decimal("0.9333333333333333333333333333"),
    ]


BASE = """service: s
slos:
  - name: ttft
    objective: 99
    indicator: {latency: {metric: time_to_first_token, threshold_seconds: 0.5}}
"""


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            BASE.replace("0.5}", "0.3}"),
            ":5: slos.0.indicator.latency.threshold_seconds: 0.3 s is not a bucket boundary",
        ),
        (BASE.replace("time_to_first_token", "ttft"), ":5: slos.0.indicator.latency.metric"),
        (BASE.replace("objective: 99", "objective: 101"), ":4: slos.0.objective"),
        (BASE.replace("name: ttft", "name: TTFT!"), ":3: slos.0.name"),
        (BASE + "  - name: ttft\n    objective: 99\n    indicator: {errors: {}}\n", "two SLOs are named 'ttft'"),
        (BASE.replace("{latency: {metric: time_to_first_token, threshold_seconds: 0.5}}", "{}"), "exactly one of"),
        (BASE + "    period: 1d\n", "shorter than the longest alert window"),
        ("slos: [\n", "not valid YAML"),
        (BASE + "alerts:\n  severities: {LLMKVCacheSatured: page}\n", "no alert named 'LLMKVCacheSatured'"),
        (BASE + "alerts:\n  webhook_token: a\n  webhook_credentials_file: /t\n", "not both"),
        (BASE + "alerts:\n  group_wait: soon\n", "alerts.group_wait"),
    ],
)
def test_bad_slo_files_name_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(SLOFileError) as exc:
        parse(text, "slos.yaml", V.Vocabulary())
    assert fragment in str(exc.value)


def test_a_threshold_added_to_the_layout_is_accepted() -> None:
    vocab = V.Vocabulary().with_boundaries(V.TIME_TO_FIRST_TOKEN, [0.3])
    spec = parse(BASE.replace("0.5}", "0.3}"), "slos.yaml", vocab)
    rules = generate(spec, vocab)["rules.yml"]
    assert 'le="0.3"' in rules


def test_cli_writes_and_checks(tmp_path: Path) -> None:
    slo = tmp_path / "slos.yaml"
    slo.write_text(BASE)
    out = tmp_path / "gen"
    runner = CliRunner()
    result = runner.invoke(app, ["generate", "alerts", "--slo", str(slo), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == {"rules.yml", "alertmanager.yml", "runbooks.md"}
    assert runner.invoke(app, ["generate", "alerts", "--slo", str(slo), "--out", str(out), "--check"]).exit_code == 0
    (out / "rules.yml").write_text("changed")
    stale = runner.invoke(app, ["generate", "alerts", "--slo", str(slo), "--out", str(out), "--check"])
    assert stale.exit_code == 1 and "stale" in stale.stderr
    slo.write_text(BASE.replace("0.5}", "0.3}"))
    bad = runner.invoke(app, ["generate", "alerts", "--slo", str(slo), "--out", str(out)])
    assert bad.exit_code == 2 and "not a bucket boundary" in bad.stderr


CUSTOM = f"""service: chat
slos:
  - name: queue-1s
    description: 99.5% of requests start within 1 s
    objective: 99.5
    period: 28d
    indicator: {{latency: {{metric: request_queue, threshold_seconds: 1.0}}}}
    selector: {{model: llama-3-8b}}
    group_by: [model, instance]
  - name: errors
    objective: 99.95
    period: 7d
    indicator: {{errors: {{}}}}
alerts:
  kv_cache_saturated_ratio: 0.9
  preemptions_for: 15m
  severities: {{{V.ALERT_KV_SATURATED}: page}}
  webhook_url: http://alerts.example:9000/hook
  webhook_credentials_file: /etc/alertmanager/inferwatch-ingest-token
  group_wait: 10s
  page_repeat_interval: 30m
"""


def test_a_new_slo_file_gives_rules_promtool_accepts(tmp_path: Path) -> None:
    """What a user does: write an SLO, run one command, check the rules with promtool."""
    from tests.conftest import require_tool

    promtool = require_tool("promtool")
    amtool = require_tool("amtool")
    slo = tmp_path / "slos.yaml"
    slo.write_text(CUSTOM)
    out = tmp_path / "gen"
    result = CliRunner().invoke(app, ["generate", "alerts", "--slo", str(slo), "--out", str(out)])
    assert result.exit_code == 0, result.output
    import subprocess

    checked = subprocess.run([promtool, "check", "rules", str(out / "rules.yml")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    am = subprocess.run([amtool, "check-config", str(out / "alertmanager.yml")], capture_output=True, text=True)
    assert am.returncode == 0, am.stdout + am.stderr
    rules = (out / "rules.yml").read_text()
    assert '{model="llama-3-8b",le="1.0"}' in rules and "by (model, instance)" in rules
    assert ">= 0.9" in rules and "for: 15m" in rules
    assert "> 0.0672" in rules  # 13.44 (28-day page factor) x 0.005
    assert "http://alerts.example:9000/hook" in (out / "alertmanager.yml").read_text()
    am_doc = yaml.safe_load((out / "alertmanager.yml").read_text())
    assert am_doc["route"]["group_wait"] == "10s" and am_doc["route"]["routes"][0]["repeat_interval"] == "30m"
    for receiver in am_doc["receivers"]:  # the collector's ingest token, as Alertmanager's bearer credentials
        auth = receiver["webhook_configs"][0]["http_config"]["authorization"]
        assert auth == {"type": "Bearer", "credentials_file": "/etc/alertmanager/inferwatch-ingest-token"}
    doc = yaml.safe_load(rules)
    kv = next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == V.ALERT_KV_SATURATED)
    assert kv["labels"][V.SEVERITY_LABEL] == V.SEVERITY_PAGE


def test_no_rule_reads_a_recording_of_its_own_group() -> None:
    """vmalert writes a group's results asynchronously: a rule built on its neighbour sees the previous
    evaluation (30 s late per level, or 5 minutes in the period group). Prometheus would not mind;
    tests/test_scale_metrics.py found it. Rules may read recordings of other groups."""
    import re

    rules = yaml.safe_load(generate(load(SLOS, V.Vocabulary()), V.Vocabulary())["rules.yml"])
    for group in rules["groups"]:
        recorded = {r["record"] for r in group["rules"] if "record" in r}
        for rule in group["rules"]:
            names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["expr"]))
            assert not names & recorded, (group["name"], rule.get("record") or rule.get("alert"), names & recorded)


@pytest.mark.parametrize(
    ("window", "part"),
    [("30m", "5m"), ("1h", "10m"), ("10m", "100s"), ("2h", "20m"), ("1d", "4h"), ("45s", "7s")],
)
def test_the_kv_trend_counts_its_window_against_the_last_sixth(window: str, part: str) -> None:
    kv = V.KV_CACHE_USAGE.name
    assert covers_window(kv, window) == (f"count_over_time({kv}[{window}]) >= 4.8 * count_over_time({kv}[{part}])")


def test_a_custom_kv_trend_window_reaches_the_rule() -> None:
    vocab = V.Vocabulary()
    spec = parse(BASE + "alerts:\n  kv_cache_prediction_window: 1h\n", "slos.yaml", vocab)
    rules = yaml.safe_load(generate(spec, vocab)["rules.yml"])
    (alert,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == V.ALERT_KV_EXHAUSTION_PREDICTED]
    assert f"predict_linear({V.KV_CACHE_USAGE.name}[1h], 900)" in alert["expr"]
    assert covers_window(V.KV_CACHE_USAGE.name, "1h") in alert["expr"]
