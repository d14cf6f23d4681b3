"""SGLang's request trace (``--enable-trace --otlp-traces-endpoint``) → one record per request root span.

Read from sgl-project/sglang: ``python/sglang/srt/observability/trace.py`` at
02a580880ee625d1d4a8c317ad913dcc0506cf79 (``TraceReqContext``: tracer ``"sglang server"``, resource
``service.name="sglang"``, the root span ``"{role} Req {rid[:8]}"`` with ``rid`` and ``module``, one
child span per thread, ``"{label}[ [TP n] ](host:… | pid:…)"``, the stage slices under them),
``python/sglang/srt/observability/req_time_stats.py`` at 00ce49e05c17e08f643afab34f3cdcef14935ac0
(stage names; ``convert_to_gen_ai_span_attrs``) and
``python/sglang/srt/managers/tokenizer_manager_components/request_tracing.py`` at
2d396b526f4fd2749397c0bc3f966e79f3f4ab71 (``make_span_attrs``: the root span's GenAI attributes).

The root span carries the pre-v1.27 GenAI names (as vLLM's): ``gen_ai.usage.prompt_tokens``,
``completion_tokens``, ``cached_tokens`` (prefix-cache hits), ``gen_ai.request.*``,
``gen_ai.response.model``, ``gen_ai.response.finish_reasons`` (a JSON list as a string) and the API
server's ``gen_ai.latency.*`` in seconds: time to first token, e2e, prefill (dispatch to first
token), decode and inference. It has no queue time: the queue is the scheduler's ``prefill_waiting``
slice, read when it is in the same export (the record's queue stays empty otherwise). The role of a
prefill/decode-disaggregated server is the root span name's prefix (``prefill Req …``, ``decode Req …``;
none for a unified one), kept as the ``role`` attribute. Without ``gen_ai.latency.e2e`` the root
span's duration (request received to finished) is the e2e.

Thread spans, stage slices (``tokenize``, ``api_server_dispatch``, ``request_process``,
``prefill_waiting``, ``prefill_forward``, ``decode_*``, the disaggregation stages…) and every other
span of the ``"sglang server"`` tracer are claimed and skipped.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from opentelemetry.proto.trace.v1.trace_pb2 import Status

from inferwatch.collector.ingest.sources.shared import Column, Rejected, SpanView, base_record, model_of, split
from inferwatch.collector.store import record as R
from inferwatch.core import vocabulary as V

NAME: Final = V.ENGINE_SGLANG
SCOPE: Final = "sglang server"
SERVICE: Final = "sglang"
MODULE: Final = "module"
MODULE_PREFIX: Final = "sglang::"
RID: Final = "rid"
ROOT_NAME: Final = re.compile(r"^(|prefill|decode) Req \S{1,8}$")
"""``f"{role} Req {rid[:8]}"``: the role is empty for a unified server."""
QUEUE_STAGE: Final = "prefill_waiting"
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
ROLE_ATTRIBUTE: Final = V.LABEL_ROLE
ROLES: Final = {"": V.ROLE_UNIFIED, "prefill": V.ROLE_PREFILL, "decode": V.ROLE_DECODE}
OUTCOMES: Final = {
    "stop": V.OUTCOME_STOP,
    "length": V.OUTCOME_LENGTH,
    "abort": V.OUTCOME_ABORT,
}
"""``BaseFinishReason.to_json()["type"]`` → the record's words."""

COLUMNS: Final[dict[str, Column]] = {
    "gen_ai.request.id": Column("request_id", "str"),
    "gen_ai.response.model": Column("model", "str"),
    "gen_ai.latency.time_to_first_token": Column(R.TTFT, "float"),
    "gen_ai.latency.e2e": Column(R.E2E, "float"),
    "gen_ai.latency.time_in_model_prefill": Column(R.PREFILL, "float"),
    "gen_ai.latency.time_in_model_decode": Column(R.DECODE, "float"),
    "gen_ai.usage.prompt_tokens": Column(R.PROMPT_TOKENS, "int"),
    "gen_ai.usage.completion_tokens": Column(R.GENERATION_TOKENS, "int"),
    "gen_ai.usage.cached_tokens": Column(R.CACHED_TOKENS, "int"),
    "gen_ai.request.n": Column("n", "int"),
    "gen_ai.request.max_tokens": Column("max_tokens", "int"),
    "gen_ai.request.temperature": Column("temperature", "float"),
}
"""SGLang's ``SpanAttributes`` → record fields; the rest (``top_p``, ``top_k``, ``time_in_model_inference``,
``rid``, ``module``) stay attributes."""


def is_root(view: SpanView) -> bool:
    """A request's root span: ``"{role} Req {rid[:8]}"`` with a ``sglang::`` module."""
    module = view.attrs.get(MODULE)
    return (
        ROOT_NAME.match(view.name) is not None
        and isinstance(module, str)
        and module.startswith(MODULE_PREFIX)
        and RID in view.attrs
    )


def claims(view: SpanView) -> bool:
    """SGLang's tracer, or a root request span from wherever it comes."""
    return view.scope == SCOPE or is_root(view)


def queue_time(view: SpanView) -> float | None:
    """The first ``prefill_waiting`` slice under the root (a retracted request waits again: not queue)."""
    stages = [c for c in view.index.descendants(view) if c.name == QUEUE_STAGE]
    if not stages:
        return None
    return min(stages, key=lambda c: c.span.start_time_unix_nano).duration


def finish_reason(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        reasons = json.loads(value)
    except ValueError:
        return None
    if not isinstance(reasons, list) or not reasons or not isinstance(reasons[0], str):
        return None
    return OUTCOMES.get(reasons[0])


def to_record(view: SpanView) -> R.RequestRecord | None:
    if not is_root(view):
        return None  # a thread span, a stage slice or another span of SGLang's tracer
    fields, rest = split(view.attrs, COLUMNS)
    if fields.get("request_id") is None:
        rid = view.attrs.get(RID)
        if not isinstance(rid, str) or not rid:
            raise Rejected("request span without rid")
        fields["request_id"] = rid
    role = view.name.split(" Req ", 1)[0]
    rest[ROLE_ATTRIBUTE] = ROLES.get(role, role)
    rec = base_record(view, NAME, rest, fields)
    if rec.request_duration is None:
        rec.request_duration = view.duration
    rec.request_queue = queue_time(view)
    rec.finish_reason = finish_reason(view.attrs.get(FINISH_REASONS))
    rec.model = rec.model or model_of(view)
    rec.time_per_output_token = R.tpot(rec.request_decode, rec.generation_tokens)
    if rec.finish_reason == V.OUTCOME_ABORT:
        rec.error = V.OUTCOME_ABORT
    elif view.span.status.code == Status.STATUS_CODE_ERROR:
        rec.error = view.error_text()
    return rec
