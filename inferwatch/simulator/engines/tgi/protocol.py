"""What TGI's router puts on the wire besides its metrics and spans: its constants, Rust ``Display`` and
``Debug`` formatting, serde's view of the request bodies, the request timings and the generated tokens."""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from fastapi.responses import PlainTextResponse, Response
from opentelemetry.context import Context

from inferwatch.simulator.base import SimulatedEngine
from inferwatch.simulator.scheduler import Finish, Sequence

VERSION = "3.3.6-dev0"
"""``CARGO_PKG_VERSION`` of the v3.3.6 and v3.3.7 builds (tgi.md §0)."""
SHA = "dfb3fbe78e0d1d69251bd33065591c61bafdfaa8"
DOCKER_LABEL = "sha-dfb3fbe"
ROUTER = "text-generation-router"
COMPUTE_TYPE = "gpu+optimized"
PIPELINE_TAG = "text-generation"
MAX_CONCURRENT_REQUESTS = 128
MAX_BEST_OF = 2
MAX_STOP_SEQUENCES = 4
MAX_TOP_N_TOKENS = 5
VALIDATION_WORKERS = 2
MAX_CLIENT_BATCH_SIZE = 4
DEFAULT_GENERATION_LENGTH = 1024
EOS_ID, EOS_TEXT, BOS_ID, BOS_TEXT = 2, "</s>", 1, "<s>"
GENERATION_ERROR = "Request failed during generation: Server error: simulated shard failure"


# -- Rust number and duration formatting ------------------------------------------------------------
def rust_f64(x: float) -> str:
    """Rust's ``Display`` for ``f64``: shortest round-trip digits, never exponent form, no ``.0``."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    if x.is_integer():
        return str(int(x))
    text = repr(x)
    if "e" in text or "E" in text:
        return format(Decimal(text), "f")
    return text


def rust_duration(nanos: int) -> str:
    """Rust's ``Debug`` for ``std::time::Duration`` (``1.234567ms``, ``2.0315s``, ``812.3µs``, ``950ns``)."""
    nanos = max(0, int(nanos))
    secs, sub = divmod(nanos, 1_000_000_000)
    if secs:
        whole, frac, width, unit = secs, sub, 9, "s"
    elif sub >= 1_000_000:
        whole, frac, width, unit = sub // 1_000_000, sub % 1_000_000, 6, "ms"
    elif sub >= 1_000:
        whole, frac, width, unit = sub // 1_000, sub % 1_000, 3, "µs"
    else:
        whole, frac, width, unit = sub, 0, 0, "ns"
    text = str(whole)
    if frac:
        text += "." + str(frac).zfill(width).rstrip("0")
    return text + unit


_DURATION_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ns|µs|ms|s)$")
_UNIT = {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_rust_duration(text: str) -> float:
    """Seconds from a Rust ``Duration`` Debug string (what a trace consumer has to do)."""
    m = _DURATION_RE.match(text)
    if m is None:
        raise ValueError(f"not a Rust Duration: {text!r}")
    return float(m.group(1)) * _UNIT[m.group(2)]


def rust_debug_opt(value: Any) -> str:
    return "None" if value is None else f"Some({rust_debug(value)})"


def rust_debug(value: Any) -> str:
    """Rust ``Debug`` of a scalar/collection as TGI's structs hold it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(rust_debug(v) for v in value) + "]"
    if isinstance(value, dict):
        return "Json(" + json.dumps(value, separators=(",", ":")) + ")"
    return str(value)


# -- request timings --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Timings:
    """TGI's per-request durations in nanoseconds (``generate_internal``'s ``Instant`` arithmetic)."""

    validation: int
    queue: int
    inference: int
    per_token: int

    @property
    def total(self) -> int:
        return self.validation + self.queue + self.inference


def validation_ns(seq: Sequence) -> int:
    """Synthetic validation time: semaphore, tokenisation on a validation worker, parameter checks."""
    return 150_000 + 1_100 * seq.prompt_tokens + zlib.crc32(seq.request_id.encode()) % 60_000


def timings(seq: Sequence) -> Timings:
    arrival = seq.arrival
    start = seq.first_scheduled if seq.first_scheduled is not None else arrival
    end = seq.finished_at if seq.finished_at is not None else start
    inference = max(0, round((end - start) * 1e9))
    return Timings(
        validation=validation_ns(seq),
        queue=max(0, round((start - arrival) * 1e9)),
        inference=inference,
        per_token=inference // max(1, seq.generated),
    )


# -- request parsing (serde's view of GenerateRequest / ChatRequest) --------------------------------
class BodyError(Exception):
    """axum's ``Json`` rejection: 400 for bad JSON, 415 without the JSON content type, 422 otherwise."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def response(self) -> Response:
        return PlainTextResponse(self.message, status_code=self.status)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    return "sequence" if isinstance(value, list) else "map"


