"""What llama.cpp's server puts on the wire besides ``/metrics``: its constants, nlohmann's and the C++
stream's number formatting, the error bodies, the sampling settings (``task_params::to_json``), the
request parameters it reads (``params_from_json_cmpl``) and the chat template it renders prompts with.

Held to the capture of a real ``llama-server`` b11312 (ggml-org/llama.cpp
0c1e57098bba43ac29e6e3b677cdceebdd22334f), ``tests/fixtures/engines/llamacpp/b11312-cpu``: ``props.json``
(the ``only_metrics`` key order of the settings, the defaults as C++ floats), ``raw/completion-nonstream.json``
(the full ``generation_settings``: ``dry_sequence_breakers``, ``stop``, ``logit_bias`` with the end-of-generation
token biased to ``-inf`` (``null``) under ``ignore_eos``, the grammar fields), ``raw/slots-after-load.json``
(a chat task's ``chat_format`` and ``generation_prompt``) and ``raw/error-*.json``. The error types and the
chat checks were read in ``tools/server/server-common.cpp`` (``format_error_response``,
``oaicompat_chat_params_parse``) at aa6192d38defc9a5d9fb2987413f71b18f214270; the b11312 build throws the
message checks as ``std::invalid_argument`` (400 ``invalid_request_error``, ``raw/error-bad-messages.json``)
where aa6192d threw ``std::runtime_error`` (500).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
BUILD_INFO = "b11312-0c1e570"
"""``build_info`` (``b<LLAMA_BUILD_NUMBER>-<short commit>``), in ``/props`` and every OpenAI body's
``system_fingerprint``, as the captured release build prints it."""
DEFAULT_PARALLEL = 4
"""``--parallel`` left at 1 (and no ``-kvu``): main() serves 4 slots."""
N_CTX_TRAIN = 131072
"""The simulated model's training context (``/v1/models`` meta; caps the per-slot context)."""
N_VOCAB = 32000
MODEL_FTYPE = "Q4_K - Medium"
"""The simulated GGUF's file type (``/props`` ``model_ftype``, ``/v1/models`` ``meta.ftype``)."""
EOS_ID = 2
"""The simulated vocabulary's end-of-generation token (``logit_bias`` under ``ignore_eos``)."""
BOS_TOKEN, EOS_TOKEN = "<s>", "</s>"
GENERATION_PROMPT = "<|im_start|>assistant\n"
"""What the template appends for the assistant's turn: a chat task's ``generation_prompt``."""
CHAT_TEMPLATE_CAPS = {
    "supports_object_arguments": False,
    "supports_parallel_tool_calls": False,
    "supports_preserve_reasoning": False,
    "supports_reasoning_effort": False,
    "supports_string_content": True,
    "supports_system_role": True,
    "supports_tool_calls": False,
    "supports_tools": False,
    "supports_typed_content": False,
}
"""``/props`` ``chat_template_caps`` of a template without tools (the captured one's)."""
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
JSON_TYPE = "application/json; charset=utf-8"
METRICS_TYPE = "text/plain; version=0.0.4"

# -- error types (format_error_response) -------------------------------------------------------------
INVALID_REQUEST, SERVER, NOT_FOUND, NOT_SUPPORTED, UNAVAILABLE, EXCEED_CONTEXT = (
    "invalid_request",
    "server",
    "not_found",
    "not_supported",
    "unavailable",
    "exceed_context_size",
)
ERROR_CODES = {
    INVALID_REQUEST: 400,
    SERVER: 500,
    NOT_FOUND: 404,
    NOT_SUPPORTED: 501,
    UNAVAILABLE: 503,
    EXCEED_CONTEXT: 400,
}


def error_data(message: str, kind: str) -> dict[str, Any]:
    """``format_error_response``: ``{"code", "message", "type"}`` in that order."""
    return {"code": ERROR_CODES[kind], "message": message, "type": f"{kind}_error"}


def loading_body() -> tuple[int, dict[str, Any]]:
    """The 503 while the model loads, keys ``message, type, code`` (``raw/health-loading.json``)."""
    return 503, {"error": {"message": "Loading model", "type": f"{UNAVAILABLE}_error", "code": 503}}


def exceed_context_message(n_prompt_tokens: int, n_ctx: int) -> str:
    """The ``exceed_context_size_error`` message (``raw/error-exceed-context.json``)."""
    return f"request ({n_prompt_tokens} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it"


