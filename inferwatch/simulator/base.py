"""What every simulated engine shares: settings, the engine runtime, request handles, spans, text.

An engine package (``simulator/engines/<engine>/``: ``api``, ``metrics``, ``spans``) adds its HTTP API,
its ``/metrics`` dialect and its span shapes on top of :class:`SimulatedEngine`.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from inferwatch.simulator.clock import Clock, SimClock
from inferwatch.simulator.gpus import GpuConfig, SimulatedGpus
from inferwatch.simulator.profiles import GpuProfile, Profile, get_gpu_profile, get_profile
from inferwatch.simulator.runtime import EngineLoop, LoadGenerator, apply_gpu_profile, apply_profile, lognormal_int
from inferwatch.simulator.scheduler import EngineParams, Finish, Sequence, ServingModel, StepReport

OtlpProtocol = Literal["http/protobuf", "grpc"]

WORDS = (
    " the",
    " of",
    " and",
    " to",
    " in",
    " a",
    " is",
    " that",
    " for",
    " it",
    " as",
    " was",
    " with",
    " be",
    " by",
    " on",
    " not",
    " he",
    " this",
    " are",
    " or",
    " his",
    " from",
    " at",
    " which",
    " but",
    " have",
    " an",
    " had",
    " they",
    " you",
    " were",
    " their",
    " one",
    " all",
    " we",
)


def count_tokens(text: str) -> int:
    """A stand-in tokenizer: about three bytes per token (what the real capture's workload shows)."""
    return max(1, len(text.encode()) // 3)


@dataclass
class SimSettings:
    """How one simulated engine runs (``inferwatch simulate`` options)."""

    engine: str
    model: str = "sim-model"
    host: str = "127.0.0.1"
    port: int = 8000
    profile: str | None = None
    """the load profile; ``None``: the GPU profile's load, else ``steady``."""
    load: float | None = None
    """requests/s of the built-in load generator (``None``: the profile's rate; 0: no built-in load)."""
    otlp_endpoint: str | None = None
    otlp_protocol: OtlpProtocol = "http/protobuf"
    seed: int = 0
    speed: float = 1.0
    params: EngineParams = field(default_factory=EngineParams)
    version: str = ""
    gpu_profile: str = "normal"
    gpus: int = 1
    """simulated GPUs beneath the engine (tensor parallelism), on its ``/dcgm/metrics`` page."""
    gpu_xid: int = 0
    """an XID the last GPU reports ``gpu_xid_after`` seconds after start (0: the GPU profile's, if any)."""
    gpu_xid_after: float = 30.0


class SpanSink:
    """An OpenTelemetry SDK tracer provider of our own (never the global one) with an OTLP exporter."""

    def __init__(
        self,
        endpoint: str,
        protocol: OtlpProtocol,
        scope: str,
        resource: Mapping[str, Any],
        exporter: SpanExporter | None = None,
    ) -> None:
        self.provider = TracerProvider(resource=Resource.create(dict(resource)))
        if exporter is None:
            if protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

                exporter = Grpc(endpoint=endpoint, insecure=True)
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

                exporter = Http(endpoint=endpoint)
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=1000))
        self.tracer: Tracer = self.provider.get_tracer(scope)

    def shutdown(self) -> None:
        self.provider.shutdown()


def parent_context(headers: Mapping[str, str]) -> Context | None:
    """The W3C trace context of an incoming request (``traceparent``/``tracestate``), if any."""
    carrier = {k: v for k, v in headers.items() if k.lower() in ("traceparent", "tracestate")}
    if not carrier:
        return None
    return TraceContextTextMapPropagator().extract(carrier=carrier)


def ns(t: float) -> int:
    return int(t * 1e9)


class RequestHandle:
    """The sequences of one user request and a stream of their events."""

    def __init__(self, engine: SimulatedEngine, seqs: list[Sequence]) -> None:
        self.engine = engine
        self.seqs = seqs
        self.queue: asyncio.Queue[tuple[Sequence, str]] = asyncio.Queue()
        for s in seqs:
            s.listener = self._listen

    def _listen(self, seq: Sequence, kind: str) -> None:
        self.queue.put_nowait((seq, kind))

    async def events(self) -> AsyncIterator[tuple[Sequence, str]]:
        """``(sequence, "token" | "finish")`` until every sequence has finished."""
        open_ = len(self.seqs)
        while open_:
            seq, kind = await self.queue.get()
            if kind == "finish":
                open_ -= 1
            yield seq, kind

    async def wait(self) -> None:
        async for _ in self.events():
            pass

    def abort(self) -> None:
        for s in self.seqs:
            if s.finish is None:
                self.engine.loop.abort(s)

    def text(self, seq: Sequence) -> str:
        return "".join(self.engine.token_text(seq, i) for i in range(seq.generated))


