"""The outbox: fan-out of incident events into deliveries, and the dispatcher against a real HTTP sink on
127.0.0.1 (retries, Retry-After, backoff, dead letters, leases, a restart). Time is passed in: no test sleeps
for a backoff. The notify file itself: ``tests/test_notify_config.py``.

The outbox tests run on SQLite and on PostgreSQL (a fresh schema; skipped without a server, failing
under CI).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import timedelta
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Connection, Engine, func, select, update

from inferwatch import __version__
from inferwatch.collector.incidents.intake import FIRING, PENDING, RESOLVED
from inferwatch.collector.incidents.messages import IncidentMessage
from inferwatch.collector.incidents.notify import NotifyConfig, parse_notify_config
from inferwatch.collector.incidents.outbox import DEAD, DELIVERED, Dispatcher, fan_out
from inferwatch.collector.store import db
from inferwatch.collector.store.tables import DELIVERIES_TABLE, INCIDENT_EVENTS_TABLE, INCIDENTS_TABLE
from tests.conftest import free_port
from tests.support.notify_outbox import (
    T0,
    TOKEN,
    Sink,
    add_event,
    add_incident,
    attempts,
    build,
    config_for,
    deliveries,
    dispatch,
    fanned_out,
    one_delivery,
    sink_server,
)
from tests.support.store_fixtures import db_url_fixture  # noqa: F401 (fixture)

# --- the database ----------------------------------------------------------------------------------------------------


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = db.make_engine(db_url)
    db.ensure_schema(eng)
    yield eng
    eng.dispose()


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


# --- dispatch ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def sink() -> Iterator[Sink]:
    with sink_server() as s:
        yield s


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
