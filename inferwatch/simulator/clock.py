"""Simulated time for the engine loop and the load generator (seconds since the epoch).

:class:`SimClock` maps wall time to simulated time (``speed`` x faster): what ``inferwatch simulate``
runs on. :class:`VirtualClock` moves only when driven, which is what tests run on: no wall-clock
sleeps and the same schedule on every run. ``await clock.advance(seconds)`` runs every timer due in
order; :meth:`VirtualClock.run` awaits a coroutine and moves time from timer to timer whenever every
task waits (the coroutine may itself sleep on the clock). Before each jump the other tasks (the
engine loop, the load generator, in-process HTTP handlers) run until none of them is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sized
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

TIMER_SLACK = 0.003
"""Wall seconds the engine may run ahead of a :class:`SimClock` before it sleeps (asyncio timers are ~1 ms)."""
VIRTUAL_EPOCH = 1_700_000_000.0
"""Where a :class:`VirtualClock` starts by default (2023-11-14, any fixed time would do)."""
RUN_LIMIT = 600.0
"""Simulated seconds :meth:`VirtualClock.run` moves at most before it gives up."""
SETTLE_TURNS = 10_000
"""Event-loop turns a :class:`VirtualClock` waits at most for the other tasks to go idle before a jump."""
FALLBACK_SETTLE_TURNS = 64
"""Turns it waits when the event loop does not expose its ready queue (then it cannot tell idleness)."""


class Clock(Protocol):
    """What the engine loop and the load generator need of time."""

    def now(self) -> float: ...

    async def sleep_until(self, t: float) -> None:
        """Return once the simulated time is ``t`` or later (at once when it is)."""
        ...

    async def wait_step_end(self, t: float) -> None:
        """Wait for the end ``t`` of an engine step; may return a little early, and always lets other tasks run."""
        ...


@dataclass
class SimClock:
    """Simulated seconds since the epoch, running ``speed`` times faster than the wall clock."""

    speed: float = 1.0
    _wall0: float = field(default_factory=time.monotonic)
    _epoch0: float = field(default_factory=time.time)

    def now(self) -> float:
        return self._epoch0 + (time.monotonic() - self._wall0) * self.speed

    async def sleep_until(self, t: float) -> None:
        delay = (t - self.now()) / self.speed
        if delay > 0:
            await asyncio.sleep(delay)

    async def wait_step_end(self, t: float) -> None:
        """Sleep only when the engine is ahead of the (scaled) wall clock by more than the timer's
        granularity, and aim a little early: otherwise each step would cost at least one timer tick of
        wall time, which at high ``speed`` inflates every simulated latency."""
        ahead = (t - self.now()) / self.speed
        if ahead > TIMER_SLACK:
            await asyncio.sleep(ahead - TIMER_SLACK / 2)
        else:
            await asyncio.sleep(0)


class VirtualClock:
    """Simulated time that moves only when driven (:meth:`advance`, :meth:`run`); timers fire in time order,
    ties in the order they were set."""

    def __init__(self, start: float = VIRTUAL_EPOCH) -> None:
        self._now = start
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._driving = False

    def now(self) -> float:
        return self._now

    @property
    def timers(self) -> int:
        """Timers set and not yet fired (or cancelled)."""
        return sum(1 for _, _, fut in self._timers if not fut.done())

    async def sleep_until(self, t: float) -> None:
        if t <= self._now:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (t, next(self._order), fut))
        await fut

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self._now + seconds)

    async def wait_step_end(self, t: float) -> None:
        if t > self._now:
            await self.sleep_until(t)
        else:
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move time ``seconds`` forward: every timer due on the way fires in order, and the other tasks
        run until idle before each jump and after the last."""
        if seconds < 0:
            raise ValueError(f"cannot move time backwards ({seconds} s)")
        with self._drive():
            target = self._now + seconds
            await self._settle()
            while (due := self._next_due()) is not None and due <= target:
                self._fire_next()
                await self._settle()
            self._now = target
            await self._settle()

    async def run(self, aw: Awaitable[T], limit: float = RUN_LIMIT) -> T:
        """Await ``aw``, moving time to the next timer whenever every task waits, until ``aw`` is done.

        Raises TimeoutError after ``limit`` simulated seconds, and RuntimeError when nothing is left to
        fire while ``aw`` still waits (on something other than this clock: a deadlock in virtual time).
        """
        with self._drive():
            task = asyncio.ensure_future(aw)
            deadline = self._now + limit
            try:
                while True:
                    await self._settle()
                    if task.done():
                        return task.result()
                    due = self._next_due()
                    if due is None:
                        raise RuntimeError("nothing left to run in virtual time, yet the awaitable is not done")
                    if due > deadline:
                        raise TimeoutError(f"not done after {limit:g} simulated seconds")
                    self._fire_next()
            finally:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    @contextlib.contextmanager
    def _drive(self) -> Iterator[None]:
        if self._driving:
            raise RuntimeError("the virtual clock is already being driven (advance/run do not nest)")
        self._driving = True
        try:
            yield
        finally:
            self._driving = False

    def _next_due(self) -> float | None:
        while self._timers and self._timers[0][2].done():  # cancelled sleeps
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def _fire_next(self) -> None:
        t, _, fut = heapq.heappop(self._timers)
        self._now = max(self._now, t)
        fut.set_result(None)

    async def _settle(self) -> None:
        """Yield to the event loop until no other callback is ready (every task waits on something)."""
        ready: Sized | None = getattr(asyncio.get_running_loop(), "_ready", None)  # asyncio's ready queue
        for _ in range(SETTLE_TURNS if ready is not None else FALLBACK_SETTLE_TURNS):
            await asyncio.sleep(0)
            if ready is not None and not ready:
                return


def run_virtual(
    main: Callable[[VirtualClock], Coroutine[Any, Any, T]], limit: float = RUN_LIMIT, start: float = VIRTUAL_EPOCH
) -> T:
    """``asyncio.run`` of ``main(clock)`` on a fresh :class:`VirtualClock` driven by :meth:`VirtualClock.run`."""
    clock = VirtualClock(start)

    async def driven() -> T:
        return await clock.run(main(clock), limit)

    return asyncio.run(driven())
