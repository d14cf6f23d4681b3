"""Load profiles that reproduce the operating failure modes, each visible in the engine's own metrics,
and GPU profiles: what the GPU beneath the engine does (its page: :mod:`inferwatch.simulator.dcgm`).

A profile sets the built-in load (arrival rate, prompt and output lengths, shared prefixes, a client
concurrency cap) and a few engine behaviours (decode speed, failure share). The engine's capacity (KV
blocks, sequence slots) never changes at runtime, as on a real engine: the failure modes come from the
load meeting it.

A GPU profile (``--gpu-profile``) sets the GPU's power limit, an XID error, and where the bottleneck
is: a GPU profile may bring the load that shows it (``saturated`` runs ``kv-pressure``, ``throttled`` a
load the engine serves at boost clock and not at the capped one), which ``--profile`` overrides when given.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    rps: float
    prompt_mean: int
    prompt_sigma: float
    output_mean: int
    output_sigma: float
    prefix_share: float = 0.0
    """share of requests that start with one of a few shared prefixes (system prompts)."""
    prefix_tokens: int = 0
    decode_slowdown: float = 1.0
    error_rate: float = 0.0
    max_tokens: int = 512
    concurrency: int = 0
    """requests in flight at most (a client's concurrency cap; arrivals wait for a free slot); 0: none."""

    def with_rps(self, rps: float | None) -> Profile:
        return self if rps is None else replace(self, rps=rps)


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("steady", "moderate load well within capacity", 4.0, 200, 0.6, 120, 0.5),
        Profile(
            "kv-pressure",
            "long outputs at high concurrency: KV usage near 1, preemptions climb (KV cache too small)",
            14.0,
            400,
            0.3,
            700,
            0.2,
            max_tokens=1024,
        ),
        Profile(
            "queue-buildup",
            "arrivals above capacity: waiting grows and P99 latency climbs (cut concurrency)",
            60.0,
            120,
            0.5,
            80,
            0.4,
        ),
        Profile(
            "long-prompts",
            "very long prompts: high TTFT (chunked prefill, shorter prompts)",
            0.5,
            3500,
            0.1,
            80,
            0.5,
        ),
        Profile(
            "slow-decode",
            "every decode step 30 times slower: high TPOT (model too big for the hardware)",
            1.0,
            200,
            0.6,
            150,
            0.4,
            decode_slowdown=30.0,
        ),
        Profile("errors", "a share of requests fail in the engine", 4.0, 200, 0.6, 120, 0.5, error_rate=0.15),
        Profile(
            "prefix-heavy",
            "most requests share long system prompts: high prefix-cache hit rate",
            6.0,
            900,
            0.2,
            100,
            0.5,
            prefix_share=0.9,
            prefix_tokens=768,
        ),
    )
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None


BOARD_POWER_LIMIT = 700.0
"""Watts: the simulated board's default power limit (an H100 SXM's)."""


@dataclass(frozen=True)
class GpuProfile:
    """What the simulated GPUs beneath an engine do, and the engine behaviours that put the bottleneck
    where the profile says (in the GPU, in front of it, or in its clocks)."""

    name: str
    description: str
    load: Profile | None = None
    """the built-in load that shows the profile, used unless ``--profile`` is given (``None``: steady)."""
    power_limit: float = BOARD_POWER_LIMIT
    """watts the board may draw: above it the clocks drop, and every step's GPU work takes longer."""
    host_step: float = 0.0
    """seconds of host work per engine step, the GPU idle (``EngineParams.host_step``)."""
    input_rate: float = 0.0
    """prompt tokens/s of the host's input stage (``EngineParams.input_rate``); 0: instant."""
    xid: int = 0
    """an XID error the last GPU reports ``xid_after`` seconds after start; 0: none."""
    xid_after: float = 30.0


CLIENT_BOUND_LOAD = Profile(
    "client-bound",
    "24 clients, one request each in flight: 600-token prompts, 120-token outputs",
    8.0,
    600,
    0.3,
    120,
    0.5,
    concurrency=24,
)

NEAR_CAPACITY_LOAD = Profile(
    "near-capacity",
    "18 rps of short requests (120-token prompts, 100-token outputs): about 80 % of what the engine serves at "
    "boost clock, more than it serves with every step 1.6 times longer",
    18.0,
    120,
    0.5,
    100,
    0.4,
)
"""The ``throttled`` profile's load: at boost clock the batch settles near 25 sequences and the queue
stays near empty (a request waits at most for the step in flight); at the 300 W cap's clock (about
1230 MHz) the batch fills its 64 slots and the queue grows by about 4 requests a second, as a throttled
replica backs up. The KV cache stays under 0.8: the clock, not the memory, is what limits."""

GPU_PROFILES: dict[str, GpuProfile] = {
    g.name: g
    for g in (
        GpuProfile("normal", "a healthy GPU at boost clock; activity follows the load"),
        GpuProfile(
            "saturated",
            "the GPU is the bottleneck: activity ~0.97, KV full (kv-pressure)",
            load=PROFILES["kv-pressure"],
        ),
        GpuProfile(
            "client_bound",
            "the host is the bottleneck: requests wait, the GPU mostly idle",
            load=CLIENT_BOUND_LOAD,
            host_step=0.02,
            input_rate=1000.0,
        ),
        GpuProfile(
            "throttled",
            "300 W cap: the SM clock drops and the queue grows (near-capacity)",
            load=NEAR_CAPACITY_LOAD,
            power_limit=300.0,
        ),
        GpuProfile(
            "xid",
            "healthy until the last GPU reports XID 79 after 30 s",
            xid=79,
        ),
    )
}


def get_gpu_profile(name: str) -> GpuProfile:
    try:
        return GPU_PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown GPU profile {name!r}; known: {', '.join(GPU_PROFILES)}") from None
