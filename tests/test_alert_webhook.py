"""Alertmanager's webhook on the collector: stored once per alert, forwarded once per change, enriched, paged."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from inferwatch.collector.api.app import create_app
from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.store.tables import ALERTS_TABLE, DELIVERIES_TABLE, INCIDENTS_TABLE, NOTIFICATIONS_TABLE
from inferwatch.core import vocabulary as V
from tests.conftest import postgres_schema
from tests.support.alertmanager import alert, notification
from tests.support.sink import Sink, running_sink

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
GROUP = {"alertname": V.ALERT_PREEMPTIONS_SUSTAINED, "model": "llama"}
LABELS = {"engine": V.ENGINE_VLLM, "model": "llama", "instance": "10.0.0.5:9400", "severity": "page"}
WEBHOOK = "/api/v1/alerts/webhook?severity=page"


def notify_file(tmp_path: Path, sink: Sink, **extra: Any) -> Path:
    path = tmp_path / "notify.yaml"
    receivers = [
        {"name": "bot", "url": f"{sink.url}/json", "format": "json", **extra},
        {"name": "chat", "url": f"{sink.url}/slack", "format": "slack", "match": {"severity": "page"}},
        {"name": "tickets-only", "url": f"{sink.url}/tickets", "format": "json", "match": {"severity": "ticket"}},
    ]
    path.write_text(yaml.safe_dump({"receivers": receivers, "retry": {"initial_seconds": 0.1, "max_seconds": 1}}))
    return path


@pytest.fixture
def sink() -> Iterator[Sink]:
    with running_sink() as s:
        yield s


def client_for(settings: CollectorSettings) -> TestClient:
    return TestClient(create_app(settings))


def count(client: TestClient, table: Any) -> int:
    with client.app.state.collector.engine.connect() as conn:  # type: ignore[attr-defined]
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_stored_once_forwarded_once_per_change(tmp_path: Path, sink: Sink) -> None:
    settings = CollectorSettings(
        data_dir=tmp_path, grpc_listen=None, notify_config=notify_file(tmp_path, sink), public_url="http://iw.example"
    )
    first = alert(V.ALERT_PREEMPTIONS_SUSTAINED, LABELS, starts=T0)
    with client_for(settings) as client:
        r = client.post(WEBHOOK, json=notification([first], group=GROUP))
        assert r.status_code == 200, r.text
        assert r.json()["new_alerts"] == 1
        incident = r.json()["incidents"][0]
        # Alertmanager re-sends (repeat interval, retry, the other member of an HA pair): nothing changes
        for _ in range(3):
            again = client.post(WEBHOOK, json=notification([first], group=GROUP)).json()
            assert again["repeats"] == 1 and again["new_alerts"] == 0
        json_bodies = sink.wait_for(1, "/json")
        slack_bodies = sink.wait_for(1, "/slack")
        # a second alert joins the group: one "updated"
        second = alert(V.ALERT_KV_SATURATED, {**LABELS, "severity": "page"}, starts=T0 + timedelta(minutes=1))
        client.post(WEBHOOK, json=notification([first, second], group=GROUP))
        sink.wait_for(2, "/json")
        # both resolve: one "resolved"
        done = [
            {**first, "status": "resolved", "endsAt": "2026-12-01T12:10:00Z"},
            {**second, "status": "resolved", "endsAt": "2026-12-01T12:10:00Z"},
        ]
        client.post(WEBHOOK, json=notification(done, group=GROUP))
        client.post(WEBHOOK, json=notification(done, group=GROUP))  # re-sent resolution
        json_bodies = sink.wait_for(3, "/json")
        time.sleep(1.0)  # nothing more may arrive
        assert [b["event"] for b in sink.bodies("/json")] == ["firing", "updated", "resolved"]
        assert len(sink.bodies("/slack")) == 3
        assert sink.bodies("/tickets") == []  # its matcher takes only severity=ticket
        assert count(client, ALERTS_TABLE) == 2
        assert count(client, INCIDENTS_TABLE) == 1
        assert count(client, NOTIFICATIONS_TABLE) == 7
        # the JSON message: the documented schema, enriched (no upstream configured: said in 'error')
        message = json_bodies[0]
        assert message["schema"] == "inferwatch.incident/v1" and message["incident_id"] == incident
        assert message["alerts"][0]["alertname"] == V.ALERT_PREEMPTIONS_SUSTAINED
        assert "no Prometheus URL" in message["enrichment"]["error"]
        assert message["incident_url"].startswith(f"http://iw.example/incidents/{incident}?key=")
        # the Slack message: a title, a colour, the link
        slack = slack_bodies[0]
        assert slack["text"].startswith("[PAGE]") and slack["attachments"][0]["color"] == "#d32f2f"
        assert slack["attachments"][0]["title_link"] == message["incident_url"]
        headers = next(r for r in sink.received if r.path == "/json").headers
        assert len(headers["idempotency-key"]) >= 16
        # the read API
        page = client.get("/api/v1/incidents", params={"status": "resolved"}).json()
        assert page["count"] == 1 and page["data"][0]["alerts"] == 2 and page["data"][0]["firing_alerts"] == 0
        detail = client.get(f"/api/v1/incidents/{incident}").json()
        assert [e["kind"] for e in detail["timeline"] if e["forwarded"]] == ["firing", "updated", "resolved"]
        assert {d["receiver"] for d in detail["deliveries"]} == {"bot", "chat"}
        assert all(d["state"] == "delivered" and d["attempt_log"] for d in detail["deliveries"])
        # a new episode of the same group opens a new incident
        later = alert(V.ALERT_PREEMPTIONS_SUSTAINED, LABELS, starts=T0 + timedelta(hours=1))
        again_id = client.post(WEBHOOK, json=notification([later], group=GROUP)).json()["incidents"][0]
        assert again_id != incident


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"version": "3"}', "unsupported payload version '3'"),
        (b'{"version": "4", "groupKey": "g", "status": "firing", "receiver": "r", "alerts": []}', "alerts"),
        (
            b'{"version": "4", "groupKey": "g", "status": "firing", "receiver": "r", "alerts": [{"status": "firing", '
            b'"labels": {"a": "b"}, "startsAt": "yesterday", "fingerprint": "f"}]}',
            "alerts.0.startsAt",
        ),
    ],
)
def test_bad_payloads_are_400_and_store_nothing(tmp_path: Path, body: bytes, message: str) -> None:
    with client_for(CollectorSettings(data_dir=tmp_path, grpc_listen=None)) as client:
        r = client.post(WEBHOOK, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and message in r.json()["detail"]
        assert count(client, NOTIFICATIONS_TABLE) == 0 and count(client, ALERTS_TABLE) == 0


def test_oversize_and_tokens(tmp_path: Path) -> None:
    settings = CollectorSettings(
        data_dir=tmp_path, grpc_listen=None, ingest_tokens=["in"], read_tokens=["out"], max_webhook_bytes=2048
    )
    body = notification([alert(V.ALERT_KV_SATURATED, LABELS, starts=T0)], group=GROUP)
    with client_for(settings) as client:
        assert client.post(WEBHOOK, json=body).status_code == 401
        assert client.post(WEBHOOK, json=body, headers={"Authorization": "Bearer out"}).status_code == 401
        ok = client.post(WEBHOOK, json=body, headers={"Authorization": "Bearer in"})
        assert ok.status_code == 200
        big = {**body, "commonAnnotations": {"x": "y" * 4096}}
        assert client.post(WEBHOOK, json=big, headers={"Authorization": "Bearer in"}).status_code == 413
        incident = ok.json()["incidents"][0]
        assert client.get("/api/v1/incidents").status_code == 401
        assert client.get("/api/v1/incidents", headers={"Authorization": "Bearer out"}).status_code == 200
        # the page: a read token, or the link's signed key
        assert client.get(f"/incidents/{incident}").status_code == 401
        assert client.get(f"/incidents/{incident}?key=forged").status_code == 401
        key = client.app.state.collector.alerts.links  # type: ignore[attr-defined]
        from inferwatch.collector.incidents.enrich import incident_key

        page = client.get(f"/incidents/{incident}", params={"key": incident_key(key.secret, incident)})
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert V.ALERT_KV_SATURATED in page.text and '<meta name="viewport"' in page.text
        assert client.get("/incidents/999999", headers={"Authorization": "Bearer out"}).status_code == 404
        assert client.get("/api/v1/incidents/0", headers={"Authorization": "Bearer out"}).status_code == 422
        bad_cursor = client.get("/api/v1/incidents?cursor=%%%", headers={"Authorization": "Bearer out"})
        assert bad_cursor.status_code == 400


def test_a_bad_notify_file_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "notify.yaml"
    path.write_text("receivers:\n  - name: chat\n    url: not-a-url\n    format: slack\n")
    from inferwatch.collector.incidents.notify import NotifyConfigError

    with pytest.raises(NotifyConfigError, match=r"line 3: receivers\.0\.url"):
        create_app(CollectorSettings(data_dir=tmp_path, grpc_listen=None, notify_config=path))


def test_receivers_down_are_retried_then_dead_and_the_collector_is_unaffected(tmp_path: Path, sink: Sink) -> None:
    sink.fail_next, sink.fail_status, sink.retry_after = 1000, 500, None
    settings = CollectorSettings(
        data_dir=tmp_path, grpc_listen=None, notify_config=notify_file(tmp_path, sink, max_attempts=3)
    )
    with client_for(settings) as client:
        r = client.post(WEBHOOK, json=notification([alert(V.ALERT_KV_SATURATED, LABELS, starts=T0)], group=GROUP))
        incident = r.json()["incidents"][0]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            detail = client.get(f"/api/v1/incidents/{incident}").json()
            bot = [d for d in detail["deliveries"] if d["receiver"] == "bot"]
            if bot and bot[0]["state"] == "dead":
                break
            time.sleep(0.1)
        assert bot[0]["state"] == "dead" and bot[0]["attempts"] == 3 and "500" in (bot[0]["last_error"] or "")
        assert client.get("/healthz").status_code == 200
        assert count(client, DELIVERIES_TABLE) == 2


def test_on_postgresql(sink: Sink, tmp_path: Path) -> None:
    with postgres_schema("iw_alerts") as url:
        settings = CollectorSettings(
            data_dir=tmp_path, grpc_listen=None, database_url=url, notify_config=notify_file(tmp_path, sink)
        )
        first = alert(V.ALERT_PREEMPTIONS_SUSTAINED, LABELS, starts=T0)
        with client_for(settings) as client:
            for _ in range(2):
                assert client.post(WEBHOOK, json=notification([first], group=GROUP)).status_code == 200
            sink.wait_for(1, "/json")
            assert count(client, ALERTS_TABLE) == 1
            time.sleep(0.5)
            assert len(sink.bodies("/json")) == 1


def test_an_alert_firing_again_with_the_same_start_is_forwarded_again(tmp_path: Path, sink: Sink) -> None:
    """Prometheus gives a re-fired alert a new startsAt; other senders reuse it. Either way it pages."""
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None, notify_config=notify_file(tmp_path, sink))
    firing = alert(V.ALERT_PREEMPTIONS_SUSTAINED, LABELS, starts=T0)
    resolved = {**firing, "status": "resolved", "endsAt": "2026-12-01T12:10:00Z"}
    with client_for(settings) as client:
        first = client.post(WEBHOOK, json=notification([firing], group=GROUP)).json()["incidents"][0]
        client.post(WEBHOOK, json=notification([resolved], group=GROUP))
        sink.wait_for(2, "/json")
        again = client.post(WEBHOOK, json=notification([firing], group=GROUP)).json()
        assert again["new_alerts"] == 1 and again["repeats"] == 0
        reopened = again["incidents"][0]
        assert reopened != first
        assert [b["event"] for b in sink.wait_for(3, "/json")] == ["firing", "resolved", "firing"]
        detail = client.get(f"/api/v1/incidents/{reopened}").json()
        assert detail["status"] == "firing" and detail["firing_alerts"] == 1
        assert count(client, ALERTS_TABLE) == 1  # the same alert, moved to the new incident


def test_a_hanging_receiver_does_not_stop_the_shutdown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A receiver that accepts and never answers holds the worker's pass; shutdown still flushes the
    writer and closes the store after the worker's grace period."""
    import socket

    from inferwatch.collector.incidents import worker

    monkeypatch.setattr(worker, "STOP_SECONDS", 0.5)
    hang = socket.create_server(("127.0.0.1", 0))
    path = tmp_path / "notify.yaml"
    url = f"http://127.0.0.1:{hang.getsockname()[1]}/hook"
    receiver = {"name": "hangs", "url": url, "format": "json", "timeout_seconds": 30}
    path.write_text(yaml.safe_dump({"receivers": [receiver]}))
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None, notify_config=path)
    app = create_app(settings)
    collector = app.state.collector
    stopped: list[bool] = []
    real_stop = collector.stop

    def recording_stop() -> None:
        stopped.append(True)
        real_stop()

    monkeypatch.setattr(collector, "stop", recording_stop)
    try:
        with TestClient(app) as client:
            client.post(WEBHOOK, json=notification([alert(V.ALERT_KV_SATURATED, LABELS, starts=T0)], group=GROUP))
            conn, _ = hang.accept()  # the delivery is in flight, and will never be answered
            started = time.monotonic()
        assert time.monotonic() - started < 5
        assert stopped == [True]
        conn.close()
    finally:
        hang.close()


def test_a_non_ascii_page_key_is_refused_not_a_500(tmp_path: Path) -> None:
    """Found by the OpenAPI fuzzer: hmac.compare_digest raised on a non-ASCII str."""
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None, read_tokens=["out"])
    with client_for(settings) as client:
        incident = client.post(
            WEBHOOK, json=notification([alert(V.ALERT_KV_SATURATED, LABELS, starts=T0)], group=GROUP)
        ).json()["incidents"][0]
        assert client.get(f"/incidents/{incident}", params={"key": "clé"}).status_code == 401
        assert client.get(f"/incidents/{incident}", params={"key": "x"}).status_code == 401
