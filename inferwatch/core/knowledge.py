"""The operating knowledge inferwatch was founded on, as data: said once, shown everywhere.

The alert runbooks, the dashboards' operating notes and the diagnosis read these tables; none
of them spells the knowledge itself.
"""

from __future__ import annotations

from typing import Final

KV_CACHE_FORMULA: Final = "2 × layers × KV heads × head dim × sequence length × batch × bytes per element"
"""Bytes of KV cache a batch needs (the factor 2: one key and one value vector per token)."""

SYMPTOM_TABLE: Final[tuple[tuple[str, str, str], ...]] = (
    ("P99 latency high", "queue backlog", "cut concurrency"),
    ("Low throughput", "memory-bound", "quantize or add tensor parallelism"),
    ("Preemptions", "KV cache too small", "more KV memory, lower concurrency"),
    ("Slow TTFT", "long prompts", "chunked prefill"),
    ("Slow TPOT", "model too big", "quantize, tensor parallelism, speculative decoding"),
)
"""(symptom, likely cause, remedy) rows, in the order an on-call engineer checks them."""

TUNING_CHECKLIST: Final[tuple[str, ...]] = (
    "Quantization (weights and KV cache)",
    "Continuous batching",
    "Prefix caching for shared prompts",
    "Concurrency (max_num_seqs) matched to the KV cache",
    "GPU memory utilization",
    "Speculative decoding",
    "Tensor parallelism",
    "Quantization method",
)
