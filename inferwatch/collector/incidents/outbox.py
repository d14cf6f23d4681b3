"""Events to deliveries, deliveries to receivers: the outbox, all of it in the database.

:func:`fan_out` turns each forwarded incident event into one ``deliveries`` row per matching receiver
(payload rendered then, in the receiver's format) and marks the event, in one transaction per event.
:class:`Dispatcher` sends what is due: it leases a row (a conditional UPDATE, so several collectors
on one PostgreSQL never send the same attempt twice), POSTs the payload with an ``Idempotency-Key``
(the same for every attempt of the row), records the attempt, and marks the row delivered, schedules
a retry (``Retry-After`` of a 429/503, else exponential backoff with jitter) or, after
``max_attempts``, dead-letters it. A collector that stops mid-attempt leaves a lease that expires;
the next one retries the row. Per incident and receiver, deliveries go in order: a row waits while
an earlier one of the same incident and receiver is still pending. Its database calls run on the
``executor`` it is given (the alert worker's threads), never on the event loop.

Payloads, URLs and tokens are never logged (a Slack webhook URL is a secret).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Final, TypeVar

import httpx
from sqlalchemy import ColumnElement, Connection, Engine, and_, exists, insert, or_, select, update
from sqlalchemy.exc import StatementError

from inferwatch import __version__
from inferwatch.collector.incidents.intake import PENDING, RESOLVED
from inferwatch.collector.incidents.messages import IncidentMessage, slack_body
from inferwatch.collector.incidents.notify import NotifyConfig, NotifyConfigError
from inferwatch.collector.store.tables import (
    DELIVERIES_TABLE,
    DELIVERY_ATTEMPTS_TABLE,
    INCIDENT_EVENTS_TABLE,
    INCIDENTS_TABLE,
)

log = logging.getLogger("inferwatch.collector.alerts")

DELIVERED: Final = "delivered"
DEAD: Final = "dead"
CONCURRENCY: Final = 8
BATCH: Final = 64
LEASE_SECONDS: Final = 90.0
"""how long a claimed row is ours: above the longest receiver timeout (60 s), plus the database's time."""
ERROR_CHARS: Final = 500
RETRY_AFTER_CODES: Final = frozenset({429, 503})

T = TypeVar("T")

BuildMessage = Callable[[Connection, int, int, str], IncidentMessage]
"""``build(conn, incident_id, event_id, kind)``: the message of an event, read in the fan-out's transaction."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


async def off_loop(executor: Executor | None, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on ``executor``'s threads (None: the loop's default pool): a blocking call kept off the loop."""
    return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args))


def _log_failure(exc: Exception, message: str, *args: Any) -> None:
    """Log an unexpected error; a database error without its statement's parameters (they hold payloads)."""
    if isinstance(exc, StatementError):
        log.error(message + ": %s: %s", *args, type(exc).__name__, exc.orig)
    else:
        log.error(message, *args, exc_info=exc)


# --- fan-out ---------------------------------------------------------------------------------------------------------


def _ready(rows: Sequence[Any]) -> list[tuple[int, int, str]]:
    """Events to fan out now, in id order. While an incident's enrichment is pending its events wait,
    unless a resolution is among them: it goes at once, with the events before it (receivers hear of
    the firing before the resolution)."""
    by_incident: dict[int, list[tuple[int, str]]] = {}
    pending: set[int] = set()
    for event_id, incident_id, kind, enrichment_state in rows:
        by_incident.setdefault(int(incident_id), []).append((int(event_id), str(kind)))
        if enrichment_state == PENDING:
            pending.add(int(incident_id))
    out = []
    for incident_id, events in by_incident.items():
        if incident_id in pending:
            last_resolved = max((n for n, (_, kind) in enumerate(events) if kind == RESOLVED), default=-1)
            events = events[: last_resolved + 1]
        out += [(event_id, incident_id, kind) for event_id, kind in events]
    return sorted(out)


def _label_sets(message: IncidentMessage) -> list[dict[str, str]]:
    """The incident's labels merged with each alert's (the alert's win); the incident's alone without alerts."""
    return [{**message.labels, **a.labels} for a in message.alerts] or [dict(message.labels)]


