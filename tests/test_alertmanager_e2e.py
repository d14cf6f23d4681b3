"""Alert forwarding end to end with the real Alertmanager: Alertmanager → collector → receivers.

Debian's Alertmanager runs the ``alertmanager.yml`` generated from an SLO file whose webhook is a
collector started as its own process (``inferwatch collector serve``, SQLite in a temporary data
directory), with short group and repeat intervals so that it re-sends every couple of seconds. A
recording HTTP receiver on loopback (:mod:`tests.support.sink`) stands for a bot (format ``json``)
and a Slack channel (format ``slack``). Alerts are posted to Alertmanager's API; the receivers must
hear of each change of state once, however often Alertmanager re-sends, also when they fail for a
while, and across a restart of the collector; a receiver that never answers ends dead-lettered. The
last test runs the whole chain: a simulated vLLM under KV pressure, its exporter, Prometheus with
the generated rules, Alertmanager, and the collector reading Prometheus for the enrichment.

Everything binds 127.0.0.1 on free ports, and every process started here is stopped at the end. On a
failure the collector's and Alertmanager's logs, the incidents API's answer (and Prometheus' alerts)
are printed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from inferwatch.alerts.generate import generate
from inferwatch.collector.incidents.markup import slack_text
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import load
from tests.conftest import ROOT, free_port, require_tool
from tests.support.sink import Sink, running_sink
from tests.support.stack import (
    Processes,
    alertmanager_cmd,
    collector_cmd,
    exporter_cmd,
    prometheus_cmd,
    simulator_cmd,
    write_prometheus_config,
)
from tests.test_e2e_prometheus import FAST_ALERTS

T = TypeVar("T")

# Alertmanager: the first notification 1 s after an alert arrives, a change at most 1 s later, and a
# re-send of an unchanged group every 2 s (repeat_interval, checked at each group_interval tick).
ROUTE_TIMINGS = {
    "group_wait": "1s",
    "group_interval": "1s",
    "repeat_interval": "2s",
    "page_repeat_interval": "2s",
    "ticket_repeat_interval": "2s",
}
REPEAT_SECONDS = 2.0
RETRY = {"initial_seconds": 0.1, "factor": 2, "max_seconds": 5, "jitter": 0}
"""the notify file's backoff: short, and far below the sink's Retry-After, to tell the two apart."""
LABELS = {
    V.LABEL_ENGINE: V.ENGINE_VLLM,
    V.LABEL_MODEL: "llama-e2e",
    "instance": "10.0.0.5:9400",
    V.SEVERITY_LABEL: V.SEVERITY_PAGE,
}
JSON_PATH, SLACK_PATH = "/json", "/slack"
E2E_TIMEOUT_S = 120.0


def iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def am_alert(name: str, labels: dict[str, str], starts: datetime, ends: datetime | None = None) -> dict[str, Any]:
    """An alert as Prometheus posts it to Alertmanager's API (``endsAt`` in the past resolves it)."""
    body: dict[str, Any] = {
        "labels": {"alertname": name, **labels},
        "annotations": {"summary": f"{name} (end-to-end test)", "runbook_url": f"alerts/runbooks.md#{name.lower()}"},
        "startsAt": iso(starts),
        "generatorURL": "http://127.0.0.1/graph",
    }
    if ends is not None:
        body["endsAt"] = iso(ends)
    return body


