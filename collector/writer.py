"""The collector's write path: a bounded queue drained by one background thread into the store.

Durability: a span is acknowledged only once it is durable. Receivers (OTLP HTTP/gRPC) call
:meth:`Writer.offer` and wait on the returned :class:`Ticket`; the ticket is settled when every
record of the batch is committed to the database, or appended to the spool and fsync'd, or
refused by the database for what it contains (counted, with the reason). Group commit: the thread
takes everything queued into one transaction (up to ``batch_size * COALESCE_BATCHES`` records),
so concurrent exports share one commit; whatever arrives meanwhile goes into the next one. A
full queue, a spool over its limit or a stopping writer refuse the batch (nothing queued).
:func:`inferwatch.collector.db.insert_records` is idempotent on (trace_id, span_id), so writing a
record twice (a client retrying after a timeout, a spool replayed after a crash) is harmless.

When the database is unreachable (an error :func:`inferwatch.collector.db.is_unreachable` counts,
including the deadline of one write, ``write_timeout``), batches go to the *spool*: an append-only
JSON-lines file, one record per line, fsync'd before the batch counts as spooled. Every
``retry_interval`` seconds the thread replays the spool in order; once all of it is stored the file
is truncated and live batches go to the database again. A spool left by a previous run (or a crash)
is replayed at start. While idle the thread probes the database every ``probe_interval`` seconds, so
:attr:`Writer.db_ok` goes false within seconds of an outage even without traffic. Records the
database refuses for what they contain (a constraint, a value it cannot store) are isolated by
bisecting the batch and appended to ``<spool>.rejected`` instead of being retried forever.

:meth:`Writer.stop` writes out everything accepted: the queue, and the batch in flight when the
thread is stuck in a database call, go to the spool.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from sqlalchemy import Engine, text

from inferwatch.collector.db import deadline, delete_older_than, describe, insert_records
from inferwatch.collector.db import is_unreachable as is_unreachable
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


@functools.cache
def _encoder() -> json.JSONEncoder:
    return json.JSONEncoder(separators=(",", ":"), default=str, check_circular=False)


def record_to_json(record: RequestRecord) -> str:
    """One line of JSON (ASCII, no newline inside); floats round-trip exactly."""
    return _encoder().encode(record_to_dict(record))


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


def append_lines(path: Path, lines: Sequence[str]) -> int:
    """Append JSON lines to ``path`` durably (fsync; the directory too when the file is new); the file's
    size after them.

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
        end = os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)
    if created:
        _fsync_dir(path.parent)
    return end


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

    def append(self, records: Sequence[RequestRecord]) -> int:
        """Append records durably; the file's size after them."""
        return self.append_lines([record_to_json(r) for r in records])

    def append_lines(self, lines: Sequence[str]) -> int:
        """Append lines of :func:`record_to_json` durably; the file's size after them."""
        with self._lock:
            return append_lines(self.path, lines)

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

    def finish(self, *, sync: bool = True) -> bool:
        """Truncate the file when it has been read to the end; False when more was appended.

        ``sync=False`` skips the fsync: should the truncation be lost in a crash, the records reappear
        and are replayed as duplicates, which is harmless.
        """
        with self._lock:
            size = self.size()
            if size > self.offset:
                return False
            if size:
                with self.path.open("r+b") as f:
                    f.truncate(0)
                    f.flush()
                    if sync:
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
    """records refused by offer (queue full, spool full, or writer stopped)."""
    rejected: int = 0
    """records the database refused for their content (kept in the ``.rejected`` file)."""
    rejected_reasons: dict[str, int] = dataclasses.field(default_factory=dict)
    """``rejected`` by reason: ``database refused: <error>``, or ``database refused after acknowledgement: <error>``
    for records the clients were already told are accepted (written ahead to the spool, then refused)."""
    not_durable: int = 0
    """accepted records that could be neither stored nor spooled (spool full or unwritable): their tickets
    fail, the client is told to retry."""
    lost: int = 0
    """records that reached neither the database nor the spool at shutdown (the spool could not be written)."""
    batches: int = 0
    """successful insert calls (each one transaction: the group commit)."""
    last_batch_seconds: float = 0.0
    write_errors: int = 0
    """failed insert calls (unreachable database or refused content)."""
    retention_deleted: int = 0
    """rows deleted by the retention pass."""


