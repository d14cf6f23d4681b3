"""TGI's request trace (tgi.md §3.3–3.5) → one record per handler span.

The router's handler span (``generate``, ``generate_stream``, ``chat_completions``, ``completions``,
``vertex_compatibility``; ``code.namespace`` ``text_generation_router::server``) carries the request's
timings as Rust ``Debug`` strings of ``Duration`` (``"1.234567ms"``, ``"2.0315s"``, ``"812.3µs"``,
``"950ns"``): ``total_time`` → e2e, ``queue_time`` → queue, ``inference_time`` → prefill + decode.
TGI has no TTFT attribute, so it is derived (``ttft_derived``): validation + queue + the first ``infer``
step (the prefill) when that child span is in the same export, else + ``time_per_token`` as a stand-in
for the prefill step. Prefill is that same step, decode the rest of ``inference_time``.

Generated tokens: the final ``send_generation`` child's ``GeneratedText { generated_tokens, finish_reason }``
when it is in the export (also the finish reason: ``Length`` → ``length``, ``EosToken``/``StopSequence``
→ ``stop``), else ``inference_time / time_per_token`` (TGI computes the latter as the former divided by
the token count), else the number of ``send_generation`` children. ``max_tokens``, ``temperature`` and
the LoRA adapter come from the ``parameters`` Debug dump; TGI records no prompt length on its spans.
A failed request (status Error, an ERROR event, no timing fields) gives a record with ``error`` and
the handler span's duration as e2e.

Every other TGI span (Infer ``generate``, ``validate``, ``tokenize``, ``schedule``, ``queued``, ``infer``,
``send_generation``, batch traces, ``health``, shard gRPC spans…) is claimed and skipped.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from inferwatch.collector.ingest.sources.shared import (
    Rejected,
    SpanView,
    base_record,
    first_of,
    integer,
    model_of,
    unmapped,
)
from inferwatch.collector.store import record as R
from inferwatch.core import vocabulary as V

NAME: Final = V.ENGINE_TGI
HANDLERS: Final = frozenset({"generate", "generate_stream", "chat_completions", "completions", "vertex_compatibility"})
NAMESPACE: Final = "code.namespace"
CRATE_PREFIX: Final = "text_generation"
"""the router (``text_generation_router[_v3]::…``) and the Python shards (``text_generation_server.…``)."""
SERVER_MODULE: Final = "::server"
SERVICE_PREFIX: Final = "text-generation-inference"
"""the default ``service.name`` of router and shards (``text-generation-inference.router``)."""
RPC_SERVICE: Final = "rpc.service"
SHARD_RPC_PREFIX: Final = "generate.v"

TOTAL: Final = "total_time"
VALIDATION: Final = "validation_time"
QUEUE: Final = "queue_time"
INFERENCE: Final = "inference_time"
PER_TOKEN: Final = "time_per_token"
PARAMETERS: Final = "parameters"
GENERATION: Final = "generation"
INFER: Final = "infer"
SEND_GENERATION: Final = "send_generation"
PROMPT_KEYS: Final = ("input_length", "prompt_tokens", "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
"""TGI sets none of these; taken if a build or a proxy adds one."""

FINISH: Final = {
    "Length": V.OUTCOME_LENGTH,
    "EosToken": V.OUTCOME_STOP,
    "StopSequence": V.OUTCOME_STOP,
    # the proto's numeric values, in case a build prints the raw i32
    "0": V.OUTCOME_LENGTH,
    "1": V.OUTCOME_STOP,
    "2": V.OUTCOME_STOP,
}
"""``FinishReason`` of TGI's generate proto → the record's words."""

# -- Rust Duration Debug strings -----------------------------------------------------------------------
UNIT_NS: Final = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5, what Rust prints
    "μs": 1_000,  # U+03BC, in case a tool "fixed" it
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_PART = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ns|us|µs|μs|ms|s|m|h)")


def parse_duration_ns(value: str) -> int:
    """Nanoseconds from a Rust ``Duration`` Debug string (``"812.3µs"``, ``"2.0315s"``, also ``"1m 2.5s"``).

    Raises ``ValueError`` for anything else.
    """
    pos, total, parts = 0, Decimal(0), 0
    stripped = value.strip()
    while pos < len(stripped):
        m = _PART.match(stripped, pos)
        if m is None:
            raise ValueError(f"not a Rust Duration: {value!r}")
        try:
            total += Decimal(m.group(1)) * UNIT_NS[m.group(2)]
        except InvalidOperation:
            raise ValueError(f"not a Rust Duration: {value!r}") from None
        pos, parts = m.end(), parts + 1
    if not parts:
        raise ValueError(f"not a Rust Duration: {value!r}")
    return int(total.to_integral_value())


def parse_duration(value: str) -> float:
    """Seconds from a Rust ``Duration`` Debug string."""
    return parse_duration_ns(value) / 1e9


def _duration_ns(attrs: dict[str, Any], key: str) -> int | None:
    value = attrs.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise Rejected(f"{key} is not a Rust Duration")
    try:
        return parse_duration_ns(value)
    except ValueError:
        raise Rejected(f"{key} is not a Rust Duration") from None


# -- Debug dumps -------------------------------------------------------------------------------------
_MAX_NEW_TOKENS = re.compile(r"[{,]\s*max_new_tokens: Some\(([0-9]+)\)")
_TEMPERATURE = re.compile(r"[{,]\s*temperature: Some\(([-+0-9.eE]+)\)")
_ADAPTER = re.compile(r'[{,]\s*adapter_id: Some\("((?:[^"\\]|\\.)*)"\)')
_GENERATED = re.compile(r"generated_tokens: ([0-9]+), finish_reason: ([A-Za-z0-9]+)")


def parse_parameters(dump: str) -> tuple[int | None, float | None, str | None]:
    """``max_new_tokens``, ``temperature`` and ``adapter_id`` from the ``GenerateParameters { … }`` dump."""
    m = _MAX_NEW_TOKENS.search(dump)
    max_tokens = int(m.group(1)) if m else None
    m = _TEMPERATURE.search(dump)
    try:
        temperature = float(m.group(1)) if m else None
    except ValueError:
        temperature = None
    m = _ADAPTER.search(dump)
    adapter = m.group(1) if m else None
    return max_tokens, temperature, adapter


def parse_generated(dump: str) -> tuple[int, str] | None:
    """``(generated_tokens, finish_reason)`` of the final ``Generation``'s ``GeneratedText``, if it has one."""
    if "generated_text: Some(" not in dump:
        return None
    found = _GENERATED.findall(dump)  # the generated text comes before these fields: take the last match
    if not found:
        return None
    tokens, reason = found[-1]
    return int(tokens), reason


