"""Simulated llama.cpp server (``llama-server``), release b11312: ggml-org/llama.cpp
0c1e57098bba43ac29e6e3b677cdceebdd22334f, the shape after the metrics rework.

It is held to a genuine capture of that build, ``tests/fixtures/engines/llamacpp/b11312-cpu`` (its
``SOURCE.md`` gives the command, the workload and when each payload was taken): ``/metrics`` byte for byte
before the first request (``metrics-fresh.txt``) and with the same 15 families, TYPE words, HELP texts and
order under load; ``/props`` and ``/v1/models`` with the captured keys in their order; ``/slots``, the SSE
events and the non-streamed bodies of ``/completion``, ``/v1/completions`` and ``/v1/chat/completions``;
the 501, 503 and 400 bodies (``raw/``). The routes, the middleware, the slots and the error types were read
in ``tools/server/server.cpp``, ``server-task.cpp``, ``server-common.cpp`` and ``server-http.cpp`` at
aa6192d38defc9a5d9fb2987413f71b18f214270 (the 0c1e570 sources are not in the index: where the capture
differs from them, the capture is followed and the module says so); the sampling defaults come from
``common/common.h`` at 001d906a6d86e2490e394361e7cc6f478b100088 with the b11312 additions the capture shows
(``adaptive_target``, ``adaptive_decay``, ``backend_sampling``, ``speculative.types``). The
``Process-Start-Time-Unix`` header carries ``ggml_time_us()`` at start, monotonic microseconds despite its
name, as the server sends it.

How the shared serving model (``simulator/scheduler.py``, ``base.py``) maps onto llama.cpp's slots:

* ``--parallel`` slots (``LlamacppOptions.parallel``, ``LLAMA_ARG_N_PARALLEL``; 4 by default, what
  main() picks when the flag is left at 1) are the serving model's ``max_num_seqs``: a running sequence
  holds a slot; a request that finds none is deferred (``llamacpp:requests_deferred`` is the waiting
  queue beyond the free slots, ``llamacpp:requests_processing`` the slots in use).
* ``--ctx-size`` is the KV capacity (``num_blocks * block_size``, 16384 tokens by default) and each slot
  owns ``ctx-size / parallel`` of it (the split of a non-unified KV cache, as with the capture's explicit
  ``--parallel 4``): that per-slot context is the serving model's ``max_model_len``, so the scheduler never
  preempts, as llama.cpp never does. A prompt of at least the slot's context fails with
  ``exceed_context_size_error``; a generation stops (``stop_type`` ``limit``, ``truncated``) when the slot
  is full. The serving model's prefix cache stands for the slot's reuse of its previous prompt
  (``cache_prompt``: ``timings.cache_n``, ``usage.prompt_tokens_details.cached_tokens``).
* ``/metrics`` is read by meaning as the capture shows it (``metrics``): evaluated prompt tokens per
  decode batch and cached ones when a slot starts, generated tokens and their time only when a request
  ends, the two throughput gauges over the window since the previous scrape, the speculative counters 0
  (no draft model). llama.cpp exports no KV-cache usage: none is rendered.
* Every response names the server's model (``model_alias``, here the simulator's ``--model``) whatever
  the request's ``model`` said, as the real server does.

Still approximated: ``prompt_seconds_total`` adds the whole duration of a step that evaluated prompt tokens
(the serving model's steps mix prompt and generation work); the slot cache is the serving model's prefix
cache keyed by the longest common prefix with a recent prompt; a prompt is tokenized by the simulator's
word count, not a vocabulary, so no UTF-8 piece is ever held back (each token is its own event);
``n != 1`` on the chat route is answered with the older builds' 500 (later builds may fan out choices).
Stop words, grammars, token probabilities, speculative decoding, infill, embeddings, reranking, LoRA,
multimodal input and the Anthropic routes are not modelled; a sequence that fails in the engine
(``Finish.ERROR``) answers ``500 Compute error.``.

``/metrics`` is served by default here (llama-server needs ``--metrics``) so the demo and the exporter
have a page; ``LlamacppOptions(endpoint_metrics=False)`` (``LLAMA_ARG_ENDPOINT_METRICS=0``) answers 501 as
the server does. ``/slots`` is on, as in the b11312 build; ``LlamacppOptions(endpoint_slots=False)``
(``--no-slots``, ``LLAMA_ARG_ENDPOINT_SLOTS=0``) answers 501. llama.cpp emits no traces: its requests
reach the collector through ``inferwatch proxy``.

The package: ``protocol`` (constants, formatting, request parameters), ``metrics`` (``/metrics``),
``slots`` (the slot table, ``/slots``), ``results`` (result bodies) and ``api`` (routes, :func:`create`).
"""

from __future__ import annotations

import os

from fastapi import FastAPI

from inferwatch.simulator.base import SimulatedEngine
from inferwatch.simulator.engines.llamacpp.api import LlamacppOptions, LlamacppSim, options_from_env


def create(engine: SimulatedEngine) -> tuple[FastAPI, LlamacppSim]:
    """The simulated server with the options llama-server's own environment variables set."""
    sim = LlamacppSim(engine, options_from_env(os.environ))
    return sim.build_app(), sim


__all__ = ["LlamacppOptions", "LlamacppSim", "create", "options_from_env"]