class Ticket:
    """What became of one offered batch.

    ``refused``: why it was not queued at all (``queue_full``, ``spool_full``, ``stopping``), else None.
    Otherwise :meth:`wait` until each record is ``durable`` (committed, already stored, or spooled),
    ``rejected`` by the database (counted by reason) or ``failed`` (neither stored nor spooled; ``error``
    says why: the client must send it again).
    """

    def __init__(self, size: int, refused: str | None = None) -> None:
        self.size = size
        self.refused = refused
        self.durable = 0
        self.failed = 0
        self.rejected: Counter[str] = Counter()
        self.error: str | None = None
        self._pending = 0 if refused else size
        self._lock = threading.Lock()
        self._done = threading.Event()
        if self._pending == 0:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once every record is settled; False when ``timeout`` passed first (they stay queued)."""
        return self._done.wait(timeout)

    def settle(
        self, *, durable: int = 0, rejected: Mapping[str, int] | None = None, failed: int = 0, error: str | None = None
    ) -> None:
        with self._lock:
            self.durable += durable
            self.failed += failed
            if rejected:
                self.rejected.update(rejected)
            if error and self.error is None:
                self.error = error
            self._pending -= durable + failed + (sum(rejected.values()) if rejected else 0)
            if self._pending <= 0:
                self._done.set()


@dataclasses.dataclass(eq=False)
class _Chunk:
    """One offered batch in the queue."""

    records: list[RequestRecord]
    lines: list[str]
    """the records as spool lines (encoded by the caller's thread, off the writer's)."""
    ticket: Ticket
    settled: bool = False


def ping(engine: Engine) -> None:
    """One round trip to the database (raises when it cannot be reached)."""
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


def _utcnow() -> datetime:
    return datetime.now(UTC)


COALESCE_BATCHES = 8
"""At most this many ``batch_size`` batches are written in one transaction when records are waiting."""
SPOOL_MAX_BYTES: Final = 1 << 30


class Writer:
    """Queue + background thread writing :class:`RequestRecord` batches to the store (see the module doc).

    ``insert``, ``delete_older``, ``probe`` and ``now`` are seams for tests (defaults:
    :mod:`inferwatch.collector.db`'s functions, :func:`ping` and the UTC wall clock); ``clock`` is the
    monotonic clock of the batching, retry, probe and retention timers. ``flush_interval`` is how long a
    record may wait for more to join its transaction (0: group commit only, no lingering).
    """

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
        insert: InsertFn = insert_records,
        delete_older: DeleteFn = delete_older_than,
        probe: Callable[[Engine], None] = ping,
        now: Callable[[], datetime] = _utcnow,
    ) -> None:
        if queue_limit < 1 or batch_size < 1:
            raise ValueError("queue_limit and batch_size must be positive")
        if write_timeout <= 0:
            raise ValueError("write_timeout must be positive")
        self.engine = engine
        self.spool = Spool(spool_path)
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
        self._delete_older = delete_older
        self._probe = probe
        self._now = now
        self._queue: deque[_Chunk] = deque()
        self._queued = 0
        self._cond = threading.Condition()
        self._stats_lock = threading.Lock()
        self._oldest: float | None = None  # clock() when the oldest queued record arrived
        self._inflight: list[_Chunk] = []
        self._flush_requested = False
        self._stopping = False
        self._retried_at_stop = False
        self._thread: threading.Thread | None = None
        self._backoff = retry_interval
        self._next_retry = 0.0
        self._next_retention = 0.0
        self._next_probe = 0.0

    # --- the receivers' side ---

    def offer(self, records: Sequence[RequestRecord]) -> Ticket:
        """Queue a batch; its :class:`Ticket` says when it is durable. Refused (``ticket.refused``, nothing
        queued) when it would exceed ``queue_limit``, while the database is down and the spool is over
        ``spool_max_bytes``, or when the writer is stopping (or its thread died)."""
        n = len(records)
        if not n:
            return Ticket(0)
        lines = [record_to_json(r) for r in records]
        with self._cond:
            dead = self._thread is not None and not self._thread.is_alive()
            reason = None
            if self._stopping or dead:
                reason = "stopping"
            elif self._queued + n > self.queue_limit:
                reason = "queue_full"
            elif not self.db_ok and self.spool_max_bytes and self.spool.size() >= self.spool_max_bytes:
                reason = "spool_full"
            if reason is not None:
                with self._stats_lock:
                    self.stats.refused += n
                return Ticket(n, refused=reason)
            ticket = Ticket(n)
            if not self._queue:
                self._oldest = self._clock()
            self._queue.append(_Chunk(list(records), lines, ticket))
            self._queued += n
            self._cond.notify_all()
        return ticket

    def submit(self, records: Sequence[RequestRecord]) -> bool:
        """:meth:`offer` without waiting: True when queued."""
        return self.offer(records).refused is None

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
        self._next_retention = now
        self._next_probe = now + self.probe_interval
        self._thread = threading.Thread(target=self._run, name="inferwatch-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop accepting, write out everything accepted (to the spool if the database is down), stop.

        True on a clean shutdown. When the thread does not finish within ``timeout`` (a database call
        hanging), what is still queued and the batch in flight are spooled from here and False is
        returned (should the stuck call still commit, the spooled copy replays as duplicates).
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
            chunks = [c for c in self._inflight if not c.settled] + list(self._queue)
            self._queue.clear()
            self._queued = 0
            self._oldest = None
        if hung or chunks:  # a database call hanging, or the thread died
            n = sum(len(c.records) for c in chunks)
            log.warning("writer thread did not finish (within %.1fs); spooling %d accepted records", timeout, n)
            if chunks:
                end = self._spool_lines([line for c in chunks for line in c.lines], n, final=True)
                if end is not None:
                    with self._stats_lock:
                        self.stats.spooled += n
                self._settle(chunks, {}, failed=end is None, error=None if end is not None else "lost at shutdown")
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
                chunks = self._take()
                if chunks:
                    try:
                        self._write(chunks)
                    finally:
                        with self._cond:
                            if all(c.settled for c in self._inflight):
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
                if not stopping and self.retention is not None and self.db_ok and now >= self._next_retention:
                    self._retain(self.retention)
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
            if self.retention is not None:
                deadlines.append(self._next_retention)
            if self.probe_interval:
                deadlines.append(self._next_probe)
        return min([MAX_WAIT_S, *(d - now for d in deadlines)])

    def _take(self) -> list[_Chunk]:
        """The next transaction's batches (everything queued, up to ``batch_size * COALESCE_BATCHES`` records,
        at least one batch), or [] when a timer is due or the writer is stopping with nothing queued."""
        with self._cond:
            while True:
                now = self._clock()
                queued = self._queued
                lingering = self._oldest is not None and now - self._oldest < self.flush_interval
                if queued and (queued >= self.batch_size or not lingering or self._stopping or self._flush_requested):
                    limit = self.batch_size * COALESCE_BATCHES
                    chunks: list[_Chunk] = []
                    taken = 0
                    while self._queue and (not chunks or taken + len(self._queue[0].records) <= limit):
                        chunk = self._queue.popleft()
                        chunks.append(chunk)
                        taken += len(chunk.records)
                    self._queued -= taken
                    if not self._queue:
                        self._oldest = None
                        self._flush_requested = False
                    self._inflight = chunks
                    return chunks
                if self._stopping:
                    return []
                timeout = self._wait_timeout(now)
                if timeout <= 0:
                    return []
                self._cond.wait(timeout)

    def _write(self, chunks: list[_Chunk]) -> None:
        """Write-ahead: append the batches to the spool (one fsync for all: group commit) and settle their tickets
        (the answers go out), then insert them and truncate the spool. The database unreachable: they stay in
        the spool for the replay. The spool unwritable: insert first, settle after (commit before the answer)."""
        records = [r for c in chunks for r in c.records]
        end = self._spool_lines([line for c in chunks for line in c.lines], len(records), final=self._stopping)
        if end is not None:
            self._settle(chunks, {})
        if not self.db_ok:
            if end is None:
                self._settle(chunks, {}, failed=True, error="database unreachable and the spool cannot take more")
            else:
                with self._stats_lock:
                    self.stats.spooled += len(records)
            return
        rejections: dict[int, str] = {}
        try:
            self._store(records, replayed=False, acknowledged=end is not None, rejections=rejections)
        except Exception as exc:  # unreachable (anything else is isolated by _store)
            self._went_down(exc)
            if end is None:
                self._settle(chunks, rejections, failed=True, error=f"database unreachable ({self.last_error})")
            else:
                with self._stats_lock:
                    self.stats.spooled += len(records)
            return
        if end is None:
            self._settle(chunks, rejections)
        else:
            self.spool.commit(end)
            self.spool.finish(sync=False)

    def _settle(
        self, chunks: list[_Chunk], rejections: Mapping[int, str], *, failed: bool = False, error: str | None = None
    ) -> None:
        """Tell the tickets: each record rejected (by reason) or else durable (``failed``: not durable)."""
        with self._cond:
            todo = [c for c in chunks if not c.settled]
            for chunk in todo:
                chunk.settled = True
        for chunk in todo:
            counts = Counter(rejections[id(r)] for r in chunk.records if id(r) in rejections) if rejections else None
            rest = len(chunk.records) - (sum(counts.values()) if counts else 0)
            if failed:
                chunk.ticket.settle(rejected=counts, failed=rest, error=error)
            else:
                chunk.ticket.settle(durable=rest, rejected=counts)

    def _store(
        self, records: list[RequestRecord], *, replayed: bool, rejections: dict[int, str], acknowledged: bool = True
    ) -> None:
        """Insert within ``write_timeout``; bisect around records the database refuses (noted in ``rejections``);
        raise when it is unreachable. ``acknowledged``: the clients were already told the records are accepted
        (the reason of a refusal says so)."""
        started = self._clock()
        try:
            with deadline(self.write_timeout):
                inserted, duplicates = self._insert(self.engine, records)
        except Exception as exc:
            with self._stats_lock:
                self.stats.write_errors += 1
            if is_unreachable(exc):
                raise
            if len(records) == 1:
                self._reject(records, exc, acknowledged=acknowledged or replayed, rejections=rejections)
                return
            half = len(records) // 2
            self._store(records[:half], replayed=replayed, rejections=rejections, acknowledged=acknowledged)
            self._store(records[half:], replayed=replayed, rejections=rejections, acknowledged=acknowledged)
            return
        now = self._clock()
        self._next_probe = now + self.probe_interval
        with self._stats_lock:
            self.stats.stored += inserted
            self.stats.duplicates += duplicates
            self.stats.batches += 1
            self.stats.last_batch_seconds = now - started
            if replayed:
                self.stats.replayed += len(records)

    def _went_down(self, exc: BaseException) -> None:
        was_ok = self.db_ok
        self.db_ok = False
        self.last_error = describe(exc)
        if was_ok:
            log.warning("database unreachable, spooling to %s: %s", self.spool.path, self.last_error)
            self._backoff = self.retry_interval
        else:
            self._backoff = min(self._backoff * 2, self.max_retry_interval)
        self._next_retry = self._clock() + self._backoff

    def _spool_lines(self, lines: list[str], n: int, *, final: bool) -> int | None:
        """Append ``n`` records' lines to the spool (fsync'd); the spool's size after them, or None when it cannot
        take them (over ``spool_max_bytes`` while the database is down, or unwritable)."""
        if not lines:
            return self.spool.size()
        problem = None
        if not final and not self.db_ok and self.spool_max_bytes and self.spool.size() >= self.spool_max_bytes:
            problem = f"spool over its {self.spool_max_bytes}-byte limit"
        else:
            try:
                return self.spool.append_lines(lines)
            except (OSError, ValueError) as exc:
                problem = f"cannot write the spool: {exc}"
        with self._stats_lock:
            if final:
                self.stats.lost += n
            else:
                self.stats.not_durable += n
        if final:
            log.error("%s at shutdown: %d records are lost", problem, n)
        else:
            log.error("%s: %d records not accepted yet", problem, n)
        return None

    def _reject(
        self, records: list[RequestRecord], exc: BaseException, *, acknowledged: bool, rejections: dict[int, str]
    ) -> None:
        orig = getattr(exc, "orig", None) or exc
        reason = f"database refused{' after acknowledgement' if acknowledged else ''}: {orig.__class__.__name__}"
        log.error("database refused %d record(s), keeping them in %s: %s", len(records), self.rejected_path, exc)
        try:
            append_lines(self.rejected_path, [record_to_json(r) for r in records])
        except (OSError, ValueError) as err:
            log.error("cannot write %s: %s", self.rejected_path, err)
        with self._stats_lock:
            self.stats.rejected += len(records)
            self.stats.rejected_reasons[reason] = self.stats.rejected_reasons.get(reason, 0) + len(records)
        for record in records:
            rejections[id(record)] = reason

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
        """Probe, then replay the spool in order; the database counts as back once all of it is stored."""
        replayed = 0
        try:
            with deadline(self.write_timeout):
                self._probe(self.engine)
            while True:
                records, end = self.spool.read(self.batch_size)
                if records:
                    self._store(records, replayed=True, rejections={})
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
        self.last_error = None
        self._backoff = self.retry_interval
        self._next_probe = self._clock() + self.probe_interval

    def _retain(self, retention: timedelta) -> None:
        self._next_retention = self._clock() + self.retention_interval
        cutoff = self._now() - retention
        try:  # in bounded chunks, each statement within the statement timeout
            deleted = self._delete_older(self.engine, cutoff)
        except Exception as exc:
            if not is_unreachable(exc):
                log.exception("retention pass failed")
                return
            self._went_down(exc)
            return
        with self._stats_lock:
            self.stats.retention_deleted += deleted
