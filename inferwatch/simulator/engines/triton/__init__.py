"""Simulated Triton Inference Server 25.03 (2.56.0) with the TensorRT-LLM C++ backend, ensemble deployment.

The model repository is the TensorRT-LLM backend's ``inflight_batcher_llm`` ensemble: ``ensemble`` →
``preprocessing`` (tokenizer, Python) → ``tensorrt_llm`` (the C++ ``tensorrtllm`` backend, decoupled)
→ ``postprocessing`` (detokenizer, Python, one execution per streamed response), all version ``1``.

Ports: a real Triton serves HTTP/REST on 8000, gRPC on 8001 and ``/metrics`` on 8002. The simulator
serves the HTTP/REST API *and* ``/metrics`` on its one port (no gRPC).

``/metrics`` reproduces Triton's prometheus-cpp exposition (sources: ``trtllm.md`` §3.1–3.2 and
§3.5, and the catalog-faithful fixture ``tests/fixtures/engines/triton/25.03-trtllm``): the same
families, HELP texts, types and label names, with counters before gauges before histograms, label
names sorted (``le`` last), values printed with ``%.16g`` (integers without decimals), histograms
as ``_count``, ``_sum``, then buckets, and every series created at model load. Series order inside
a family is unspecified in prometheus-cpp; the fixture's order is used.

How the serving model maps onto the TensorRT-LLM executor's iteration statistics (the backend copies
the latest iteration's stats into the ``nv_trt_llm_*`` gauges), taken after each engine step:

* ``scheduled`` (``numScheduledRequests``): sequences the step scheduled that are still in flight
  after it (the in-flight batch); ``context`` the ones among them whose context phase ran in the step
  (``numContextRequests``); ``generation_requests`` the rest.
* ``active`` (``numActiveRequests``): requests the executor holds, ``running + waiting`` of the
  serving model capped at ``max`` (``maxNumActiveRequests`` = ``max_num_seqs``; beyond it requests
  stay in the executor queue, which the backend does not export).
* ``waiting`` = ``active - scheduled``, exactly as the backend computes it (not a queue depth).
* KV blocks from the model parameters and the step's used blocks; ``reused`` is the cumulative
  number of prefix-cache blocks hit; ``fraction`` goes through ``std::to_string`` (6 decimals).
* ``paused_requests`` = sequences preempted in the step; ``total_context_tokens`` = its prefill tokens.
* Before the first iteration the capacity gauges (``max``, ``tokens_per``, ``free``) show the
  configuration, the others 0, the timestamp the start time. Timestamps are simulated time.

``nv_inference_*`` follow Triton core: each model reports once per request (``postprocessing`` once
per response) at its final response; durations are cumulative microseconds; a failure bumps only the
failure counter (``tensorrt_llm``: ``CANCELED`` for a client that went away, ``BACKEND`` for an
engine error or a rejected prompt; the ensemble then reports ``OTHER``). ``preprocessing`` and
``postprocessing`` get small synthetic durations (a few ms and well under 1 ms); the ensemble's
compute durations are the sums of its composing models'. The built-in load goes through the
ensemble as streaming requests.

API: ``/v2`` (server metadata), ``/v2/health/{live,ready}``, ``/v2/models/<m>[/versions/1]`` (metadata,
``/ready``), ``/v2/repository/index`` and the generate extension on the ensemble:
``POST /v2/models/ensemble[/versions/1]/generate`` returns one JSON object with every ensemble output
(keys sorted, ``text_output`` without the prompt as with ``exclude_input_in_output``);
``generate_stream`` returns SSE ``data:`` events, one per token when the ``stream`` input is true, a
single one otherwise. ``min_tokens`` is honoured. Errors are ``{"error": "..."}`` with status 400 (as
the brief and older Triton releases do; newer releases map some error codes to 404/500/503). A request
carrying ``endpoint-load-metrics-format: text|json`` gets Triton's ORCA ``endpoint-load-metrics`` header.

The package: ``repository`` (the models and their tensors), ``metrics`` (``/metrics``) and ``api`` (the
routes, :func:`create`); the simulated Triton emits no spans.
"""

from __future__ import annotations

from inferwatch.simulator.engines.triton.api import TritonSim, create

__all__ = ["TritonSim", "create"]
