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
    profile: Annotated[
        str | None,
        typer.Option(help="Load profile (see --list-profiles; default: the GPU profile's load, else steady)."),
    ] = None,
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
    gpu_profile: Annotated[
        str, typer.Option(help="What the simulated GPUs do (see --list-profiles); page at /dcgm/metrics.")
    ] = "normal",
    gpus: Annotated[int, typer.Option(help="Simulated GPUs beneath the engine (tensor parallel), 1 to 8.")] = 1,
    gpu_xid: Annotated[
        int, typer.Option(help="An XID the last GPU reports (13, 31, 48, 79, 94, 95, 119; 0: the GPU profile's).")
    ] = 0,
    gpu_xid_after: Annotated[float, typer.Option(help="Simulated seconds after start of --gpu-xid.")] = 30.0,
    list_profiles: Annotated[bool, typer.Option(help="List the load and GPU profiles and exit.")] = False,
) -> None:
    """Serve a simulated LLM engine: its API, /metrics in its exact dialect, and its spans.

    For demos and tests without a GPU; point inferwatch at real engines in production. Its GPUs'
    dcgm-exporter page is at /dcgm/metrics. Switch profiles at runtime with:
    curl -XPOST localhost:PORT/simulator/profile -d '{"profile":"kv-pressure"}' (or /simulator/gpu)
    """
    with needs_extra("sim", "simulate"):
        from inferwatch.simulator.base import SimSettings
        from inferwatch.simulator.dcgm import XID_MESSAGES
        from inferwatch.simulator.gpus import MAX_GPUS
        from inferwatch.simulator.profiles import GPU_PROFILES, PROFILES
        from inferwatch.simulator.server import default_params, serve

    if list_profiles:
        for p in PROFILES.values():
            typer.echo(f"{p.name:14} {p.rps:5g} rps  {p.description}")
        typer.echo("\nGPU profiles (--gpu-profile):")
        for g in GPU_PROFILES.values():
            typer.echo(f"{g.name:14} {g.description}")
        return
    if profile is not None and profile not in PROFILES:
        raise fail(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    if gpu_profile not in GPU_PROFILES:
        raise fail(f"unknown GPU profile {gpu_profile!r}; known: {', '.join(GPU_PROFILES)}")
    if not 1 <= gpus <= MAX_GPUS:
        raise fail(f"--gpus must be 1 to {MAX_GPUS}, not {gpus}")
    if gpu_xid and gpu_xid not in XID_MESSAGES:
        raise fail(f"--gpu-xid {gpu_xid} is not simulated; known: {', '.join(map(str, XID_MESSAGES))}")
    if gpu_xid_after < 0:
        raise fail("--gpu-xid-after cannot be negative")
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
        gpu_profile=gpu_profile,
        gpus=gpus,
        gpu_xid=gpu_xid,
        gpu_xid_after=gpu_xid_after,
    )
    gpu = GPU_PROFILES[gpu_profile]
    load_name = profile or (gpu.load.name if gpu.load is not None else "steady")
    err.print(
        f"simulated {engine} serving http://{host}:{port} (model {model}, profile {load_name}, "
        f"GPU {gpu_profile} x{gpus} at /dcgm/metrics, speed {speed:g}x)"
    )
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
