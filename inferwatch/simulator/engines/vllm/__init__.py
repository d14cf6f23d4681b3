"""Simulated vLLM 0.33: OpenAI-compatible API, ``/metrics`` in vLLM's exact families, ``llm_request`` spans.

The metrics are registered with prometheus_client exactly as vLLM's ``PrometheusStatLogger`` does
(names, label names, bucket families, pre-created children, ``_created`` series, the
``cache_config_info`` info gauge, the HTTP instrumentator's families that appear after the first
request), so the exposition is rendered by the same library as a real vLLM's. Sources: vllm.md
§1–3 and the real 0.32.0 capture (``tests/fixtures/engines/vllm/0.32.0-cpu``).

The package: ``metrics`` (``/metrics``), ``spans`` (``llm_request``) and ``api`` (the routes, :func:`create`).
"""

from __future__ import annotations

from inferwatch.simulator.engines.vllm.api import VllmSim, create

__all__ = ["VllmSim", "create"]
