"""The bodies of a completion task's results (``tools/server/server-task.cpp``: ``result_timings::to_json``,
``server_task_result_cmpl_partial``, one per generated token when streaming, and
``server_task_result_cmpl_final``) in the three shapes the routes ask for: native (``/completion``),
OpenAI completions (``/v1/completions``) and OpenAI chat (``/v1/chat/completions``).

Held to the real b11312 build's bodies (ggml-org/llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f,
``tests/fixtures/engines/llamacpp/b11312-cpu/raw``: ``sse-*.txt`` and ``*-nonstream.json``): the keys and
their order, ``model`` the server's own (``model_alias``) whatever the request named,
``usage.prompt_tokens_details.cached_tokens``, the chat stream's ``role`` delta with ``content: null``
before the first token's, ``usage`` and ``timings`` in a last chunk with ``choices: []``, and the
generation timings per decode step (``predicted_ms / (predicted_n - 1)``: the last token is sampled, never
decoded). nlohmann writes ``inf`` and ``nan`` as ``null``; keys keep the source's order (``ordered_json``).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

from inferwatch.simulator.base import SimulatedEngine
from inferwatch.simulator.engines.llamacpp.metrics import generation_ms, prompt_ms
from inferwatch.simulator.engines.llamacpp.protocol import BUILD_INFO, N_VOCAB, TaskParams
from inferwatch.simulator.scheduler import Finish, Sequence

NATIVE, COMPLETION, CHAT = "none", "completion", "chat"
"""``oaicompat_type`` of a route."""


def num(x: float) -> float | None:
    """A ``double`` as nlohmann serialises it: non-finite values become ``null``."""
    return x if math.isfinite(x) else None


@dataclass
class Call:
    """One completion task: the route's shape, its parameters and what the server echoes."""

    kind: str
    params: TaskParams
    cmpl_id: str
    prompt_text: str
    prompt_tokens: int
    index: int = 0
    created: int = 0


def stop_type(seq: Sequence) -> str:
    """``stop_type_to_str``: ``eos`` when the model stopped by itself, ``limit`` at ``n_predict`` or the context."""
    if seq.finish is Finish.STOP:
        return "eos"
    return "limit" if seq.finish is Finish.LENGTH else "none"


def finish_reason(seq: Sequence) -> str:
    return "stop" if seq.finish is Finish.STOP else "length"


def token_text(engine: SimulatedEngine, seq: Sequence, i: int) -> str:
    """The piece of generated token ``i``: the end-of-generation token prints as nothing (``special=false``)."""
    if seq.finish is Finish.STOP and i == seq.output_tokens - 1:
        return ""
    return engine.token_text(seq, i)


def token_id(engine: SimulatedEngine, seq: Sequence, i: int) -> int:
    if seq.finish is Finish.STOP and i == seq.output_tokens - 1:
        return 2  # the EOS token of the simulated vocabulary
    return 100 + zlib.crc32(engine.token_text(seq, i).encode()) % (N_VOCAB - 100)


def content(engine: SimulatedEngine, seq: Sequence) -> str:
    return "".join(token_text(engine, seq, i) for i in range(seq.generated))


def timings(seq: Sequence) -> dict[str, Any]:
    """``slot.get_timings()`` as ``result_timings::to_json`` writes it (no ``draft_n``: no speculation)."""
    p_n = seq.prompt_tokens - seq.cached_tokens
    p_ms = prompt_ms(seq)
    g_n = seq.generated
    g_ms = generation_ms(seq) if g_n else 0.0
    steps = g_n - 1  # decode steps: the first token comes from the prompt's batch
    return {
        "cache_n": seq.cached_tokens,
        "prompt_n": p_n,
        "prompt_ms": p_ms,
        "prompt_per_token_ms": num(p_ms / p_n) if p_n else None,
        "prompt_per_second": num(1e3 / p_ms * p_n) if p_ms else None,
        "predicted_n": g_n,
        "predicted_ms": g_ms,
        "predicted_per_token_ms": num(g_ms / steps) if steps > 0 else None,
        "predicted_per_second": num(1e3 / g_ms * steps) if g_ms and steps >= 0 else None,
    }


def usage(call: Call, seq: Sequence) -> dict[str, Any]:
    return {
        "completion_tokens": seq.generated,
        "prompt_tokens": call.prompt_tokens,
        "total_tokens": seq.generated + call.prompt_tokens,
        "prompt_tokens_details": {"cached_tokens": seq.cached_tokens},
    }


def _oai_head(call: Call, obj: str) -> dict[str, Any]:
    return {"created": call.created, "model": call.params.model, "system_fingerprint": BUILD_INFO, "object": obj}


