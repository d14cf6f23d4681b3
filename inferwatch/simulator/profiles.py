"""Load profiles that reproduce the operating failure modes, each visible in the engine's own metrics.

A profile sets the built-in load (arrival rate, prompt and output lengths, shared prefixes) and a few
engine behaviours (decode speed, failure share). The engine's capacity (KV blocks, sequence slots)
never changes at runtime, as on a real engine: the failure modes come from the load meeting it.
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