def error_body(message: str, kind: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    """``server_res_generator::error``: the status from ``code`` and the data under ``"error"``."""
    data = {**error_data(message, kind), **extra}
    return int(data["code"]), {"error": data}


# -- formatting --------------------------------------------------------------------------------------
def dumps(data: Any) -> bytes:
    """``safe_json_to_str``: ``dump(-1)``, compact, UTF-8 kept as is."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def sse(data: Any) -> bytes:
    """``format_sse``: one ``data: <json>\\n\\n`` event, or one per item of an array."""
    items = data if isinstance(data, list) else [data]
    return b"".join(b"data: " + dumps(item) + b"\n\n" for item in items)


def f32(x: float) -> float:
    """A C++ ``float`` stored into a JSON number (a double): 0.8f is 0.800000011920929."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def cpp_double(x: float) -> str:
    """``std::ostream << double`` with the default precision (6 significant digits, ``%g``)."""
    if math.isnan(x):
        return "nan" if math.copysign(1.0, x) > 0 else "-nan"
    return format(x, "g")


# -- sampling defaults and the request's parameters --------------------------------------------------
SAMPLERS = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
SEED_DEFAULT = 0xFFFFFFFF
"""``LLAMA_DEFAULT_SEED``."""
FLOAT_DEFAULTS: dict[str, float] = {
    "temperature": 0.80,
    "dynatemp_range": 0.0,
    "dynatemp_exponent": 1.0,
    "top_p": 0.95,
    "min_p": 0.05,
    "top_n_sigma": -1.0,
    "xtc_probability": 0.0,
    "xtc_threshold": 0.10,
    "typical_p": 1.0,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "dry_multiplier": 0.0,
    "dry_base": 1.75,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.10,
    "adaptive_target": -1.0,
    "adaptive_decay": 0.90,
}
INT_DEFAULTS: dict[str, int] = {
    "top_k": 40,
    "repeat_last_n": 64,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": 64,
    "mirostat": 0,
    "n_probs": 0,
    "min_keep": 0,
    "n_keep": 0,
    "n_discard": 0,
}
FIRST_FLOATS = ("temperature", "dynatemp_range", "dynatemp_exponent")
MIDDLE_FLOATS = ("top_p", "min_p", "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p")
PENALTIES = ("repeat_penalty", "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base")
DRY_INTS = ("dry_allowed_length", "dry_penalty_last_n")
MIROSTAT_FLOATS = ("mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay")
CONTENT_ONLY = "Content-only"
CHAT_FORMAT = "peg-native"
"""``chat_format`` of a task rendered through the chat template (``raw/slots-after-load.json``)."""
REASONING_FORMAT = "deepseek"
"""``--reasoning-format`` ``auto``: what every request's settings say; ``/props`` shows the task defaults' ``none``."""


@dataclass
class TaskParams:
    """The parts of ``task_params`` a request sets (``params_from_json_cmpl``) that the simulator uses."""

    stream: bool = False
    include_usage: bool = False
    cache_prompt: bool = True
    return_tokens: bool = False
    timings_per_token: bool = False
    n_predict: int = -1
    ignore_eos: bool = False
    seed: int = SEED_DEFAULT
    model: str = ""
    chat: bool = False
    reasoning_format: str = "none"
    stop: list[str] = field(default_factory=list)
    floats: dict[str, float] = field(default_factory=lambda: dict(FLOAT_DEFAULTS))
    ints: dict[str, int] = field(default_factory=lambda: dict(INT_DEFAULTS))
    response_fields: list[str] = field(default_factory=list)

    def to_json(self, only_metrics: bool = True) -> dict[str, Any]:
        """``task_params::to_json`` (``only_metrics``: the ``/slots`` and ``/props`` form) in its key order."""
        fl = {k: f32(v) for k, v in self.floats.items()}
        ints = self.ints
        out: dict[str, Any] = {"seed": self.seed, **{k: fl[k] for k in FIRST_FLOATS}, "top_k": ints["top_k"]}
        out |= {k: fl[k] for k in MIDDLE_FLOATS}
        out["repeat_last_n"] = ints["repeat_last_n"]
        out |= {k: fl[k] for k in PENALTIES} | {k: ints[k] for k in DRY_INTS}
        if not only_metrics:
            out["dry_sequence_breakers"] = ["\n", ":", '"', "*"]
        out |= {"mirostat": ints["mirostat"], **{k: fl[k] for k in MIROSTAT_FLOATS}}
        if not only_metrics:
            out["stop"] = list(self.stop)
        out |= {"max_tokens": self.n_predict, "n_predict": self.n_predict}
        out |= {"n_keep": ints["n_keep"], "n_discard": ints["n_discard"]}
        out |= {"ignore_eos": self.ignore_eos, "stream": self.stream}
        if not only_metrics:
            out["logit_bias"] = [{"bias": None, "token": EOS_ID}] if self.ignore_eos else []
        out |= {"n_probs": ints["n_probs"], "min_keep": ints["min_keep"]}
        if not only_metrics:
            out |= {"grammar": "", "grammar_lazy": False, "grammar_triggers": [], "preserved_tokens": []}
        out |= {
            "chat_format": CHAT_FORMAT if self.chat else CONTENT_ONLY,
            "reasoning_format": self.reasoning_format,
            "reasoning_in_content": False,
            "generation_prompt": GENERATION_PROMPT if self.chat else "",
            "samplers": list(SAMPLERS),
            "speculative.types": "none",
            "timings_per_token": self.timings_per_token,
            "post_sampling_probs": False,
            "backend_sampling": False,
            "lora": [],
        }
        return out


class BadRequest(Exception):
    """A request the server answers with an error body (``kind`` picks the status)."""

    def __init__(self, message: str, kind: str = INVALID_REQUEST) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


def _value(data: Mapping[str, Any], key: str, default: Any) -> Any:
    """``json_value``: the default when the key is absent or null, or when its type does not fit."""
    v = data.get(key)
    if v is None:
        return default
    if isinstance(default, bool):
        return v if isinstance(v, bool) else default
    if isinstance(default, int):
        return v if isinstance(v, int) and not isinstance(v, bool) else default
    if isinstance(default, float):
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else default
    return v if isinstance(v, type(default)) else default


def params_from_json(data: Mapping[str, Any], model_alias: str) -> TaskParams:
    """``server_task::params_from_json_cmpl`` for the fields the simulator honours."""
    p = TaskParams()
    p.stream = _value(data, "stream", False)
    p.include_usage = _value(_value(data, "stream_options", {}), "include_usage", False)
    p.cache_prompt = _value(data, "cache_prompt", True)
    p.return_tokens = _value(data, "return_tokens", False)
    p.timings_per_token = _value(data, "timings_per_token", False)
    p.n_predict = _value(data, "n_predict", _value(data, "max_tokens", -1))
    p.ignore_eos = _value(data, "ignore_eos", False)
    p.seed = _value(data, "seed", SEED_DEFAULT)
    p.model = model_alias  # every response names the server's model, whatever the request said
    p.chat = "chat_format" in data
    p.reasoning_format = REASONING_FORMAT
    p.response_fields = [str(f) for f in _value(data, "response_fields", [])]
    for key, default in FLOAT_DEFAULTS.items():
        p.floats[key] = _value(data, key, default)
    for key, dflt in INT_DEFAULTS.items():
        p.ints[key] = _value(data, key, dflt)
    if "logprobs" in data and p.ints["n_probs"] == 0:
        p.ints["n_probs"] = _value(data, "logprobs", 0)
    if p.ints["repeat_last_n"] < -1:
        raise BadRequest("Error: repeat_last_n must be >= -1")
    if p.ints["dry_penalty_last_n"] < -1:
        raise BadRequest("Error: dry_penalty_last_n must be >= -1")
    stop = data.get("stop")
    if isinstance(stop, list):
        p.stop = [str(w) for w in stop if w]
    return p


# -- prompts ------------------------------------------------------------------------------------------
def _message_text(msg: Any) -> tuple[str, str]:
    """One message's role and text, with ``oaicompat_chat_params_parse``'s checks (``invalid_argument``: 400)."""
    role = str(msg.get("role", "")) if isinstance(msg, dict) else ""
    if not isinstance(msg, dict) or (role != "assistant" and "content" not in msg):
        raise BadRequest("All non-assistant messages must contain 'content'")
    if role == "assistant" and "content" not in msg and "tool_calls" not in msg:
        raise BadRequest("Assistant message must contain either 'content' or 'tool_calls'!")
    content = msg.get("content")
    if isinstance(content, list):
        if any(isinstance(p, dict) and p.get("type") != "text" for p in content):
            raise BadRequest("unsupported content[].type")
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    elif content is not None and not isinstance(content, str):
        raise BadRequest("Expected 'content' to be a string or an array")
    return role, content or ""


def render_chat(messages: Any) -> str:
    """The checks on ``messages``, then the (ChatML) template applied to them."""
    if not isinstance(messages, list):
        raise BadRequest("Expected 'messages' to be an array")
    out = [f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in map(_message_text, messages)]
    return "".join(out) + GENERATION_PROMPT


def chat_to_completion(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat body as the completion task reads it: ``prompt`` from the template, the rest copied."""
    if "messages" not in body:
        raise BadRequest("'messages' is required")
    prompt = render_chat(body["messages"])
    if _value(body, "n", 1) != 1:
        # a std::runtime_error (500) in the builds read; later ones may fan out n choices (not modelled)
        raise BadRequest("Only one completion choice is allowed", SERVER)
    data: dict[str, Any] = {"prompt": prompt, "chat_format": 0}
    if body.get("max_completion_tokens") is not None:
        data["n_predict"] = body["max_completion_tokens"]
    for key, value in body.items():
        if key not in data or key == "n_predict":
            data[key] = value
    return data
