"""The notify file (errors name line and field, matchers, tokens) and the outbox: fan-out of incident
events into deliveries, and the dispatcher against a real HTTP sink on 127.0.0.1 (retries,
Retry-After, backoff, dead letters, leases, a restart). Time is passed in: no test sleeps for a backoff.

The outbox tests run on SQLite and on PostgreSQL (a fresh schema; skipped without a server, failing
under CI).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Connection, Engine, func, insert, select, update

from inferwatch import __version__
from inferwatch.collector.incidents.intake import FIRING, PENDING, RESOLVED
from inferwatch.collector.incidents.messages import IncidentMessage
from inferwatch.collector.incidents.notify import (
    NotifyConfig,
    NotifyConfigError,
    Receiver,
    RetryPolicy,
    load_notify_config,
    parse_notify_config,
)
from inferwatch.collector.incidents.outbox import DEAD, DELIVERED, Dispatcher, fan_out, retry_after_seconds
from inferwatch.collector.store import db
from inferwatch.collector.store.tables import (
    ALERTS_TABLE,
    DELIVERIES_TABLE,
    DELIVERY_ATTEMPTS_TABLE,
    INCIDENT_EVENTS_TABLE,
    INCIDENTS_TABLE,
)
from tests.conftest import free_port, postgres_schema

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
TOKEN = "s3cr3t-bot-token"


# --- the notify file -------------------------------------------------------------------------------------------------

GOOD = """\
receivers:
  - name: oncall-slack
    url: https://hooks.example.com/services/T000/B000/XXXX
    format: slack
    match: {severity: page}
  - name: incident-bot
    url: http://incident-bot.internal:8080/inferwatch
    format: json
    token_env: INCIDENT_BOT_TOKEN
