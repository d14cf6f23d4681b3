"""The OpenAI API of ``trtllm-serve`` (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``),
``/health``, ``/health_generate``, ``/version``, the Prometheus text at ``/prometheus/metrics`` and the
iteration stats at ``/metrics``; bodies follow ``openai_protocol.py`` and ``postprocess_handlers.py``."""

from __future__ import annotations

import json
import re
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import make_asgi_app
from starlette.routing import Mount
from starlette.types import Receive, Scope, Send

from inferwatch.simulator.base import SimulatedEngine, count_tokens
from inferwatch.simulator.engines.trtllm.catalog import FINISHED_REASON
from inferwatch.simulator.engines.trtllm.metrics import NGRAM, Speculation, TrtllmMetrics
from inferwatch.simulator.engines.trtllm.spans import TrtllmRequest, emit_span, open_spans
from inferwatch.simulator.scheduler import Finish, Sequence

VERSION = "1.3.0rc10"
PROMETHEUS_PATH = "/prometheus/metrics"
JSON_PATH = "/metrics"


def _dump(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def _without_none(value: Any) -> Any:
    """``model_dump_json(exclude_none=True)``."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


class TrtllmSim:
    """The simulated ``trtllm-serve``: API routes, metrics and spans around a :class:`SimulatedEngine`."""

    def __init__(self, engine: SimulatedEngine, speculation: Speculation | None = NGRAM) -> None:
        self.engine = engine
        self.metrics = TrtllmMetrics(engine, speculation)
        engine.add_observer(self.metrics)
        open_spans(engine)
        engine.on_internal_finish.append(self._internal_done)
        self._executor_ids = 0

    def next_executor_id(self) -> int:
        self._executor_ids += 1
        return self._executor_ids

    def _internal_done(self, seq: Sequence) -> None:
        """A request of the built-in load (a client of the HTTP API in spirit) finished."""
        if seq.finish is Finish.ERROR:
            self.metrics.request_error(500)
            return
        emit_span(self.engine, TrtllmRequest(self.next_executor_id(), [seq], None, {}))

    # -- API ----------------------------------------------------------------------------------------
    def build_app(self) -> FastAPI:
        app = FastAPI(title=f"simulated trtllm-serve {VERSION}", lifespan=self.engine.lifespan)
        metrics = self.metrics

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200)

        @app.get("/health_generate")
        async def health_generate() -> Response:
            body = {
                "model": self.engine.settings.model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_completion_tokens": 1,
                "stream": False,
                "temperature": 0.0,
            }
            response = await self._serve({}, body, count_tokens("hi") + 10, chat=True, prefix=None)
            if response.status_code == 200:
                return Response(status_code=200, content="Generation health check OK")
            return Response(status_code=500, content="Generation health check failed")

        @app.get("/version")
        async def version() -> JSONResponse:
            return JSONResponse({"version": self.engine.settings.version or VERSION})

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            card = {
                "id": self.engine.settings.model,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "tensorrt_llm",
            }
            return JSONResponse({"object": "list", "data": [card]})

        @app.get(JSON_PATH)
        async def iteration_stats() -> JSONResponse:
            return JSONResponse(metrics.take_iteration_stats())

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            body = await self._body(request, "prompt")
            if isinstance(body, Response):
                return body
            prompt = body["prompt"]
            if isinstance(prompt, list) and not prompt:
                return self._error(400, "'prompt' must not be empty.")
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                tokens, text = len(prompt), " ".join(map(str, prompt))
            else:
                text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
                tokens = count_tokens(text)
            return await self._serve(dict(request.headers), body, tokens, chat=False, prefix=(text, tokens))

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            body = await self._body(request, "messages")
            if isinstance(body, Response):
                return body
            messages = [m for m in body["messages"] if isinstance(m, dict)]
            texts = [_text_of(m.get("content")) for m in messages]
            tokens = count_tokens(" ".join(texts)) + 10
            shared = " ".join(texts[:-1]) if len(texts) > 1 else " ".join(texts)
            prefix = (shared, count_tokens(shared) + 10 if len(texts) > 1 else tokens)
            return await self._serve(dict(request.headers), body, tokens, chat=True, prefix=prefix)

        prometheus = make_asgi_app(registry=metrics.registry)

        async def prometheus_app(scope: Scope, receive: Receive, send: Send) -> None:
            metrics.drain_if_woken()
            await prometheus(scope, receive, send)

        mount = Mount(PROMETHEUS_PATH, app=prometheus_app)
        mount.path_regex = re.compile(f"^{PROMETHEUS_PATH}(?P<path>.*)$")
        app.routes.append(mount)
        return app

    async def _body(self, request: Request, required: str) -> dict[str, Any] | Response:
        """FastAPI's request validation as ``trtllm-serve`` answers it: 400 ``{"error": str(exc)}``."""
        try:
            body = await request.json()
        except ValueError as exc:
            err = {
                "type": "json_invalid",
                "loc": ("body", 0),
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": str(exc).split(":")[0]},
            }
            return self._invalid(err)
        if not isinstance(body, dict):
            return self._invalid(
                {
                    "type": "model_attributes_type",
                    "loc": ("body",),
                    "msg": "Input should be a valid dictionary or object to extract fields from",
                    "input": body,
                }
            )
        for name in (required, "model"):
            if name not in body:
                return self._invalid({"type": "missing", "loc": ("body", name), "msg": "Field required", "input": body})
        if not isinstance(body["model"], str):
            return self._invalid(
                {
                    "type": "string_type",
                    "loc": ("body", "model"),
                    "msg": "Input should be a valid string",
                    "input": body["model"],
                }
            )
        if body.get("stream_options") is not None and not body.get("stream"):
            message = (
                "stream_options can only be set if stream is true"
                if required == "messages"
                else "Stream options can only be defined when stream is true."
            )
            return self._invalid(
                {"type": "value_error", "loc": ("body",), "msg": f"Value error, {message}", "input": body}
            )
        return body

    def _invalid(self, error: dict[str, Any]) -> JSONResponse:
        self.metrics.request_error(400)
        return JSONResponse({"error": f"1 validation error:\n  {error}"}, status_code=400)

    def _error(self, status: int, message: str) -> JSONResponse:
        """``OpenAIServer.create_error_response`` (an ``ErrorResponse``, not wrapped in ``error``)."""
        self.metrics.request_error(status)
        kind = "BadRequestError" if status == 400 else "InternalServerError"
        body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
        return JSONResponse(body, status_code=status)

    def _abort(self, req: TrtllmRequest) -> None:
        """Abort what is still running (client gone); cancelled candidates are logged as finished."""
        live = [s for s in req.seqs if s.finish is None]
        for seq in live:
            self.engine.loop.abort(seq)
            if seq.finish is Finish.ABORT:
                self.metrics.on_abort(seq)
        emit_span(self.engine, req)

    async def _serve(
        self,
        headers: Mapping[str, str],
        body: dict[str, Any],
        prompt_tokens: int,
        chat: bool,
        prefix: tuple[str, int] | None,
    ) -> Response:
        eng = self.engine
        limit = eng.params.max_model_len
        if prompt_tokens + 1 > limit:
            return self._error(
                400,
                f"The sum of prompt length ({prompt_tokens}) and query length (0) should not exceed "
                f"max_seq_len ({limit})",
            )
        requested = body.get("max_completion_tokens") or body.get("max_tokens")
        max_tokens = int(requested) if requested else (limit - prompt_tokens if chat else 16)
        max_tokens = max(1, min(max_tokens, limit - prompt_tokens))
        n = max(1, int(body.get("n") or 1))
        prefix_key, prefix_tokens = None, 0
        if prefix is not None and prefix[0]:
            prefix_key, prefix_tokens = f"prompt-{zlib.crc32(prefix[0].encode()):08x}", prefix[1]
        executor_id = self.next_executor_id()
        handle = eng.new_request(
            f"trtllm-{executor_id}",
            prompt_tokens,
            max_tokens,
            n=n,
            ignore_eos=bool(body.get("ignore_eos")),
            prefix_key=prefix_key,
            prefix_tokens=prefix_tokens,
        )
        params = {k: body.get(k) for k in ("temperature", "top_p", "top_k")}
        req = TrtllmRequest(executor_id, handle.seqs, headers, params)
        model = str(body["model"])
        created = int(time.time())

        def usage() -> dict[str, Any]:
            completion = sum(s.generated for s in handle.seqs)
            return {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion,
                "completion_tokens": completion,
                "prompt_tokens_details": {"cached_tokens": handle.seqs[0].cached_tokens},
            }

        def reason(seq: Sequence) -> str:
            return FINISHED_REASON.get(seq.finish, "stop")

        if not body.get("stream"):
            try:
                await handle.wait()
            finally:
                self._abort(req)  # no-op once finished
            failed = next((s for s in handle.seqs if s.finish is Finish.ERROR), None)
            if failed is not None:
                return self._error(500, f"Generation failed: request {executor_id} failed in the executor")
            if chat:
                choices: list[dict[str, Any]] = [
                    {
                        "index": s.seq_index,
                        "message": {
                            "role": "assistant",
                            "content": handle.text(s),
                            "reasoning_content": "",
                            "reasoning": None,
                            "tool_calls": [],
                        },
                        "logprobs": None,
                        "finish_reason": reason(s),
                        "stop_reason": None,
                        "mm_embedding_handle": None,
                        "disaggregated_params": None,
                        "avg_decoded_tokens_per_iter": None,
                    }
                    for s in handle.seqs
                ]
                payload = {
                    "id": f"chatcmpl-{uuid.uuid4().hex}",
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": choices,
                    "usage": usage(),
                    "prompt_token_ids": None,
                    "prompt_token_ids_b64": None,
                }
            else:
                choices = [
                    {
                        "index": s.seq_index,
                        "text": handle.text(s),
                        "token_ids": None,
                        "logprobs": None,
                        "context_logits": None,
                        "finish_reason": reason(s),
                        "stop_reason": None,
                        "disaggregated_params": None,
                        "avg_decoded_tokens_per_iter": None,
                    }
                    for s in handle.seqs
                ]
                payload = {
                    "id": f"cmpl-{uuid.uuid4().hex}",
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": choices,
                    "usage": usage(),
                    "prompt_token_ids": None,
                }
            return JSONResponse(payload)

        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage", True) is not False
        stream_id = f"{'chatcmpl' if chat else 'cmpl'}-{executor_id}"
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choice: dict[str, Any]) -> bytes:
            if chat:  # chat_stream_post_processor: model_dump_json(exclude_none=True)
                payload = {"id": stream_id, "object": obj, "created": created, "model": model, "choices": [choice]}
                return f"data: {_dump(_without_none(payload))}\n\n".encode()
            payload = {
                "id": stream_id,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": None,
            }
            return f"data: {_dump(payload)}\n\n".encode()

        def token_chunk(seq: Sequence, text: str, finish: str | None) -> bytes:
            if chat:
                return chunk(
                    {
                        "index": seq.seq_index,
                        "delta": {"content": text, "reasoning_content": ""},
                        "finish_reason": finish,
                    }
                )
            return chunk(
                {
                    "index": seq.seq_index,
                    "text": text,
                    "token_ids": None,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "avg_decoded_tokens_per_iter": None,
                }
            )

        async def stream() -> AsyncIterator[bytes]:
            try:
                if chat:
                    for s in handle.seqs:
                        first = {
                            "id": stream_id,
                            "object": obj,
                            "created": created,
                            "model": model,
                            "choices": [{"index": s.seq_index, "delta": {"role": "assistant"}}],
                        }
                        yield f"data: {_dump(first)} \n\n".encode()
                # The finish reason rides on the last token's chunk: hold each token back until the next
                # event of its candidate says whether it was the last.
                held: dict[int, str] = {}
                failed = False
                async for seq, kind in handle.events():
                    pending = held.pop(seq.seq_index, None)
                    if kind == "token":
                        if pending is not None:
                            yield token_chunk(seq, pending, None)
                        held[seq.seq_index] = eng.token_text(seq, seq.generated - 1)
                    elif seq.finish is Finish.ERROR:
                        failed = True
                    elif pending is not None:
                        yield token_chunk(seq, pending, reason(seq))
                if failed:
                    error = {
                        "error": {
                            "message": f"Generation failed: request {executor_id} failed in the executor",
                            "type": "server_error",
                            "code": None,
                            "param": None,
                        }
                    }
                    yield f"data: {_dump(error)}\n\n".encode()
                elif include_usage:
                    final = {
                        "id": stream_id,
                        "object": obj,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage(),
                    }
                    yield f"data: {_dump(final)}\n\n".encode()
                yield b"data: [DONE]\n\n"
            finally:
                self._abort(req)

        return StreamingResponse(stream(), media_type="text/event-stream")


def create(engine: SimulatedEngine, speculation: Speculation | None = NGRAM) -> tuple[FastAPI, TrtllmSim]:
    """The app and the sim object; ``speculation=None`` serves without speculative decoding."""
    sim = TrtllmSim(engine, speculation)
    return sim.build_app(), sim