def _fan_out_event(
    conn: Connection,
    config: NotifyConfig,
    build: BuildMessage,
    now: datetime,
    event_id: int,
    incident_id: int,
    kind: str,
) -> int:
    e, d = INCIDENT_EVENTS_TABLE, DELIVERIES_TABLE
    # claim the event first: a concurrent fan-out (another collector) waits on the row, then finds it taken
    claimed = conn.execute(
        update(e).where(e.c.id == event_id, e.c.fanned_out.is_(False)).values(fanned_out=True)
    ).rowcount
    if claimed != 1:
        return 0
    message = build(conn, incident_id, event_id, kind)
    label_sets = _label_sets(message)
    done = set(conn.execute(select(d.c.receiver).where(d.c.event_id == event_id)).scalars())
    rows = []
    for receiver in config.receivers:
        if receiver.name in done or not any(receiver.matches(labels) for labels in label_sets):
            continue
        payload = message.json_body() if receiver.format == "json" else slack_body(message)
        rows.append(
            {
                "incident_id": incident_id,
                "event_id": event_id,
                "receiver": receiver.name,
                "format": receiver.format,
                "url": receiver.url,
                "idempotency_key": uuid.uuid4().hex,
                "payload": payload,
                "state": PENDING,
                "attempts": 0,
                "max_attempts": receiver.max_attempts,
                "created_at": now,
                "next_attempt_at": now,
            }
        )
    if rows:
        conn.execute(insert(d), rows)
    return len(rows)


def fan_out(engine: Engine, config: NotifyConfig, build: BuildMessage, now: datetime) -> int:
    """Turn the forwarded events not yet fanned out into deliveries; the number of deliveries created.

    One transaction per event (its deliveries and its ``fanned_out`` flag together); running it twice,
    or in two collectors at once, creates nothing twice. An event whose message cannot be built is
    logged and left for the next run. Blocking: call it in a thread from async code.
    """
    e, i = INCIDENT_EVENTS_TABLE, INCIDENTS_TABLE
    with engine.connect() as conn:
        rows = conn.execute(
            select(e.c.id, e.c.incident_id, e.c.kind, i.c.enrichment_state)
            .join_from(e, i, e.c.incident_id == i.c.id)
            .where(e.c.forward.is_(True), e.c.fanned_out.is_(False))
            .order_by(e.c.id)
        ).all()
    created = 0
    for event_id, incident_id, kind in _ready(rows):
        try:
            with engine.begin() as conn:
                n = _fan_out_event(conn, config, build, now, event_id, incident_id, kind)
        except Exception as exc:  # this event is retried at the next run; the others go on
            _log_failure(
                exc, "cannot fan out incident %d event %d (%s); retried at the next run", incident_id, event_id, kind
            )
        else:
            created += n
    return created


# --- dispatch --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Claimed:
    id: int
    incident_id: int
    receiver: str
    url: str
    idempotency_key: str
    payload: Any
    attempts: int
    max_attempts: int
    lease_until: datetime


@dataclass(frozen=True)
class _Answer:
    status: int | None
    error: str | None
    """None for a 2xx answer; else what went wrong (stored, never logged: it may quote the receiver)."""
    reason: str
    """what went wrong, safe to log: the status code or the exception's type."""
    retry_after: str | None
    duration: float

    @property
    def ok(self) -> bool:
        return self.error is None


def _due(now: datetime) -> ColumnElement[bool]:
    d = DELIVERIES_TABLE
    return and_(
        d.c.state == PENDING,
        d.c.next_attempt_at <= now,
        or_(d.c.lease_until.is_(None), d.c.lease_until < now),
    )


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delay-seconds or an HTTP date), None when absent or bad."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when
    return max(0.0, (when - now).total_seconds())


