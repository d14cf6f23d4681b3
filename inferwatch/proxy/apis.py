"""The engines' generation APIs as the proxy sees them: data, keyed by API shape.

An :class:`Api` says which requests are generation requests (method and path), what a request asks
for (model, LoRA adapter, whether it streams, its token budget) and what one SSE event or one
non-streamed body of its response carries (content, finish reasons, usage, an error), as a
:class:`Reading`. :data:`ENGINE_APIS` says which shapes each engine serves and how its OpenAI-style
``model`` field is meant; :data:`ENGINE_UPSTREAM` where it tells its health and its models. Generic
code (:mod:`~inferwatch.proxy.server`, :mod:`~inferwatch.proxy.measure`) reads only these tables.

Sources: the engines' HTTP API facts in vllm.md, tgi.md and trtllm.md (the shared reference) and the
simulated engines' routes, which follow them (OpenAI ``choices[].delta.content``/``text``, ``usage``
and ``finish_reason``; TGI's ``token``/``details`` events with ``data:`` and no space; Triton's
generate extension with one ``text_output`` per response). SGLang and llama.cpp's server, read in their
sources:

- sgl-project/sglang ``python/sglang/srt/entrypoints/http_server.py`` at
  44cedc2b9c7dd31d9acae4498ea4fa0d3665feed (``POST``/``PUT /generate``: ``data: <json>`` events then
  ``data: [DONE]``, ``{"error": {"message"}}`` in the stream and with 400 outside it; ``/health``;
  ``/v1/models`` listing LoRA adapters with a ``parent``; the warm-up request's ``text``/``input_ids``
  and ``sampling_params.max_new_tokens``), ``python/sglang/srt/managers/tokenizer_manager.py`` at
  001067fffe33427bee0ed2f007fb7551a1d76b44 (the nearest stored version: ``meta_info`` with ``id``,
  ``finish_reason`` (``null`` until the end), ``prompt_tokens``, ``completion_tokens``,
  ``cached_tokens``, cumulative; ``text`` cumulative per event unless the server runs
  ``--incremental-streaming-output``; queued outputs coalesced into one event, so one event may carry
  several tokens) and ``python/sglang/srt/managers/schedule_batch.py`` at
  fd3907ee4618e96b73ee94d9a836db78efb5d046 (``finish_reason`` ``{"type": "stop"|"length"|"abort", ...}``,
  an abort with its ``message``);
- ggml-org/llama.cpp ``tools/server/server.cpp`` at aa6192d38defc9a5d9fb2987413f71b18f214270 (routes
  ``/completion`` and ``/completions`` native, ``/v1/completions``, ``/chat/completions`` and
  ``/v1/chat/completions`` OpenAI, ``/health``, ``/v1/models``, ``/props``; native streams end without
  ``[DONE]``, errors as ``{"error": {...}}``, an array for several prompts) and
  ``tools/server/server-task.cpp`` at the same commit (partial events ``{"content", "tokens", "stop":
  false, "tokens_predicted", "tokens_evaluated"}``, the final one ``"stop": true`` with ``stop_type``
  ``eos``/``word``/``limit``/``none``, ``tokens_predicted``, ``tokens_evaluated``, ``timings`` and an
  empty ``content`` when streamed; the request's ``n_predict``, else ``max_tokens``; ``model`` in a
  request only echoed back).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from inferwatch.core import vocabulary as V


@dataclass(slots=True)
class Reading:
    """What one SSE event (or one non-streamed body) of a generation response carries."""

    content: int = 0
    """generated pieces that carry content the user sees (choices with text, non-special tokens)."""
    tokens: int = 0
    """generated tokens the proxy counts (an estimate: one per content piece, or per token event)."""
    finish_reasons: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    """from the engine's usage (exact)."""
    completion_tokens: int | None = None
    """from the engine's usage (exact)."""
    error: str | None = None
    response_id: str | None = None
    final: bool = False
    """the last event of the response (TGI's carries ``generated_text``)."""


