"""One collector per data directory: an exclusive lock held for as long as the collector runs.

The spool's own lock is a thread lock, good within one process only: two collectors on one data directory
would append to, replay and truncate each other's spool, and a truncation by one can lose records the other
acknowledged. :class:`DataDirLock` takes ``fcntl.flock`` on ``<data_dir>/collector.lock`` at start (the
kernel drops it when the process ends, ``kill -9`` included, so a crash never leaves a stale lock) and writes
who holds it into the file, so that a second collector refuses to start naming the directory and the holder.
The descriptor is not inherited by child processes (close-on-exec), so the ingest workers never keep it.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

LOCK_FILE: Final = "collector.lock"


class DataDirInUse(RuntimeError):
    """Another collector holds the data directory."""


class DataDirLock:
    """The exclusive lock of one data directory (:meth:`acquire` at start, :meth:`release` at the end)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock; :class:`DataDirInUse` (naming the holder) when another process has it."""
        if self._fd is not None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "a process that did not say who it is"
            os.close(fd)
            raise DataDirInUse(
                f"data directory {self.directory} is in use by another collector ({holder}); two collectors on "
                "one data directory can lose acknowledged spans: give each its own --data-dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        who = f"pid {os.getpid()} on {socket.gethostname()}, since {datetime.now(UTC).isoformat(timespec='seconds')}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{who}: {' '.join(sys.argv)[:300]}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Let the lock go (the file stays: removing it would race a collector starting now)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
