"""``inferwatch simulate`` and ``inferwatch demo``: simulated engines, and the whole fleet on this machine."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from inferwatch.cli.common import err, fail, needs_extra
from inferwatch.core.config import SimEngine

OtlpChoice = Literal["http/protobuf", "grpc"]
DEMO_MODULES = ("httpx", "aiohttp", "fastapi", "uvicorn", "sqlalchemy", "numpy", "grpc", "grafanalib")
"""A library of each extra the demo's parts need (exporter, proxy, sim, collector, generate)."""


def simulate(
    engine: Annotated[SimEngine, typer.Option(help="Which engine's wire formats to simulate.")],
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1.")] = 8000,
    model: Annotated[str, typer.Option(help="Served model name.")] = "sim-model",
    profile: Annotated[str, typer.Option(help="Load profile (see --list-profiles).")] = "steady",
    load: Annotated[
        float | None, typer.Option(help="Built-in load in requests/s (default: the profile's; 0: none).")
    ] = None,
    otlp_endpoint: Annotated[
        str | None, typer.Option(help="Send per-request spans here (e.g. http://127.0.0.1:4318/v1/traces).")
    ] = None,
    otlp_protocol: Annotated[OtlpChoice, typer.Option(help="OTLP transport.")] = "http/protobuf",
    seed: Annotated[int, typer.Option(help="Random seed (lengths, arrivals, failures).")] = 0,
    speed: Annotated[float, typer.Option(help="Simulated seconds per wall second (time compression).")] = 1.0,
    blocks: Annotated[int | None, typer.Option(help="KV-cache blocks (default: about 16k tokens).")] = None,
    block_size: Annotated[int | None, typer.Option(help="Tokens per KV block.")] = None,
    max_num_seqs: Annotated[int, typer.Option(help="Sequences in the running batch at most.")] = 64,
    max_model_len: Annotated[int, typer.Option(help="Context length (prompt + output).")] = 4096,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    list_profiles: Annotated[bool, typer.Option(help="List the load profiles and exit.")] = False,
) -> None:
    """Serve a simulated LLM engine: its API, /metrics in its exact dialect, and its spans.

    For demos and tests without a GPU; point inferwatch at real engines in production. Switch the
    profile at runtime with: curl -XPOST localhost:PORT/simulator/profile -d '{"profile":"kv-pressure"}'
    """
    with needs_extra("sim", "simulate"):
        from inferwatch.simulator.base import SimSettings
        from inferwatch.simulator.profiles import PROFILES
        from inferwatch.simulator.server import default_params, serve

    if list_profiles:
        for p in PROFILES.values():
            typer.echo(f"{p.name:14} {p.rps:5g} rps  {p.description}")
        return
    if profile not in PROFILES:
        raise fail(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    params = default_params(engine)
    if block_size:
        params.num_blocks = params.num_blocks * params.block_size // block_size
        params.block_size = block_size
    if blocks:
        params.num_blocks = blocks
    params.max_num_seqs = max_num_seqs
    params.max_model_len = max_model_len
    settings = SimSettings(
        engine=engine,
        model=model,
        host=host,
        port=port,
        profile=profile,
        load=load,
        otlp_endpoint=otlp_endpoint,
        otlp_protocol=otlp_protocol,
        seed=seed,
        speed=speed,
        params=params,
    )
    err.print(f"simulated {engine} serving http://{host}:{port} (model {model}, profile {profile}, speed {speed:g}x)")
    serve(settings)


def demo(
    duration: Annotated[
        float | None, typer.Option(help="Stop after this many seconds (default: until Ctrl-C).")
    ] = None,
    vllm_profile: Annotated[str, typer.Option("--profile", help="Load profile of the simulated vLLM.")] = "steady",
    speed: Annotated[float, typer.Option(help="Simulated seconds per wall second.")] = 1.0,
    base_port: Annotated[int, typer.Option(help="First port to use (0: any free ports).")] = 0,
) -> None:
    """The whole pipeline here, on 127.0.0.1: simulated engines, exporters, Prometheus, Alertmanager, collector.

    A simulated vLLM, TGI, trtllm-serve, Triton, SGLang and llama.cpp under load, an exporter beside each,
    inferwatch proxy in front of TGI and llama.cpp, the collector
    (spans, diagnosis, alert webhook) and, when Debian's prometheus and prometheus-alertmanager are
    installed, Prometheus with the generated rules and Alertmanager delivering to the collector. The
    live view (80 columns) shows traffic, latency, KV usage, preemptions, SLO burn, the top diagnosis
    per engine and the incidents. --profile kv-pressure fires the chain within about two minutes.
    Ctrl-C (or --duration) stops every process it started.
    """
    # the demo runs every part, as child processes: their libraries are checked before any starts
    with needs_extra("all", "demo", also=DEMO_MODULES):
        from inferwatch.demo import run_demo

    raise typer.Exit(run_demo(duration=duration, vllm_profile=vllm_profile, speed=speed, base_port=base_port))
