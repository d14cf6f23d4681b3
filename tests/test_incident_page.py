"""The incident page in a real browser: headless Chromium renders a realistic incident.

A simulated vLLM runs the ``kv-pressure`` profile and sends its spans to a collector served on
127.0.0.1; an inferwatch exporter sits beside the simulator, and the collector diagnoses from that
exporter (``--exporter``, no Prometheus). Once the collector itself sees the preemptions and has
stored requests, an Alertmanager notification for the preemptions alert with the exporter's
labels arrives at the webhook; the incident is enriched (the preemptions finding, the slowest
requests, the dashboards and the runbook) and forwarded to a recording receiver. Debian's Chromium
then opens the page with the link's signed key: ``--dump-dom`` for the content, ``--screenshot``
at a phone's width for a look (kept under ``$INFERWATCH_TEST_ARTIFACTS`` when set). Every process
is stopped at the end.
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import signal
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferwatch.collector.api.app import create_app
from inferwatch.collector.incidents.enrich import incident_key
from inferwatch.collector.settings import CollectorSettings
from inferwatch.core import vocabulary as V
from tests.conftest import ROOT, free_port, require_tool, served_in_thread
from tests.support.alertmanager import alert, notification
from tests.support.chromium import FLAGS as DEVTOOLS_FLAGS
from tests.support.sink import Sink, running_sink
from tests.support.stack import INFERWATCH, Processes, exporter_cmd

MODEL = "llama-3.1-8b-instruct"
SPEED = 4.0
READ_TOKEN = "read-token-for-the-test"
GRAFANA = "https://grafana.example.com"
RUNBOOKS = "https://git.example.com/ops/inferwatch/blob/main/alerts/runbooks.md"
PHONE_WIDTH = 412
PHONE_HEIGHT = 1600
READY_TIMEOUT_S = 120.0
CHROMIUM_TIMEOUT_S = 90.0
CHROMIUM_FLAGS = (*(f for f in DEVTOOLS_FLAGS if not f.startswith("--remote-debugging")), "--hide-scrollbars")
ARTIFACTS_ENV = "INFERWATCH_TEST_ARTIFACTS"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass
class Incident:
    base: str
    """the collector's base URL."""
    id: int
    key: str
    detail: dict[str, Any]
    """``GET /api/v1/incidents/{id}`` once the enrichment is done."""
    sink: Sink

    @property
    def page(self) -> str:
        return f"{self.base}/incidents/{self.id}"

    @property
    def signed(self) -> str:
        return f"{self.page}?key={self.key}"


def read(client: httpx.Client, path: str, **params: Any) -> Any:
    r = client.get(path, params=params, headers={"Authorization": f"Bearer {READ_TOKEN}"})
    assert r.status_code == 200, r.text
    return r.json()