def eventually(check: Callable[[], T | None], what: str, timeout: float = 20.0, every: float = 0.2) -> T:
    """The first non-None answer of ``check``; an AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except httpx.HTTPError:
            got = None
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(every)


def receivers(sink: Sink, **extra: Any) -> list[dict[str, Any]]:
    """A bot (json) and a chat channel (slack) on the sink; no matchers: they get every incident."""
    return [
        {"name": "bot", "url": f"{sink.url}{JSON_PATH}", "format": "json", **extra},
        {"name": "chat", "url": f"{sink.url}{SLACK_PATH}", "format": "slack", **extra},
    ]


@dataclass
class AlertStack:
    procs: Processes
    sink: Sink
    alertmanager: str
    """Alertmanager's base URL."""
    collector: str
    """the collector's base URL."""
    collector_command: list[str]
    data_dir: Path
    generated: dict[str, str]
    """the files generated from the SLO file (``alertmanager.yml``, ``rules.yml``)."""
    diagnostics: dict[str, str] = field(default_factory=dict)
    """more URLs whose answers are printed on a failure."""

    # --- processes ---------------------------------------------------------------------------------------------------

    def start_collector(self, name: str = "collector") -> None:
        self.procs.spawn(name, self.collector_command)
        self.procs.wait_http(name, f"{self.collector}/healthz", timeout=30)

    def stop_collector(self, name: str = "collector") -> int | None:
        """SIGTERM to the collector (SIGKILL after the grace period); its exit code."""
        proc = self.procs.procs[name]
        self.procs.stop(name)
        return proc.returncode

    # --- Alertmanager ----------------------------------------------------------------------------------------------

    def post(self, *alerts: dict[str, Any]) -> None:
        r = httpx.post(f"{self.alertmanager}/api/v2/alerts", json=list(alerts), timeout=10)
        assert r.status_code == 200, f"Alertmanager refused the alerts: {r.status_code} {r.text}"

    def am_metric(self, name: str, **labels: str) -> float:
        """The sum of an Alertmanager self-metric over the series with ``labels``."""
        text = httpx.get(f"{self.alertmanager}/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            series, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
        return total

    # --- the collector ------------------------------------------------------------------------------------------------

    def incidents(self) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.collector}/api/v1/incidents", timeout=10)
        assert r.status_code == 200, r.text
        data: list[dict[str, Any]] = r.json()["data"]
        return data

    def incident(self, incident_id: int) -> dict[str, Any]:
        r = httpx.get(f"{self.collector}/api/v1/incidents/{incident_id}", timeout=10)
        assert r.status_code == 200, r.text
        detail: dict[str, Any] = r.json()
        return detail

    def only_incident(self) -> dict[str, Any]:
        """The one incident (waits for Alertmanager's first notification)."""
        found = eventually(lambda: self.incidents() or None, "an incident opened by Alertmanager's webhook")
        assert len(found) == 1, found
        return self.incident(int(found[0]["id"]))

    def deliveries_where(self, incident_id: int, ok: Callable[[dict[str, Any]], bool], count: int) -> dict[str, Any]:
        """The incident once it has ``count`` deliveries and ``ok`` holds for each."""

        def check() -> dict[str, Any] | None:
            detail = self.incident(incident_id)
            found = detail["deliveries"]
            return detail if len(found) == count and all(ok(d) for d in found) else None

        return eventually(check, f"{count} deliveries of incident {incident_id} in the state wanted")

    def db(self, sql: str) -> list[tuple[Any, ...]]:
        """Read the collector's SQLite database (what the API does not show: each webhook call Alertmanager made)."""
        with contextlib.closing(sqlite3.connect(self.data_dir / "inferwatch.db", timeout=10)) as conn:
            return list(conn.execute(sql).fetchall())

    # --- failures --------------------------------------------------------------------------------------------------

    def describe(self) -> str:
        parts = []
        for log in sorted(self.procs.logs.glob("*.log")):
            parts.append(f"----- {log.stem} (end of its log) -----\n{self.procs.log(log.stem)}")
        try:
            for summary in self.incidents():
                detail = self.incident(int(summary["id"]))
                parts.append(f"----- incident {summary['id']} -----\n{json.dumps(detail, indent=1)[:6000]}")
        except (httpx.HTTPError, AssertionError, ValueError) as exc:
            parts.append(f"----- incidents: unavailable ({exc!r})")
        for title, url in {"Alertmanager alerts": f"{self.alertmanager}/api/v2/alerts", **self.diagnostics}.items():
            try:
                parts.append(f"----- {title} -----\n{httpx.get(url, timeout=5).text[:6000]}")
            except httpx.HTTPError as exc:
                parts.append(f"----- {title}: unavailable ({exc!r})")
        with self.sink.lock:
            got = [(r.path, r.body.get("event") if isinstance(r.body, dict) else None) for r in self.sink.received]
            parts.append(f"----- sink: {got}, {self.sink.failed} answered with {self.sink.fail_status}")
        return "\n".join(parts)


