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
generate extension with one ``text_output`` per response).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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
    """A chunk: ``choices[].delta`` (chat) or ``choices[].text`` (completions), ``usage`` when asked for."""
    r = Reading()
    o = _dict(obj)
    r.response_id = _str(o.get("id"))
    for choice in o.get("choices") or ():
        c = _dict(choice)
        delta = _dict(c.get("delta"))
        if c.get("text") or delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
            r.content += 1
            r.tokens += 1
        reason = c.get("finish_reason")
        if isinstance(reason, str):
            r.finish_reasons.append(reason)
    if o.get("usage"):
        _openai_usage(r, o["usage"])
    r.error = _error_text(o.get("error"))
    return r


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
)
OPENAI_CHAT: Final = Api(
    "openai-chat",
    re.compile(r"/v1/chat/completions"),
    "chat",
    openai_ask,
    openai_event,
    openai_body,
    OPENAI_FINISH,
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
    TGI_GENERATE,
    TGI_GENERATE_STREAM,
    TGI_COMPAT,
    TRITON_GENERATE,
    TRITON_GENERATE_STREAM,
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
}
"""Without ``--engine``: every shape (their paths do not collide), ``model`` taken as the model."""
ENGINE_UPSTREAM: Final[dict[str, Upstream]] = {
    V.ENGINE_VLLM: Upstream(health="/health", models="/v1/models"),
    V.ENGINE_TRTLLM: Upstream(health="/health", models="/v1/models"),
    V.ENGINE_TGI: Upstream(health="/health", models="/info"),
    V.ENGINE_TRITON: Upstream(health="/v2/health/ready"),
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
