"""Messages say only what the alert says: Slack text is escaped by Slack's rules, JSON receivers get plain strings.

Slack decodes ``&amp;``, ``&lt;`` and ``&gt;`` and reads everything between ``<`` and ``>`` as a control
sequence: ``<!channel>`` pings a channel, ``<@U123>`` a person, ``<http://x|text>`` shows a disguised link.
In what the collector sends, the only control sequences are the links it builds itself (the incident page,
an http(s) runbook, the dashboards); everything from the alert arrives as the characters it was.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from inferwatch.collector.api.app import create_app
from inferwatch.collector.incidents.markup import SLACK_LINK_BAR, slack_link, slack_text
from inferwatch.collector.incidents.messages import AlertSummary, DashboardLink, Enrichment, IncidentMessage, slack_body
from inferwatch.collector.settings import CollectorSettings
from tests.support.alertmanager import alert, notification
from tests.support.hostile import NOW, URLS, hostile_finding, hostile_request
from tests.support.sink import Sink, running_sink

INJECTION = "<!channel> <http://evil.example|click me>"
"""the alert name of the issue: a channel-wide ping and a disguised link."""
MENTIONS = f"{INJECTION} <!here> <!everyone> <@U123> <#C123> <!subteam^S123> &amp; & a > b < c"
INCIDENT_URL = "https://inferwatch.example/incidents/7?key=abc&x=1"
GRAFANA = "https://grafana.example/d/kv?from=now-1h&to=now&var-model=a%7Cb"
CONTROL = re.compile(r"<([^<>]*)>")


def unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)


def hostile_message(runbook: str | None = URLS["javascript"], **overrides: Any) -> IncidentMessage:
    finding = hostile_finding().model_copy(update={"summary": MENTIONS, "cause": MENTIONS})
    summary = AlertSummary(
        alertname=INJECTION,
        status="firing",
        severity="page",
        labels={"alertname": INJECTION, "x": MENTIONS},
        annotations={"summary": MENTIONS, "runbook_url": runbook or ""},
        starts_at=NOW,
        ends_at=None,
        generator_url=URLS["data"],
    )
    fields: dict[str, Any] = {
        "event": "firing",
        "incident_id": 7,
        "status": "firing",
        "title": f"{INJECTION} (model={MENTIONS})",
        "severity": "page",
        "labels": {"x": MENTIONS},
        "opened_at": NOW,
        "resolved_at": None,
        "summary": MENTIONS,
        "alerts": [summary],
        "enrichment": Enrichment(
            findings=[finding],
            example_requests=[hostile_request().model_copy(update={"request_id": MENTIONS})],
            runbook_url=runbook,
            dashboards=[DashboardLink(title="LLM KV Cache & Scheduling", url=GRAFANA)],
        ),
        "top_finding": finding,
        "remedy": MENTIONS,
        "incident_url": INCIDENT_URL,
    }
    return IncidentMessage(**{**fields, **overrides})


def control_sequences(body: dict[str, Any]) -> list[str]:
    """Every ``<...>`` Slack would read in the message (``title_link`` is a URL, not text)."""
    texts = [s for k, s in _text_items(body)]
    return [m.group(1) for text in texts for m in CONTROL.finditer(text)]


def _text_items(node: Any, key: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k not in ("title_link", "color"):
                yield from _text_items(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from _text_items(v, key)
    elif isinstance(node, str):
        yield key, node


def test_slack_gets_alert_content_as_literal_text() -> None:
    message = hostile_message()
    body = slack_body(message)
    # the only control sequences are the links built here; none is a mention or a link of the alert's
    assert sorted(control_sequences(body)) == sorted(
        [
            "https://inferwatch.example/incidents/7?key=abc&amp;x=1|Incident page",
            "https://grafana.example/d/kv?from=now-1h&amp;to=now&amp;var-model=a%7Cb|LLM KV Cache &amp; Scheduling",
        ]
    )
    assert body["text"] == f"[PAGE] {slack_text(message.title)}"
    attachment = body["attachments"][0]
    assert attachment["title"] == body["text"] and attachment["text"] == slack_text(MENTIONS)
    assert attachment["title_link"] == INCIDENT_URL
    values = {f["title"]: f["value"] for f in attachment["fields"]}
    assert values["Likely cause"] == slack_text(MENTIONS) and values["Remedy"] == slack_text(MENTIONS)
    assert unescape(values["Slowest request"]).startswith(MENTIONS)
    # nothing is lost: Slack shows exactly the alert's characters
    shown = "\n".join(unescape(s) for s in strings(body))
    assert MENTIONS in shown and INJECTION in shown
    for _, text in _text_items(body):  # every & starts one of the three entities Slack decodes
        assert "&" not in CONTROL.sub("", text).replace("&amp;", "").replace("&lt;", "").replace("&gt;", "")


def test_slack_links_only_http_runbooks() -> None:
    body = slack_body(hostile_message(runbook=URLS["javascript"]))
    links = next(f["value"] for f in body["attachments"][0]["fields"] if f["title"] == "Links")
    assert f"Runbook: {slack_text(URLS['javascript'])}" in links
    assert not any(s.startswith(("javascript", "data")) for s in control_sequences(body))
    hostile_http = "https://runbooks.example/a|b>c<d&e#x"
    body = slack_body(hostile_message(runbook=hostile_http))
    assert "https://runbooks.example/a%7Cb%3Ec%3Cd&amp;e#x|Runbook" in control_sequences(body)


def test_slack_link_text_and_url_are_escaped() -> None:
    assert slack_link("https://a.example/?q=1&r=<2>|3", "a | b <!here> & c") == (
        f"<https://a.example/?q=1&amp;r=%3C2%3E%7C3|a {SLACK_LINK_BAR} b &lt;!here&gt; &amp; c>"
    )
    assert slack_link("javascript:alert(1)", "Runbook") == "Runbook: javascript:alert(1)"
    assert slack_link(None, "<b>") == "&lt;b&gt;: "
    assert slack_text("<!channel> & <@U1>") == "&lt;!channel&gt; &amp; &lt;@U1&gt;"


def test_resolved_messages_are_escaped_too() -> None:
    body = slack_body(hostile_message(event="resolved", status="resolved", resolved_at=NOW + timedelta(minutes=5)))
    assert body["text"].startswith("[RESOLVED] &lt;!channel&gt;")
    assert len(control_sequences(body)) == 2  # the incident page and the dashboard


def test_json_receivers_get_plain_strings() -> None:
    message = hostile_message()
    body = message.json_body()
    assert body["title"] == f"{INJECTION} (model={MENTIONS})"
    assert body["summary"] == MENTIONS and body["remedy"] == MENTIONS
    assert body["alerts"][0]["alertname"] == INJECTION
    assert body["enrichment"]["runbook_url"] == URLS["javascript"]
    assert all("&lt;" not in s and "&gt;" not in s for s in strings(body))  # not escaped for Slack or HTML


# --- through the webhook, the worker and the outbox ------------------------------------------------------------------


@pytest.fixture
def sink() -> Iterator[Sink]:
    with running_sink() as s:
        yield s


def test_the_issue_alert_reaches_slack_as_text(tmp_path: Path, sink: Sink) -> None:
    receivers = [
        {"name": "bot", "url": f"{sink.url}/json", "format": "json"},
        {"name": "chat", "url": f"{sink.url}/slack", "format": "slack"},
    ]
    notify = tmp_path / "notify.yaml"
    notify.write_text(yaml.safe_dump({"receivers": receivers, "retry": {"initial_seconds": 0.1, "max_seconds": 1}}))
    settings = CollectorSettings(
        data_dir=tmp_path, grpc_listen=None, notify_config=notify, public_url="https://inferwatch.example"
    )
    labels = {"engine": "vllm", "model": MENTIONS, "severity": "page"}
    body = alert(INJECTION, labels, starts=NOW - timedelta(minutes=2))
    body["annotations"] = {"summary": MENTIONS, "runbook_url": URLS["javascript"]}
    with TestClient(create_app(settings)) as client:
        r = client.post("/api/v1/alerts/webhook", json=notification([body], group={"alertname": INJECTION}))
        assert r.status_code == 200, r.text
        slack = sink.wait_for(1, "/slack")[0]
        plain = sink.wait_for(1, "/json")[0]
    sequences = control_sequences(slack)
    assert not any(s.startswith(("!", "@", "#", "http://evil")) for s in sequences), sequences
    assert all(s.startswith("https://inferwatch.example/incidents/") for s in sequences), sequences
    assert slack["text"] == f"[PAGE] {slack_text(INJECTION)}"
    assert plain["title"] == INJECTION and plain["alerts"][0]["labels"]["model"] == MENTIONS