@dataclass(frozen=True)
class Ask:
    """What a generation request asks for (from its path and JSON body; anything may be missing)."""

    model: str | None = None
    adapter: str | None = None
    stream: bool = False
    max_tokens: int | None = None


EventReader = Callable[[Any], Reading]
QuickReader = Callable[[Any], int]
"""An :data:`EventReader`'s short way for the usual event, once the stream's response id is known: the event's
content pieces (one token each; 0: none) when it carries nothing else that :class:`Reading` keeps (no finish
reason, usage, error, end), ``-1`` for any other event (then read by the full reader)."""
BodyReader = Callable[[Any, Mapping[str, str]], Reading]
AskReader = Callable[[Any, "re.Match[str]"], Ask]


@dataclass(frozen=True)
class Api:
    """One API shape."""

    name: str
    pattern: re.Pattern[str]
    operation: str
    """``gen_ai.operation.name`` of its spans."""
    ask: AskReader
    event: EventReader
    """one SSE event's JSON."""
    body: BodyReader
    """a non-streamed response's JSON (and its headers)."""
    finish: Mapping[str, str]
    """the engine's finish reasons -> outcome (``stop``/``length``); others count as ``stop``."""
    count_length: bool = False
    """the API reports no finish reason: ``length`` when the counted tokens reach the request's budget."""
    method: str = "POST"
    quick: QuickReader | None = None
    """``event``'s short way for the usual event (once per chunk); None: every event is read by ``event``."""


# -- small readers -----------------------------------------------------------------------------------
def _int(value: Any) -> int | None:
    if isinstance(value, list) and value:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _error_text(value: Any) -> str | None:
    """An ``error`` member: a string, or an object with a ``message``."""
    if isinstance(value, str):
        return value or "error"
    if isinstance(value, dict):
        return str(value.get("message") or value.get("type") or "error")
    return None if value is None else "error"


# -- OpenAI-compatible: /v1/completions and /v1/chat/completions --------------------------------------
OPENAI_FINISH: Final = {"length": V.OUTCOME_LENGTH}


def openai_ask(body: Any, match: re.Match[str]) -> Ask:
    b = _dict(body)
    budget = _int(b.get("max_completion_tokens"))
    return Ask(
        model=_str(b.get("model")),
        stream=b.get("stream") is True,
        max_tokens=budget if budget is not None else _int(b.get("max_tokens")),
    )


def _openai_usage(reading: Reading, usage: Any) -> None:
    u = _dict(usage)
    reading.prompt_tokens = _int(u.get("prompt_tokens"))
    reading.completion_tokens = _int(u.get("completion_tokens"))