@contextlib.contextmanager
def alert_stack(
    tmp: Path,
    sink: Sink,
    notify: dict[str, Any],
    *,
    alerts: dict[str, str] | None = None,
    collector_options: Sequence[str] = (),
) -> Iterator[AlertStack]:
    """Alertmanager with the configuration generated for a collector on a free port, and that collector.

    ``notify`` is the notify file's content; ``alerts`` more settings of the SLO file's ``alerts:``.
    Both processes are stopped on exit; on an exception their logs and the incidents are printed.
    """
    alertmanager_bin = require_tool("prometheus-alertmanager")
    port, grpc_port, am_port = free_port(), free_port(), free_port()
    collector = f"http://127.0.0.1:{port}"
    # the SLO file: the SLOs that ship with inferwatch, and an alerts section for this test
    settings = {"webhook_url": f"{collector}/api/v1/alerts/webhook", **ROUTE_TIMINGS, **(alerts or {})}
    slo_file = tmp / "slos.yaml"
    slo_file.write_text(
        (ROOT / "inferwatch" / "alerts" / "slos.yaml").read_text() + yaml.safe_dump({"alerts": settings})
    )
    generated = generate(load(slo_file, V.Vocabulary()), V.Vocabulary())
    (tmp / "alertmanager.yml").write_text(generated["alertmanager.yml"])
    (tmp / "notify.yaml").write_text(yaml.safe_dump(notify))
    data_dir = tmp / "collector"
    command = collector_cmd(
        port,
        grpc_port,
        data_dir,
        "--notify-config",
        str(tmp / "notify.yaml"),
        "--public-url",
        collector,
        *collector_options,
        "--log-level",
        "info",
    )
    procs = Processes(tmp / "logs", cwd=ROOT)
    stack = AlertStack(procs, sink, f"http://127.0.0.1:{am_port}", collector, command, data_dir, generated)
    try:
        procs.spawn("alertmanager", alertmanager_cmd(alertmanager_bin, tmp / "alertmanager.yml", tmp / "am", am_port))
        stack.start_collector()
        procs.wait_http("alertmanager", f"{stack.alertmanager}/-/ready", timeout=30)
        yield stack
    except BaseException:
        print(stack.describe())
        raise
    finally:
        procs.close()


@pytest.fixture
def sink() -> Iterator[Sink]:
    with running_sink() as s:
        yield s


def events(sink: Sink, path: str) -> list[str]:
    """What the sink got on ``path``: the JSON messages' events, or the Slack messages' ``[STATE]`` prefixes."""
    if path == JSON_PATH:
        return [str(body["event"]) for body in sink.bodies(path)]
    return [str(body["text"]).partition(" ")[0] for body in sink.bodies(path)]


def settle(seconds: float) -> None:
    """Let Alertmanager re-send and the collector's worker run a few passes: nothing more may arrive."""
    time.sleep(seconds)


# --- 1. each change of state once, however often Alertmanager re-sends -------------------------------------------