"""


def test_notify_file_loads_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "notify.yaml"
    path.write_text(GOOD)
    config = load_notify_config(path, {"INCIDENT_BOT_TOKEN": TOKEN})
    slack, bot = config.receivers
    assert (slack.name, slack.format, slack.match, slack.timeout_seconds, slack.max_attempts) == (
        "oncall-slack",
        "slack",
        {"severity": "page"},
        5,
        10,
    )
    assert config.retry == RetryPolicy(initial_seconds=1, factor=2, max_seconds=300, jitter=0.2)
    assert slack.bearer({}) is None
    assert bot.bearer({"INCIDENT_BOT_TOKEN": TOKEN}) == TOKEN
    inline = Receiver(name="a", url="http://h", format="json", token=TOKEN)
    assert TOKEN not in repr(config) and TOKEN not in repr(inline) and inline.bearer({}) == TOKEN
    assert config.receiver("incident-bot") is bot and config.receiver("gone") is None
    assert parse_notify_config("retry: {factor: 3}\n", "n.yaml", {}).receivers == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            GOOD.replace("http://incident-bot", "ftp://incident-bot"),
            "notify.yaml line 7: receivers.1.url: expected an http",
        ),
        (
            GOOD.replace("https://hooks.example.com/", "https:///"),
            "notify.yaml line 3: receivers.0.url: the URL has no host",
        ),
        (GOOD.replace(":8080/", ":80800/"), "notify.yaml line 7: receivers.1.url: the URL's port"),
        (
            GOOD.replace("match: {severity: page}", 'match_re: {model: "lla(ma"}'),
            "notify.yaml line 5: receivers.0.match_re.model: 'lla(ma' is not a regular expression",
        ),
        (
            GOOD.replace("match: {severity: page}", 'match: {"bad-label": x}'),
            "notify.yaml line 5: receivers.0.match.bad-label: 'bad-label' is not a label name",
        ),
        (
            GOOD.replace("format: json", "format: xml"),
            "notify.yaml line 8: receivers.1.format: Input should be 'json' or",
        ),
        (
            GOOD.replace("incident-bot\n", "oncall-slack\n"),
            "notify.yaml line 6: receivers.1.name: two receivers are named",
        ),
        (GOOD.replace("name: oncall-slack", "name: OnCall"), "notify.yaml line 2: receivers.0.name: 'OnCall': use"),
        (
            GOOD + "    token: inline\n",
            "notify.yaml line 9: receivers.1.token_env: give token or token_env, not both",
        ),
        (GOOD + "    colour: red\n", "notify.yaml line 10: receivers.1.colour: Extra inputs are not permitted"),
        (GOOD + "    timeout_seconds: 61\n", "notify.yaml line 10: receivers.1.timeout_seconds: Input should be less"),
        (GOOD + "    max_attempts: 0\n", "notify.yaml line 10: receivers.1.max_attempts: Input should be greater"),
        (
            GOOD.replace("    url: http://incident", "    uri: http://incident"),
            "notify.yaml line 7: receivers.1.uri: Extra",
        ),
        (
            GOOD + "retry: {initial_seconds: 10, max_seconds: 5}\n",
            "notify.yaml line 10: retry.max_seconds: must not be",
        ),
        (GOOD + "retries: 3\n", "notify.yaml line 10: retries: Extra inputs are not permitted"),
        ("receivers:\n  - name: a\n    url: [http\n", "notify.yaml line 4: not valid YAML"),
        ("- a\n", "notify.yaml: expected a mapping with 'receivers:'"),
    ],
)
def test_notify_file_errors_name_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(NotifyConfigError) as exc:
        parse_notify_config(text, "notify.yaml", {"INCIDENT_BOT_TOKEN": TOKEN})
    assert expected in str(exc.value), str(exc.value)


def test_notify_file_missing_token_env_names_the_variable(tmp_path: Path) -> None:
    path = tmp_path / "notify.yaml"
    path.write_text(GOOD)
    with pytest.raises(NotifyConfigError) as exc:
        load_notify_config(path, {})
    assert str(exc.value) == (
        f"{path} line 9: receivers.1.token_env: the environment variable INCIDENT_BOT_TOKEN is not set "
        "(receiver incident-bot)"
    )
    with pytest.raises(NotifyConfigError, match="INCIDENT_BOT_TOKEN is not set"):
        load_notify_config(path, {"INCIDENT_BOT_TOKEN": ""})
    with pytest.raises(NotifyConfigError, match="cannot read"):
        load_notify_config(tmp_path / "absent.yaml", {})


def test_no_url_in_errors() -> None:
    """A Slack webhook URL is a secret: a bad one is not quoted back."""
    with pytest.raises(NotifyConfigError) as exc:
        parse_notify_config(GOOD.replace("https://hooks", "htps://hooks"), "n.yaml", {"INCIDENT_BOT_TOKEN": "x"})
    assert "XXXX" not in str(exc.value)


def test_matching() -> None:
    r = Receiver(name="r", url="http://h", format="json", match={"severity": "page"}, match_re={"model": "llama-.*"})
    assert r.matches({"severity": "page", "model": "llama-3"})
    assert not r.matches({"severity": "ticket", "model": "llama-3"})
    assert not r.matches({"severity": "page", "model": "my-llama-3"})  # a full match, not a search
    assert not r.matches({"severity": "page"})  # a missing label is ""
    assert Receiver(name="all", url="http://h", format="json").matches({})
    absent = Receiver(name="a", url="http://h", format="json", match={"team": ""}, match_re={"env": "|prod"})
    assert absent.matches({}) and absent.matches({"env": "prod"}) and not absent.matches({"team": "x"})


def test_backoff() -> None:
    policy = RetryPolicy(initial_seconds=1, factor=2, max_seconds=60, jitter=0)
    assert [policy.delay(n, random.Random(0)) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert policy.delay(100_000, random.Random(0)) == 60
    jittered = RetryPolicy(jitter=0.2)
    delays = [jittered.delay(3, random.Random(seed)) for seed in range(200)]
    assert min(delays) >= 3.2 and max(delays) <= 4.8 and len(set(delays)) > 100


def test_retry_after() -> None:
    assert retry_after_seconds("30", T0) == 30
    assert retry_after_seconds(format_datetime(T0 + timedelta(seconds=90), usegmt=True), T0) == 90
    assert retry_after_seconds(format_datetime(T0 - timedelta(seconds=90), usegmt=True), T0) == 0
    assert retry_after_seconds("soon", T0) is None
    assert retry_after_seconds(None, T0) is None


# --- the database ----------------------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield db.default_url(tmp_path / "data")
        return
    with postgres_schema("iw_outbox") as url:
        yield url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = db.make_engine(db_url)
    db.ensure_schema(eng)
    yield eng
    eng.dispose()


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


# --- fan-out ---------------------------------------------------------------------------------------------------------

ROUTING = parse_notify_config(
    """\
