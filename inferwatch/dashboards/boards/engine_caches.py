"""The LLM Engine Detail dashboard's caches row: prefix cache, KV cache and speculative decoding."""

from __future__ import annotations

from inferwatch.core import vocabulary as V
from inferwatch.dashboards.panels import (
    TIMESERIES,
    UNIT_RATIO,
    UNIT_TOKENS_PER_S,
    Panel,
    Query,
    Row,
)
from inferwatch.dashboards.promql import (
    EM,
    describe,
    legend_format,
    positive,
    sum_rate,
)


def ratio(num: V.MetricSpec, den: V.MetricSpec, by: tuple[str, ...] = EM) -> str:
    """``rate(num) / rate(den)`` per ``by`` group (groups whose ``den`` does not move drop out)."""
    return f"{sum_rate(num, by)} / {positive(sum_rate(den, by))}"


SPEC_DECODE_IDLE = (
    "No data yet for this selection and time range; an engine that counts speculative tokens reports them "
    "only while speculative decoding is enabled."
)


def cache_panels() -> list[Panel | Row]:
    """The row "Caches and speculative decoding" and its panels."""
    return [
        Row("Caches and speculative decoding"),
        Panel(
            "Prefix-cache hit rate",
            describe(
                "Prompt tokens found in the prefix cache over prompt tokens looked up (hit rate), and over all "
                "prompt tokens (share of prompt tokens whose prefill was skipped)",
                V.PREFIX_CACHE_HIT_TOKENS,
                V.PREFIX_CACHE_QUERIED_TOKENS,
                V.PROMPT_TOKENS,
            ),
            UNIT_RATIO,
            (
                Query(
                    ratio(V.PREFIX_CACHE_HIT_TOKENS, V.PREFIX_CACHE_QUERIED_TOKENS),
                    legend_format(EM, "hit rate"),
                    (V.PREFIX_CACHE_HIT_TOKENS, V.PREFIX_CACHE_QUERIED_TOKENS),
                    True,
                ),
                Query(
                    ratio(V.PREFIX_CACHE_HIT_TOKENS, V.PROMPT_TOKENS),
                    legend_format(EM, "share of prompt tokens"),
                    (V.PREFIX_CACHE_HIT_TOKENS, V.PROMPT_TOKENS),
                    True,
                ),
            ),
            TIMESERIES,
            12,
            8,
            min=0,
            max=1,
        ),
        Panel(
            "Prompt tokens computed vs from the prefix cache",
            describe(
                "Prompt tokens per second that prefill computed (prompt tokens minus prefix-cache hits) and "
                "those served from the prefix cache, stacked to the prompt tokens per second",
                V.PROMPT_TOKENS,
                V.PREFIX_CACHE_HIT_TOKENS,
            ),
            UNIT_TOKENS_PER_S,
            (
                Query(
                    f"clamp_min({sum_rate(V.PROMPT_TOKENS)} - {sum_rate(V.PREFIX_CACHE_HIT_TOKENS)}, 0)",
                    legend_format(EM, "computed"),
                    (V.PROMPT_TOKENS, V.PREFIX_CACHE_HIT_TOKENS),
                    True,
                ),
                Query(
                    sum_rate(V.PREFIX_CACHE_HIT_TOKENS),
                    legend_format(EM, "prefix cache"),
                    (V.PREFIX_CACHE_HIT_TOKENS,),
                    True,
                ),
            ),
            TIMESERIES,
            12,
            8,
            stacked=True,
        ),
        Panel(
            "Speculative-decoding acceptance rate",
            describe(
                "Draft tokens accepted by the target model over draft tokens proposed",
                V.SPEC_DECODE_ACCEPTED_TOKENS,
                V.SPEC_DECODE_DRAFT_TOKENS,
            ),
            UNIT_RATIO,
            (
                Query(
                    ratio(V.SPEC_DECODE_ACCEPTED_TOKENS, V.SPEC_DECODE_DRAFT_TOKENS),
                    legend_format(EM),
                    (V.SPEC_DECODE_ACCEPTED_TOKENS, V.SPEC_DECODE_DRAFT_TOKENS),
                    True,
                ),
            ),
            TIMESERIES,
            8,
            8,
            min=0,
            max=1,
            idle=SPEC_DECODE_IDLE,
        ),
        Panel(
            "Speculative tokens/s: drafted, accepted, rejected",
            describe(
                "Draft tokens proposed, accepted and rejected (proposed - accepted: wasted draft and verification "
                "work) per second",
                V.SPEC_DECODE_DRAFT_TOKENS,
                V.SPEC_DECODE_ACCEPTED_TOKENS,
            ),
            UNIT_TOKENS_PER_S,
            (
                Query(
                    sum_rate(V.SPEC_DECODE_DRAFT_TOKENS),
                    legend_format(EM, "drafted"),
                    (V.SPEC_DECODE_DRAFT_TOKENS,),
                    True,
                ),
                Query(
                    sum_rate(V.SPEC_DECODE_ACCEPTED_TOKENS),
                    legend_format(EM, "accepted"),
                    (V.SPEC_DECODE_ACCEPTED_TOKENS,),
                    True,
                ),
                Query(
                    f"{sum_rate(V.SPEC_DECODE_DRAFT_TOKENS)} - {sum_rate(V.SPEC_DECODE_ACCEPTED_TOKENS)}",
                    legend_format(EM, "rejected"),
                    (V.SPEC_DECODE_DRAFT_TOKENS, V.SPEC_DECODE_ACCEPTED_TOKENS),
                    True,
                ),
            ),
            TIMESERIES,
            8,
            8,
            idle=SPEC_DECODE_IDLE,
        ),
        Panel(
            "Output from drafts",
            describe(
                "Share of generated tokens that were accepted draft tokens",
                V.SPEC_DECODE_ACCEPTED_TOKENS,
                V.GENERATION_TOKENS,
            ),
            UNIT_RATIO,
            (
                Query(
                    ratio(V.SPEC_DECODE_ACCEPTED_TOKENS, V.GENERATION_TOKENS),
                    legend_format(EM),
                    (V.SPEC_DECODE_ACCEPTED_TOKENS, V.GENERATION_TOKENS),
                    True,
                ),
            ),
            TIMESERIES,
            8,
            8,
            min=0,
            max=1,
            idle=SPEC_DECODE_IDLE,
        ),
    ]