# -- partial results (streaming, one per token) ---------------------------------------------------------
def partial(engine: SimulatedEngine, call: Call, seq: Sequence, i: int) -> Any:
    """The partial result of generated token ``i`` (``n_decoded`` = i + 1); ``[]`` means nothing to send."""
    text = token_text(engine, seq, i)
    with_timings = call.params.timings_per_token
    if call.kind == NATIVE:
        out: dict[str, Any] = {
            "index": call.index,
            "content": text,
            "tokens": [token_id(engine, seq, i)],
            "stop": False,
            "id_slot": -1,
            "tokens_predicted": i + 1,
            "tokens_evaluated": call.prompt_tokens,
        }
        if with_timings:
            out["timings"] = timings(seq)
        return out
    if call.kind == COMPLETION:
        choice = {"text": text, "index": call.index, "logprobs": None, "finish_reason": None}
        out = {"choices": [choice], **_oai_head(call, "text_completion"), "id": call.cmpl_id}
        if with_timings:
            out["timings"] = timings(seq)
        return out
    deltas: list[dict[str, Any]] = []
    if i == 0:
        deltas.append({"role": "assistant", "content": None})
    deltas.append({"content": text})  # one per token, even an empty piece (raw/sse-v1-chat-completions.txt)
    chunks = [_chat_chunk(call, delta, None) for delta in deltas]
    if chunks and with_timings:
        chunks[-1]["timings"] = timings(seq)
    return chunks


def _chat_chunk(call: Call, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    head = _oai_head(call, "chat.completion.chunk")
    return {
        "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
        "created": head["created"],
        "id": call.cmpl_id,
        "model": head["model"],
        "system_fingerprint": BUILD_INFO,
        "object": "chat.completion.chunk",
    }


# -- final results ------------------------------------------------------------------------------------------
def final(engine: SimulatedEngine, call: Call, seq: Sequence, id_slot: int) -> Any:
    """``server_task_result_cmpl_final::to_json`` for the call's shape (streamed or not)."""
    if call.kind == NATIVE:
        return _final_native(engine, call, seq, id_slot)
    if call.kind == COMPLETION:
        return _final_completion(engine, call, seq)
    return _final_chat_stream(call, seq) if call.params.stream else _final_chat(engine, call, seq)


def _final_native(engine: SimulatedEngine, call: Call, seq: Sequence, id_slot: int) -> dict[str, Any]:
    stream = call.params.stream
    tokens = [token_id(engine, seq, i) for i in range(seq.generated)] if call.params.return_tokens else []
    n_predict = call.params.n_predict
    truncated = seq.finish is Finish.LENGTH and not (n_predict >= 0 and seq.generated >= max(n_predict, 1))
    res: dict[str, Any] = {
        "index": call.index,
        "content": "" if stream else content(engine, seq),
        "tokens": [] if stream else tokens,
        "id_slot": id_slot,
        "stop": True,
        "model": call.params.model,
        "tokens_predicted": seq.generated,
        "tokens_evaluated": call.prompt_tokens,
        "generation_settings": call.params.to_json(only_metrics=False),
        "prompt": call.prompt_text,
        "has_new_line": False,
        "truncated": truncated,
        "stop_type": stop_type(seq),
        "stopping_word": "",
        "tokens_cached": seq.computed,
        "timings": timings(seq),
    }
    if call.params.response_fields:
        return {f: res[f] for f in call.params.response_fields if f in res}
    return res


def _final_completion(engine: SimulatedEngine, call: Call, seq: Sequence) -> dict[str, Any]:
    text = "" if call.params.stream else content(engine, seq)
    choice = {"text": text, "index": call.index, "logprobs": None, "finish_reason": finish_reason(seq)}
    return {
        "choices": [choice],
        **_oai_head(call, "text_completion"),
        "usage": usage(call, seq),
        "id": call.cmpl_id,
        "timings": timings(seq),
    }


def _final_chat(engine: SimulatedEngine, call: Call, seq: Sequence) -> dict[str, Any]:
    choice = {
        "finish_reason": finish_reason(seq),
        "index": 0,
        "message": {"role": "assistant", "content": content(engine, seq)},
    }
    return {
        "choices": [choice],
        **_oai_head(call, "chat.completion"),
        "usage": usage(call, seq),
        "id": call.cmpl_id,
        "timings": timings(seq),
    }


def _final_chat_stream(call: Call, seq: Sequence) -> list[dict[str, Any]]:
    """Every delta was sent with the partial results: the finish chunk, the usage chunk, then the timings."""
    chunks = [_chat_chunk(call, {}, finish_reason(seq))]
    if call.params.include_usage:
        head = _oai_head(call, "chat.completion.chunk")
        chunks.append(
            {
                "choices": [],
                "created": head["created"],
                "id": call.cmpl_id,
                "model": head["model"],
                "system_fingerprint": BUILD_INFO,
                "object": "chat.completion.chunk",
                "usage": usage(call, seq),
            }
        )
    chunks[-1]["timings"] = timings(seq)
    return chunks
