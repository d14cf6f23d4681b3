"""Drive the serving model on a clock, with a built-in load generator.

``EngineLoop`` runs steps: plan at ``now``, wait on the clock until the step's simulated end, complete
it, tell the observers (the engine's metrics) and the per-request listeners (HTTP streams).
``LoadGenerator`` submits Poisson arrivals with log-normal prompt and output lengths from the active
:class:`~inferwatch.simulator.profiles.Profile`. Both take the clock as a parameter
(:mod:`inferwatch.simulator.clock`): scaled wall time when serving, virtual time in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from inferwatch.simulator.clock import Clock
from inferwatch.simulator.profiles import GpuProfile, Profile
from inferwatch.simulator.scheduler import EngineParams, Sequence, ServingModel, StepReport


class Observer(Protocol):
    def on_submit(self, seq: Sequence) -> None: ...
    def on_step(self, report: StepReport) -> None: ...


@dataclass
class EngineLoop:
    """Runs the serving model; ``submit`` is safe to call from request handlers."""

    model: ServingModel
    clock: Clock
    observers: list[Observer] = field(default_factory=list)
    _wake: asyncio.Event | None = None
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(self, seq: Sequence) -> None:
        self.model.add(seq)
        for obs in self.observers:
            obs.on_submit(seq)
        if self._wake is not None:
            self._wake.set()

    def abort(self, seq: Sequence) -> None:
        self.model.abort(seq, self.clock.now())

    async def _run(self) -> None:
        """Steps run back to back in simulated time while the engine is busy; idle, it waits for a submit."""
        assert self._wake is not None
        engine_t = self.clock.now()
        while True:
            report = self.model.plan(max(engine_t, self.clock.now()))
            if report is None:
                self._wake.clear()
                ready = self.model.next_ready()
                if ready is None:
                    await self._wake.wait()
                else:
                    await self._wait_until(ready)
                engine_t = self.clock.now()
                continue
            await self.clock.wait_step_end(report.end)
            engine_t = report.end
            done = self.model.complete()
            for obs in self.observers:
                obs.on_step(done)

    async def _wait_until(self, t: float) -> None:
        """Until the clock reaches ``t`` (the queue's head leaves the host's input stage) or a submit."""
        assert self._wake is not None
        timer = asyncio.ensure_future(self.clock.sleep_until(t))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait((timer, woken), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (timer, woken):
                task.cancel()
            await asyncio.gather(timer, woken, return_exceptions=True)


def lognormal_int(rng: random.Random, mean: float, sigma: float, low: int, high: int) -> int:
    """A log-normal draw with the given mean (not median), clamped to ``[low, high]``."""
    mu = math.log(max(mean, 1.0)) - sigma * sigma / 2
    return max(low, min(high, int(rng.lognormvariate(mu, sigma))))


@dataclass
class LoadGenerator:
    """Poisson arrivals from the active profile, submitted straight to the engine loop."""

    submit: Callable[[int, int, int, str | None, int], None]
    """(prompt_tokens, max_tokens, output_tokens, prefix_key, prefix_tokens) -> None."""
    clock: Clock
    profile: Profile
    max_model_len: int
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    _task: asyncio.Task[None] | None = None
    sent: int = 0
    in_flight: int = 0
    """requests sent and not finished (what the profile's client concurrency cap counts)."""
    _slot: asyncio.Event = field(default_factory=asyncio.Event)

    def draw(self) -> tuple[int, int, int, str | None, int]:
        p = self.profile
        limit = self.max_model_len - 1
        prompt = lognormal_int(self.rng, p.prompt_mean, p.prompt_sigma, 4, limit - 1)
        max_tokens = min(p.max_tokens, self.max_model_len - prompt)
        output = lognormal_int(self.rng, p.output_mean, p.output_sigma, 1, 4 * max(p.output_mean, 1))
        prefix_key, prefix_tokens = None, 0
        if p.prefix_share and self.rng.random() < p.prefix_share:
            prefix_key = f"system-prompt-{self.rng.randrange(4)}"
            prefix_tokens = min(p.prefix_tokens, prompt - 1)
            prompt = max(prompt, prefix_tokens + 16)
            max_tokens = max(1, min(max_tokens, self.max_model_len - prompt))
        return prompt, max_tokens, output, prefix_key, prefix_tokens

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="load-generator")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def started(self) -> None:
        """The engine took one of its requests (one it refused takes no client slot)."""
        self.in_flight += 1

    def finished(self) -> None:
        """One of its requests finished: a client slot is free again."""
        self.in_flight = max(0, self.in_flight - 1)
        self._slot.set()

    async def _run(self) -> None:
        """Arrivals until the profile's rate drops to 0 (``SimulatedEngine.set_profile`` starts it again).

        With a client concurrency cap (``Profile.concurrency``) an arrival waits for a free slot, as a
        benchmark client with at most that many requests in flight does; the next arrival counts from then.
        """
        next_at = self.clock.now()
        while True:
            rps = self.profile.rps
            if rps <= 0:
                return
            next_at += self.rng.expovariate(rps)
            await self.clock.sleep_until(next_at)
            if self.profile.concurrency > 0 and self.in_flight >= self.profile.concurrency:
                while self.profile.concurrency > 0 and self.in_flight >= self.profile.concurrency:
                    self._slot.clear()
                    await self._slot.wait()
                next_at = max(next_at, self.clock.now())
            self.submit(*self.draw())
            self.sent += 1


def apply_profile(params: EngineParams, profile: Profile) -> None:
    """Engine behaviours a profile sets (decode speed, failure share); capacity stays as configured."""
    params.decode_slowdown = profile.decode_slowdown
    params.error_rate = profile.error_rate


def apply_gpu_profile(params: EngineParams, profile: GpuProfile) -> None:
    """Engine behaviours a GPU profile sets (the host's share of a step, its input stage)."""
    params.host_step = profile.host_step
    params.input_rate = profile.input_rate