def test_each_change_is_forwarded_once_through_alertmanager(tmp_path: Path, sink: Sink) -> None:
    """Firing then resolved reach each receiver once while Alertmanager re-sends the group every 2 s; enriched."""
    notify = {"receivers": receivers(sink), "retry": RETRY}
    with alert_stack(tmp_path, sink, notify) as stack:
        starts = datetime.now(UTC)
        firing = am_alert(V.ALERT_KV_SATURATED, LABELS, starts)
        stack.post(firing)
        first = sink.wait_for(1, JSON_PATH, timeout=20)[0]
        sink.wait_for(1, SLACK_PATH, timeout=20)

        # Alertmanager re-sends the unchanged group every repeat interval: stored, never forwarded again
        def resent(least: int) -> int | None:
            (times_seen,) = stack.db("SELECT times_seen FROM alerts")[0]
            return int(times_seen) if times_seen >= least else None

        eventually(lambda: resent(4), "three re-sends of the firing alert", timeout=6 * REPEAT_SECONDS + 5)
        incident = stack.only_incident()
        assert [e["kind"] for e in incident["timeline"] if e["forwarded"]] == ["firing"]
        assert events(sink, JSON_PATH) == ["firing"] and events(sink, SLACK_PATH) == ["[PAGE]"]

        # the resolution: forwarded once too
        stack.post(am_alert(V.ALERT_KV_SATURATED, LABELS, starts, ends=datetime.now(UTC)))
        sink.wait_for(2, JSON_PATH, timeout=20)
        sink.wait_for(2, SLACK_PATH, timeout=20)
        settle(REPEAT_SECONDS + 1.5)
        assert events(sink, JSON_PATH) == ["firing", "resolved"]
        assert events(sink, SLACK_PATH) == ["[PAGE]", "[RESOLVED]"]

        # what the collector stored: one alert, every webhook call, the re-sends among them changing nothing
        calls = stack.db("SELECT status, changes FROM alert_notifications ORDER BY id")
        assert len(calls) >= 5, calls
        assert calls[0] == ("firing", 1) and calls[-1] == ("resolved", 1), calls
        assert all(changes == 0 for _, changes in calls[1:-1]), calls
        assert stack.db("SELECT count(*), max(times_seen) FROM alerts") == [(1, len(calls))]
        sent = stack.am_metric("alertmanager_notifications_total", integration="webhook")
        assert sent >= len(calls), f"Alertmanager counts {sent} webhook notifications, the collector {len(calls)}"

        # the incident: resolved, enriched (no Prometheus configured: said so), every delivery once
        detail = stack.incident(incident["id"])
        assert detail["status"] == "resolved" and detail["firing_alerts"] == 0
        assert [e["kind"] for e in detail["timeline"] if e["forwarded"]] == ["firing", "resolved"]
        assert detail["enrichment_state"] == "done"
        assert "no Prometheus URL" in detail["enrichment"]["error"]
        assert detail["enrichment"]["runbook_url"] == f"alerts/runbooks.md#{V.ALERT_KV_SATURATED.lower()}"
        [alert] = detail["alert_list"]
        assert alert["labels"] == {"alertname": V.ALERT_KV_SATURATED, **LABELS}
        assert alert["status"] == "resolved"
        deliveries = {(d["receiver"], d["event"]): d for d in detail["deliveries"]}
        assert set(deliveries) == {("bot", "firing"), ("chat", "firing"), ("bot", "resolved"), ("chat", "resolved")}
        assert all(d["state"] == "delivered" and d["attempts"] == 1 for d in deliveries.values())

        # the messages: the documented schema, the alert as Alertmanager sent it, the enrichment
        assert first["schema"] == "inferwatch.incident/v1" and first["incident_id"] == incident["id"]
        assert first["event"] == "firing" and first["severity"] == V.SEVERITY_PAGE
        assert first["alerts"][0]["alertname"] == V.ALERT_KV_SATURATED
        assert first["alerts"][0]["labels"] == {"alertname": V.ALERT_KV_SATURATED, **LABELS}
        assert "no Prometheus URL" in first["enrichment"]["error"]
        assert first["incident_url"].startswith(f"{stack.collector}/incidents/{incident['id']}?key=")
        slack = sink.bodies(SLACK_PATH)[0]
        assert slack["attachments"][0]["title_link"] == first["incident_url"]
        keys = [r.headers["idempotency-key"] for r in sink.received]
        assert len(set(keys)) == 4, keys


# --- 2. a receiver failing for a while ----------------------------------------------------------------------------


def test_a_receiver_failing_for_a_while_gets_each_message_once_it_recovers(tmp_path: Path, sink: Sink) -> None:
    """503 with Retry-After, then recovery: delivered once, after waiting as told, every attempt in the API."""
    failures = 4  # both receivers are on the sink: each is refused twice
    sink.fail_next, sink.fail_status, sink.retry_after = failures, 503, "1"
    notify = {"receivers": receivers(sink), "retry": RETRY}
    with alert_stack(tmp_path, sink, notify) as stack:
        stack.post(am_alert(V.ALERT_PREEMPTIONS_SUSTAINED, LABELS, datetime.now(UTC)))
        sink.wait_for(1, JSON_PATH, timeout=20)
        sink.wait_for(1, SLACK_PATH, timeout=20)
        settle(REPEAT_SECONDS + 1.5)
        assert events(sink, JSON_PATH) == ["firing"] and events(sink, SLACK_PATH) == ["[PAGE]"]
        assert sink.failed == failures

        incident = stack.only_incident()
        detail = stack.deliveries_where(incident["id"], lambda d: d["state"] == "delivered", 2)
        total = 0
        for delivery in detail["deliveries"]:
            log = delivery["attempt_log"]
            assert delivery["attempts"] == len(log) >= 2, delivery
            assert [a["status_code"] for a in log] == [503] * (len(log) - 1) + [200], delivery
            assert all(a["error"] == "HTTP 503" for a in log[:-1]) and log[-1]["error"] is None, delivery
            assert delivery["last_status"] == 200 and delivery["last_error"] is None, delivery
            # the next attempt waited for the receiver's Retry-After (1 s), not the notify file's 0.1 s backoff
            times = [datetime.fromisoformat(a["at"]) for a in log]
            gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
            assert all(gap >= 0.9 for gap in gaps), (gaps, delivery)
            total += len(log)
        assert total == failures + 2