def _deserialize_error(path: str, value: Any, expected: str) -> BodyError:
    return BodyError(
        422,
        f"Failed to deserialize the JSON body into the target type: {path}: invalid type: "
        f"{_describe(value)}, expected {expected}",
    )


def _opt(d: Mapping[str, Any], key: str, kind: str, path: str) -> Any:
    """An ``Option<T>`` field with ``#[serde(default)]``: absent or null is ``None``."""
    value = d.get(key)
    if value is None:
        return None
    return _typed(value, kind, f"{path}{key}")


def _req(d: Mapping[str, Any], key: str, kind: str, path: str, default: Any) -> Any:
    """A non-``Option`` field with ``#[serde(default)]``: absent is the default, null is an error."""
    if key not in d:
        return default
    return _typed(d[key], kind, f"{path}{key}")


def _typed(value: Any, kind: str, path: str) -> Any:
    if kind == "bool":
        if not isinstance(value, bool):
            raise _deserialize_error(path, value, "a boolean")
        return value
    if kind == "f32":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _deserialize_error(path, value, "f32")
        return float(value)
    if kind in ("u32", "u64", "usize", "i32"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise _deserialize_error(path, value, kind)
        if value < 0 and kind != "i32":
            raise BodyError(
                422,
                "Failed to deserialize the JSON body into the target type: "
                f"{path}: invalid value: integer `{value}`, expected {kind}",
            )
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise _deserialize_error(path, value, "a string")
        return value
    if kind == "strs":
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise _deserialize_error(path, value, "a sequence of strings")
        return list(value)
    return value


@dataclass
class Params:
    """``GenerateParameters`` (field order as in ``router/src/lib.rs``)."""

    best_of: int | None = None
    temperature: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    typical_p: float | None = None
    do_sample: bool = False
    max_new_tokens: int | None = None
    return_full_text: bool | None = None
    stop: tuple[str, ...] = ()
    truncate: int | None = None
    watermark: bool = False
    details: bool = False
    decoder_input_details: bool = False
    seed: int | None = None
    top_n_tokens: int | None = None
    grammar: Any = None
    adapter_id: str | None = None

    @classmethod
    def parse(cls, raw: Any) -> Params:
        """An explicit ``parameters`` object (an absent one is ``default_parameters()``: sampling on)."""
        if not isinstance(raw, dict):
            raise _deserialize_error("parameters", raw, "struct GenerateParameters")
        p = "parameters."
        return cls(
            best_of=_opt(raw, "best_of", "usize", p),
            temperature=_opt(raw, "temperature", "f32", p),
            repetition_penalty=_opt(raw, "repetition_penalty", "f32", p),
            frequency_penalty=_opt(raw, "frequency_penalty", "f32", p),
            top_k=_opt(raw, "top_k", "i32", p),
            top_p=_opt(raw, "top_p", "f32", p),
            typical_p=_opt(raw, "typical_p", "f32", p),
            do_sample=_req(raw, "do_sample", "bool", p, False),
            max_new_tokens=_opt(raw, "max_new_tokens", "u32", p),
            return_full_text=_opt(raw, "return_full_text", "bool", p),
            stop=tuple(_req(raw, "stop", "strs", p, [])),
            truncate=_opt(raw, "truncate", "usize", p),
            watermark=_req(raw, "watermark", "bool", p, False),
            details=_req(raw, "details", "bool", p, False),
            decoder_input_details=_req(raw, "decoder_input_details", "bool", p, False),
            seed=_opt(raw, "seed", "u64", p),
            top_n_tokens=_opt(raw, "top_n_tokens", "u32", p),
            grammar=raw.get("grammar"),
            adapter_id=_opt(raw, "adapter_id", "str", p),
        )

    def debug(self) -> str:
        """The handler span's ``parameters`` field: ``GenerateParameters { … }`` in Rust Debug form."""
        fields = [
            ("best_of", rust_debug_opt(self.best_of)),
            ("temperature", rust_debug_opt(self.temperature)),
            ("repetition_penalty", rust_debug_opt(self.repetition_penalty)),
            ("frequency_penalty", rust_debug_opt(self.frequency_penalty)),
            ("top_k", rust_debug_opt(self.top_k)),
            ("top_p", rust_debug_opt(self.top_p)),
            ("typical_p", rust_debug_opt(self.typical_p)),
            ("do_sample", rust_debug(self.do_sample)),
            ("max_new_tokens", rust_debug_opt(self.max_new_tokens)),
            ("return_full_text", rust_debug_opt(self.return_full_text)),
            ("stop", rust_debug(list(self.stop))),
            ("truncate", rust_debug_opt(self.truncate)),
            ("watermark", rust_debug(self.watermark)),
            ("details", rust_debug(self.details)),
            ("decoder_input_details", rust_debug(self.decoder_input_details)),
            ("seed", rust_debug_opt(self.seed)),
            ("top_n_tokens", rust_debug_opt(self.top_n_tokens)),
            ("grammar", rust_debug_opt(self.grammar)),
            ("adapter_id", rust_debug_opt(self.adapter_id)),
        ]
        return "GenerateParameters { " + ", ".join(f"{k}: {v}" for k, v in fields) + " }"


def parse_generate(body: Any, compat: bool = False) -> tuple[str, Params, bool]:
    """``GenerateRequest`` (or ``CompatGenerateRequest`` with its ``stream`` flag)."""
    target = "CompatGenerateRequest" if compat else "GenerateRequest"
    if not isinstance(body, dict):
        raise BodyError(
            422,
            f"Failed to deserialize the JSON body into the target type: invalid type: {_describe(body)}, "
            f"expected struct {target}",
        )
    if "inputs" not in body:
        raise BodyError(422, "Failed to deserialize the JSON body into the target type: missing field `inputs`")
    inputs = _typed(body["inputs"], "str", "inputs")
    params = Params.parse(body["parameters"]) if "parameters" in body else Params(do_sample=True)
    stream = bool(_req(body, "stream", "bool", "", False)) if compat else False
    return inputs, params, stream


@dataclass
class ChatBody:
    model: str | None
    messages: list[tuple[str, str]]
    stream: bool
    include_usage: bool
    logprobs: bool
    params: Params


def parse_chat(body: Any) -> ChatBody:
    if not isinstance(body, dict):
        raise BodyError(
            422,
            f"Failed to deserialize the JSON body into the target type: invalid type: {_describe(body)}, "
            "expected struct ChatRequest",
        )
    if "messages" not in body:
        raise BodyError(422, "Failed to deserialize the JSON body into the target type: missing field `messages`")
    raw = body["messages"]
    if not isinstance(raw, list):
        raise _deserialize_error("messages", raw, "a sequence")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BodyError(
                422, f"Failed to deserialize the JSON body into the target type: messages[{i}]: missing field `role`"
            )
        content = m.get("content", "")
        if isinstance(content, list):
            parts = []
            for chunk in content:
                if isinstance(chunk, dict) and chunk.get("type") == "text":
                    parts.append(str(chunk.get("text", "")))
                elif isinstance(chunk, dict) and chunk.get("type") == "image_url":
                    parts.append(f"![]({(chunk.get('image_url') or {}).get('url', '')})")
            content = "".join(parts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise _deserialize_error(f"messages[{i}].content", content, "a string or a sequence of chunks")
        messages.append((m["role"], content))
    model = _opt(body, "model", "str", "")
    temperature = _opt(body, "temperature", "f32", "")
    presence = _opt(body, "presence_penalty", "f32", "")
    max_tokens = _opt(body, "max_tokens", "u32", "")
    if max_tokens is None:
        max_tokens = _opt(body, "max_completion_tokens", "u32", "")
    options = body.get("stream_options") or {}
    params = Params(
        temperature=None if temperature == 0.0 else temperature,
        repetition_penalty=None if presence is None else presence + 2.0,
        frequency_penalty=_opt(body, "frequency_penalty", "f32", ""),
        top_p=_opt(body, "top_p", "f32", ""),
        do_sample=temperature != 0.0,
        max_new_tokens=max_tokens,
        stop=tuple(_opt(body, "stop", "strs", "") or ()),
        details=True,
        seed=_opt(body, "seed", "u64", ""),
        top_n_tokens=_opt(body, "top_logprobs", "u32", ""),
        adapter_id=model if model not in (None, "tgi") else None,
    )
    return ChatBody(
        model=model,
        messages=messages,
        stream=bool(_req(body, "stream", "bool", "", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        logprobs=bool(_opt(body, "logprobs", "bool", "")),
        params=params,
    )


def chat_template(messages: list[tuple[str, str]]) -> str:
    """A Llama-3 style template (the simulated tokenizer only counts bytes)."""
    parts = ["<|begin_of_text|>"]
    for role, content in messages:
        parts.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>")
    parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def dumps(obj: Any) -> str:
    """serde_json's compact form."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def sse(obj: Any) -> bytes:
    """axum's ``Event::json_data``: ``data:`` without a space."""
    return f"data:{dumps(obj)}\n\n".encode()


# -- one request ------------------------------------------------------------------------------------
@dataclass
class Call:
    """One generation request as the router handles it (what its spans and responses need)."""

    handler: str
    """the handler span name: ``generate``, ``generate_stream`` or ``chat_completions``."""
    inputs: str
    params: Params
    stream: bool = False
    chat: bool = False
    compat: bool = False
    parent: Context | None = None
    seed: int | None = None
    """the seed reported back (``Some`` only when sampling)."""
    input_length: int = 0
    entry_id: int = 0
    model: str = ""
    """chat: the ``model`` of the response."""
    logprobs: bool = False
    include_usage: bool = False

    @property
    def finish_eos(self) -> bool:
        return not self.params.stop


# -- generated tokens -------------------------------------------------------------------------------
def token(engine: SimulatedEngine, seq: Sequence, i: int, call: Call) -> dict[str, Any]:
    """The ``i``-th generated token of ``seq`` (the special EOS token when it stopped by itself)."""
    lp = -((zlib.crc32(f"{seq.request_id}:{i}".encode()) % 2500) / 1000.0)
    if i == seq.generated - 1 and seq.finish is Finish.STOP and call.finish_eos:
        return {"id": EOS_ID, "text": EOS_TEXT, "logprob": round(lp / 25, 4), "special": True}
    word = engine.token_text(seq, i)
    return {"id": 100 + zlib.crc32(word.encode()) % 32000, "text": word, "logprob": lp, "special": False}


def generated_text(engine: SimulatedEngine, seq: Sequence, call: Call) -> str:
    """The generated text without special tokens."""
    toks = (token(engine, seq, i, call) for i in range(seq.generated))
    return "".join(t["text"] for t in toks if not t["special"])


def finish_reason(seq: Sequence, call: Call) -> str:
    if seq.finish is Finish.LENGTH:
        return "length"
    return "eos_token" if call.finish_eos else "stop_sequence"
