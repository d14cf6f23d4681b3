"""The rollup job in a process of its own: what ``collector serve`` runs on a store it opens itself.

Why a process: a pass is CPU-bound Python and numpy for up to ``PASS_BUDGET_S`` seconds. In the collector's own
process it held the GIL against the writer thread, whose inserts give the GIL up and take it back at every row
(``sqlite3`` releases it around each step): one thread spinning in Python cut a raw sqlite3 insert of the
request table from 15-40k to 2-3k rows/s (docs/collector.md, 'measurements'). In a process of its own the job
uses the cores' idle time and leaves ingest alone; the database's own locking is the same as between two
connections of one process.

The process is started from the fork server (never forked from the collector, whose threads a fork would copy
mid-state), is named ``iw-rollups`` for the operating system (``ps``, ``top``; bench/collector.py counts its CPU
as the maintenance's), ignores SIGINT and SIGTERM (the collector stops it: a signal to the process group must
not end it under a collector that is still flushing) and ends when the collector is gone (``watch``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from collections.abc import Callable
from typing import Any, Final

from inferwatch.collector.stats.rollup import INTERVAL_S, THREAD_NAME, RollupJob, Stop
from inferwatch.collector.store import db

log = logging.getLogger("inferwatch.collector")

START_METHOD: Final = "forkserver"
STOP_GRACE_S: Final = 10.0
"""How long :meth:`RollupProcess.stop` waits for the pass under way to end before it terminates the process."""


class RollupProcess:
    """:class:`~inferwatch.collector.stats.rollup.RollupJob` in a child process on the store at ``url``.

    ``watch(pid)``: run first in the child, it ends the child when the process ``pid`` (the collector) is gone
    (e.g. :func:`inferwatch.collector.ingest.prepare.exit_with`, which also makes it ignore SIGINT and SIGTERM).
    ``interval`` may be changed until :meth:`start`.
    """

    def __init__(
        self,
        url: str,
        timeouts: db.DbTimeouts,
        interval: float = INTERVAL_S,
        *,
        watch: Callable[[int], None] | None = None,
    ) -> None:
        self.url = url
        self.timeouts = timeouts
        self.interval = interval
        self.watch = watch
        self._stop: Stop | None = None
        self._process: Any = None

    @property
    def running(self) -> bool:
        return self._process is not None

    def start(self) -> None:
        if self._process is not None:
            return
        context = multiprocessing.get_context(START_METHOD)
        self._stop = context.Event()
        self._process = context.Process(
            target=_main,
            args=(self.url, self.timeouts, self.interval, self._stop, self.watch, os.getpid()),
            name=THREAD_NAME,
            daemon=True,
        )
        self._process.start()

    def stop(self, timeout: float = STOP_GRACE_S) -> None:
        """Ask the job to stop after its pass (whose work is one transaction per step: nothing half-written), and
        wait; a process that does not end in ``timeout`` seconds is terminated."""
        process, self._process = self._process, None
        if process is None:
            return
        assert self._stop is not None
        self._stop.set()
        process.join(timeout)
        if process.is_alive():
            log.warning("the rollup process did not stop within %.0f s: terminated", timeout)
            process.kill()
            process.join(5.0)


def _main(
    url: str, timeouts: db.DbTimeouts, interval: float, stop: Stop, watch: Callable[[int], None] | None, parent: int
) -> None:
    if watch is not None:
        watch(parent)
    else:  # as ``exit_with`` does: a signal to the process group is the collector's to act on
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
    engine = db.make_engine(url, timeouts)
    try:
        RollupJob(engine, interval, stop=stop).run()
    finally:
        engine.dispose()
