"""The collector's alert worker: enrich new incidents, turn events into deliveries, deliver them.

One asyncio task per collector, woken by each webhook call and every half second: it enriches the
incidents waiting for it (one at a time: a diagnosis may take a few seconds), fans forwarded
events out to the matching receivers (an incident's firing event waits for its enrichment; a
resolution goes at once), then sends what is due. Everything it works from is in the database, so
a restart picks up where it stopped.

Nothing it does blocks the event loop: every database call runs on the worker's own threads
(:data:`DB_THREADS` of them), so a database that does not answer (a partition: each connection attempt
waits out its timeout) holds those threads, never the loop, nor the default thread pool that the
readiness probe and the read API use; deliveries are sent with an async client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Final

import httpx
from sqlalchemy import Connection, Engine, select, update

from inferwatch.collector.diagnosis.diagnoser import OnCall
from inferwatch.collector.incidents import outbox
from inferwatch.collector.incidents.enrich import LinkSettings, enrich, load_incident, message
from inferwatch.collector.incidents.intake import PENDING
from inferwatch.collector.incidents.messages import Enrichment, IncidentMessage
from inferwatch.collector.incidents.notify import NotifyConfig
from inferwatch.collector.store.tables import INCIDENTS_TABLE

log = logging.getLogger("inferwatch.collector.alerts")

POLL_SECONDS: Final = 0.5
STOP_SECONDS: Final = 10.0
"""How long shutdown waits for a pass in flight before cancelling it."""
ENRICH_BATCH: Final = 4
DB_THREADS: Final = outbox.CONCURRENCY + 1
"""The worker's threads for its database calls: one per delivery in flight, and one for the enrichment."""
DONE = "done"


class AlertWorker:
    def __init__(
        self,
        engine: Engine,
        oncall: OnCall,
        notify: NotifyConfig,
        links: LinkSettings,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.engine = engine
        self.oncall = oncall
        self.notify = notify
        self.links = links
        self.environ = dict(os.environ if environ is None else environ)
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._threads: ThreadPoolExecutor | None = None
        self.dispatcher: outbox.Dispatcher | None = None

    def build(self, conn: Connection, incident_id: int, event_id: int, kind: str) -> IncidentMessage:
        return message(conn, incident_id, event_id, kind, self.links)

    def wake(self) -> None:
        """Called after a webhook: work now instead of at the next poll (thread-safe)."""
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def enrich_pending(self) -> int:
        ids = await outbox.off_loop(self._threads, self._pending)
        for incident_id in ids:
            incident, alerts = await outbox.off_loop(self._threads, self._load, incident_id)
            enrichment = await enrich(self.oncall, self.engine, incident, alerts, self.links, executor=self._threads)
            await outbox.off_loop(self._threads, self._store, incident_id, enrichment)
        return len(ids)

    # --- the database (blocking: run on the worker's threads) --------------------------------------------------------

    def _pending(self) -> list[int]:
        i = INCIDENTS_TABLE
        query = select(i.c.id).where(i.c.enrichment_state == PENDING).order_by(i.c.id).limit(ENRICH_BATCH)
        with self.engine.connect() as conn:
            return [int(r[0]) for r in conn.execute(query)]

    def _load(self, incident_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        with self.engine.connect() as conn:
            return load_incident(conn, incident_id)

    def _store(self, incident_id: int, enrichment: Enrichment) -> None:
        i = INCIDENTS_TABLE
        with self.engine.begin() as conn:
            conn.execute(
                update(i)
                .where(i.c.id == incident_id)
                .values(
                    enrichment=enrichment.model_dump(mode="json"),
                    enrichment_state=DONE,
                    enriched_at=datetime.now(UTC),
                )
            )

    # --- the loop ----------------------------------------------------------------------------------------------------

    async def step(self, now: datetime | None = None) -> None:
        now = now or datetime.now(UTC)
        await self.enrich_pending()
        await outbox.off_loop(self._threads, outbox.fan_out, self.engine, self.notify, self.build, now)
        if self.dispatcher is not None:
            await self.dispatcher.run_once(datetime.now(UTC))

    async def _run(self) -> None:
        assert self._wake is not None and self._stop is not None
        while not self._stop.is_set():
            try:
                await self.step()
            except Exception:  # keep the worker alive; the next pass retries from the database
                log.exception("alert worker pass failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_SECONDS)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake, self._stop = asyncio.Event(), asyncio.Event()
        self._client = httpx.AsyncClient()
        self._threads = ThreadPoolExecutor(DB_THREADS, thread_name_prefix="inferwatch-alerts")
        self.dispatcher = outbox.Dispatcher(
            self.engine, self.notify, self._client, self.environ, executor=self._threads
        )
        self._task = self._loop.create_task(self._run(), name="alert-worker")

    async def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            # a pass stuck on a hanging receiver or a slow Prometheus is cancelled after 10 s (its
            # delivery stays leased and is retried once the lease lapses); the shutdown goes on
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._task, STOP_SECONDS)
            self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._threads is not None:
            # a thread still waiting on the database (a cancelled pass) ends with its timeout; nobody waits for it
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None