class EngineMetrics:
    """Base for an engine's metrics dialect: observes the serving model, renders ``/metrics``."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, engine: SimulatedEngine) -> None:
        self.engine = engine

    def on_submit(self, seq: Sequence) -> None:
        return None

    def on_step(self, report: StepReport) -> None:
        return None

    def render(self) -> str:
        raise NotImplementedError


class SimulatedEngine:
    """The serving model, its clock and loop, the built-in load, the active profiles and the GPUs beneath it
    (:mod:`inferwatch.simulator.gpus`, which slow its steps when their clocks drop).

    The clock is scaled wall time (``settings.speed``) unless one is given (a virtual clock in tests).
    """

    def __init__(
        self, settings: SimSettings, span_exporter: SpanExporter | None = None, clock: Clock | None = None
    ) -> None:
        self.settings = settings
        self.params = settings.params
        self.rng = random.Random(settings.seed)
        self.clock: Clock = clock if clock is not None else SimClock(speed=settings.speed)
        self.model = ServingModel(self.params, random.Random(settings.seed + 1))
        self.loop = EngineLoop(self.model, self.clock)
        self.gpu_profile: GpuProfile = get_gpu_profile(settings.gpu_profile)
        self.profile: Profile = self._load_of(settings.profile, self.gpu_profile).with_rps(settings.load)
        apply_profile(self.params, self.profile)
        apply_gpu_profile(self.params, self.gpu_profile)
        self.gpus = SimulatedGpus(
            GpuConfig(
                engine=settings.engine,
                port=settings.port,
                profile=self.gpu_profile,
                count=settings.gpus,
                seed=settings.seed,
                xid=settings.gpu_xid,
                xid_after=settings.gpu_xid_after,
            ),
            start=self.clock.now(),
        )
        self.gpus.pending_start = lambda: self.model.pending_start
        self.model.gpu_time_scale = self.gpus.time_scale
        self.loop.observers.append(self.gpus)
        self.load = LoadGenerator(
            self.submit_internal,
            self.clock,
            self.profile,
            self.params.max_model_len,
            random.Random(settings.seed + 2),
        )
        self.started = time.time()
        self.pid = os.getpid()
        self.spans: SpanSink | None = None
        self._span_exporter = span_exporter
        self._ids = 0
        self.on_internal_finish: list[Callable[[Sequence], None]] = []

    def open_spans(self, scope: str, resource: Mapping[str, Any]) -> None:
        if self.settings.otlp_endpoint or self._span_exporter is not None:
            self.spans = SpanSink(
                self.settings.otlp_endpoint or "",
                self.settings.otlp_protocol,
                scope,
                resource,
                self._span_exporter,
            )

    def add_observer(self, metrics: EngineMetrics) -> None:
        self.loop.observers.append(metrics)

    @asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """FastAPI lifespan: run the engine while the app serves."""
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    async def start(self) -> None:
        self.loop.start()
        if self.profile.rps > 0:
            self.load.start()

    async def stop(self) -> None:
        await self.load.stop()
        await self.loop.stop()
        if self.spans is not None:
            self.spans.shutdown()

    @staticmethod
    def _load_of(name: str | None, gpu: GpuProfile) -> Profile:
        if name is not None:
            return get_profile(name)
        return gpu.load if gpu.load is not None else get_profile("steady")

    def set_profile(self, name: str, rps: float | None = None) -> Profile:
        """Switch the load profile; ``rps`` overrides its rate (else ``--load``, else the profile's)."""
        return self._switch_load(get_profile(name), rps)

    def set_gpu_profile(self, name: str) -> GpuProfile:
        """Switch the GPU profile, and the load to the one it brings (if any)."""
        gpu = get_gpu_profile(name)
        self.gpu_profile = gpu
        self.gpus.set_profile(gpu)
        apply_gpu_profile(self.params, gpu)
        if gpu.load is not None:
            self._switch_load(gpu.load, None)
        return gpu

    def _switch_load(self, profile: Profile, rps: float | None) -> Profile:
        if rps is not None:
            profile = profile.with_rps(rps)
        elif self.settings.load is not None:
            profile = profile.with_rps(self.settings.load)
        self.profile = profile
        self.load.profile = profile
        apply_profile(self.params, profile)
        if profile.rps > 0 and (self.load._task is None or self.load._task.done()):
            self.load.start()
        return profile

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def output_len(self, max_tokens: int, ignore_eos: bool) -> int:
        """How many tokens a sequence generates before EOS (the profile's distribution)."""
        if ignore_eos:
            return max_tokens + 1  # never emits EOS: it stops at max_tokens (finish reason "length")
        p = self.profile
        return lognormal_int(self.rng, p.output_mean, p.output_sigma, 1, 4 * max(p.output_mean, 1))

    def token_text(self, seq: Sequence, index: int) -> str:
        return WORDS[(zlib.crc32(seq.request_id.encode()) + 7 * index + seq.seq_index) % len(WORDS)]

    def new_request(
        self,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int,
        n: int = 1,
        ignore_eos: bool = False,
        prefix_key: str | None = None,
        prefix_tokens: int = 0,
    ) -> RequestHandle:
        """Create and submit the ``n`` sequences of a request. Raises ValueError when it cannot fit."""
        now = self.clock.now()
        seqs = [
            Sequence(
                request_id=request_id,
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                output_tokens=self.output_len(max_tokens, ignore_eos),
                arrival=now,
                prefix_key=prefix_key,
                prefix_tokens=prefix_tokens,
                seq_index=i,
            )
            for i in range(n)
        ]
        handle = RequestHandle(self, seqs)
        for s in seqs:
            self.loop.submit(s)
        return handle

    def submit_internal(
        self, prompt: int, max_tokens: int, output: int, prefix_key: str | None, prefix_tokens: int
    ) -> None:
        """The built-in load generator's requests (not seen by the HTTP layer)."""
        seq = Sequence(
            request_id=f"load-{self.next_id()}",
            prompt_tokens=prompt,
            max_tokens=max_tokens,
            output_tokens=output,
            arrival=self.clock.now(),
            prefix_key=prefix_key,
            prefix_tokens=prefix_tokens,
        )
        seq.listener = self._internal_listener
        try:
            self.loop.submit(seq)
        except ValueError:
            return
        self.load.started()

    def _internal_listener(self, seq: Sequence, kind: str) -> None:
        if kind == "finish":
            self.load.finished()
            for cb in self.on_internal_finish:
                cb(seq)


def finish_word(finish: Finish | None) -> str:
    """OpenAI-style finish reason."""
    return "length" if finish is Finish.LENGTH else "stop"
