"""The collector's write path: a bounded queue drained by one background thread into the store.

Receivers (OTLP HTTP/gRPC) call :meth:`Writer.submit`; it never blocks on the database. A full
queue refuses the whole batch (``submit`` returns False: answer 429 / RESOURCE_EXHAUSTED). The
thread writes batches with :func:`inferwatch.collector.db.insert_records`, which is idempotent on
(trace_id, span_id), so writing a record twice is harmless.

When the database is unreachable, batches go to the *spool*: an append-only JSON-lines file, one
record per line, fsync'd before the batch counts as spooled. Every ``retry_interval`` seconds the
thread replays the spool in order; once all of it is stored the file is truncated and live batches
go to the database again. A spool left by a previous run is replayed at start. Records the
database refuses for what they contain (a constraint, a value it cannot store) are isolated by
bisecting the batch and appended to ``<spool>.rejected`` instead of being retried forever.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from inferwatch.collector.db import delete_older_than, insert_records
from inferwatch.collector.record import RequestRecord

log = logging.getLogger("inferwatch.collector")

InsertFn = Callable[[Engine, Sequence[RequestRecord]], tuple[int, int]]
DeleteFn = Callable[[Engine, datetime], int]

DATETIME_FIELDS: Final[tuple[str, ...]] = ("start_time", "end_time")
RECORD_FIELDS: Final[frozenset[str]] = frozenset(f.name for f in dataclasses.fields(RequestRecord))
MAX_WAIT_S: Final = 1.0
"""upper bound of one idle wait of the writer thread (timers are re-checked at least this often)."""


# --- JSON (de)serialisation ------------------------------------------------------------------------------------------


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def record_to_dict(record: RequestRecord) -> dict[str, Any]:
    """A JSON-ready dict of the record: datetimes as ISO 8601 strings (naive ones taken as UTC)."""
    data = dict(vars(record))
    for name in DATETIME_FIELDS:
        data[name] = _utc(data[name]).isoformat()
    return data


def record_from_dict(data: dict[str, Any]) -> RequestRecord:
    """The inverse of :func:`record_to_dict`; keys that are not record fields are ignored."""
    values = {k: v for k, v in data.items() if k in RECORD_FIELDS}
    for name in DATETIME_FIELDS:
        values[name] = _utc(datetime.fromisoformat(values[name]))
    return RequestRecord(**values)


def record_to_json(record: RequestRecord) -> str:
    """One line of JSON (ASCII, no newline inside); floats round-trip exactly."""
    return json.dumps(record_to_dict(record), separators=(",", ":"), default=str)


def record_from_json(line: str | bytes) -> RequestRecord:
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("a spooled record is a JSON object")
    return record_from_dict(data)


# --- spool -----------------------------------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_lines(path: Path, lines: Sequence[str]) -> None:
    """Append JSON lines to ``path`` durably (fsync; the directory too when the file is new).

    A torn last line left by a crash is terminated first, so it stays one (unparsable) line.
    """
    created = not path.exists()
    data = "".join(line + "\n" for line in lines).encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        _fsync_dir(path.parent)


class Spool:
    """Append-only JSON-lines file of records waiting for the database, read back in order.

    ``read``/``commit`` walk it from the start; ``finish`` truncates it once everything has been
    read. Appends and ``finish`` hold a lock, so an append racing the end of a replay is kept.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        """bytes already replayed (in this process)."""
        self.corrupt = 0
        """unparsable lines skipped (a torn write after a crash)."""
        self._lock = threading.Lock()

    def append(self, records: Sequence[RequestRecord]) -> None:
        lines = [record_to_json(r) for r in records]
        with self._lock:
            append_lines(self.path, lines)

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def read(self, limit: int) -> tuple[list[RequestRecord], int]:
        """Up to ``limit`` records from the current offset, and the offset after them."""
        records: list[RequestRecord] = []
        with self._lock:
            if self.size() <= self.offset:
                return records, self.offset
            with self.path.open("rb") as f:
                f.seek(self.offset)
                while len(records) < limit:
                    line = f.readline()
                    if not line:
                        break
                    try:
                        records.append(record_from_json(line))
                    except (ValueError, TypeError, KeyError) as exc:
                        self.corrupt += 1
                        log.error("spool %s: skipping an unreadable line (%s): %.200r", self.path, exc, line)
                return records, f.tell()

    def commit(self, offset: int) -> None:
        self.offset = offset

    def finish(self) -> bool:
        """Truncate the file when it has been read to the end; False when more was appended."""
        with self._lock:
            size = self.size()
            if size > self.offset:
                return False
            if size:
                with self.path.open("r+b") as f:
                    f.truncate(0)
                    f.flush()
                    os.fsync(f.fileno())
            self.offset = 0
            return True


