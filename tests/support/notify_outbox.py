"""The outbox's rows (incidents, alerts, events, deliveries, attempts) written and read straight in the
tables, a notify file for one receiver, and the sink: a real HTTP server on 127.0.0.1 that records what it is
sent and answers as told. For ``tests/test_notify_outbox.py``."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from sqlalchemy import Connection, Engine, insert, select

from inferwatch.collector.incidents.intake import FIRING
from inferwatch.collector.incidents.messages import IncidentMessage
from inferwatch.collector.incidents.notify import NotifyConfig, parse_notify_config
from inferwatch.collector.incidents.outbox import Dispatcher, fan_out
from inferwatch.collector.store.tables import (
    ALERTS_TABLE,
    DELIVERIES_TABLE,
    DELIVERY_ATTEMPTS_TABLE,
    INCIDENT_EVENTS_TABLE,
    INCIDENTS_TABLE,
)

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
TOKEN = "s3cr3t-bot-token"


def add_incident(
    engine: Engine, alerts: list[dict[str, str]], labels: dict[str, str] | None = None, enrichment: str = "done"
) -> int:
    i, a = INCIDENTS_TABLE, ALERTS_TABLE
    with engine.begin() as conn:
        incident_id = int(
            conn.execute(
                insert(i)
                .values(
                    group_key='{}:{alertname="x"}',
                    status=FIRING,
                    title="x",
                    severity=alerts[0].get("severity") if alerts else None,
                    labels=labels or {},
                    opened_at=T0,
                    updated_at=T0,
                    enrichment_state=enrichment,
                )
                .returning(i.c.id)
            ).scalar_one()
        )
        for n, alert_labels in enumerate(alerts):
            conn.execute(
                insert(a).values(
                    incident_id=incident_id,
                    fingerprint=f"{incident_id:x}{n:04x}",
                    starts_at=T0,
                    status=FIRING,
                    alertname=alert_labels.get("alertname", "x"),
                    severity=alert_labels.get("severity"),
                    labels=alert_labels,
                    annotations={},
                    first_seen_at=T0,
                    last_seen_at=T0,
                    times_seen=1,
                )
            )
    return incident_id


def add_event(engine: Engine, incident_id: int, kind: str, forward: bool = True) -> int:
    e = INCIDENT_EVENTS_TABLE
    with engine.begin() as conn:
        return int(
            conn.execute(
                insert(e)
                .values(incident_id=incident_id, at=T0, kind=kind, detail=kind, forward=forward, fanned_out=False)
                .returning(e.c.id)
            ).scalar_one()
        )


def build(conn: Connection, incident_id: int, event_id: int, kind: str) -> IncidentMessage:
    """A message from the rows (the collector's real one adds the enrichment)."""
    i, a = INCIDENTS_TABLE, ALERTS_TABLE
    inc = conn.execute(select(i).where(i.c.id == incident_id)).one()
    alerts = conn.execute(select(a).where(a.c.incident_id == incident_id).order_by(a.c.id)).all()
    return IncidentMessage.model_validate(
        {
            "event": kind,
            "incident_id": incident_id,
            "status": inc.status,
            "title": inc.title,
            "severity": inc.severity,
            "labels": inc.labels,
            "opened_at": inc.opened_at,
            "resolved_at": inc.resolved_at,
            "summary": f"event {event_id}",
            "alerts": [
                {
                    "alertname": r.alertname,
                    "status": r.status,
                    "severity": r.severity,
                    "labels": r.labels,
                    "annotations": r.annotations,
                    "starts_at": r.starts_at,
                    "ends_at": r.ends_at,
                    "generator_url": r.generator_url,
                }
                for r in alerts
            ],
            "enrichment": {},
            "top_finding": None,
            "remedy": None,
            "incident_url": None,
        }
    )


def deliveries(engine: Engine) -> list[Any]:
    d = DELIVERIES_TABLE
    with engine.connect() as conn:
        return list(conn.execute(select(d).order_by(d.c.id)).all())


def attempts(engine: Engine, delivery_id: int) -> list[Any]:
    t = DELIVERY_ATTEMPTS_TABLE
    with engine.connect() as conn:
        return list(conn.execute(select(t).where(t.c.delivery_id == delivery_id).order_by(t.c.id)).all())


def fanned_out(engine: Engine) -> dict[int, bool]:
    e = INCIDENT_EVENTS_TABLE
    with engine.connect() as conn:
        return {int(r.id): bool(r.fanned_out) for r in conn.execute(select(e.c.id, e.c.fanned_out))}


def config_for(url: str, *, max_attempts: int = 10, token: bool = False, jitter: float = 0) -> NotifyConfig:
    auth = "    token_env: BOT_TOKEN\n" if token else ""
    text = (
        f"receivers:\n  - name: bot\n    url: {url}\n    format: json\n    max_attempts: {max_attempts}\n{auth}"
        f"    timeout_seconds: 2\nretry: {{initial_seconds: 1, factor: 2, max_seconds: 300, jitter: {jitter}}}\n"
    )
    return parse_notify_config(text, "notify.yaml", {"BOT_TOKEN": TOKEN})


# --- the sink: a real HTTP server ------------------------------------------------------------------------------------


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any
    status: int


@dataclass
class Sink:
    """Records POSTs; answers 200 unless told otherwise for the next requests."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    plan: deque[tuple[int, dict[str, str]]] = field(default_factory=deque)
    delay: float = 0.0
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)

    def answer_next(self, n: int, status: int, headers: dict[str, str] | None = None) -> None:
        self.plan.extend([(status, headers or {})] * n)

    def keys(self) -> list[str]:
        return [s.headers["idempotency-key"] for s in self.seen]


@contextmanager
def sink_server() -> Iterator[Sink]:
    sink = Sink()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with sink.lock:
                sink.in_flight += 1
                sink.max_in_flight = max(sink.max_in_flight, sink.in_flight)
            try:
                if sink.delay:
                    sink.release.wait(sink.delay)
                with sink.lock:
                    status, headers = sink.plan.popleft() if sink.plan else (200, {})
                    sink.seen.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body, status))
            finally:
                with sink.lock:
                    sink.in_flight -= 1
            answer = b"ok" if status < 300 else b"try later"
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
    sink.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        sink.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def dispatch(engine: Engine, config: NotifyConfig, *nows: datetime, **kwargs: Any) -> tuple[list[int], Dispatcher]:
    """Run one dispatcher's ``run_once`` at each of ``nows``; what each attempted, and the dispatcher."""

    async def main() -> tuple[list[int], Dispatcher]:
        async with httpx.AsyncClient() as client:
            d = Dispatcher(engine, config, client, {"BOT_TOKEN": TOKEN}, **kwargs)
            return [await d.run_once(now) for now in nows], d

    return asyncio.run(main())


def one_delivery(engine: Engine, config: NotifyConfig, kind: str = FIRING) -> Any:
    incident = add_incident(engine, [{"alertname": "A", "severity": "page"}])
    add_event(engine, incident, kind)
    assert fan_out(engine, config, build, T0) == 1
    return deliveries(engine)[-1]