def openai_event(obj: Any) -> Reading:
    """A chunk: ``choices[].delta`` (chat) or ``choices[].text`` (completions), ``usage`` when asked for.
    (Once per chunk: written for few calls; ``openai_body`` reads the same members the plain way.)"""
    r = Reading()
    if not isinstance(obj, dict):
        return r
    get = obj.get
    rid = get("id")
    if isinstance(rid, str) and rid:
        r.response_id = rid
    for c in get("choices") or ():
        if not isinstance(c, dict):
            continue
        if not c.get("text"):
            delta = c.get("delta")
            if not (
                isinstance(delta, dict)
                and (delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"))
            ):
                delta = None
        else:
            delta = c
        if delta is not None:
            r.content += 1
            r.tokens += 1
        reason = c.get("finish_reason")
        if isinstance(reason, str):
            r.finish_reasons.append(reason)
    usage = get("usage")
    if usage:
        _openai_usage(r, usage)
    error = get("error")
    if error is not None:
        r.error = _error_text(error)
    return r


def openai_quick(obj: Any) -> int:
    """:func:`openai_event`'s usual chunk (one choice, with content or without, and no finish reason, no usage,
    no error) in fewer steps: what ``openai_event`` would count, or ``-1`` for anything else."""
    if type(obj) is not dict or obj.get("usage") or obj.get("error") is not None:
        return -1
    choices = obj.get("choices")
    if type(choices) is not list or len(choices) != 1:
        return -1
    c = choices[0]
    if not isinstance(c, dict) or c.get("finish_reason") is not None:
        return -1
    if c.get("text"):
        return 1
    delta = c.get("delta")
    return int(
        isinstance(delta, dict)
        and bool(delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"))
    )


def openai_body(obj: Any, headers: Mapping[str, str]) -> Reading:
    r = Reading()
    o = _dict(obj)
    r.response_id = _str(o.get("id"))
    for choice in o.get("choices") or ():
        c = _dict(choice)
        if c.get("text") or _dict(c.get("message")).get("content"):
            r.content += 1
            r.tokens += 1
        reason = c.get("finish_reason")
        if isinstance(reason, str):
            r.finish_reasons.append(reason)
    _openai_usage(r, o.get("usage"))
    r.error = _error_text(o.get("error"))
    return r


OPENAI_COMPLETIONS: Final = Api(
    "openai-completions",
    re.compile(r"/v1/completions"),
    "text_completion",
    openai_ask,
    openai_event,
    openai_body,
    OPENAI_FINISH,
    quick=openai_quick,
)
OPENAI_CHAT: Final = Api(
    "openai-chat",
    re.compile(r"/v1/chat/completions"),
    "chat",
    openai_ask,
    openai_event,
    openai_body,
    OPENAI_FINISH,
    quick=openai_quick,
)


# -- TGI: /generate, /generate_stream and / (compat) ----------------------------------------------------
TGI_FINISH: Final = {"length": V.OUTCOME_LENGTH}
"""``eos_token`` and ``stop_sequence`` are stops."""


def _tgi_ask(body: Any, stream: bool | None) -> Ask:
    b = _dict(body)
    params = _dict(b.get("parameters"))
    return Ask(
        adapter=_str(params.get("adapter_id")),
        stream=(b.get("stream") is True) if stream is None else stream,
        max_tokens=_int(params.get("max_new_tokens")),
    )


def tgi_event(obj: Any) -> Reading:
    """``{"index", "token": {"text", "special"}, "generated_text", "details"}``; ``details`` on the last
    event only when asked for (``finish_reason``, ``generated_tokens``, ``input_length``)."""
    r = Reading()
    o = _dict(obj)
    token = o.get("token")
    if isinstance(token, dict):
        r.tokens += 1
        if not token.get("special") and token.get("text"):
            r.content += 1
    details = _dict(o.get("details"))
    reason = details.get("finish_reason")
    if isinstance(reason, str):
        r.finish_reasons.append(reason)
    r.completion_tokens = _int(details.get("generated_tokens"))
    r.prompt_tokens = _int(details.get("input_length"))
    r.error = _error_text(o.get("error"))
    r.final = o.get("generated_text") is not None
    return r


def tgi_body(obj: Any, headers: Mapping[str, str]) -> Reading:
    """``{"generated_text", "details"?}`` (a list of one for ``/``); the router's ``x-prompt-tokens`` and
    ``x-generated-tokens`` headers carry the usage of every non-streamed response."""
    r = Reading()
    items = obj if isinstance(obj, list) else [obj]
    for item in items:
        o = _dict(item)
        if o.get("generated_text"):
            r.content += 1
            r.tokens += 1
        reason = _dict(o.get("details")).get("finish_reason")
        if isinstance(reason, str):
            r.finish_reasons.append(reason)
        r.error = r.error or _error_text(o.get("error"))
    for attr, header in (("prompt_tokens", "x-prompt-tokens"), ("completion_tokens", "x-generated-tokens")):
        value = headers.get(header, "")
        if value.isdigit():
            setattr(r, attr, int(value))
    return r


TGI_GENERATE: Final = Api(
    "tgi-generate", re.compile(r"/generate"), "text_completion", lambda b, m: _tgi_ask(b, False), tgi_event, tgi_body,
    TGI_FINISH,
)  # fmt: skip
TGI_GENERATE_STREAM: Final = Api(
    "tgi-generate-stream", re.compile(r"/generate_stream"), "text_completion", lambda b, m: _tgi_ask(b, True),
    tgi_event, tgi_body, TGI_FINISH,
)  # fmt: skip
TGI_COMPAT: Final = Api(
    "tgi-compat", re.compile(r"/"), "text_completion", lambda b, m: _tgi_ask(b, None), tgi_event, tgi_body, TGI_FINISH
)


# -- Triton: the generate extension (v2/models/{m}[/versions/{v}]/generate[_stream]) ---------------------
def _triton_ask(body: Any, match: re.Match[str], stream: bool) -> Ask:
    b = _dict(body)
    return Ask(model=match.group("model"), stream=stream, max_tokens=_int(b.get("max_tokens")))


def triton_event(obj: Any) -> Reading:
    """One response of the model: ``text_output`` (one token per event with ``"stream": true``, all of
    them in one event otherwise; ``output_log_probs`` has one entry per token), or ``{"error"}``."""
    r = Reading()
    o = _dict(obj)
    text = o.get("text_output")
    if isinstance(text, list):
        text = "".join(str(t) for t in text)
    if text:
        r.content += 1
        logprobs = o.get("output_log_probs")
        r.tokens += len(logprobs) if isinstance(logprobs, list) and logprobs else 1
    r.error = _error_text(o.get("error"))
    return r


TRITON_PATH: Final = r"/v2/models/(?P<model>[^/]+)(?:/versions/[^/]+)?"
TRITON_GENERATE: Final = Api(
    "triton-generate", re.compile(TRITON_PATH + "/generate"), "text_completion",
    lambda b, m: _triton_ask(b, m, False), triton_event, lambda o, h: triton_event(o), {}, count_length=True,
)  # fmt: skip
TRITON_GENERATE_STREAM: Final = Api(
    "triton-generate-stream", re.compile(TRITON_PATH + "/generate_stream"), "text_completion",
    lambda b, m: _triton_ask(b, m, True), triton_event, lambda o, h: triton_event(o), {}, count_length=True,
)  # fmt: skip


# -- SGLang: /generate ---------------------------------------------------------------------------------
SGLANG_FINISH: Final = {"length": V.OUTCOME_LENGTH}
"""``finish_reason.type``: ``stop`` (a stop token, string or regex) and ``length``; ``abort`` is an error."""


def _sglang_ask(body: Any, match: re.Match[str]) -> Ask:
    b = _dict(body)
    params = _dict(b.get("sampling_params"))
    return Ask(
        adapter=_str(b.get("lora_path")),
        stream=b.get("stream") is True,
        max_tokens=_int(params.get("max_new_tokens")),
    )


def _sglang_item(r: Reading, o: dict[str, Any]) -> None:
    """One output (``text`` or ``output_ids``, ``meta_info``) added to ``r``."""
    meta = _dict(o.get("meta_info"))
    if o.get("text") or o.get("output_ids"):
        r.content += 1
        r.tokens += 1
    r.response_id = r.response_id or _str(meta.get("id"))
    for attr in ("prompt_tokens", "completion_tokens"):
        value = _int(meta.get(attr))
        if value is not None:
            setattr(r, attr, (getattr(r, attr) or 0) + value)
    reason = _dict(meta.get("finish_reason"))
    kind = _str(reason.get("type"))
    if kind is not None:
        r.finish_reasons.append(kind)
        r.final = True
        if kind == "abort":
            r.error = r.error or str(reason.get("message") or "aborted")
    r.error = r.error or _error_text(o.get("error"))


def sglang_event(obj: Any) -> Reading:
    """``{"text": <the text so far>, "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
    "completion_tokens", ...}}``: the text is cumulative, so an event counts once whatever it adds, and the
    usage is the running total (the last event's is exact)."""
    r = Reading()
    _sglang_item(r, _dict(obj))
    return r


def sglang_body(obj: Any, headers: Mapping[str, str]) -> Reading:
    """One output, or a list of them for a batch (``text`` a list): usage summed over the list."""
    r = Reading()
    for item in obj if isinstance(obj, list) else [obj]:
        _sglang_item(r, _dict(item))
    return r


SGLANG_GENERATE: Final = Api(
    "sglang-generate", re.compile(r"/generate"), "text_completion", _sglang_ask, sglang_event, sglang_body,
    SGLANG_FINISH,
)  # fmt: skip


# -- llama.cpp's server: /completion and /completions ---------------------------------------------------
LLAMACPP_FINISH: Final = {"limit": V.OUTCOME_LENGTH}
"""``stop_type``: ``eos`` and ``word`` are stops, ``limit`` the budget (``n_predict`` or the context)."""


def _llamacpp_ask(body: Any, match: re.Match[str]) -> Ask:
    b = _dict(body)
    budget = _int(b.get("n_predict"))
    if budget is None:
        budget = _int(b.get("max_tokens"))
    return Ask(stream=b.get("stream") is True, max_tokens=budget if budget is not None and budget >= 0 else None)


def _llamacpp_item(r: Reading, o: dict[str, Any]) -> None:
    tokens = o.get("tokens")
    if o.get("content"):
        r.content += 1
        r.tokens += len(tokens) if isinstance(tokens, list) and tokens else 1
    elif isinstance(tokens, list):
        r.tokens += len(tokens)
    for attr, key in (("prompt_tokens", "tokens_evaluated"), ("completion_tokens", "tokens_predicted")):
        value = _int(o.get(key))
        if value is not None:
            setattr(r, attr, (getattr(r, attr) or 0) + value)
    if o.get("stop") is True:
        r.final = True
        r.finish_reasons.append(_str(o.get("stop_type")) or "none")
    r.error = r.error or _error_text(o.get("error"))


def llamacpp_event(obj: Any) -> Reading:
    """A partial ``{"content", "tokens", "stop": false, "tokens_predicted", "tokens_evaluated"}`` (the counts
    running totals), or the final ``{"content": "", "stop": true, "stop_type", "tokens_predicted", ...}``:
    the stream's end, as it sends no ``[DONE]``."""
    r = Reading()
    _llamacpp_item(r, _dict(obj))
    return r


def llamacpp_body(obj: Any, headers: Mapping[str, str]) -> Reading:
    """The final result, or an array of them for several prompts (usage summed)."""
    r = Reading()
    for item in obj if isinstance(obj, list) else [obj]:
        _llamacpp_item(r, _dict(item))
    return r


def _served_model_only(body: Any, match: re.Match[str]) -> Ask:
    """llama.cpp's server serves one model and only echoes a request's ``model`` back: the proxy labels its
    requests with the model ``/v1/models`` names, as the engine's metrics are."""
    return replace(openai_ask(body, match), model=None)


LLAMACPP_COMPLETION: Final = Api(
    "llamacpp-completion", re.compile(r"/completions?"), "text_completion", _llamacpp_ask, llamacpp_event,
    llamacpp_body, LLAMACPP_FINISH,
)  # fmt: skip
LLAMACPP_OPENAI_COMPLETIONS: Final = replace(OPENAI_COMPLETIONS, ask=_served_model_only)
LLAMACPP_OPENAI_CHAT: Final = replace(
    OPENAI_CHAT, pattern=re.compile(r"(?:/v1)?/chat/completions"), ask=_served_model_only
)


# -- /generate without --engine: TGI's or SGLang's, told apart by the body -------------------------------
def _generate_ask(body: Any, match: re.Match[str]) -> Ask:
    b = _dict(body)
    return _tgi_ask(b, False) if "inputs" in b else _sglang_ask(b, match)


def _sglang_shaped(obj: Any) -> bool:
    first = obj[0] if isinstance(obj, list) and obj else obj
    return isinstance(first, dict) and "meta_info" in first


ANY_GENERATE: Final = Api(
    "generate", re.compile(r"/generate"), "text_completion", _generate_ask,
    lambda o: sglang_event(o) if _sglang_shaped(o) else tgi_event(o),
    lambda o, h: sglang_body(o, h) if _sglang_shaped(o) else tgi_body(o, h),
    {**TGI_FINISH, **SGLANG_FINISH},
)  # fmt: skip
"""TGI's ``/generate`` (never streamed) and SGLang's share a path: the events say which answered."""


# -- the engines ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineApis:
    """The generation APIs one engine serves."""

    apis: tuple[Api, ...]
    model_is_adapter: bool = False
    """the OpenAI ``model`` field names a LoRA adapter, not the model (TGI's Messages API)."""
    placeholder_models: frozenset[str] = frozenset()
    """``model`` values that name nothing (TGI's ``tgi``)."""


@dataclass(frozen=True)
class Upstream:
    """Where an engine tells its health and its models."""

    health: str | None = None
    models: str | None = None
    """``/v1/models`` (adapters listed with a ``parent``) or TGI's ``/info`` (``model_id``)."""


ALL_APIS: Final = (
    OPENAI_COMPLETIONS,
    OPENAI_CHAT,
    ANY_GENERATE,
    TGI_GENERATE_STREAM,
    TGI_COMPAT,
    TRITON_GENERATE,
    TRITON_GENERATE_STREAM,
    LLAMACPP_COMPLETION,
)
ENGINE_APIS: Final[dict[str, EngineApis]] = {
    V.ENGINE_VLLM: EngineApis((OPENAI_COMPLETIONS, OPENAI_CHAT)),
    V.ENGINE_TRTLLM: EngineApis((OPENAI_COMPLETIONS, OPENAI_CHAT)),
    V.ENGINE_TGI: EngineApis(
        (OPENAI_COMPLETIONS, OPENAI_CHAT, TGI_GENERATE, TGI_GENERATE_STREAM, TGI_COMPAT),
        model_is_adapter=True,
        placeholder_models=frozenset({"tgi"}),
    ),
    V.ENGINE_TRITON: EngineApis((TRITON_GENERATE, TRITON_GENERATE_STREAM)),
    V.ENGINE_SGLANG: EngineApis((OPENAI_COMPLETIONS, OPENAI_CHAT, SGLANG_GENERATE)),
    V.ENGINE_LLAMACPP: EngineApis((LLAMACPP_OPENAI_COMPLETIONS, LLAMACPP_OPENAI_CHAT, LLAMACPP_COMPLETION)),
}
"""Without ``--engine``: every shape (``/generate``, TGI's and SGLang's, read by its body), ``model`` taken
as the model."""
ENGINE_UPSTREAM: Final[dict[str, Upstream]] = {
    V.ENGINE_VLLM: Upstream(health="/health", models="/v1/models"),
    V.ENGINE_TRTLLM: Upstream(health="/health", models="/v1/models"),
    V.ENGINE_TGI: Upstream(health="/health", models="/info"),
    V.ENGINE_TRITON: Upstream(health="/v2/health/ready"),
    V.ENGINE_SGLANG: Upstream(health="/health", models="/v1/models"),
    V.ENGINE_LLAMACPP: Upstream(health="/health", models="/v1/models"),
}


def engine_apis(engine: str | None) -> EngineApis:
    if engine is None:
        return EngineApis(ALL_APIS)
    return ENGINE_APIS[engine]


def match(apis: EngineApis, method: str, path: str) -> tuple[Api, re.Match[str]] | None:
    """The API shape of a request, if it is a generation request."""
    for api in apis.apis:
        if method == api.method:
            m = api.pattern.fullmatch(path)
            if m is not None:
                return api, m
    return None


def read_models(obj: Any) -> tuple[str | None, dict[str, str]]:
    """A models answer: (the served model, adapter -> its base model).

    OpenAI ``/v1/models``: entries with a ``parent`` are LoRA adapters of that parent (vLLM); the served
    model is the one entry without one, when there is exactly one. TGI ``/info``: ``model_id``.
    """
    o = _dict(obj)
    if isinstance(o.get("model_id"), str):
        return o["model_id"], {}
    adapters: dict[str, str] = {}
    bases: list[str] = []
    for entry in o.get("data") or ():
        e = _dict(entry)
        name, parent = _str(e.get("id")), _str(e.get("parent"))
        if name is None:
            continue
        if parent is not None and parent != name:
            adapters[name] = parent
        else:
            bases.append(name)
    return (bases[0] if len(bases) == 1 else None), adapters