receivers:
  - name: pager
    url: https://hooks.example.com/services/T/B/X
    format: slack
    match: {severity: page}
  - name: llama-team
    url: http://bot.internal/hook
    format: json
    match_re: {model: "llama-.*"}
  - name: everything
    url: http://archive.internal/hook
    format: json
""",
    "notify.yaml",
    {},
)


def test_fan_out_matches_any_alert_and_is_idempotent(engine: Engine) -> None:
    incident = add_incident(
        engine,
        [{"alertname": "A", "severity": "ticket", "model": "mistral"}, {"alertname": "B", "severity": "page"}],
        labels={"model": "llama-3"},  # the incident's labels count too (the alert's own win)
    )
    event = add_event(engine, incident, FIRING)
    add_event(engine, incident, FIRING, forward=False)  # timeline only
    assert fan_out(engine, ROUTING, build, T0) == 3
    rows = deliveries(engine)
    assert {r.receiver for r in rows} == {"pager", "llama-team", "everything"}
    by = {r.receiver: r for r in rows}
    assert by["pager"].format == "slack" and by["pager"].payload["attachments"][0]["footer"].endswith(str(incident))
    assert (by["llama-team"].payload["schema"], by["llama-team"].payload["event"]) == ("inferwatch.incident/v1", FIRING)
    assert by["llama-team"].url == "http://bot.internal/hook"
    for r in rows:
        assert (r.state, r.attempts, r.max_attempts, r.next_attempt_at, r.event_id) == (PENDING, 0, 10, T0, event)
        assert len(r.idempotency_key) == 32
    assert len({r.idempotency_key for r in rows}) == 3
    assert fanned_out(engine)[event] is True

    assert fan_out(engine, ROUTING, build, T0) == 0  # twice: nothing new
    # a fan-out interrupted after its deliveries were written (flag lost) adds none twice
    with engine.begin() as conn:
        conn.execute(update(INCIDENT_EVENTS_TABLE).values(fanned_out=False))
    assert fan_out(engine, ROUTING, build, T0) == 0
    assert len(deliveries(engine)) == 3


def test_fan_out_only_to_matching_receivers(engine: Engine) -> None:
    incident = add_incident(engine, [{"alertname": "A", "severity": "ticket", "model": "mistral"}])
    add_event(engine, incident, FIRING)
    assert fan_out(engine, ROUTING, build, T0) == 1
    assert [r.receiver for r in deliveries(engine)] == ["everything"]
    assert fan_out(engine, NotifyConfig(), build, T0) == 0  # no receivers: events are marked all the same


def test_fan_out_waits_for_enrichment_unless_resolved(engine: Engine) -> None:
    waiting = add_incident(engine, [{"alertname": "A"}], enrichment=PENDING)
    firing = add_event(engine, waiting, FIRING)
    assert fan_out(engine, ROUTING, build, T0) == 0
    assert fanned_out(engine)[firing] is False

    with engine.begin() as conn:
        conn.execute(update(INCIDENTS_TABLE).where(INCIDENTS_TABLE.c.id == waiting).values(enrichment_state="done"))
    assert fan_out(engine, ROUTING, build, T0) == 1
    assert fanned_out(engine)[firing] is True

    # a resolution goes at once, with the events before it (in order), enrichment or not
    quick = add_incident(engine, [{"alertname": "B"}], enrichment=PENDING)
    first = add_event(engine, quick, FIRING)
    last = add_event(engine, quick, RESOLVED)
    assert fan_out(engine, ROUTING, build, T0) == 2
    rows = [r for r in deliveries(engine) if r.incident_id == quick]
    assert [(r.event_id, r.payload["event"]) for r in rows] == [(first, FIRING), (last, RESOLVED)]


def test_fan_out_leaves_an_event_it_cannot_build(engine: Engine) -> None:
    ok = add_incident(engine, [{"alertname": "A"}])
    bad = add_incident(engine, [{"alertname": "B"}])
    bad_event = add_event(engine, bad, FIRING)
    ok_event = add_event(engine, ok, FIRING)

    def flaky(conn: Connection, incident_id: int, event_id: int, kind: str) -> IncidentMessage:
        if incident_id == bad:
            raise RuntimeError("enrichment row unreadable")
        return build(conn, incident_id, event_id, kind)

    assert fan_out(engine, ROUTING, flaky, T0) == 1
    assert fanned_out(engine) == {bad_event: False, ok_event: True}  # rolled back: retried next time
    assert fan_out(engine, ROUTING, build, T0) == 1


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


@pytest.fixture
def sink() -> Iterator[Sink]:
    with sink_server() as s:
        yield s


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


# --- dispatch --------------------------------------------------------------------------------------------------------


def test_delivered_once_with_idempotency_key_and_token(engine: Engine, sink: Sink) -> None:
    config = config_for(sink.url, token=True)
    row = one_delivery(engine, config)
    done, d = dispatch(engine, config, T0, T0 + timedelta(seconds=1))
    assert done == [1, 0]
    assert len(sink.seen) == 1
    seen = sink.seen[0]
    assert seen.path == "/hook"
    assert seen.headers["idempotency-key"] == row.idempotency_key
    assert seen.headers["authorization"] == f"Bearer {TOKEN}"
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["user-agent"] == f"inferwatch/{__version__}"
    assert json.loads(seen.body) == row.payload
    after = deliveries(engine)[0]
    assert (after.state, after.attempts, after.delivered_at, after.last_status, after.lease_until) == (
        DELIVERED,
        1,
        T0,
        200,
        None,
    )
    [attempt] = attempts(engine, row.id)
    assert (attempt.status_code, attempt.error, attempt.at) == (200, None, T0) and attempt.duration_seconds >= 0
    assert (d.delivered_total, d.retried_total, d.dead_total, d.attempts_total) == (1, 0, 0, 1)


def test_no_token_no_authorization_header(engine: Engine, sink: Sink) -> None:
    config = config_for(sink.url)
    one_delivery(engine, config)
    assert dispatch(engine, config, T0)[0] == [1]
    assert "authorization" not in sink.seen[0].headers


@pytest.mark.parametrize("status", [503, 429])
def test_retry_after_is_waited_for(engine: Engine, sink: Sink, status: int) -> None:
    config = config_for(sink.url)
    row = one_delivery(engine, config)
    sink.answer_next(1, status, {"Retry-After": "30"})
    done, d = dispatch(engine, config, T0, T0 + timedelta(seconds=29), T0 + timedelta(seconds=30))
    assert done == [1, 0, 1]  # not before Retry-After
    assert [s.status for s in sink.seen] == [status, 200]
    assert sink.keys() == [row.idempotency_key] * 2  # the same key on the retry: one delivery
    after = deliveries(engine)[0]
    assert (after.state, after.attempts, after.delivered_at) == (DELIVERED, 2, T0 + timedelta(seconds=30))
    tried = attempts(engine, row.id)
    assert [(a.status_code, a.at) for a in tried] == [(status, T0), (200, T0 + timedelta(seconds=30))]
    assert tried[0].error == f"HTTP {status}: try later"
    assert (d.delivered_total, d.retried_total, d.dead_total) == (1, 1, 0)


def test_retry_after_date_and_its_bound(engine: Engine, sink: Sink) -> None:
    config = config_for(sink.url)
    one_delivery(engine, config)
    sink.answer_next(1, 503, {"Retry-After": format_datetime(T0 + timedelta(seconds=120), usegmt=True)})
    dispatch(engine, config, T0)
    assert deliveries(engine)[0].next_attempt_at == T0 + timedelta(seconds=120)
    sink.answer_next(1, 503, {"Retry-After": "86400"})  # bounded by retry.max_seconds
    dispatch(engine, config, T0 + timedelta(seconds=120))
    assert deliveries(engine)[0].next_attempt_at == T0 + timedelta(seconds=420)


def test_other_errors_back_off_exponentially(engine: Engine, sink: Sink) -> None:
    config = config_for(sink.url)
    one_delivery(engine, config)
    sink.answer_next(3, 500, {"Retry-After": "100"})  # Retry-After counts only with 429 and 503
    now, schedule = T0, []
    for _ in range(3):
        dispatch(engine, config, now)
        now = deliveries(engine)[0].next_attempt_at
        schedule.append(now)
    assert schedule == [T0 + timedelta(seconds=s) for s in (1, 3, 7)]
    dispatch(engine, config, now)
    assert deliveries(engine)[0].state == DELIVERED and len(sink.seen) == 4


def test_sink_down_for_good_is_dead_after_max_attempts(engine: Engine) -> None:
    config = config_for(f"http://127.0.0.1:{free_port()}/hook", max_attempts=3)
    row = one_delivery(engine, config)

    async def main() -> Dispatcher:
        async with httpx.AsyncClient() as client:
            d = Dispatcher(engine, config, client, {})
            now = T0
            for _ in range(5):
                await d.run_once(now)
                now += timedelta(seconds=600)
            return d

    d = asyncio.run(main())
    after = deliveries(engine)[0]
    assert (after.state, after.attempts, after.last_status) == (DEAD, 3, None)
    assert after.last_error.startswith("ConnectError")
    tried = attempts(engine, row.id)
    assert len(tried) == 3 and all(a.status_code is None and a.error for a in tried)
    assert (d.delivered_total, d.retried_total, d.dead_total, d.attempts_total) == (0, 2, 1, 3)


def test_timeout_is_a_failed_attempt(engine: Engine, sink: Sink) -> None:
    config = parse_notify_config(
        f"receivers:\n  - {{name: bot, url: '{sink.url}', format: json, timeout_seconds: 0.2, max_attempts: 1}}\n",
        "n.yaml",
        {},
    )
    one_delivery(engine, config)
    sink.delay = 5
    dispatch(engine, config, T0)
    after = deliveries(engine)[0]
    assert (after.state, after.last_error) == (DEAD, "timed out after 0.2 s")


def test_receiver_gone_from_the_config_is_dead(engine: Engine, sink: Sink) -> None:
    one_delivery(engine, config_for(sink.url))
    done, d = dispatch(engine, NotifyConfig(), T0)
    after = deliveries(engine)[0]
    assert done == [1] and (after.state, after.attempts) == (DEAD, 0)
    assert after.last_error == "receiver 'bot' is no longer in the notify file"
    assert sink.seen == [] and d.dead_total == 1


def test_deliveries_of_an_incident_go_in_order(engine: Engine, sink: Sink) -> None:
    config = config_for(sink.url)
    incident = add_incident(engine, [{"alertname": "A"}])
    add_event(engine, incident, FIRING)
    add_event(engine, incident, RESOLVED)
    assert fan_out(engine, config, build, T0) == 2
    sink.answer_next(1, 500)
    dispatch(engine, config, T0)  # the firing one fails; the resolution waits for it
    assert [json.loads(s.body)["event"] for s in sink.seen] == [FIRING]
    dispatch(engine, config, T0 + timedelta(seconds=1))
    dispatch(engine, config, T0 + timedelta(seconds=1))
    assert [json.loads(s.body)["event"] for s in sink.seen] == [FIRING, FIRING, RESOLVED]


def test_concurrency_is_bounded(engine: Engine, sink: Sink) -> None:
    config = config_for(sink.url)
    for _ in range(7):
        add_event(engine, add_incident(engine, [{"alertname": "A"}]), FIRING)
    assert fan_out(engine, config, build, T0) == 7
    sink.delay = 0.2
    done, _ = dispatch(engine, config, T0, concurrency=3)
    assert done == [7] and len(sink.seen) == 7 and sink.max_in_flight == 3


def test_two_dispatchers_send_each_delivery_once(engine: Engine, sink: Sink) -> None:
    """Two collectors on one database: the lease makes every attempt one collector's."""
    config = config_for(sink.url)
    for _ in range(6):
        add_event(engine, add_incident(engine, [{"alertname": "A"}]), FIRING)
    assert fan_out(engine, config, build, T0) == 6
    sink.delay = 0.05

    async def main() -> list[int]:
        async with httpx.AsyncClient() as c1, httpx.AsyncClient() as c2:
            d1, d2 = Dispatcher(engine, config, c1, {}), Dispatcher(engine, config, c2, {})
            return list(await asyncio.gather(d1.run_once(T0), d2.run_once(T0)))

    done = asyncio.run(main())
    assert sum(done) == 6
    assert sorted(sink.keys()) == sorted(r.idempotency_key for r in deliveries(engine))
    assert all(r.state == DELIVERED and r.attempts == 1 for r in deliveries(engine))


