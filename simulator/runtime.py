"""Drive the serving model in (scaled) real time, with a built-in load generator.

``SimClock`` maps wall time to simulated seconds (``speed`` x faster). ``EngineLoop`` runs steps:
plan at ``now``, sleep until the step's simulated end, complete it, tell the observers (the
engine's metrics) and the per-request listeners (HTTP streams). ``LoadGenerator`` submits Poisson
arrivals with log-normal prompt and output lengths from the active :class:`~inferwatch.simulator.profiles.Profile`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from inferwatch.simulator.model import EngineParams, Sequence, ServingModel, StepReport
from inferwatch.simulator.profiles import Profile

TIMER_SLACK = 0.003
"""Wall seconds the engine may run ahead of the clock before it sleeps (asyncio timers are ~1 ms)."""


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


class Observer(Protocol):
    def on_submit(self, seq: Sequence) -> None: ...
    def on_step(self, report: StepReport) -> None: ...


@dataclass
class EngineLoop:
    """Runs the serving model; ``submit`` is safe to call from request handlers."""

    model: ServingModel
    clock: SimClock
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
        """Steps run back to back in simulated time while the engine is busy.

        The loop sleeps only when the engine is ahead of the (scaled) wall clock by more than the
        timer's granularity, and aims a little early: otherwise each step would cost at least one
        timer tick of wall time, which at high ``speed`` inflates every simulated latency.
        """
        assert self._wake is not None
        engine_t = self.clock.now()
        while True:
            report = self.model.plan(max(engine_t, self.clock.now()))
            if report is None:
                self._wake.clear()
                await self._wake.wait()
                engine_t = self.clock.now()
                continue
            ahead = (report.end - self.clock.now()) / self.clock.speed
            if ahead > TIMER_SLACK:
                await asyncio.sleep(ahead - TIMER_SLACK / 2)
            else:
                await asyncio.sleep(0)
            engine_t = report.end
            done = self.model.complete()
            for obs in self.observers:
                obs.on_step(done)


def lognormal_int(rng: random.Random, mean: float, sigma: float, low: int, high: int) -> int:
    """A log-normal draw with the given mean (not median), clamped to ``[low, high]``."""
    mu = math.log(max(mean, 1.0)) - sigma * sigma / 2
    return max(low, min(high, int(rng.lognormvariate(mu, sigma))))


@dataclass
class LoadGenerator:
    """Poisson arrivals from the active profile, submitted straight to the engine loop."""

    submit: Callable[[int, int, int, str | None, int], None]
    """(prompt_tokens, max_tokens, output_tokens, prefix_key, prefix_tokens) -> None."""
    clock: SimClock
    profile: Profile
    max_model_len: int
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    _task: asyncio.Task[None] | None = None
    sent: int = 0

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

    async def _run(self) -> None:
        next_at = self.clock.now()
        while True:
            rps = self.profile.rps
            if rps <= 0:
                await asyncio.sleep(0.2)
                next_at = self.clock.now()
                continue
            next_at += self.rng.expovariate(rps)
            await self.clock.sleep_until(next_at)
            self.submit(*self.draw())
            self.sent += 1


def apply_profile(params: EngineParams, profile: Profile) -> None:
    """Engine behaviours a profile sets (decode speed, failure share); capacity stays as configured."""
    params.decode_slowdown = profile.decode_slowdown
    params.error_rate = profile.error_rate