# --- 3. a receiver down for good ----------------------------------------------------------------------------------


def test_a_receiver_down_for_good_ends_dead_and_the_collector_stays_healthy(tmp_path: Path, sink: Sink) -> None:
    """A receiver always 503 and one refusing connections: dead after max_attempts; the collector carries on."""
    sink.fail_next, sink.fail_status, sink.retry_after = 10**6, 503, "1"
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connections are refused
    bot, chat = receivers(sink, max_attempts=3)
    notify = {"receivers": [bot, {**chat, "url": f"{closed}{SLACK_PATH}"}], "retry": RETRY}
    with alert_stack(tmp_path, sink, notify) as stack:
        starts = datetime.now(UTC)
        stack.post(am_alert(V.ALERT_KV_SATURATED, LABELS, starts))
        incident = stack.only_incident()
        detail = stack.deliveries_where(incident["id"], lambda d: d["state"] == "dead", 2)
        for delivery in detail["deliveries"]:
            assert delivery["attempts"] == delivery["max_attempts"] == len(delivery["attempt_log"]) == 3, delivery
            assert delivery["next_attempt_at"] is None, delivery
        errors = {d["receiver"]: d["last_error"] or "" for d in detail["deliveries"]}
        assert errors["bot"] == "HTTP 503", errors
        assert "ConnectError" in errors["chat"], errors

        # the collector is unaffected: healthy, ready, and it still takes Alertmanager's notifications
        assert httpx.get(f"{stack.collector}/healthz", timeout=10).status_code == 200
        assert httpx.get(f"{stack.collector}/readyz", timeout=10).status_code == 200
        stack.post(am_alert(V.ALERT_KV_SATURATED, LABELS, starts, ends=datetime.now(UTC)))
        eventually(
            lambda: True if stack.incidents()[0]["status"] == "resolved" else None,
            "the resolution after the dead letters",
        )
        detail = stack.deliveries_where(incident["id"], lambda d: d["state"] == "dead", 4)
        assert sorted(d["event"] for d in detail["deliveries"]) == ["firing", "firing", "resolved", "resolved"]
        assert stack.procs.procs["collector"].poll() is None
        assert httpx.get(f"{stack.collector}/healthz", timeout=10).status_code == 200
        assert sink.received == []


# --- 4. a restart with deliveries pending -------------------------------------------------------------------------


def test_pending_deliveries_survive_a_restart_and_go_once(tmp_path: Path, sink: Sink) -> None:
    """Deliveries pending at SIGTERM, a resolution while down: after the restart each goes once, in order."""
    sink.fail_next, sink.fail_status, sink.retry_after = 10**6, 503, "2"
    notify = {"receivers": receivers(sink), "retry": RETRY}
    with alert_stack(tmp_path, sink, notify) as stack:
        starts = datetime.now(UTC)
        stack.post(am_alert(V.ALERT_PREEMPTIONS_SUSTAINED, LABELS, starts))
        incident = stack.only_incident()
        stack.deliveries_where(incident["id"], lambda d: d["state"] == "pending" and d["attempts"] >= 1, 2)
        assert stack.stop_collector() == 0, "the collector did not stop cleanly on SIGTERM"
        assert sink.received == []

        # while the collector is down the alert resolves: Alertmanager's webhook fails, it keeps the resolution
        failing = "alertmanager_notification_requests_failed_total"  # each refused request
        failed_before = stack.am_metric(failing, integration="webhook")
        stack.post(am_alert(V.ALERT_PREEMPTIONS_SUSTAINED, LABELS, starts, ends=datetime.now(UTC)))
        eventually(
            lambda: True if stack.am_metric(failing, integration="webhook") > failed_before else None,
            "Alertmanager failing to notify the stopped collector",
        )
        with sink.lock:
            sink.fail_next = 0

        stack.start_collector("collector-restarted")
        sink.wait_for(2, JSON_PATH, timeout=30)
        sink.wait_for(2, SLACK_PATH, timeout=30)
        settle(REPEAT_SECONDS + 1.5)
        assert events(sink, JSON_PATH) == ["firing", "resolved"]
        assert events(sink, SLACK_PATH) == ["[PAGE]", "[RESOLVED]"]

        detail = stack.deliveries_where(incident["id"], lambda d: d["state"] == "delivered", 4)
        assert detail["status"] == "resolved"
        assert [e["kind"] for e in detail["timeline"] if e["forwarded"]] == ["firing", "resolved"]
        for delivery in detail["deliveries"]:
            statuses = [a["status_code"] for a in delivery["attempt_log"]]
            if delivery["event"] == "firing":  # refused before the restart, delivered after it
                assert len(statuses) >= 2 and statuses == [503] * (len(statuses) - 1) + [200], delivery
            else:
                assert statuses == [200], delivery
        keys = [r.headers["idempotency-key"] for r in sink.received]
        assert len(set(keys)) == 4, keys