def test_pending_delivery_survives_a_restart(tmp_path: Path, sink: Sink) -> None:
    url = db.default_url(tmp_path / "data")
    config = config_for(sink.url)
    first = db.make_engine(url)
    db.ensure_schema(first)
    row = one_delivery(first, config)
    sink.answer_next(1, 503, {"Retry-After": "10"})
    dispatch(first, config, T0)
    # the collector dies mid-attempt: a lease it never released
    with first.begin() as conn:
        conn.execute(update(DELIVERIES_TABLE).values(lease_until=T0 + timedelta(seconds=60)))
    first.dispose()

    second = db.make_engine(url)
    try:
        db.ensure_schema(second)
        done, d = dispatch(second, config, T0 + timedelta(seconds=30), T0 + timedelta(seconds=61))
        assert done == [0, 1]  # the lease is respected, then taken over
        after = deliveries(second)[0]
        assert (after.state, after.attempts, d.delivered_total) == (DELIVERED, 2, 1)
        assert sink.keys() == [row.idempotency_key] * 2
    finally:
        second.dispose()


def test_run_loop_wakes_and_stops(engine: Engine, sink: Sink) -> None:
    config = config_for(sink.url)

    async def main() -> Dispatcher:
        async with httpx.AsyncClient() as client:
            d = Dispatcher(engine, config, client, {}, clock=lambda: T0 + timedelta(seconds=5))
            stop, wake = asyncio.Event(), asyncio.Event()
            task = asyncio.create_task(d.run(stop, wake, poll_seconds=30))
            await asyncio.sleep(0.1)
            assert d.delivered_total == 0
            await asyncio.to_thread(one_delivery, engine, config)
            wake.set()
            for _ in range(200):
                if d.delivered_total:
                    break
                await asyncio.sleep(0.02)
            stop.set()
            await asyncio.wait_for(task, 5)
            return d

    assert asyncio.run(main()).delivered_total == 1
    assert len(sink.seen) == 1


