"""Simulated SGLang at commit 44cedc2b9c7dd31d9acae4498ea4fa0d3665feed (``44cedc2``), faithful on the wire.

``44cedc2`` is on main between the 0.5.9 and 0.5.10 releases; its metric declarations are those of the
0.5.9 wheel on PyPI (compared file by file: ``tests/fixtures/engines/sglang/44cedc2/SOURCE.md``, which
also says where the released 0.5.9 differs: no ``engine_type`` on the tokenizer's series, and a
``cache_config_info`` series before the first request).

Sources (sgl-project/sglang; each file at the commit named, the stored version the reference index
holds): ``python/sglang/srt/observability/metrics_collector.py`` and
``python/sglang/srt/observability/scheduler_metrics_mixin.py`` at 44cedc2b9c7dd31d9acae4498ea4fa0d3665feed
(families, HELP texts, label names, buckets, when each is set);
``python/sglang/srt/entrypoints/http_server.py`` at 44cedc2b9c7dd31d9acae4498ea4fa0d3665feed (routes,
the native ``/generate`` and its ``data: …`` / ``data: [DONE]`` stream, ``/health``,
``/health_generate``, ``/get_model_info``, ``/get_server_info``, ``/server_info``, the tracing and
metrics set-up); ``python/sglang/srt/observability/trace.py`` at
02a580880ee625d1d4a8c317ad913dcc0506cf79 (span tree, names, thread and root attributes),
``python/sglang/srt/observability/req_time_stats.py`` at 00ce49e05c17e08f643afab34f3cdcef14935ac0
(stages, their levels, the GenAI latency attributes) and
``python/sglang/srt/managers/tokenizer_manager_components/request_tracing.py`` at
2d396b526f4fd2749397c0bc3f966e79f3f4ab71 (the root span's GenAI attributes). The metrics fixture it is
held to: ``tests/fixtures/engines/sglang/44cedc2``; the span fixture: ``tests/fixtures/otlp/sglang-44cedc2``.

How the shared serving model (:mod:`inferwatch.simulator.scheduler`, :mod:`inferwatch.simulator.base`)
maps onto SGLang's counters:

* the page size is the block size (1 token, SGLang's default), ``max_total_num_tokens`` the blocks times
  the page size, ``token_usage`` the used share of it and ``num_used_tokens`` the used tokens;
* a step that prefills is a prefill batch: ``log_prefill_stats`` (``realtime_tokens_total`` by
  ``prefill_compute``/``prefill_cache``, every scheduler gauge, ``cache_hit_rate`` of the batch); the
  gauges are logged again every ``--decode-log-interval`` (40) decode batches, with ``gen_throughput``
  and the decode tokens since the last log;
* a preemption of the serving model is SGLang's retraction (a running request losing its KV when the
  pool runs out, requeued and recomputed): ``num_retracted_requests_total`` and its input/output token
  counters, the ``num_retracted_reqs`` gauge (retractions since the last log) and, per finished request,
  ``num_retractions`` and ``meta_info.total_retractions``;
* the queue time (arrival to first scheduling) is ``queue_time_seconds`` and the span's
  ``prefill_waiting`` slice; prefix-cache hits are ``cached_tokens_total{cache_source="device"}``;
* the tokenizer's families (TTFT, inter-token latency with one token per interval, e2e, tokens,
  requests, aborts) are observed per finished request, internal load included.

The package: ``exposition`` (the multiprocess rendering), ``metrics`` (``/metrics``), ``spans`` (the
request trace) and ``api`` (the routes, :func:`create`).
"""

from __future__ import annotations

from inferwatch.simulator.engines.sglang.api import SglangSim, create

__all__ = ["SglangSim", "create"]