# --- 5. the whole chain: a simulated vLLM under KV pressure to the receivers ------------------------------------


def test_kv_pressure_reaches_the_receivers_enriched(tmp_path: Path, sink: Sink) -> None:
    """Simulated vLLM under KV pressure → Prometheus rules → Alertmanager → collector: the preemptions finding."""
    prometheus_bin = require_tool("prometheus")
    prom_port, sim_port, exporter_port = free_port(), free_port(), free_port()
    prometheus = f"http://127.0.0.1:{prom_port}"
    notify = {"receivers": receivers(sink), "retry": RETRY}
    options = ["--prometheus-url", prometheus]
    with alert_stack(tmp_path, sink, notify, alerts=FAST_ALERTS, collector_options=options) as stack:
        stack.diagnostics["Prometheus alerts"] = f"{prometheus}/api/v1/alerts"
        procs = stack.procs
        (tmp_path / "rules.yml").write_text(stack.generated["rules.yml"])
        sim, exporter = f"http://127.0.0.1:{sim_port}", f"127.0.0.1:{exporter_port}"
        procs.spawn("vllm-sim", simulator_cmd(V.ENGINE_VLLM, sim_port, model="kv-e2e", profile="kv-pressure"))
        procs.spawn("vllm-exporter", exporter_cmd(V.ENGINE_VLLM, sim, exporter))
        write_prometheus_config(
            tmp_path / "prometheus.yml",
            {"inferwatch": [exporter]},
            [tmp_path / "rules.yml"],
            alertmanager=stack.alertmanager.removeprefix("http://"),
        )
        procs.spawn(
            "prometheus", prometheus_cmd(prometheus_bin, tmp_path / "prometheus.yml", tmp_path / "tsdb", prom_port)
        )
        procs.wait_http("prometheus", f"{prometheus}/-/ready")
        procs.wait_http("vllm-exporter", f"http://{exporter}/metrics")

        wanted = {V.ALERT_KV_SATURATED, V.ALERT_PREEMPTIONS_SUSTAINED}

        def forwarded() -> dict[str, Any] | None:
            for body in sink.bodies(JSON_PATH):
                # (an alert that resolves before its enrichment is done is forwarded at once, unenriched: skip it)
                if body["event"] == body["status"] == "firing" and wanted & {a["alertname"] for a in body["alerts"]}:
                    return dict(body)
            return None

        message = eventually(
            forwarded, f"a message naming {' or '.join(sorted(wanted))}", timeout=E2E_TIMEOUT_S, every=1
        )
        findings = message["enrichment"]["findings"]
        assert message["enrichment"]["source"] == "prometheus" and message["enrichment"]["error"] is None, message
        assert "preemptions" in [f["symptom"] for f in findings], findings
        top = message["top_finding"]
        assert top["symptom"] == "preemptions", top  # the symptom the alert points at comes first
        assert top["engine"] == V.ENGINE_VLLM and top["model"] == "kv-e2e" and top["instance"] == exporter, top
        assert message["remedy"] and message["remedy"] == top["remedies"][0], message
        assert message["alerts"][0]["labels"]["instance"] == exporter
        assert message["enrichment"]["runbook_url"] == "alerts/runbooks.md#preemptions"

        # the Slack message of that incident carries the finding and the remedy too
        footer = f"inferwatch incident {message['incident_id']}"
        slack = eventually(
            lambda: next((b for b in sink.bodies(SLACK_PATH) if b["attachments"][0]["footer"] == footer), None),
            "the Slack message of the same incident",
        )
        fields = {f["title"]: f["value"] for f in slack["attachments"][0]["fields"]}
        assert fields.get("Remedy") == slack_text(message["remedy"]), fields  # Slack's escaping: & < >
        finding = next((v for k, v in fields.items() if k.startswith("Finding: preemptions")), "")
        assert finding.startswith(slack_text(top["summary"])), fields

        detail = stack.incident(message["incident_id"])
        assert detail["enrichment_state"] == "done" and detail["top_finding"] == top["summary"]