# --- writer ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class WriterStats:
    """Counters of a :class:`Writer` (records unless stated otherwise)."""

    stored: int = 0
    """rows inserted (live and replayed)."""
    duplicates: int = 0
    """records skipped because their (trace_id, span_id) was already stored."""
    spooled: int = 0
    """records appended to the spool while the database was unreachable."""
    replayed: int = 0
    """records read back from the spool and written to the database."""
    refused: int = 0
    """records refused by submit (queue full or writer stopped)."""
    rejected: int = 0
    """records the database refused for their content (kept in the ``.rejected`` file)."""
    lost: int = 0
    """records that reached neither the database nor the spool (the spool could not be written)."""
    batches: int = 0
    """successful insert calls."""
    last_batch_seconds: float = 0.0
    write_errors: int = 0
    """failed insert calls (unreachable database or refused content)."""
    retention_deleted: int = 0
    """rows deleted by the retention pass."""


def is_unreachable(exc: BaseException) -> bool:
    """Whether a database error means "cannot reach the database now" (spool and retry) rather
    than "the database refuses this data"."""
    if isinstance(exc, OperationalError | InterfaceError | DisconnectionError | PoolTimeoutError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def _utcnow() -> datetime:
    return datetime.now(UTC)


COALESCE_BATCHES = 8
"""At most this many ``batch_size`` batches are written in one transaction when records are waiting."""


class Writer:
    """Queue + background thread writing :class:`RequestRecord` batches to the store.

    ``insert``, ``delete_older`` and ``now`` are seams for tests (defaults: :mod:`inferwatch.collector.db`'s
    functions and the UTC wall clock); ``clock`` is the monotonic clock of the batching, retry and
    retention timers.
    """

    def __init__(
        self,
        engine: Engine,
        spool_path: Path,
        queue_limit: int = 100_000,
        batch_size: int = 512,
        flush_interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        retention: timedelta | None = None,
        retention_interval: float = 60.0,
        *,
        retry_interval: float = 2.0,
        insert: InsertFn = insert_records,
        delete_older: DeleteFn = delete_older_than,
        now: Callable[[], datetime] = _utcnow,
    ) -> None:
        if queue_limit < 1 or batch_size < 1:
            raise ValueError("queue_limit and batch_size must be positive")
        self.engine = engine
        self.spool = Spool(spool_path)
        self.rejected_path = spool_path.with_name(spool_path.name + ".rejected")
        self.queue_limit = queue_limit
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.retention = retention
        self.retention_interval = retention_interval
        self.retry_interval = retry_interval
        self.stats = WriterStats()
        self.db_ok = True
        """False from a failed write until the spool has been replayed completely."""
        self._clock = clock
        self._insert = insert
        self._delete_older = delete_older
        self._now = now
        self._queue: deque[RequestRecord] = deque()
        self._cond = threading.Condition()
        self._stats_lock = threading.Lock()
        self._oldest: float | None = None  # clock() when the oldest queued record arrived
        self._inflight = 0
        self._flush_requested = False
        self._stopping = False
        self._retried_at_stop = False
        self._thread: threading.Thread | None = None
        self._next_retry = 0.0
        self._next_retention = 0.0

    # --- the receivers' side ---

    def submit(self, records: Sequence[RequestRecord]) -> bool:
        """Queue a batch; False (nothing queued) when it would exceed ``queue_limit``, or the writer is
        stopping (or its thread died)."""
        if not records:
            return True
        with self._cond:
            dead = self._thread is not None and not self._thread.is_alive()
            if self._stopping or dead or len(self._queue) + len(records) > self.queue_limit:
                with self._stats_lock:
                    self.stats.refused += len(records)
                return False
            was_empty = not self._queue
            if was_empty:
                self._oldest = self._clock()
            self._queue.extend(records)
            if was_empty or len(self._queue) >= self.batch_size:
                self._cond.notify_all()
        return True

    @property
    def queue_depth(self) -> int:
        """Records accepted and not yet taken by the writer thread."""
        return len(self._queue)

    def snapshot(self) -> WriterStats:
        """A consistent copy of the counters."""
        with self._stats_lock:
            return dataclasses.replace(self.stats)

    # --- lifecycle ---

    def start(self) -> None:
        """Start the writer thread (it first replays a spool left by a previous run)."""
        if self._thread is not None:
            raise RuntimeError("writer already started")
        self._next_retention = self._clock()
        self._thread = threading.Thread(target=self._run, name="inferwatch-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop accepting, write out everything queued (to the spool if the database is down), stop.

        True on a clean shutdown. When the thread does not finish within ``timeout`` (a database
        call hanging), what is still queued is spooled from here and False is returned.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is None:
            self._run()  # never started: drain inline
            return True
        self._thread.join(timeout)
        hung = self._thread.is_alive()
        with self._cond:
            leftover = list(self._queue)
            self._queue.clear()
            self._oldest = None
        if hung or leftover:  # a database call hanging, or the thread died
            log.warning(
                "writer thread did not finish (within %.1fs); spooling %d queued records", timeout, len(leftover)
            )
            if leftover:
                self._spool_batch(leftover, final=True)
            return False
        return True

    def flush(self, timeout: float = 10.0) -> bool:
        """Write out what is queued now, without waiting for the flush interval; True when idle in time."""
        with self._cond:
            self._flush_requested = True
            self._cond.notify_all()
            return self._cond.wait_for(lambda: not self._queue and not self._inflight, timeout)

    # --- the writer thread ---

    def _run(self) -> None:
        try:
            self._recover()
            while True:
                batch = self._take()
                if batch:
                    try:
                        self._write(batch)
                    finally:
                        with self._cond:
                            self._inflight = 0
                            self._cond.notify_all()
                now = self._clock()
                stopping = self._stopping
                # while stopping, one more attempt: the database may be back, and then nothing stays spooled
                if not self.db_ok and (now >= self._next_retry or (stopping and not self._retried_at_stop)):
                    self._retried_at_stop = stopping
                    self._recover()
                if not stopping and self.retention is not None and self.db_ok and now >= self._next_retention:
                    self._retain(self.retention)
                if stopping and not batch:
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
        elif self.retention is not None:
            deadlines.append(self._next_retention)
        return min([MAX_WAIT_S, *(d - now for d in deadlines)])

    def _take(self) -> list[RequestRecord]:
        """The next batch, or [] when a timer is due or the writer is stopping with nothing queued."""
        with self._cond:
            while True:
                now = self._clock()
                n = len(self._queue)
                due = self._oldest is not None and now - self._oldest >= self.flush_interval
                if n and (n >= self.batch_size or due or self._stopping or self._flush_requested):
                    # under a backlog, several batches go in one transaction (fewer commits)
                    take = min(n, self.batch_size * COALESCE_BATCHES)
                    batch = [self._queue.popleft() for _ in range(take)]
                    if not self._queue:
                        self._oldest = None
                        self._flush_requested = False
                    self._inflight = take
                    return batch
                if self._stopping:
                    return []
                timeout = self._wait_timeout(now)
                if timeout <= 0:
                    return []
                self._cond.wait(timeout)

    def _write(self, batch: list[RequestRecord]) -> None:
        if self.db_ok:
            try:
                self._store(batch, replayed=False)
                return
            except Exception as exc:
                if not is_unreachable(exc):
                    raise
                self._went_down(exc)
        self._spool_batch(batch, final=self._stopping)

    def _store(self, records: list[RequestRecord], *, replayed: bool) -> None:
        """Insert; bisect around records the database refuses; raise when it is unreachable."""
        started = self._clock()
        try:
            inserted, duplicates = self._insert(self.engine, records)
        except Exception as exc:
            with self._stats_lock:
                self.stats.write_errors += 1
            if is_unreachable(exc):
                raise
            if len(records) == 1:
                self._reject(records, exc)
                return
            half = len(records) // 2
            self._store(records[:half], replayed=replayed)
            self._store(records[half:], replayed=replayed)
            return
        elapsed = self._clock() - started
        with self._stats_lock:
            self.stats.stored += inserted
            self.stats.duplicates += duplicates
            self.stats.batches += 1
            self.stats.last_batch_seconds = elapsed
            if replayed:
                self.stats.replayed += len(records)

    def _went_down(self, exc: BaseException) -> None:
        if self.db_ok:
            log.warning("database unreachable, spooling to %s: %s", self.spool.path, exc)
        self.db_ok = False
        self._next_retry = self._clock() + self.retry_interval

    def _spool_batch(self, batch: list[RequestRecord], *, final: bool) -> None:
        try:
            self.spool.append(batch)
        except (OSError, ValueError) as exc:
            if final:
                log.error("cannot spool %d records at shutdown, they are lost: %s", len(batch), exc)
                with self._stats_lock:
                    self.stats.lost += len(batch)
                return
            log.error("cannot write the spool %s (%s); keeping %d records queued", self.spool.path, exc, len(batch))
            with self._cond:
                self._queue.extendleft(reversed(batch))
                self._oldest = self._clock()
            time.sleep(min(self.retry_interval, MAX_WAIT_S))
            return
        with self._stats_lock:
            self.stats.spooled += len(batch)

    def _reject(self, records: list[RequestRecord], exc: BaseException) -> None:
        log.error("database refused %d record(s), keeping them in %s: %s", len(records), self.rejected_path, exc)
        try:
            append_lines(self.rejected_path, [record_to_json(r) for r in records])
        except (OSError, ValueError) as err:
            log.error("cannot write %s: %s", self.rejected_path, err)
        with self._stats_lock:
            self.stats.rejected += len(records)

    def _recover(self) -> None:
        """Replay the spool in order; the database counts as back once all of it is stored."""
        replayed = 0
        try:
            while True:
                records, end = self.spool.read(self.batch_size)
                if records:
                    self._store(records, replayed=True)
                    replayed += len(records)
                self.spool.commit(end)
                if not records and self.spool.finish():
                    break
        except Exception as exc:
            if not is_unreachable(exc) and not isinstance(exc, OSError):
                raise
            self._went_down(exc)
            return
        if not self.db_ok or replayed:
            log.info("database reachable; replayed %d spooled records", replayed)
        self.db_ok = True

    def _retain(self, retention: timedelta) -> None:
        self._next_retention = self._clock() + self.retention_interval
        cutoff = self._now() - retention
        try:
            deleted = self._delete_older(self.engine, cutoff)
        except Exception as exc:
            if not is_unreachable(exc):
                log.exception("retention pass failed")
                return
            self._went_down(exc)
            return
        with self._stats_lock:
            self.stats.retention_deleted += deleted
