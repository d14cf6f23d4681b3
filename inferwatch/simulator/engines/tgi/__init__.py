"""Simulated Hugging Face TGI v3.3.7 (the v3 ``text-generation-router``), faithful on the wire.

Sources: the TGI catalog ``tgi.md`` (§1.1–1.7 metrics, §3.1–3.6 spans and headers, §4 ``/info``), the
catalog-faithful scrape ``tests/fixtures/engines/tgi/3.3.7`` and TGI's router source at v3.3.7
(``router/src/server.rs``, ``lib.rs``, ``validation.rs``, ``infer/mod.rs``, ``backends/v3/src/backend.rs``).

``/metrics`` is rendered in the format of the Rust ``metrics-exporter-prometheus`` 0.15.3
recorder TGI installs: text format 0.0.4, counters without ``_total``, no ``_created``, ``# HELP`` only
for the names TGI describes, counters → gauges → histograms/summaries with a blank line after every
family, families and label sets in an unspecified (shuffled per render) order, numbers in Rust
``Display`` form, the router's bucket configuration (35 geometric duration bounds built by repeated
multiplication, linear token bounds from ``max_input_tokens``/``max_total_tokens``, 1..1024 for the
next-batch size, the skipped-tokens histogram as a summary) and an empty body until the first request.

How the serving model maps onto TGI:

* ``max_total_tokens`` is ``params.max_model_len`` and ``max_input_tokens`` is one less (``/info`` and
  the token buckets agree); validation follows ``validation.rs`` (422 ``{"error", "error_type"}``).
* Every engine step is one router iteration: a step that admits requests from the queue is a
  ``prefill`` call (one ``tgi_batch_next_size`` sample; a ``chunking`` concat when a batch was
  already running), any other step is a ``decode`` call. Forward, decode (post-processing) and filter
  durations are fixed shares of the step time.
* A sequence that fails in the engine (``Finish.ERROR``) is a failed one-request prefill batch:
  ``err="generation"`` and ``tgi_batch_inference_failure{method="prefill"}`` (TGI would also drop the
  running batch it was concatenated with; the serving model does not).
* ``max_concurrent_requests`` (128) is enforced on the requests in the engine (running + waiting),
  for HTTP requests and for the built-in load alike (``err="overloaded"``, HTTP 429).
* Validation time is synthetic (a few hundred µs, growing with the prompt), as the serving model
  starts at queue admission; total = validation + queue + inference. Continuation chunks of
  generations longer than 1024 tokens are not modelled: one sequence generates up to the full budget.
  ``best_of`` > 1 (non-streaming) is validated but runs a single sequence.
* The wire follows the v3.3.7 source where it differs from looser descriptions: stream events omit
  ``top_tokens`` when empty (``skip_serializing_if``) and their index starts at 1; the final event's
  ``details`` carries ``input_length``; a sequence that stops by itself ends with the special EOS token
  (counted in ``generated_tokens``, left out of ``generated_text``); ``/`` defaults ``return_full_text``
  to true (pipeline tag ``text-generation``) and wraps the non-streaming body in a list; streaming
  requests validate inside the stream, so their errors are SSE events of a 200 response; a client
  that disconnects (streaming or not) is counted as ``err="dropped"``.

Spans (when ``engine.spans`` is set) follow TGI's request trace (§3.3): the handler span
(``generate``, ``generate_stream`` or ``chat_completions``; INTERNAL; child of an incoming
``traceparent``, which is honoured even when its sampled flag is off, as TGI samples AlwaysOn) with
the Debug-format timing strings, ``parameters`` and ``seed``; below it Infer ``generate`` (non-stream)
or ``async_stream`` (stream), Infer ``generate_stream``, ``validate`` → ``validate_input`` →
``tokenize``, and ``schedule`` → ``append``, ``queued`` (its duration is the queue time) and the
``infer`` spans, each with a ``send_generation`` child carrying the Debug dump of the generation.
There is one ``infer`` span per token-emitting step the request took part in (prefill chunks that emit
no token fold into the first one); above 64 steps only the first 32 and the last 32 are kept, so a
request has at most 64 ``infer`` spans. ``/`` adds TGI's separate ``compat_generate`` root span.
Batch traces (``next_batch``/``batch``) and the links between them and ``infer`` are not emitted.

The package: ``protocol`` (constants, Rust formatting, request bodies, tokens), ``metrics``
(``/metrics``), ``spans`` (the request trace) and ``api`` (the router's routes, ``create``).
"""

from __future__ import annotations

from inferwatch.simulator.engines.tgi.api import TgiSim, create

__all__ = ["TgiSim", "create"]
