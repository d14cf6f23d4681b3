"""Simulated TensorRT-LLM ``trtllm-serve`` (PyTorch backend) with the Gen C metrics, faithful on the wire.

What a client or scraper sees (sources: ``trtllm.md`` §2.1-2.5 and §4.1, the fixtures
``tests/fixtures/engines/trtllm/gen-c`` and ``.../json-iteration-stats`` with their SOURCE.md):

* ``GET /prometheus/metrics``: the Gen C families of ``tensorrt_llm/metrics/collector.py`` @ ``050f80de``
  (names, HELP texts, label names, buckets), exposed as prometheus_client renders them in multiprocess
  mode: gauges carry a ``pid`` label (``trtllm_scheduled_batch_size`` the executor worker's, the others
  the server's), counters are named ``..._total`` in HELP/TYPE, there is no ``_created`` series,
  histograms list ``_sum`` first, then the buckets, then ``_count``, and a family appears once one of
  its children was first touched (family order = ``.db`` file order, then first-touch order; not
  sorted). The text is rendered by prometheus_client itself (``make_asgi_app`` over a private registry
  with a collector of our own): no process-global state, no ``PROMETHEUS_MULTIPROC_DIR``.
* ``GET /metrics``: the JSON array of PyTorch iteration stats (camelCase, C++ keys sorted, then the
  keys the Python worker appends), a **destructive** read of a buffer bounded by
  ``iter_stats_max_iterations`` (1000, oldest dropped).
* The collector-loop quirk (§2.4): the server's background loop sleeps until a request finishes, then
  drains the executor's stats queue, logs every iteration to Prometheus and tees it into the ``/metrics``
  buffer. So the iteration gauges and counters, and the JSON ``/metrics`` itself, only move when a
  request finishes. Per-request histograms are logged at each finish; ``trtllm_scheduled_batch_size``
  is published by the worker every step.
* OpenAI API (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``), ``/health``,
  ``/health_generate``, ``/version``; request and response bodies follow ``openai_protocol.py`` and
  ``postprocess_handlers.py`` (chat stream chunks are dumped with ``exclude_none`` and the first one
  ends in ``" \\n\\n"``; completion chunks keep their nulls; stream ids are ``chatcmpl-<executor id>``).
* OpenTelemetry: one SERVER span per request from the tracer ``trt.llm`` with the ``gen_ai.*``
  attributes of §4.1, parented on the incoming ``traceparent``. The span name is **unverified**: the
  catalog only says the implementation was adapted from vLLM, whose span is ``llm_request``, so that
  is used here.

``/version`` answers ``{"version": "1.3.0rc10"}`` (``api.VERSION``, overridable by ``SimSettings.version``):
the Gen C collector is newer than 1.2 (Gen B shipped around 1.3.0rc5) and the exact release that
carries ``050f80de`` is not verified.

Approximations: speculative decoding (NGram, ``max_draft_len`` 4, as in both fixtures; pass
``speculation=None`` to :func:`create` to turn it off) is drawn from a seeded RNG and reported in the
stats, but tokens are still produced one per step by the serving model. KV block counters are derived
from the serving model (prompt blocks at admission, one block per ``block_size`` generated tokens,
reused blocks = cached prefix tokens / block size). ``gpuMemUsage`` is a synthetic device-wide figure.
The serving model has no per-request deadline, so ``finished_reason="timeout"`` never occurs; client
aborts are ``cancelled``. Engine failures are answered with HTTP 500 and counted in
``trtllm_request_error_total{http_code="500"}`` (upstream's generic handler answers them with 400).

The package: ``catalog`` (the Gen C families and the in-memory multiprocess store), ``metrics`` (the
collector, the iteration stats, speculation), ``spans`` and ``api`` (the routes, :func:`create`).
"""

from __future__ import annotations

from inferwatch.simulator.engines.trtllm.api import TrtllmSim, create

__all__ = ["TrtllmSim", "create"]
