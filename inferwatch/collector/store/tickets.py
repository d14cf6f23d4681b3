"""What the writer tells of the records offered to it: a :class:`Ticket` per offered batch (what became of each
record), :class:`WriterStats` overall; and a batch as it waits in the writer's queue (:class:`Chunk`)."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Mapping

from inferwatch.collector.store.rows import Prepared
from inferwatch.collector.store.spool import Mark


@dataclasses.dataclass
class WriterStats:
    """Counters of a :class:`Writer` (records unless stated otherwise)."""

    stored: int = 0
    """rows inserted (live and replayed)."""
    duplicates: int = 0
    """records skipped because their (trace_id, span_id) was already stored."""
    spooled: int = 0
    """records left in the spool for a later replay (the database unreachable when their turn came)."""
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
    """accepted records that could be neither spooled nor stored: their tickets fail, the client is told to retry."""
    lost: int = 0
    """records that reached neither the database nor the spool at shutdown (the spool could not be written)."""
    batches: int = 0
    """successful insert calls (each one transaction)."""
    last_batch_seconds: float = 0.0
    write_errors: int = 0
    """failed insert calls (unreachable database or refused content)."""
    retention_deleted: int = 0
    """rows deleted by the retention pass."""
    retention_steps: int = 0
    """delete transactions of the retention (each one between two of the writer's inserts)."""
    retention_longest_step: float = 0.0
    """seconds of the longest retention step: the longest the writer stalled for retention."""


class Ticket:
    """What became of one offered batch.

    ``refused``: why it was not accepted at all (``queue_full``, ``spool_full``, ``stopping``), else None.
    Otherwise :meth:`wait` until each record is ``durable`` (in the spool, fsync'd, or committed),
    ``rejected`` by the database (counted by reason) or ``failed`` (neither spooled nor stored; ``error``
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
class Chunk:
    """One offered batch in the queue: ``mark`` is where it ends in the spool (None: it could not be spooled,
    and its ticket waits for the database)."""

    batch: Prepared
    ticket: Ticket
    mark: Mark | None
    settled: bool = False