def test_counts_match_the_table(engine: Engine, sink: Sink) -> None:
    config = config_for(sink.url, max_attempts=2)
    one_delivery(engine, config)
    one_delivery(engine, config)
    sink.answer_next(3, 500)
    dispatch(engine, config, T0, T0 + timedelta(seconds=10))
    with engine.connect() as conn:
        states: dict[str, int] = dict(
            conn.execute(select(DELIVERIES_TABLE.c.state, func.count()).group_by(DELIVERIES_TABLE.c.state)).all()
        )
    assert states == {DEAD: 1, DELIVERED: 1}


def test_logs_hold_no_payload_url_or_token(engine: Engine, sink: Sink, caplog: pytest.LogCaptureFixture) -> None:
    config = config_for(sink.url, token=True, max_attempts=2)
    one_delivery(engine, config)
    sink.answer_next(2, 503, {"Retry-After": "1"})
    with caplog.at_level("DEBUG", logger="inferwatch"):
        dispatch(engine, config, T0, T0 + timedelta(seconds=1))
        dispatch(engine, NotifyConfig(), T0)
    assert deliveries(engine)[0].state == DEAD
    assert "dead after 2 attempts" in caplog.text
    for secret in (TOKEN, sink.url, "127.0.0.1", "event 1", "try later"):
        assert secret not in caplog.text
