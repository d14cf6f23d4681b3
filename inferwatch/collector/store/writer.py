"""The collector's write path: a write-ahead log (the spool, :mod:`inferwatch.collector.store.spool`) and one thread
applying it to the store.

Durability: a span is acknowledged only once it is on disk. Receivers (OTLP HTTP/gRPC) call
:meth:`Writer.offer` from their worker threads; it appends the records to the spool and fsyncs it
before returning (group commit: while one caller's fsync runs, the others append, and the next fsync
covers them all), then the answer goes out. The writer thread takes what is queued in memory (the
same records, in the same order), inserts it in one transaction (up to ``batch_size *
COALESCE_BATCHES`` records) and commits the spool up to there; once everything in the spool is in
the database it is emptied. A crash (``kill -9``) leaves the spool behind: the next start replays
it. :func:`inferwatch.collector.store.inserts.insert_records` is idempotent on (trace_id, span_id), so writing
a record twice (a replay of records already inserted, a client retrying) is harmless. Should the
spool be unwritable, the batch is committed to the database before the answer instead.

When the database is unreachable (an error :func:`inferwatch.collector.store.db.is_unreachable` counts, the
deadline of one write, ``write_timeout``, included) the records simply stay in the spool; the queue is not
written. Every ``retry_interval`` seconds (doubling up to ``max_retry_interval``) the thread probes the
database and replays the spool in order from the last commit; once it has caught up the database counts as
back. While idle it probes every ``probe_interval`` seconds, so :attr:`Writer.db_ok` (``database_up``) falls
within seconds of an outage even without traffic. While the database is down a spool beyond
``spool_max_bytes`` refuses new batches (503). A full queue refuses them too (429): back-pressure (receivers
wait for room before decoding, :meth:`Writer.wait_for_room`). Records the database refuses for what they
contain are isolated by bisecting the batch, counted by reason and appended to ``<spool>.rejected`` instead
of being retried forever (the ingest path rejects what it knows the database would refuse before answering,
:func:`inferwatch.collector.store.rows.refusal`). A :class:`~inferwatch.collector.store.tickets.Ticket` says
what became of an offered batch.

Retention (``retention``: delete requests started longer ago, a pass every ``retention_interval`` seconds) runs in
small steps in the writer thread (:class:`~inferwatch.collector.store.retention.RetentionSchedule`), queued records
inserted between two. :meth:`Writer.stop` applies what is queued; a thread stuck in a database call past the
timeout leaves what it had not committed in the spool, for the next start.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from sqlalchemy import Engine

from inferwatch.collector.store.db import deadline, describe, is_unreachable, ping
from inferwatch.collector.store.inserts import insert_rows
from inferwatch.collector.store.record import RequestRecord
from inferwatch.collector.store.retention import DeleteFn, RetentionSchedule, delete_oldest
from inferwatch.collector.store.rows import Prepared
from inferwatch.collector.store.spool import SEGMENT_BYTES, Mark, Spool, append_lines
from inferwatch.collector.store.tickets import Chunk, Ticket, WriterStats

log = logging.getLogger("inferwatch.collector")

InsertFn = Callable[[Engine, Sequence[RequestRecord]], tuple[int, int]]

MAX_WAIT_S: Final = 1.0
"""upper bound of one idle wait of the writer thread (timers are re-checked at least this often)."""


COALESCE_BATCHES = 8
"""At most this many ``batch_size`` batches are written in one transaction when records are waiting."""
SPOOL_MAX_BYTES: Final = 1 << 30


class Writer:
    """The write-ahead log (the spool) and the thread that applies it to the store (see the module doc).

    ``insert``, ``delete_older``, ``probe`` and ``now`` are seams for tests (defaults: the prepared rows inserted
    with :func:`~inferwatch.collector.store.inserts.insert_rows`, :func:`~.retention.delete_oldest`,
    :func:`~.db.ping`, the UTC wall clock; an ``insert`` given gets the records back); ``clock``: the monotonic
    clock of the batching, retry, probe and retention timers; ``flush_interval``: how long a record may wait for
    more to join its transaction (0: whatever is queued goes together)."""

    def __init__(
        self,
        engine: Engine,
        spool_path: Path,
        queue_limit: int = 100_000,
        batch_size: int = 512,
        flush_interval: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        retention: timedelta | None = None,
        retention_interval: float = 60.0,
        *,
        retry_interval: float = 2.0,
        max_retry_interval: float = 30.0,
        write_timeout: float = 5.0,
        probe_interval: float = 5.0,
        spool_max_bytes: int = SPOOL_MAX_BYTES,
        segment_bytes: int = SEGMENT_BYTES,
        insert: InsertFn | None = None,
        delete_older: DeleteFn = delete_oldest,
        probe: Callable[[Engine], None] = ping,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if queue_limit < 1 or batch_size < 1:
            raise ValueError("queue_limit and batch_size must be positive")
        if write_timeout <= 0:
            raise ValueError("write_timeout must be positive")
        self.engine = engine
        self.dialect = engine.dialect.name
        """the dialect offered records are prepared for (:meth:`offer_prepared` takes rows of this one)."""
        self.spool = Spool(spool_path, segment_bytes)
        self.rejected_path = spool_path.with_name(spool_path.name + ".rejected")
        self.queue_limit = queue_limit
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.retention = retention
        self.retention_interval = retention_interval
        self.retry_interval = retry_interval
        self.max_retry_interval = max(max_retry_interval, retry_interval)
        self.write_timeout = write_timeout
        self.probe_interval = probe_interval
        self.spool_max_bytes = spool_max_bytes
        self.stats = WriterStats()
        self.db_ok = True
        """False from a failed write or probe until the spool has been replayed completely."""
        self.last_error: str | None = None
        """What the last failed write or probe said (None once the database is back)."""
        self._clock = clock
        self._insert = insert
        self._probe = probe
        self._retention = (
            None
            if retention is None
            else RetentionSchedule(retention, retention_interval, delete=delete_older, clock=clock, now=now)
        )
        self._queue: deque[Chunk] = deque()
        self._queued = 0
        self._cond = threading.Condition()
        self._stats_lock = threading.Lock()
        self._oldest: float | None = None  # clock() when the oldest queued record arrived
        self._inflight: list[Chunk] = []
        self._flush_requested = False
        self._stopping = False
        self._retried_at_stop = False
        self._thread: threading.Thread | None = None
        self._backoff = retry_interval
        self._next_retry = 0.0
        self._next_probe = 0.0
        self._replaying = False

    # --- the receivers' side ---

    def offer(self, records: Sequence[RequestRecord]) -> Ticket:
        """:meth:`offer_prepared` of the records' rows and spool lines."""
        if not records:
            return Ticket(0)
        return self.offer_prepared(Prepared.of(records, self.dialect))

    def offer_prepared(self, batch: Prepared) -> Ticket:
        """Accept a batch: write it ahead to the spool (fsync'd, shared with concurrent callers) and queue it for
        the database. The returned :class:`Ticket` is settled (durable) on return, unless the spool could not
        be written: then it waits for the database commit. Refused (``ticket.refused``, nothing written) when
        it would exceed ``queue_limit``, while the database is down and the spool is over ``spool_max_bytes``,
        or when the writer is stopping (or its thread died). ``batch.rows`` are for :attr:`dialect`."""
        n = len(batch)
        if not n:
            return Ticket(0)
        reason = self._refusal(n)
        if reason is not None:
            with self._stats_lock:
                self.stats.refused += n
            return Ticket(n, refused=reason)
        ticket = Ticket(n)
        chunk = Chunk(batch, ticket, None)
        try:
            _, seq = self.spool.write(batch.lines, then=lambda mark: self._enqueue(chunk, mark))
        except (OSError, ValueError) as exc:
            log.error("cannot write the spool %s: %s", self.spool.path, exc)
            if not self.db_ok:
                with self._stats_lock:
                    self.stats.not_durable += n
                ticket.settle(failed=n, error=f"database unreachable and the spool unwritable ({exc})")
                return ticket
            self._enqueue(chunk, None)  # commit before the answer instead
            return ticket
        try:
            self.spool.sync(seq)
        except OSError as exc:  # written, not known durable: the client retries (duplicates are skipped)
            log.error("cannot fsync the spool %s: %s", self.spool.path, exc)
            with self._stats_lock:
                self.stats.not_durable += n
            ticket.settle(failed=n, error=f"the spool could not be made durable ({exc})")
            return ticket
        ticket.settle(durable=n)
        return ticket

    def _refusal(self, n: int) -> str | None:
        with self._cond:
            dead = self._thread is not None and not self._thread.is_alive()
            if self._stopping or dead:
                return "stopping"
            if not self.has_room(n):
                return "queue_full"
        if not self.db_ok and self.spool_max_bytes and self.spool.size() >= self.spool_max_bytes:
            return "spool_full"
        return None

    def _enqueue(self, chunk: Chunk, mark: Mark | None) -> None:
        """Queue a batch for the database (called under the spool's lock for a spooled one). While the database
        is down, or the spool being replayed, a spooled batch is not queued: the replay will read it."""
        chunk.mark = mark
        if mark is not None and (self._replaying or not self.db_ok):
            if not self.db_ok:
                with self._stats_lock:
                    self.stats.spooled += len(chunk.batch)
            return
        with self._cond:
            if not self._queue:
                self._oldest = self._clock()
            self._queue.append(chunk)
            self._queued += len(chunk.batch)
            self._cond.notify_all()

    def submit(self, records: Sequence[RequestRecord]) -> bool:
        """:meth:`offer`: True when accepted."""
        return self.offer(records).refused is None

    def has_room(self, n: int) -> bool:
        """A batch of ``n`` would be queued, not refused ``queue_full`` (a hint without the lock: admission)."""
        return self._queued + n <= self.queue_limit

    def wait_for_room(self, n: int, timeout: float) -> bool:
        """:meth:`has_room` once there is room (or the writer stops), waiting at most ``timeout`` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopping or self.has_room(n), timeout)
            return self.has_room(n)

    @property
    def queue_depth(self) -> int:
        """Records accepted and not yet taken by the writer thread."""
        return self._queued

    def snapshot(self) -> WriterStats:
        """A consistent copy of the counters."""
        with self._stats_lock:
            return dataclasses.replace(self.stats, rejected_reasons=dict(self.stats.rejected_reasons))

    # --- lifecycle ---

    def start(self) -> None:
        """Start the writer thread (it first replays a spool left by a previous run)."""
        if self._thread is not None:
            raise RuntimeError("writer already started")
        now = self._clock()
        if self._retention is not None:
            self._retention.next_pass = now
        self._next_probe = now + self.probe_interval
        self._thread = threading.Thread(target=self._run, name="inferwatch-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop accepting, apply what is queued (it is in the spool already), stop.

        True on a clean shutdown. When the thread does not finish within ``timeout`` (a database call
        hanging), False: what it had not committed stays in the spool, for the next start to replay (those
        that could not be spooled are spooled from here).
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is None:
            self._run()  # never started: drain inline
            self.spool.close()
            return True
        self._thread.join(timeout)
        hung = self._thread.is_alive()
        with self._cond:
            chunks = [c for c in self._inflight + list(self._queue) if c.mark is None and not c.settled]
            n_queued = self._queued + sum(len(c.batch) for c in self._inflight)
            self._queue.clear()
            self._queued = 0
            self._oldest = None
        if chunks:  # accepted without a spool copy: one more try to spool them
            lines = [line for c in chunks for line in c.batch.lines]
            try:
                self.spool.append_lines(lines)
                spooled = True
            except (OSError, ValueError) as exc:
                log.error("cannot spool %d records at shutdown, they are lost: %s", len(lines), exc)
                spooled = False
            with self._stats_lock:
                if spooled:
                    self.stats.spooled += len(lines)
                else:
                    self.stats.lost += len(lines)
            self._settle(chunks, {}, failed=not spooled, error=None if spooled else "lost at shutdown")
        if hung:
            log.warning("writer thread did not finish within %.1fs; %d records stay in the spool", timeout, n_queued)
            return False
        self.spool.close()
        return not chunks

    def flush(self, timeout: float = 10.0) -> bool:
        """Apply what is queued now, without waiting for the flush interval; True when idle in time (nothing
        queued, in flight or being replayed)."""
        with self._cond:
            self._flush_requested = True
            self._cond.notify_all()
            return self._cond.wait_for(lambda: not self._queue and not self._inflight and not self._replaying, timeout)

    # --- the writer thread ---

    def _run(self) -> None:
        try:
            self._recover()
            while True:
                chunks = self._take()
                if chunks:
                    try:
                        self._apply(chunks)
                    finally:
                        with self._cond:
                            self._inflight = []
                            self._cond.notify_all()
                now = self._clock()
                stopping = self._stopping
                # while stopping, one more attempt: the database may be back, and then nothing stays spooled
                if not self.db_ok and (now >= self._next_retry or (stopping and not self._retried_at_stop)):
                    self._retried_at_stop = stopping
                    self._recover()
                elif self.db_ok and not stopping and not chunks and self.probe_interval and now >= self._next_probe:
                    self._check()
                if not stopping and self._retention is not None and self.db_ok and self._retention.due(now):
                    self._retain(self._retention)
                if stopping and not chunks:
                    with self._cond:
                        if not self._queue:
                            return
        except Exception:
            self.db_ok = False
            log.exception("writer thread crashed")
            raise

    def _wait_timeout(self, now: float) -> float:
        deadlines = []
        if self._oldest is not None:
            deadlines.append(self._oldest + self.flush_interval)
        if not self.db_ok:
            deadlines.append(self._next_retry)
        else:
            if self._retention is not None:
                # a pass in progress goes on at once (after whatever is queued: _take serves that first)
                deadlines.append(self._retention.wake_at(now))
            if self.probe_interval:
                deadlines.append(self._next_probe)
        return min([MAX_WAIT_S, *(d - now for d in deadlines)])

    def _take(self) -> list[Chunk]:
        """The next transaction's batches (everything queued, up to ``batch_size * COALESCE_BATCHES`` records,
        at least one batch), or [] when a timer is due or the writer is stopping with nothing queued."""
        with self._cond:
            while True:
                now = self._clock()
                queued = self._queued
                lingering = self._oldest is not None and now - self._oldest < self.flush_interval
                if queued and (queued >= self.batch_size or not lingering or self._stopping or self._flush_requested):
                    limit = self.batch_size * COALESCE_BATCHES
                    chunks: list[Chunk] = []
                    taken = 0
                    while self._queue and (not chunks or taken + len(self._queue[0].batch) <= limit):
                        chunk = self._queue.popleft()
                        chunks.append(chunk)
                        taken += len(chunk.batch)
                    self._queued -= taken
                    if not self._queue:
                        self._oldest = None
                        self._flush_requested = False
                    self._inflight = chunks
                    self._cond.notify_all()  # room in the queue: receivers waiting for it (wait_for_room)
                    return chunks
                if self._stopping:
                    return []
                timeout = self._wait_timeout(now)
                if timeout <= 0:
                    return []
                self._cond.wait(timeout)

    def _apply(self, chunks: list[Chunk]) -> None:
        """Insert the batches (one transaction), then commit their spool marks; the database unreachable, they
        stay in the spool for the replay (those without a spool copy are spooled now, or fail)."""
        batch = Prepared.join([c.batch for c in chunks])
        spooled = [c for c in chunks if c.mark is not None]
        unspooled = [c for c in chunks if c.mark is None]
        if self.db_ok:
            rejections: dict[int, str] = {}
            try:
                self._store(batch, replayed=False, rejections=rejections, acknowledged=not unspooled)
            except Exception as exc:  # unreachable (anything else is isolated by _store)
                self._went_down(exc)
            else:
                marks = [c.mark for c in spooled if c.mark is not None]
                if marks:
                    self.spool.commit(max(marks))
                    self.spool.finish(sync=False)
                self._settle(chunks, rejections, only=unspooled)
                return
        # the database is down: the spool keeps what it has, for the replay
        with self._stats_lock:
            self.stats.spooled += sum(len(c.batch) for c in spooled)
        if unspooled:
            lost = [line for c in unspooled for line in c.batch.lines]
            try:
                self.spool.append_lines(lost)
            except (OSError, ValueError) as exc:
                with self._stats_lock:
                    self.stats.not_durable += len(lost)
                self._settle(unspooled, {}, failed=True, error=f"database unreachable and the spool unwritable ({exc})")
            else:
                with self._stats_lock:
                    self.stats.spooled += len(lost)
                self._settle(unspooled, {})

    def _settle(
        self,
        chunks: list[Chunk],
        rejections: Mapping[int, str],
        *,
        only: list[Chunk] | None = None,
        failed: bool = False,
        error: str | None = None,
    ) -> None:
        """Tell the tickets of chunks without a spool copy (``only`` of ``chunks``, by default all) what became of
        each record: rejected (``rejections``: reason by the record's position in ``chunks``' records) or else
        durable (``failed``: not durable)."""
        wanted = {id(c) for c in (chunks if only is None else only)}
        todo: list[tuple[Chunk, int]] = []
        offset = 0
        with self._cond:
            for chunk in chunks:
                if id(chunk) in wanted and not chunk.settled:
                    chunk.settled = True
                    todo.append((chunk, offset))
                offset += len(chunk.batch)
        for chunk, start in todo:
            n = len(chunk.batch)
            counts = Counter(rejections[i] for i in range(start, start + n) if i in rejections) if rejections else None
            rest = n - (sum(counts.values()) if counts else 0)
            if failed:
                chunk.ticket.settle(rejected=counts, failed=rest, error=error)
            else:
                chunk.ticket.settle(durable=rest, rejected=counts)

    def _store(
        self,
        batch: Prepared,
        *,
        replayed: bool,
        rejections: dict[int, str],
        acknowledged: bool = True,
        offset: int = 0,
    ) -> None:
        """Insert within ``write_timeout``; bisect around records the database refuses (noted in ``rejections`` by
        position, ``offset`` being the batch's first); raise when it is unreachable. ``acknowledged``: the clients
        were already told the records are accepted (the reason of a refusal says so)."""
        started = self._clock()
        try:
            with deadline(self.write_timeout):
                if self._insert is None:
                    inserted, duplicates = insert_rows(self.engine, batch.rows)
                else:
                    inserted, duplicates = self._insert(self.engine, batch.records())
        except Exception as exc:
            with self._stats_lock:
                self.stats.write_errors += 1
            if is_unreachable(exc):
                raise
            if len(batch) == 1:
                self._reject(batch, offset, exc, acknowledged=acknowledged or replayed, rejections=rejections)
                return
            half = len(batch) // 2
            for start, stop in ((0, half), (half, len(batch))):
                self._store(
                    batch.part(start, stop),
                    replayed=replayed,
                    rejections=rejections,
                    acknowledged=acknowledged,
                    offset=offset + start,
                )
            return
        now = self._clock()
        self._next_probe = now + self.probe_interval
        with self._stats_lock:
            self.stats.stored += inserted
            self.stats.duplicates += duplicates
            self.stats.batches += 1
            self.stats.last_batch_seconds = now - started
            if replayed:
                self.stats.replayed += len(batch)

    def _went_down(self, exc: BaseException) -> None:
        was_ok = self.db_ok
        self.db_ok = False
        self.last_error = describe(exc)
        if was_ok:
            log.warning("database unreachable, keeping accepted records in %s: %s", self.spool.path, self.last_error)
            self._backoff = self.retry_interval
        else:
            self._backoff = min(self._backoff * 2, self.max_retry_interval)
        self._next_retry = self._clock() + self._backoff

    def _reject(
        self, batch: Prepared, offset: int, exc: BaseException, *, acknowledged: bool, rejections: dict[int, str]
    ) -> None:
        orig = getattr(exc, "orig", None) or exc
        reason = f"database refused{' after acknowledgement' if acknowledged else ''}: {orig.__class__.__name__}"
        n = len(batch)
        log.error("database refused %d record(s), keeping them in %s: %s", n, self.rejected_path, exc)
        try:
            append_lines(self.rejected_path, batch.lines)
        except (OSError, ValueError) as err:
            log.error("cannot write %s: %s", self.rejected_path, err)
        with self._stats_lock:
            self.stats.rejected += n
            self.stats.rejected_reasons[reason] = self.stats.rejected_reasons.get(reason, 0) + n
        for i in range(offset, offset + n):
            rejections[i] = reason

    def _check(self) -> None:
        """The idle probe: one round trip within ``write_timeout``."""
        self._next_probe = self._clock() + self.probe_interval
        try:
            with deadline(self.write_timeout):
                self._probe(self.engine)
        except Exception as exc:
            if not is_unreachable(exc):
                log.exception("database probe failed")
                return
            self._went_down(exc)

    def _recover(self) -> None:
        """Probe, then replay the spool from the last commit, in order, until caught up with the writes; the
        database counts as back then, and what is queued (all of it replayed already) is dropped."""
        replayed = 0
        was_ok = self.db_ok
        try:
            with deadline(self.write_timeout):
                self._probe(self.engine)
            self._replaying = True
            self.spool.rewind()
            while True:
                records, mark = self.spool.read(self.batch_size * COALESCE_BATCHES)  # as many as a live transaction
                if records:
                    self._store(Prepared.of(records, self.dialect), replayed=True, rejections={})
                    replayed += len(records)
                self.spool.commit(mark)
                if not records and self.spool.finish(sync=True, then=self._caught_up):
                    break
        except Exception as exc:
            with self._cond:
                self._replaying = False
                self._cond.notify_all()
            if not is_unreachable(exc) and not isinstance(exc, OSError):
                raise
            self._went_down(exc)
            return
        if not was_ok or replayed:
            log.info("database reachable; replayed %d spooled records", replayed)
        self.last_error = None
        self._backoff = self.retry_interval
        self._next_probe = self._clock() + self.probe_interval

    def _caught_up(self) -> None:
        """The replay has written everything in the spool (run under its lock: no write in between): drop the
        queued batches it covered, and go live (the next writes are queued for the database again)."""
        with self._cond:
            live = [c for c in self._queue if c.mark is None]
            self._queued = sum(len(c.batch) for c in live)
            self._queue = deque(live)
            if not self._queue:
                self._oldest = None
            self._replaying = False
            self.db_ok = True
            self._cond.notify_all()

    @property
    def retention_running(self) -> bool:
        """Whether a retention pass is under way (its next step runs at the writer's next turn)."""
        return self._retention is not None and self._retention.cutoff is not None

    def _retain(self, schedule: RetentionSchedule) -> None:
        """One short step of the retention pass (queued records wait at most one); the pass goes on at the
        writer's next turn, queued records first, until nothing older than the cutoff is left."""
        try:
            deleted, took = schedule.step(self.engine, self.write_timeout)
        except Exception as exc:
            if is_unreachable(exc):
                self._went_down(exc)
            else:
                log.exception("retention pass failed")
            return
        with self._stats_lock:
            self.stats.retention_deleted += deleted
            self.stats.retention_steps += 1
            self.stats.retention_longest_step = max(self.stats.retention_longest_step, took)
