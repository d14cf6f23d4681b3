"""SGLang's HTTP server (``python/sglang/srt/entrypoints/http_server.py``): the native ``/generate``, the
OpenAI-compatible ``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models``, the health and info
routes and ``/metrics``."""

from __future__ import annotations

import json
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from inferwatch.simulator.base import RequestHandle, SimulatedEngine, count_tokens, finish_word
from inferwatch.simulator.engines.sglang.metrics import SglangMetrics
from inferwatch.simulator.engines.sglang.spans import SglangSpans, finish_reason, open_spans
from inferwatch.simulator.scheduler import Finish, Sequence

VERSION = "44cedc2"
"""the commit simulated (``/server_info``'s ``version``; no release tag could be read at it)."""
DEFAULT_MAX_NEW_TOKENS = 128
"""``SamplingParams.max_new_tokens`` when a native request does not say."""
CHAT_TEMPLATE_TOKENS = 10
WEIGHT_VERSION = "default"


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


class SglangSim:
    """The simulated SGLang server: routes, metrics and spans around a :class:`SimulatedEngine`."""

    def __init__(self, engine: SimulatedEngine) -> None:
        self.engine = engine
        self.metrics = SglangMetrics(engine)
        engine.add_observer(self.metrics)
        open_spans(engine)
        self.spans = SglangSpans(engine)
        engine.on_internal_finish.append(self._internal_done)

    def _internal_done(self, seq: Sequence) -> None:
        self.spans.emit(seq, uuid.uuid4().hex, None, {"max_new_tokens": seq.max_tokens}, seq.prompt_tokens)

    # -- routes ---------------------------------------------------------------------------------
    def build_app(self) -> FastAPI:
        app = FastAPI(title=f"simulated SGLang {VERSION}", lifespan=self.engine.lifespan)

        async def ok() -> Response:
            return Response(status_code=200)

        app.add_api_route("/health", ok, methods=["GET"])
        app.add_api_route("/health_generate", ok, methods=["GET"])
        app.add_api_route("/ping", ok, methods=["GET"])
        app.add_api_route("/model_info", self.model_info, methods=["GET"])
        app.add_api_route("/get_model_info", self.model_info, methods=["GET"])
        app.add_api_route("/server_info", self.server_info, methods=["GET"])
        app.add_api_route("/get_server_info", self.server_info, methods=["GET"])
        app.add_api_route("/v1/models", self.models, methods=["GET"])
        app.add_api_route("/metrics", self.render_metrics, methods=["GET"])
        app.add_api_route("/generate", self.generate, methods=["POST", "PUT"])
        app.add_api_route("/v1/completions", self.completions, methods=["POST"])
        app.add_api_route("/v1/chat/completions", self.chat, methods=["POST"])
        return app

    async def render_metrics(self) -> Response:
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def model_info(self) -> dict[str, Any]:
        model = self.engine.settings.model
        return {
            "model_path": model,
            "tokenizer_path": model,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": WEIGHT_VERSION,
            "has_image_understanding": False,
            "has_audio_understanding": False,
        }

    async def server_info(self) -> dict[str, Any]:
        p, m = self.engine.params, self.engine.model
        return {
            "model_path": self.engine.settings.model,
            "served_model_name": self.engine.settings.model,
            "page_size": p.block_size,
            "max_running_requests": p.max_num_seqs,
            "chunked_prefill_size": p.max_num_batched_tokens,
            "context_length": p.max_model_len,
            "enable_metrics": True,
            "enable_trace": self.engine.spans is not None,
            "disaggregation_mode": "null",
            "max_total_num_tokens": p.num_blocks * p.block_size,
            "internal_states": [{"last_gen_throughput": self.metrics.gen_throughput, "#running-req": len(m.running)}],
            "version": self.engine.settings.version or VERSION,
        }

    async def models(self) -> dict[str, Any]:
        name = self.engine.settings.model
        card = {
            "id": name,
            "object": "model",
            "created": int(self.engine.started),
            "owned_by": "sglang",
            "root": name,
            "parent": None,
            "max_model_len": self.engine.params.max_model_len,
        }
        return {"object": "list", "data": [card]}

    # -- requests -------------------------------------------------------------------------------
    def _submit(
        self, prompt: str, prompt_tokens: int, max_new_tokens: int | None, n: int, ignore_eos: bool
    ) -> RequestHandle | str:
        """The request's sequences, or SGLang's error message when it cannot be served.

        The radix cache matches any earlier prompt's tokens: a prompt seen before (the same text) shares
        all but its last token, which the serving model's prefix cache then serves from its full pages.
        """
        limit = self.engine.params.max_model_len
        if prompt_tokens >= limit:
            return f"The input ({prompt_tokens} tokens) is longer than the model's context length ({limit} tokens)."
        budget = limit - prompt_tokens
        max_tokens = max(1, min(max_new_tokens if max_new_tokens is not None else DEFAULT_MAX_NEW_TOKENS, budget))
        key = f"prompt-{zlib.crc32(prompt.encode()):08x}"
        return self.engine.new_request(
            uuid.uuid4().hex,
            prompt_tokens,
            max_tokens,
            n=n,
            ignore_eos=ignore_eos,
            prefix_key=key,
            prefix_tokens=max(prompt_tokens - 1, 0),
        )

    def _finish(
        self, handle: RequestHandle, rid: str, request: Request, sampling: dict[str, Any], prompt_tokens: int
    ) -> None:
        """The request's trace, one per sequence (``n`` > 1: SGLang's ``rid_i`` sub-requests)."""
        for s in handle.seqs:
            sid = rid if len(handle.seqs) == 1 else f"{rid}_{s.seq_index}"
            self.spans.emit(s, sid, dict(request.headers), sampling, prompt_tokens)

    def close(self, handle: RequestHandle, traced: Callable[[], None] | None = None) -> None:
        """The client went away: abort what still runs (``num_aborted_requests_total``, and the request's
        trace through ``traced``); a no-op when it finished."""
        aborted = False
        for s in handle.seqs:
            if s.finish is None:
                self.engine.loop.abort(s)
                if s.finish is Finish.ABORT:
                    self.metrics.on_finished(s)
                    aborted = True
        if aborted and traced is not None:
            traced()

    async def _wait(self, handle: RequestHandle, traced: Callable[[], None]) -> None:
        try:
            await handle.wait()
        except BaseException:
            self.close(handle, traced)
            raise

    def meta_info(
        self, seq: Sequence, rid: str, prompt_tokens: int, generated: int | None = None, final: bool = True
    ) -> dict[str, Any]:
        """``meta_info`` of a native response (``_handle_batch_output`` of the tokenizer manager); a stream's
        chunks before the last say ``generated`` tokens so far and no finish reason."""
        info: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish_reason(seq) if final else None,
            "prompt_tokens": prompt_tokens,
            "weight_version": WEIGHT_VERSION,
            "total_retractions": seq.preemptions,
            "completion_tokens": seq.generated if generated is None else generated,
            "cached_tokens": seq.cached_tokens,
            "cached_tokens_details": None,
            "dp_rank": None,
            "e2e_latency": (seq.finished_at or self.engine.clock.now()) - seq.arrival,
        }
        if final:
            info["response_sent_to_client_ts"] = time.time()
        return info

    async def generate(self, request: Request) -> Response:
        body = await _json(request)
        if isinstance(body, Response):
            return body
        text = body.get("text")
        ids = body.get("input_ids")
        prompt = json.dumps(ids) if isinstance(ids, list) else (text if isinstance(text, str) else "")
        prompt_tokens = len(ids) if isinstance(ids, list) else count_tokens(prompt)
        sampling = dict(body.get("sampling_params") or {})
        got = self._submit(
            prompt, prompt_tokens, _int(sampling.get("max_new_tokens")), 1, bool(sampling.get("ignore_eos"))
        )
        if isinstance(got, str):
            return _native_error(got)
        handle, rid = got, str(body.get("rid") or uuid.uuid4().hex)
        seq = handle.seqs[0]

        def traced() -> None:
            self._finish(handle, rid, request, sampling, prompt_tokens)

        if not body.get("stream"):
            await self._wait(handle, traced)
            traced()
            out_ids = [_token_id(seq, i) for i in range(seq.generated)]
            return JSONResponse(
                {"text": handle.text(seq), "output_ids": out_ids, "meta_info": self.meta_info(seq, rid, prompt_tokens)}
            )

        async def stream() -> AsyncIterator[bytes]:
            # SGLang's native stream: each chunk carries the whole text so far and the new output ids; a
            # token is held back until the next event says whether it was the last (it carries the finish)
            try:
                sent = received = 0
                held = False

                def chunk(final: bool) -> bytes:
                    nonlocal sent
                    new = [_token_id(seq, i) for i in range(sent, received)]
                    sent = received
                    text = "".join(self.engine.token_text(seq, i) for i in range(received))
                    meta = self.meta_info(seq, rid, prompt_tokens, received, final)
                    return b"data: " + _dumps({"text": text, "output_ids": new, "meta_info": meta}) + b"\n\n"

                async for _, kind in handle.events():
                    if held:
                        yield chunk(final=kind == "finish")
                    held = kind == "token"
                    received += kind == "token"
                if received == 0:
                    yield chunk(final=True)
                yield b"data: [DONE]\n\n"
                traced()
            finally:
                self.close(handle, traced)

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def completions(self, request: Request) -> Response:
        body = await _json(request)
        if isinstance(body, Response):
            return body
        prompt = body.get("prompt", "")
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        return await self._openai(request, body, text, count_tokens(text), chat=False)

    async def chat(self, request: Request) -> Response:
        body = await _json(request)
        if isinstance(body, Response):
            return body
        messages = body.get("messages") or []
        text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        return await self._openai(request, body, text, count_tokens(text) + CHAT_TEMPLATE_TOKENS, chat=True)

    async def _openai(
        self, request: Request, body: dict[str, Any], prompt: str, prompt_tokens: int, chat: bool
    ) -> Response:
        max_tokens = _int(body.get("max_completion_tokens") or body.get("max_tokens"))
        if max_tokens is None and not chat:
            max_tokens = 16
        n = max(1, _int(body.get("n")) or 1)
        got = self._submit(prompt, prompt_tokens, max_tokens, n, bool(body.get("ignore_eos")))
        if isinstance(got, str):
            return _openai_error(got)
        handle = got
        rid = uuid.uuid4().hex
        sampling: dict[str, Any] = {k: body[k] for k in ("temperature", "top_p", "top_k") if k in body}
        sampling["max_new_tokens"] = handle.seqs[0].max_tokens
        if n > 1:
            sampling["n"] = n
        reply = OpenAIReply(self, handle, rid, prompt_tokens, body.get("model") or self.engine.settings.model, chat)

        def traced() -> None:
            self._finish(handle, rid, request, sampling, prompt_tokens)

        if not body.get("stream"):
            await self._wait(handle, traced)
            traced()
            return JSONResponse(reply.whole())
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(reply.stream(include_usage, traced), media_type="text/event-stream")


