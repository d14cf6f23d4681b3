"""Build and run a simulated engine's HTTP app (``inferwatch simulate``)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import signal
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse
from opentelemetry.sdk.trace.export import SpanExporter
from pydantic import BaseModel

from inferwatch.simulator import dcgm
from inferwatch.simulator.base import SimSettings, SimulatedEngine
from inferwatch.simulator.clock import Clock
from inferwatch.simulator.profiles import GPU_PROFILES, PROFILES
from inferwatch.simulator.scheduler import EngineParams

Factory = Callable[[SimulatedEngine], tuple[FastAPI, Any]]


ENGINES = ("vllm", "tgi", "trtllm", "triton", "sglang", "llamacpp")
"""The simulated engines, registered explicitly: each is the package ``simulator/engines/<name>/`` with ``create``."""


def engine_factory(name: str) -> Factory:
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    module = importlib.import_module(f"inferwatch.simulator.engines.{name}")
    factory: Factory = module.create
    return factory


def default_params(engine: str) -> EngineParams:
    """Capacity of a simulated engine: about 16k KV tokens, in the engine's usual block size."""
    block = {"vllm": 16, "tgi": 16, "trtllm": 32, "triton": 64, "sglang": 1, "llamacpp": 1}.get(engine, 16)
    return EngineParams(block_size=block, num_blocks=16384 // block)


class ProfileChange(BaseModel):
    profile: str
    rps: float | None = None


class GpuProfileChange(BaseModel):
    profile: str


def create_app(settings: SimSettings, span_exporter: SpanExporter | None = None, clock: Clock | None = None) -> FastAPI:
    """The simulated engine's app: its own API, ``/simulator/profile`` and ``/simulator/gpu`` to switch
    profiles live, and its GPUs' page in dcgm-exporter's dialect at ``/dcgm/metrics`` (a real
    dcgm-exporter is a process of its own, on ``:9400/metrics``).

    ``clock``: scaled wall time by default (``settings.speed``); tests pass a virtual clock.
    """
    factory = engine_factory(settings.engine)
    engine = SimulatedEngine(settings, span_exporter=span_exporter, clock=clock)
    app, sim = factory(engine)
    app.state.engine = engine
    app.state.sim = sim

    @app.get("/simulator/profile")
    async def get_profile() -> dict[str, Any]:
        p = engine.profile
        return {"profile": p.name, "description": p.description, "rps": p.rps, "profiles": sorted(PROFILES)}

    @app.post("/simulator/profile")
    async def set_profile(change: ProfileChange) -> dict[str, Any]:
        try:
            p = engine.set_profile(change.profile, change.rps)
        except KeyError as exc:
            raise HTTPException(status_code=400, detail=str(exc.args[0])) from None
        return {"profile": p.name, "description": p.description, "rps": p.rps}

    @app.get("/simulator/gpu")
    async def get_gpu_profile() -> dict[str, Any]:
        g = engine.gpu_profile
        return {
            "profile": g.name,
            "description": g.description,
            "uuids": [gpu.uuid for gpu in engine.gpus.gpus],
            "profiles": sorted(GPU_PROFILES),
        }

    @app.post("/simulator/gpu")
    async def set_gpu_profile(change: GpuProfileChange) -> dict[str, Any]:
        try:
            g = engine.set_gpu_profile(change.profile)
        except KeyError as exc:
            raise HTTPException(status_code=400, detail=str(exc.args[0])) from None
        return {"profile": g.name, "description": g.description, "load": engine.profile.name}

    @app.get(dcgm.PATH)
    async def dcgm_metrics() -> PlainTextResponse:
        return PlainTextResponse(dcgm.render(engine.gpus, engine.clock.now()), media_type=dcgm.CONTENT_TYPE)

    @app.get("/simulator/state")
    async def state() -> dict[str, Any]:
        m = engine.model
        return {
            "engine": settings.engine,
            "model": settings.model,
            "profile": engine.profile.name,
            "gpu_profile": engine.gpu_profile.name,
            "gpu_uuids": [gpu.uuid for gpu in engine.gpus.gpus],
            "running": len(m.running),
            "waiting": len(m.waiting),
            "kv_usage": m.kv_usage,
            "preemptions": m.preemptions_total,
            "steps": m.step_count,
            "load_sent": engine.load.sent,
        }

    return app


class _Server(uvicorn.Server):
    """uvicorn without its signal capture (which re-raises SIGTERM after shutdown): we stop it ourselves."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve(settings: SimSettings) -> None:
    """Run until SIGINT or SIGTERM, then shut down cleanly (lifespan shutdown flushes spans) and exit 0."""
    app = create_app(settings)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", lifespan="on")
    server = _Server(config)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        await server.serve()

    asyncio.run(main())
