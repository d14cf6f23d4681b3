"""Histogram bucket families shared by the simulated vLLM and trtllm-serve.

vLLM's defaults (``vllm/v1/metrics/buckets.py``, vllm.md §1.3); TensorRT-LLM's metrics collector uses
the same lists for its request histograms (trtllm.md §2.4).
"""

from __future__ import annotations

from typing import Final

TTFT_BUCKETS: Final[tuple[float, ...]] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""time to first token."""
ITL_BUCKETS: Final[tuple[float, ...]] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""inter-token latency and per-request time per output token."""
LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
"""end-to-end, queue, prefill, decode and inference time (request latency)."""