class OpenAIReply:
    """One OpenAI-compatible response (``serving_completions.py``, ``serving_chat.py``)."""

    def __init__(self, sim: SglangSim, handle: RequestHandle, rid: str, prompt_tokens: int, model: str, chat: bool):
        self.sim, self.handle, self.rid, self.prompt_tokens, self.model, self.chat = (
            sim,
            handle,
            rid,
            prompt_tokens,
            model,
            chat,
        )
        self.created = int(time.time())

    def usage(self) -> dict[str, Any]:
        completion = sum(s.generated for s in self.handle.seqs)
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
        }

    def choice(self, seq: Sequence, text: str | None, finish: str | None) -> dict[str, Any]:
        """A response choice (``text`` None), else a stream chunk's: a chat delta holds ``text`` (none with
        the finish reason, which SGLang sends in a chunk of its own)."""
        matched = 2 if finish == "stop" else None
        if self.chat:
            if text is None:
                body: dict[str, Any] = {
                    "role": "assistant",
                    "content": self.handle.text(seq),
                    "reasoning_content": None,
                    "tool_calls": None,
                }
                return {
                    "index": seq.seq_index,
                    "message": body,
                    "logprobs": None,
                    "finish_reason": finish,
                    "matched_stop": matched,
                }
            delta: dict[str, Any] = {"content": text} if finish is None else {}
            return {
                "index": seq.seq_index,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": matched,
            }
        return {
            "index": seq.seq_index,
            "text": self.handle.text(seq) if text is None else text,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": matched,
        }

    def whole(self) -> dict[str, Any]:
        choices = [self.choice(s, None, finish_word(s.finish)) for s in self.handle.seqs]
        return {
            "id": self.rid,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
            "metadata": {"weight_version": WEIGHT_VERSION},
        }

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        payload = {
            "id": self.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage,
        }
        return b"data: " + _dumps(payload) + b"\n\n"

    async def stream(self, include_usage: bool, done: Callable[[], None]) -> AsyncIterator[bytes]:
        handle, eng = self.handle, self.sim.engine
        try:
            if self.chat:  # serving_chat.py opens each choice with the assistant role and empty content
                for seq in handle.seqs:
                    role = {"role": "assistant", "content": ""}
                    yield self.chunk(
                        [
                            {
                                "index": seq.seq_index,
                                "delta": role,
                                "logprobs": None,
                                "finish_reason": None,
                                "matched_stop": None,
                            }
                        ]
                    )
            sent = {s.seq_index: 0 for s in handle.seqs}
            async for seq, kind in handle.events():
                if kind == "token":
                    text = eng.token_text(seq, sent[seq.seq_index])
                    sent[seq.seq_index] += 1
                    yield self.chunk([self.choice(seq, text, None)])
                else:
                    yield self.chunk([self.choice(seq, "", finish_word(seq.finish))])
            if include_usage:
                yield self.chunk([], self.usage())
            yield b"data: [DONE]\n\n"
            done()
        finally:
            self.sim.close(handle, done)


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _token_id(seq: Sequence, index: int) -> int:
    """A stand-in token id, stable per sequence and position."""
    return 1000 + (zlib.crc32(seq.request_id.encode()) + 7 * index + seq.seq_index) % 30000


async def _json(request: Request) -> dict[str, Any] | Response:
    try:
        body = await request.json()
    except ValueError:
        return _openai_error("request body is not valid JSON")
    if not isinstance(body, dict):
        return _openai_error("request body must be a JSON object")
    return body


def _native_error(message: str) -> JSONResponse:
    """``_create_error_response`` of the native API."""
    return JSONResponse({"error": {"message": message}}, status_code=400)


def _openai_error(message: str) -> JSONResponse:
    """SGLang's OpenAI ``ErrorResponse``."""
    return JSONResponse(
        {"object": "error", "message": message, "type": "BadRequest", "param": None, "code": 400}, status_code=400
    )


def create(engine: SimulatedEngine) -> tuple[FastAPI, SglangSim]:
    sim = SglangSim(engine)
    return sim.build_app(), sim
