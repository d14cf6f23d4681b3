"""The request store's public SQL contract: the table and column names that readers query.

The collector writes this table; the Requests dashboard and users' own SQL read it. Timing and
token columns are named after the canonical vocabulary's metric keys (``time_to_first_token``,
``request_queue``...), so a stored request and a metric series speak the same words.
"""

from __future__ import annotations

from typing import Final

from inferwatch.core import vocabulary as V

REQUEST_TABLE: Final = "inference_requests"

TTFT: Final = V.TIME_TO_FIRST_TOKEN.key
TPOT: Final = V.TIME_PER_OUTPUT_TOKEN.key
E2E: Final = V.REQUEST_DURATION.key
QUEUE: Final = V.REQUEST_QUEUE.key
PREFILL: Final = V.REQUEST_PREFILL.key
DECODE: Final = V.REQUEST_DECODE.key
PROMPT_TOKENS: Final = V.PROMPT_TOKENS.key
GENERATION_TOKENS: Final = V.GENERATION_TOKENS.key
CACHED_TOKENS: Final = V.PREFIX_CACHE_HIT_TOKENS.key
LATENCY_FIELDS: Final[tuple[str, ...]] = (TTFT, TPOT, E2E, QUEUE, PREFILL, DECODE)
