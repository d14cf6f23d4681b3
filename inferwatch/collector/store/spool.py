"""The spool: the collector's write-ahead log of accepted records, append-only JSON-lines segments read back in order.

A span is acknowledged only once it is here, fsync'd (:class:`Spool`: group commit, segments, marks; read
back by the writer thread, :mod:`inferwatch.collector.store.writer`, from the last commit). :func:`append_lines`
appends durably to a plain file (the ``.rejected`` file beside the spool).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from inferwatch.collector.store.record import RequestRecord
from inferwatch.collector.store.rows import record_from_json, record_to_json

log = logging.getLogger("inferwatch.collector")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


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
        _write_all(fd, data)
        os.fsync(fd)
        end = os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)
    if created:
        _fsync_dir(path.parent)
    return end


Mark = tuple[int, int]
"""A place in the spool: (segment number, byte offset in it)."""
SEGMENT_BYTES: Final = 64 << 20
"""A spool segment is closed (and a new one started) past this size, so consumed segments can be deleted while
records keep arriving."""


class Spool:
    """The write-ahead log of accepted records: append-only JSON-lines segments, read back in order.

    Segments are ``<path>`` (number 0), then ``<path>.1``, ``<path>.2``…; appends go to the newest, which is
    closed past ``segment_bytes``. :meth:`write` appends under a lock (its ``then`` callback runs under it,
    so the writer's queue has the order of the file) and :meth:`sync` makes it durable: one fsync covers
    every write made before it started, so concurrent callers share it (group commit). The applier reads
    from the last :meth:`commit` on (:meth:`read`); :meth:`commit` deletes the segments before its mark and
    :meth:`finish` empties the spool once everything in it is committed.

    Marks are (segment, logical offset): emptying the newest segment moves its logical start forward
    instead of reusing offsets, so a mark never points at bytes written after it was taken. A segment keeps
    its logical start when it is closed: a byte's place in the file is its logical offset less the start of
    its segment (a segment emptied by :meth:`finish` and then filled past ``segment_bytes`` starts past 0).
    """

    def __init__(self, path: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.path = path
        self.segment_bytes = segment_bytes
        self.corrupt = 0
        """unparsable lines skipped (a write torn by a crash)."""
        self._lock = threading.Lock()
        self._sync_cond = threading.Condition()
        numbers = [0] if path.exists() else []
        for other in path.parent.glob(path.name + ".*"):
            suffix = other.name[len(path.name) + 1 :]
            if suffix.isdigit():
                numbers.append(int(suffix))
        self._segments: list[int] = sorted(numbers) or [0]
        self._active = self._segments[-1]
        self._ends = {n: self._file(n).stat().st_size for n in self._segments[:-1]}
        """logical ends of the closed segments."""
        self._starts: dict[int, int] = {}
        """logical offsets of the closed segments' first bytes (absent: 0, as for every segment found at open)."""
        self._base = 0
        """logical offset of the newest segment's first byte."""
        active = self._file(self._active)
        self._size = active.stat().st_size if active.exists() else 0
        self._fd: int | None = None
        self._committed: Mark = (self._segments[0], 0)
        self._cursor: Mark = self._committed
        self._written = 0  # writes made (a sequence number)
        self._synced = 0  # writes known durable
        self._syncing = False

    def _file(self, number: int) -> Path:
        return self.path if number == 0 else self.path.with_name(f"{self.path.name}.{number}")

    def _end(self) -> Mark:
        return (self._active, self._base + self._size)

    def _normal(self, mark: Mark) -> Mark:
        """The same place, at the start of the next segment when it is the end of a closed one."""
        number, offset = mark
        while number != self._active and offset >= self._ends.get(number, 0):
            later = [n for n in self._segments if n > number]
            number, offset = (later[0], 0) if later else (self._active, self._base)
        return number, offset

    # --- appending (any thread) ---

    def _open(self) -> int:
        if self._fd is None:
            path = self._file(self._active)
            created = not path.exists()
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # a line torn by a crash stays one bad line
                _write_all(fd, b"\n")
                size += 1
            self._fd, self._size = fd, size
            if created:
                _fsync_dir(path.parent)
        return self._fd

    def write(self, lines: Sequence[str], then: Callable[[Mark], None] | None = None) -> tuple[Mark, int]:
        """Append ``lines`` (durable only after :meth:`sync`); ``then(mark)`` runs under the spool's lock.
        Returns the mark after them and the write's sequence number."""
        data = "".join(line + "\n" for line in lines).encode()
        with self._lock:
            fd = self._open()
            _write_all(fd, data)
            self._size += len(data)
            mark = self._end()
            self._written += 1
            seq = self._written
            if self._size >= self.segment_bytes:  # close this segment (durably) and start the next
                os.fsync(fd)
                os.close(fd)
                self._fd = None
                self._ends[self._active] = self._base + self._size
                if self._base:
                    self._starts[self._active] = self._base
                self._active += 1
                self._segments.append(self._active)
                self._base = self._size = 0
            if then is not None:
                then(mark)
        return mark, seq

    def sync(self, seq: int) -> None:
        """Return once write ``seq`` is on disk: one caller fsyncs for everyone waiting (group commit)."""
        with self._sync_cond:
            while self._synced < seq:
                if self._syncing:
                    self._sync_cond.wait()
                    continue
                self._syncing = True
                with self._lock:
                    target = self._written
                    fd = os.dup(self._fd) if self._fd is not None else None
                self._sync_cond.release()
                try:
                    if fd is not None:  # None: closed since, and closing fsync'd the segment
                        try:
                            os.fsync(fd)
                        finally:
                            os.close(fd)
                    synced = True
                except OSError:
                    synced = False
                    raise
                finally:
                    self._sync_cond.acquire()
                    if synced:
                        self._synced = max(self._synced, target)
                    self._syncing = False
                    self._sync_cond.notify_all()

    def append_lines(self, lines: Sequence[str]) -> Mark:
        """Append lines of :func:`record_to_json` durably; the mark after them."""
        mark, seq = self.write(lines)
        self.sync(seq)
        return mark

    def append(self, records: Sequence[RequestRecord]) -> Mark:
        return self.append_lines([record_to_json(r) for r in records])

    # --- sizes and marks ---

    def size(self) -> int:
        """Bytes in the spool's files (committed or not)."""
        total = 0
        for number in list(self._segments):
            with contextlib.suppress(FileNotFoundError):
                total += self._file(number).stat().st_size
        return total

    def pending(self) -> bool:
        """Whether anything was written after the last commit."""
        with self._lock:
            return self._normal(self._committed) < self._end()

    # --- reading back and committing (the applier's thread) ---

    def rewind(self) -> None:
        """Read again from the last commit (after a failed replay)."""
        with self._lock:
            self._cursor = self._committed

    def read(self, limit: int) -> tuple[list[RequestRecord], Mark]:
        """Up to ``limit`` records from the read cursor (across segments), and the mark after them."""
        records: list[RequestRecord] = []
        while True:
            with self._lock:
                number, offset = self._cursor = self._normal(self._cursor)
                base = self._base if number == self._active else self._starts.get(number, 0)
                end = self._base + self._size if number == self._active else self._ends.get(number, 0)
            path = self._file(number)
            try:
                with path.open("rb") as f:
                    f.seek(offset - base)
                    while len(records) < limit and offset < end:
                        line = f.readline(end - offset)
                        if not line:
                            break
                        offset += len(line)
                        if not line.strip():
                            continue
                        try:
                            records.append(record_from_json(line))
                        except (ValueError, TypeError, KeyError) as exc:
                            self.corrupt += 1
                            log.error("spool %s: skipping an unreadable line (%s): %.200r", path, exc, line)
            except FileNotFoundError:
                offset = end
            with self._lock:
                self._cursor = (number, offset)
                if len(records) >= limit or number == self._active:
                    return records, self._normal(self._cursor)

    def commit(self, mark: Mark) -> None:
        """Everything up to ``mark`` is in the database: delete the segments before it."""
        with self._lock:
            mark = self._normal(mark)
            if mark <= self._committed:
                return
            self._committed = mark
            self._cursor = max(self._cursor, mark)
            done = [n for n in self._segments if n < mark[0]]
            self._segments = [n for n in self._segments if n >= mark[0]]
            for number in done:
                self._ends.pop(number, None)
                self._starts.pop(number, None)
        for number in done:
            with contextlib.suppress(FileNotFoundError):
                self._file(number).unlink()

    def finish(self, *, sync: bool = True, then: Callable[[], None] | None = None) -> bool:
        """Empty the spool when everything in it is committed (``then`` runs under the spool's lock, no write
        in between); False when more was written.

        ``sync=False`` skips the fsync of the truncation: should it be lost in a crash, the records reappear
        and are replayed as duplicates, which is harmless.
        """
        with self._lock:
            end = self._end()
            if self._normal(self._committed) < end:
                return False
            if self._size:
                fd = self._open()
                os.ftruncate(fd, 0)
                if sync:
                    os.fsync(fd)
                self._base += self._size
                self._size = 0
            self._committed = self._cursor = self._end()
            done = [n for n in self._segments if n < self._active]
            self._segments = [self._active]
            self._ends.clear()
            self._starts.clear()
            if then is not None:
                then()
        for number in done:
            with contextlib.suppress(FileNotFoundError):
                self._file(number).unlink()
        return True

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
