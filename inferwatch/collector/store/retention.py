"""Retention: deleting the requests that started longer ago than the configured retention, oldest first.

:func:`delete_oldest` is one step (a delete transaction walking the start-time index from its old end);
:class:`RetentionSchedule` is when the writer's steps run and how large each is: a pass every
``retention_interval`` seconds, in steps sized to take about :data:`RETENTION_STEP_S`, the records queued
meanwhile inserted between two steps, so retention never stalls ingest for more than one short step (a pass in
one go stalled it for seconds on SQLite: docs/collector.md, 'measurements').
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy import Engine, delete, select

from inferwatch.collector.store.db import deadline
from inferwatch.collector.store.tables import REQUEST_TABLE

DeleteFn = Callable[[Engine, datetime, int], int]
"""Deletes at most ``limit`` rows older than the cutoff, in one transaction; how many it deleted."""

DELETE_CHUNK: Final = 10_000
"""Rows one statement of :func:`delete_older_than` deletes at most."""
RETENTION_STEP_S: Final = 0.03
"""What one retention step (one delete transaction between two of the writer's inserts) aims to take: the
writer's longest stall for retention stays well under 100 ms."""
RETENTION_ROWS: Final = (16, 128, 20_000)
"""Rows one retention step deletes: at least, at first, at most (adjusted to :data:`RETENTION_STEP_S`)."""


def delete_oldest(engine: Engine, cutoff: datetime, limit: int) -> int:
    """Delete at most ``limit`` of the oldest requests that started before ``cutoff`` (naive: UTC), in one
    transaction (walking the start-time index from its old end); the number deleted."""
    t = REQUEST_TABLE
    oldest = select(t.c.id).where(t.c.start_time < cutoff).order_by(t.c.start_time).limit(limit)
    with engine.begin() as conn:
        deleted: int = conn.execute(delete(t).where(t.c.id.in_(oldest.scalar_subquery()))).rowcount
    return deleted


def delete_older_than(engine: Engine, cutoff: datetime, chunk: int = DELETE_CHUNK) -> int:
    """Delete every request that started before ``cutoff`` (naive: UTC), ``chunk`` rows per transaction; the
    number deleted. (The writer's retention deletes in small steps between its inserts instead.)"""
    total = 0
    while True:
        deleted = delete_oldest(engine, cutoff, chunk)
        total += deleted
        if deleted < chunk:
            return total


class RetentionSchedule:
    """The writer's retention passes: when the next step is due and how many rows it deletes.

    ``clock`` is the writer's monotonic clock, ``now`` its UTC wall clock (the cutoff: ``retention`` before
    the pass starts), ``delete`` one step (:func:`delete_oldest` by default).
    """

    def __init__(
        self,
        retention: timedelta,
        interval: float,
        *,
        delete: DeleteFn,
        clock: Callable[[], float],
        now: Callable[[], datetime],
    ) -> None:
        self.retention = retention
        self.interval = interval
        self._delete = delete
        self._clock = clock
        self._now = now
        self.next_pass = 0.0
        self.cutoff: datetime | None = None
        """the pass in progress deletes what is older (None: no pass in progress)."""
        self.rows = RETENTION_ROWS[1]

    def due(self, now: float) -> bool:
        """Whether a step is to run now: a pass is in progress, or the next one's time has come."""
        return self.cutoff is not None or now >= self.next_pass

    def wake_at(self, now: float) -> float:
        """When the writer must run the next step (a pass in progress goes on at once)."""
        return now if self.cutoff is not None else self.next_pass

    def step(self, engine: Engine, timeout: float) -> tuple[int, float]:
        """One step of the pass (starting one when none is in progress): delete a few of the oldest rows, within
        ``timeout``; (rows deleted, seconds taken). The pass ends when fewer than asked for were left; a failed
        step ends it too, and raises."""
        if self.cutoff is None:
            self.cutoff = self._now() - self.retention
        limit = self.rows
        started = self._clock()
        try:
            with deadline(timeout):
                deleted = self._delete(engine, self.cutoff, limit)
        except Exception:
            self.cutoff = None
            self.next_pass = self._clock() + self.interval
            raise
        took = self._clock() - started
        smallest, _, largest = RETENTION_ROWS
        if took > RETENTION_STEP_S or deleted >= limit:  # the next step's size, in proportion (at most doubled)
            scaled = int(limit * min(1.5, RETENTION_STEP_S / max(took, 1e-6)))
            self.rows = max(smallest, min(largest, scaled))
        if deleted < limit:  # the pass is done
            self.cutoff = None
            self.next_pass = self._clock() + self.interval
        return deleted, took