class Dispatcher:
    """Sends due deliveries, at most ``concurrency`` at a time; one per collector.

    ``config`` may be replaced (a reloaded notify file): each attempt looks its receiver up by name
    in the current one, for the token and the timeout; a delivery whose receiver is gone is dead.
    The counters (``delivered_total``, ``retried_total``, ``dead_total``, ``attempts_total``) are
    for the collector's metrics. The database calls run on ``executor`` (default: the loop's default pool).
    """

    def __init__(
        self,
        engine: Engine,
        config: NotifyConfig,
        client: httpx.AsyncClient,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], datetime] = _utcnow,
        *,
        concurrency: int = CONCURRENCY,
        batch: int = BATCH,
        rng: random.Random | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.client = client
        self.environ: Mapping[str, str] = os.environ if environ is None else environ
        self.clock = clock
        self.concurrency = concurrency
        self.batch = batch
        self.rng = rng or random.Random()
        self.executor = executor
        self.delivered_total = 0
        self.retried_total = 0
        self.dead_total = 0
        self.attempts_total = 0

    # --- the loop --------------------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, wake: asyncio.Event, poll_seconds: float = 0.5) -> None:
        """Dispatch until ``stop`` is set: at once when ``wake`` is set, else every ``poll_seconds``."""
        while not stop.is_set():
            wake.clear()
            handled = 0
            try:
                handled = await self.run_once(self.clock())
            except Exception as exc:  # the database may be away for a while: keep the loop, the rows wait
                _log_failure(exc, "delivery pass failed; retried in %.1f s", poll_seconds)
            if handled >= self.batch:
                continue  # more may be due
            await _wait_any(stop, wake, poll_seconds)

    async def run_once(self, now: datetime) -> int:
        """Attempt the deliveries due at ``now`` (up to ``batch``); how many were handled (sent or dead-lettered)."""
        ids = await off_loop(self.executor, self._due_ids, now)
        if not ids:
            return 0
        started = time.monotonic()
        slots = asyncio.Semaphore(self.concurrency)

        async def one(delivery_id: int) -> int:
            async with slots:
                try:
                    return await self._handle(delivery_id, now, started)
                except Exception as exc:  # its lease expires and the row is retried
                    _log_failure(exc, "delivery %d failed unexpectedly", delivery_id)
                    return 0

        return sum(await asyncio.gather(*(one(i) for i in ids)))

    # --- one delivery ----------------------------------------------------------------------------------------------

    async def _handle(self, delivery_id: int, now: datetime, started: float) -> int:
        lease = now + timedelta(seconds=time.monotonic() - started + LEASE_SECONDS)
        row = await off_loop(self.executor, self._claim, delivery_id, now, lease)
        if row is None:  # taken by another collector, or no longer due
            return 0
        receiver = self.config.receiver(row.receiver)
        if receiver is None:
            reason = f"receiver {row.receiver!r} is no longer in the notify file"
            await off_loop(self.executor, self._finish, row, {"state": DEAD, "last_error": reason}, None)
            self.dead_total += 1
            log.warning("delivery %d (incident %d): dead: %s", row.id, row.incident_id, reason)
            return 1
        try:
            token = receiver.bearer(self.environ)
        except NotifyConfigError as exc:
            answer = _Answer(None, str(exc), "missing token", None, 0.0)
        else:
            answer = await self._post(row, token, receiver.timeout_seconds)
        await self._record(row, answer, now)
        return 1

    async def _post(self, row: _Claimed, token: str | None, timeout: float) -> _Answer:
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": row.idempotency_key,
            "User-Agent": f"inferwatch/{__version__}",
        }
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        body = json.dumps(row.payload, separators=(",", ":"), ensure_ascii=False).encode()
        t0 = time.perf_counter()
        try:
            async with (
                asyncio.timeout(timeout),
                self.client.stream("POST", row.url, content=body, headers=headers, timeout=timeout) as response,
            ):
                status = response.status_code
                retry_after = response.headers.get("Retry-After")
                answer = b""
                if not 200 <= status < 300:  # the start of the answer, for last_error
                    async for chunk in response.aiter_bytes():
                        answer += chunk
                        if len(answer) >= ERROR_CHARS:
                            break
        except (TimeoutError, httpx.TimeoutException):
            return _Answer(None, f"timed out after {timeout:g} s", "timeout", None, time.perf_counter() - t0)
        except Exception as exc:  # refused, reset, DNS, TLS, a bad URL: all worth another try
            name = type(exc).__name__
            return _Answer(None, f"{name}: {exc}"[:ERROR_CHARS], name, None, time.perf_counter() - t0)
        duration = time.perf_counter() - t0
        if 200 <= status < 300:
            return _Answer(status, None, f"HTTP {status}", None, duration)
        text = " ".join(answer.decode("utf-8", "replace").split())
        error = f"HTTP {status}: {text}" if text else f"HTTP {status}"
        return _Answer(status, error[:ERROR_CHARS], f"HTTP {status}", retry_after, duration)

    async def _record(self, row: _Claimed, answer: _Answer, now: datetime) -> None:
        attempts = row.attempts + 1
        values: dict[str, Any] = {"attempts": attempts, "last_status": answer.status}
        self.attempts_total += 1
        if answer.ok:
            values.update(state=DELIVERED, delivered_at=now, last_error=None)
            self.delivered_total += 1
            log.info("delivery %d (incident %d) to %s: delivered", row.id, row.incident_id, row.receiver)
        elif attempts >= row.max_attempts:
            values.update(state=DEAD, last_error=answer.error)
            self.dead_total += 1
            log.warning(
                "delivery %d (incident %d) to %s: %s; dead after %d attempts",
                *(row.id, row.incident_id, row.receiver, answer.reason, attempts),
            )
        else:
            retry = self.config.retry
            delay = retry_after_seconds(answer.retry_after, now) if answer.status in RETRY_AFTER_CODES else None
            delay = retry.delay(attempts, self.rng) if delay is None else min(delay, retry.max_seconds)
            values.update(next_attempt_at=now + timedelta(seconds=delay), last_error=answer.error)
            self.retried_total += 1
            log.warning(
                "delivery %d (incident %d) to %s: %s; attempt %d of %d, next in %.1f s",
                *(row.id, row.incident_id, row.receiver, answer.reason, attempts, row.max_attempts, delay),
            )
        await off_loop(self.executor, self._finish, row, values, (now, answer))

    # --- the database (blocking: run in a thread) --------------------------------------------------------------------

    def _due_ids(self, now: datetime) -> list[int]:
        d = DELIVERIES_TABLE
        earlier = DELIVERIES_TABLE.alias("earlier")
        waiting = exists().where(
            earlier.c.incident_id == d.c.incident_id,
            earlier.c.receiver == d.c.receiver,
            earlier.c.state == PENDING,
            earlier.c.id < d.c.id,
        )
        query = select(d.c.id).where(_due(now), ~waiting).order_by(d.c.next_attempt_at, d.c.id).limit(self.batch)
        with self.engine.connect() as conn:
            return [int(x) for x in conn.execute(query).scalars()]

    def _claim(self, delivery_id: int, now: datetime, lease: datetime) -> _Claimed | None:
        d = DELIVERIES_TABLE
        with self.engine.begin() as conn:
            taken = conn.execute(update(d).where(d.c.id == delivery_id, _due(now)).values(lease_until=lease)).rowcount
            if taken != 1:
                return None
            r = conn.execute(
                select(
                    d.c.incident_id,
                    d.c.receiver,
                    d.c.url,
                    d.c.idempotency_key,
                    d.c.payload,
                    d.c.attempts,
                    d.c.max_attempts,
                ).where(d.c.id == delivery_id)
            ).one()
        return _Claimed(
            delivery_id,
            int(r.incident_id),
            str(r.receiver),
            str(r.url),
            str(r.idempotency_key),
            r.payload,
            int(r.attempts),
            int(r.max_attempts),
            lease,
        )

    def _finish(self, row: _Claimed, values: dict[str, Any], attempt: tuple[datetime, _Answer] | None) -> None:
        """Store the outcome if the lease is still ours (else another collector took the row over)."""
        d = DELIVERIES_TABLE
        with self.engine.begin() as conn:
            if attempt is not None:
                at, answer = attempt
                conn.execute(
                    insert(DELIVERY_ATTEMPTS_TABLE).values(
                        delivery_id=row.id,
                        at=at,
                        status_code=answer.status,
                        error=answer.error,
                        duration_seconds=answer.duration,
                    )
                )
            kept = conn.execute(
                update(d)
                .where(d.c.id == row.id, d.c.state == PENDING, d.c.lease_until == row.lease_until)
                .values(lease_until=None, **values)
            ).rowcount
        if kept != 1:
            log.warning("delivery %d: its lease expired during the attempt; the outcome was not stored", row.id)


async def _wait_any(stop: asyncio.Event, wake: asyncio.Event, timeout: float) -> None:
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        for w in waiters:
            with contextlib.suppress(asyncio.CancelledError):
                await w