# -- claiming ----------------------------------------------------------------------------------------
def _namespace(view: SpanView) -> str | None:
    value = view.attrs.get(NAMESPACE)
    return value if isinstance(value, str) else None


def is_handler(view: SpanView) -> bool:
    """A router handler span: a handler name in the ``…::server`` module, or one carrying ``total_time``."""
    if view.name not in HANDLERS:
        return False
    ns = _namespace(view)
    if ns is not None and ns.startswith(CRATE_PREFIX) and ns.endswith(SERVER_MODULE):
        return True
    return TOTAL in view.attrs


def is_tgi(view: SpanView) -> bool:
    """Any span of TGI's router or shards."""
    ns = _namespace(view)
    if (ns is not None and ns.startswith(CRATE_PREFIX)) or view.scope.startswith(CRATE_PREFIX):
        return True
    rpc = view.attrs.get(RPC_SERVICE)
    if isinstance(rpc, str) and rpc.startswith(SHARD_RPC_PREFIX):
        return True
    service = view.resource.service
    return service is not None and service.startswith(SERVICE_PREFIX)


def claims(view: SpanView) -> bool:
    return is_handler(view) or is_tgi(view)


# -- the record --------------------------------------------------------------------------------------
def to_record(view: SpanView) -> R.RequestRecord | None:
    if not is_handler(view):
        return None  # a child span (folded into its handler's record) or another TGI span
    attrs = view.attrs
    rec = base_record(view, NAME, unmapped(attrs, (TOTAL, QUEUE)))
    total, validation, queue = _duration_ns(attrs, TOTAL), _duration_ns(attrs, VALIDATION), _duration_ns(attrs, QUEUE)
    inference, per_token = _duration_ns(attrs, INFERENCE), _duration_ns(attrs, PER_TOKEN)

    children = list(view.index.descendants(view, stop=is_handler))
    infers = [c for c in children if c.name == INFER]
    sends = sorted((c for c in children if c.name == SEND_GENERATION), key=lambda c: c.span.start_time_unix_nano)
    first_infer = min(infers, key=lambda c: c.span.start_time_unix_nano) if infers else None

    rec.request_duration = total / 1e9 if total is not None else view.duration
    rec.request_queue = queue / 1e9 if queue is not None else None
    prefill_ns = (
        max(0, first_infer.span.end_time_unix_nano - first_infer.span.start_time_unix_nano)
        if first_infer is not None
        else per_token
    )
    if inference is not None and prefill_ns is not None:
        prefill_ns = min(prefill_ns, inference)
        rec.request_prefill = prefill_ns / 1e9
        rec.request_decode = (inference - prefill_ns) / 1e9
    if queue is not None and prefill_ns is not None:
        rec.time_to_first_token = ((validation or 0) + queue + prefill_ns) / 1e9
        rec.ttft_derived = True

    generated = None
    if sends:
        dump = sends[-1].attrs.get(GENERATION)
        generated = parse_generated(dump) if isinstance(dump, str) else None
    if generated is not None:
        rec.generation_tokens = generated[0]
        rec.finish_reason = FINISH.get(generated[1])
    elif inference is not None and per_token:
        rec.generation_tokens = round(inference / per_token)
    elif sends:
        rec.generation_tokens = len(sends)
    prompt_key = first_of(attrs, *PROMPT_KEYS)
    rec.prompt_tokens = integer(attrs, prompt_key) if prompt_key else None
    rec.time_per_output_token = R.tpot(rec.request_decode, rec.generation_tokens)

    params = attrs.get(PARAMETERS)
    if isinstance(params, str):
        rec.max_tokens, rec.temperature, rec.lora_adapter = parse_parameters(params)
    rec.model = model_of(view)
    rec.error = view.error_text()
    return rec