def wait_until_diagnosed(client: httpx.Client, procs: Processes) -> None:
    """Until the collector's own diagnosis shows the preemptions and some requests are stored."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    seen: list[str] = []
    while time.monotonic() < deadline:
        stored = read(client, "/api/v1/requests", engine=V.ENGINE_VLLM, limit=1)["count"]
        if stored >= 3:
            found = read(client, "/api/v1/diagnose", engine=V.ENGINE_VLLM)["findings"]
            seen = [f["symptom"] for f in found]
            if "preemptions" in seen:
                return
        time.sleep(1.0)
    raise AssertionError(
        f"no preemptions finding within {READY_TIMEOUT_S:g} s (findings {seen}):\n"
        f"{procs.log('sim')}\n{procs.log('exporter')}"
    )


def preemption_alert(instance: str, now: datetime) -> dict[str, Any]:
    labels = {"engine": V.ENGINE_VLLM, "model": MODEL, "instance": instance, "severity": "page"}
    body = alert(V.ALERT_PREEMPTIONS_SUSTAINED, labels, starts=now - timedelta(minutes=2))
    body["annotations"] = {
        "summary": "An engine keeps preempting running requests.",
        "description": f"vllm {MODEL} on {instance} preempted 41.5 sequences a minute (5-minute average), "
        "without pause for 10m. Preempted sequences are recomputed, so latency and throughput suffer.",
        "runbook_url": f"{RUNBOOKS}#llmpreemptionssustained",
    }
    return body


def notify_file(path: Path, sink: Sink) -> Path:
    receivers = [
        {"name": "oncall-bot", "url": f"{sink.url}/json", "format": "json"},
        {"name": "slack-llm-oncall", "url": f"{sink.url}/slack", "format": "slack", "match": {"severity": "page"}},
    ]
    path.write_text(yaml.safe_dump({"receivers": receivers}))
    return path


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Incident]:
    tmp = tmp_path_factory.mktemp("incident-page")
    procs = Processes(tmp / "logs", cwd=ROOT)
    sim_port, exporter_port = free_port(), free_port()
    instance = f"127.0.0.1:{exporter_port}"
    with running_sink() as sink:
        settings = CollectorSettings(
            data_dir=tmp / "collector",
            grpc_listen=None,
            read_tokens=[READ_TOKEN],
            exporters=[f"http://{instance}"],
            exporter_interval_seconds=3,
            grafana_url=GRAFANA,
            public_url="https://inferwatch.example.com",
            notify_config=notify_file(tmp / "notify.yaml", sink),
        )
        app = create_app(settings)
        try:
            with served_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as client:
                sim = [
                    *INFERWATCH,
                    "simulate",
                    *("--engine", V.ENGINE_VLLM, "--port", str(sim_port), "--model", MODEL),
                    *("--profile", "kv-pressure", "--seed", "7", "--speed", f"{SPEED:g}"),
                    *("--otlp-endpoint", f"{base}/v1/traces"),
                ]
                procs.spawn("sim", sim)
                procs.spawn("exporter", exporter_cmd(V.ENGINE_VLLM, f"http://127.0.0.1:{sim_port}", instance))
                procs.wait_http("exporter", f"http://{instance}/metrics")
                wait_until_diagnosed(client, procs)

                now = datetime.now(UTC)
                group = {"alertname": V.ALERT_PREEMPTIONS_SUSTAINED, "model": MODEL}
                r = client.post(
                    "/api/v1/alerts/webhook?severity=page",
                    json=notification([preemption_alert(instance, now)], group=group),
                )
                assert r.status_code == 200, r.text
                incident_id = int(r.json()["incidents"][0])
                deadline = time.monotonic() + 60
                detail = read(client, f"/api/v1/incidents/{incident_id}")
                while detail["enrichment_state"] != "done" and time.monotonic() < deadline:
                    time.sleep(0.5)
                    detail = read(client, f"/api/v1/incidents/{incident_id}")
                assert detail["enrichment_state"] == "done", detail
                sink.wait_for(1, "/json")
                sink.wait_for(1, "/slack")
                while time.monotonic() < deadline:  # the page lists both deliveries as delivered
                    detail = read(client, f"/api/v1/incidents/{incident_id}")
                    if len(detail["deliveries"]) == 2 and all(d["state"] == "delivered" for d in detail["deliveries"]):
                        break
                    time.sleep(0.2)
                key = incident_key(settings.link_key(), incident_id)
                yield Incident(base, incident_id, key, detail, sink)
        finally:
            procs.close()


def chromium(binary: str, profile: Path, *args: str) -> str:
    """Run headless Chromium with a new empty profile; its stdout. The whole process group is stopped after."""
    profile.mkdir(parents=True)
    cmd = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=CHROMIUM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"chromium did not finish in {CHROMIUM_TIMEOUT_S:g} s: {err.decode()[-2000:]}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):  # helpers it may have left behind
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"chromium exited with {proc.returncode}: {err.decode()[-2000:]}"
    return out.decode()


def artifacts_dir(tmp_path: Path) -> Path:
    configured = os.environ.get(ARTIFACTS_ENV)
    path = Path(configured) if configured else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def test_the_enrichment_found_the_preemptions(incident: Incident) -> None:
    enrichment = incident.detail["enrichment"]
    assert enrichment["error"] is None and enrichment["source"] == "exporters"
    top = enrichment["findings"][0]
    assert top["symptom"] == "preemptions" and top["model"] == MODEL
    assert any("--max-num-seqs" in r for r in top["remedies"])
    assert enrichment["example_requests"], "no stored request was picked"
    assert enrichment["runbook_url"] == f"{RUNBOOKS}#{top['runbook']}"
    assert [d["title"] for d in enrichment["dashboards"]] == ["LLM KV Cache & Scheduling", "LLM Engine Detail"]
    # the forwarded messages carry the same finding and the signed link
    message = incident.sink.bodies("/json")[0]
    assert message["top_finding"]["symptom"] == "preemptions" and "--max-num-seqs" in message["remedy"]
    assert message["incident_url"].endswith(f"/incidents/{incident.id}?key={incident.key}")
    slack = incident.sink.bodies("/slack")[0]
    assert slack["text"].startswith(f"[PAGE] {V.ALERT_PREEMPTIONS_SUSTAINED}")


def test_the_page_needs_a_key_or_a_read_token(incident: Incident) -> None:
    with httpx.Client(timeout=10) as client:
        assert client.get(incident.page).status_code == 401
        assert client.get(incident.page, params={"key": "0" * 32}).status_code == 401
        other = client.get(f"{incident.base}/incidents/{incident.id + 1}", params={"key": incident.key})
        assert other.status_code == 401  # a key opens its own incident only
        token = client.get(incident.page, headers={"Authorization": f"Bearer {READ_TOKEN}"})
        assert token.status_code == 200
        signed = client.get(incident.signed)
        assert signed.status_code == 200 and signed.headers["content-type"].startswith("text/html")
        page = signed.text
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert "<script" not in page.lower()


def test_chromium_renders_the_incident(incident: Incident, tmp_path: Path) -> None:
    binary = require_tool("chromium")
    dom = chromium(binary, tmp_path / "profile-dom", "--dump-dom", incident.signed)
    text = html.unescape(re.sub(r"<[^>]+>", "", dom))
    enrichment = incident.detail["enrichment"]
    top = enrichment["findings"][0]
    assert f"<title>{V.ALERT_PREEMPTIONS_SUSTAINED} (model={MODEL}) · inferwatch</title>" in html.unescape(dom)
    assert '<span class="badge firing">FIRING</span>' in dom
    assert "<script" not in dom.lower()
    # the diagnosis: the preemptions finding, what to do (vLLM's own flag) and the evidence query
    assert "<b>preemptions</b>" in dom and top["summary"] in text
    assert "What to do first:" in text and top["remedies"][0] in text
    assert '<span class="flag">--max-num-seqs</span>' in dom  # kept on one line on a phone
    assert top["evidence"][0]["query"] in text
    # the slowest requests, each with a phase bar
    assert "<h2>Slowest requests</h2>" in dom and dom.count('<div class="bar">') == len(enrichment["example_requests"])
    slowest = enrichment["example_requests"][0]
    assert (slowest["request_id"] or slowest["trace_id"]) in text
    # links: the runbook section of the finding and the dashboards with the alert's labels
    assert f'href="{html.escape(enrichment["runbook_url"])}">Runbook</a>' in dom
    for board in enrichment["dashboards"]:
        assert f'href="{html.escape(board["url"])}">{html.escape(board["title"])}</a>' in dom
        assert board["url"].startswith(f"{GRAFANA}/d/")
    # where the notifications went
    assert "oncall-bot (json)" in text and "slack-llm-oncall (slack)" in text


def test_phone_screenshot(incident: Incident, tmp_path: Path) -> None:
    binary = require_tool("chromium")
    shot = artifacts_dir(tmp_path) / "incident-page-phone.png"
    shot.unlink(missing_ok=True)
    chromium(
        binary,
        tmp_path / "profile-shot",
        f"--screenshot={shot}",
        f"--window-size={PHONE_WIDTH},{PHONE_HEIGHT}",
        incident.signed,
    )
    assert shot.exists(), "chromium wrote no screenshot"
    data = shot.read_bytes()
    width, height = png_size(data)
    assert (width, height) == (PHONE_WIDTH, PHONE_HEIGHT)
    assert len(data) > 20_000, f"a {len(data)}-byte screenshot is too small to show the page"
