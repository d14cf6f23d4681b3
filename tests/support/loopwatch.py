"""Event-loop stall detection for tests: a watchdog thread pings a running loop and records how late each ping ran.

Every ``interval`` (10 ms) the watchdog schedules a callback with ``call_soon_threadsafe`` and measures the time
until the loop runs it. A loop that is free runs it within a millisecond or two; a coroutine that calls something
blocking (a database connect, a file read, ``time.sleep``, a synchronous HTTP client) holds every callback, the
ping included, for as long as it blocks. A ping later than ``threshold`` (100 ms) is a stall: the watchdog takes
the loop thread's stack at that moment (``sys._current_frames``), so the failure names the blocking call.

Why this and not asyncio's debug mode (``loop.set_debug(True)``, ``slow_callback_duration``, the "Executing ...
took X seconds" warnings of the ``asyncio`` logger):

* it measures what a client feels: the time from "ready to run" to "ran", whichever callback held the loop, and
  also a run of callbacks that each stay under the limit but together hold the loop past it;
* its cost is 100 tiny callbacks a second, while debug mode instruments every callback and coroutine (creation
  tracebacks, thread checks), which inflates the very latencies a fault test measures;
* it works on any loop, uvloop included (uvicorn's default where it is installed), without relying on that
  loop's debug support;
* a stall comes with the stack of the call that blocked, not only the name of a task's step.

A late ping is a block only when code was running on the loop thread: its stack then holds frames beyond the
event loop's own (a callback, a task's step, what they called). A loop found inside its own machinery (the
selector's wait, or no Python frame at all in uvloop) was not held by any coroutine: its thread was waiting for
the CPU or the GIL (a busy machine: the suite runs on two shared cores next to other jobs). Such a stall is
counted as starvation and reported, not failed: the ping's lag counts both, only a block is the code's fault.
A block longer than threshold plus interval (110 ms) is always caught while in progress: the ping it holds was
sent at most one interval before it began.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import selectors
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import uvicorn

THRESHOLD_S: Final = 0.1
"""A ping later than this is a stall: the loop was blocked."""
INTERVAL_S: Final = 0.01
_LOOP_FILES: Final = (os.path.dirname(asyncio.__file__) + os.sep, selectors.__file__, threading.__file__, __file__)
"""Where the frames of a thread running an event loop come from while no callback runs: the thread's start, the
runner (:func:`served_watched`), the loop (the pure-Python loop's; uvloop's have no Python frame)."""


@dataclass(frozen=True)
class Stall:
    lag: float
    """seconds from the ping's scheduling to its run."""
    stack: str
    """the loop thread's stack when the ping was ``threshold`` late (what blocked it)."""
    blocked: bool
    """code was running on the loop thread then (else the loop was waiting for the CPU or the GIL: starvation)."""


class LoopWatch:
    """``attach(loop)`` from inside the loop's thread starts the watchdog; :meth:`check` fails on any stall."""

    def __init__(self, threshold: float = THRESHOLD_S, interval: float = INTERVAL_S) -> None:
        self.threshold = threshold
        self.interval = interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lags: list[float] = []
        self._stalls: list[Stall] = []

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch ``loop``; call it from the thread that runs the loop (its stack is the one taken on a stall)."""
        loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._run, args=(loop, loop_thread), name="loopwatch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def reset(self) -> None:
        """Forget the pings so far (e.g. the app's startup)."""
        with self._lock:
            self._lags.clear()
            self._stalls.clear()

    @property
    def pings(self) -> int:
        with self._lock:
            return len(self._lags)

    @property
    def worst(self) -> float:
        with self._lock:
            return max(self._lags, default=0.0)

    @property
    def stalls(self) -> list[Stall]:
        with self._lock:
            return list(self._stalls)

    @property
    def blocks(self) -> list[Stall]:
        """The stalls during which code held the loop."""
        return [s for s in self.stalls if s.blocked]

    @property
    def starved(self) -> int:
        """The stalls during which the loop waited for the CPU or the GIL (no code of ours held it)."""
        return sum(1 for s in self.stalls if not s.blocked)

    def check(self) -> None:
        """AssertionError naming the worst block (lag and the blocking stack) when code ever held the loop longer
        than the threshold."""
        assert self.pings > 0, "the loop watch saw no ping run: was it attached to the serving loop?"
        blocks = self.blocks
        if blocks:
            worst = max(blocks, key=lambda s: s.lag)
            raise AssertionError(
                f"the event loop was blocked {len(blocks)} time(s) longer than {self.threshold * 1000:.0f} ms "
                f"(worst {worst.lag * 1000:.0f} ms); the loop thread's stack then:\n{worst.stack}"
            )

    def _run(self, loop: asyncio.AbstractEventLoop, loop_thread: int) -> None:
        while not self._stop.wait(self.interval):
            ran: list[float] = []
            done = threading.Event()

            def ping(ran: list[float] = ran, done: threading.Event = done) -> None:
                ran.append(time.perf_counter())
                done.set()

            sent = time.perf_counter()
            try:
                loop.call_soon_threadsafe(ping)
            except RuntimeError:  # the loop is closed
                return
            stack, blocked = "", False
            if not done.wait(self.threshold):
                stack, blocked = _sample(loop_thread)
                while not done.wait(0.05):
                    if self._stop.is_set() or loop.is_closed():
                        return
            lag = ran[0] - sent
            with self._lock:
                self._lags.append(lag)
                if lag > self.threshold:
                    self._stalls.append(Stall(lag, stack, blocked))


def _sample(thread: int) -> tuple[str, bool]:
    """The thread's stack, and whether code beyond the event loop's own was running in it."""
    frame = sys._current_frames().get(thread)
    if frame is None:
        return "(the loop thread is gone)", False
    entries = traceback.extract_stack(frame)
    blocked = any(not e.filename.startswith(_LOOP_FILES) for e in entries)
    return "".join(traceback.format_list(entries)), blocked


@contextlib.contextmanager
def served_watched(app: Any, watch: LoopWatch, *, startup_timeout: float = 20.0) -> Iterator[str]:
    """``app`` under uvicorn (its default loop, uvloop when installed) on 127.0.0.1 in a background thread, the loop
    watched by ``watch`` from the end of the app's startup; yields the base URL; stopped on exit."""
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="on")
    server = uvicorn.Server(config)

    async def main() -> None:
        watch.attach(asyncio.get_running_loop())
        try:
            await server.serve(sockets=[sock])
        finally:
            watch.stop()

    def run() -> None:
        with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
            runner.run(main())

    thread = threading.Thread(target=run, name="uvicorn-watched", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        watch.reset()  # the startup (migrations, spawning the ingest processes) serves no request
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
