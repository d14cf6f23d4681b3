"""vLLM's OpenAI-compatible API (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``), the
health and version routes, ``/metrics`` and the HTTP instrumentator's middleware."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint

from inferwatch.simulator.base import SimulatedEngine, count_tokens, finish_word
from inferwatch.simulator.engines.vllm.metrics import HTTP_EXCLUDED, VllmMetrics
from inferwatch.simulator.engines.vllm.spans import emit_span, open_spans
from inferwatch.simulator.scheduler import Sequence

VERSION = "0.33.0"


class VllmSim:
    """The simulated vLLM server: API routes, metrics and spans around a :class:`SimulatedEngine`."""

    def __init__(self, engine: SimulatedEngine) -> None:
        self.engine = engine
        self.metrics = VllmMetrics(engine)
        engine.add_observer(self.metrics)
        open_spans(engine)
        engine.on_internal_finish.append(self._internal_done)

    def _internal_done(self, seq: Sequence) -> None:
        self.metrics.on_user_request([seq])
        emit_span(self.engine, seq, seq.request_id, None, None)

    # -- API --------------------------------------------------------------------------------
    def build_app(self) -> FastAPI:
        app = FastAPI(title=f"simulated vLLM {VERSION}", lifespan=self.engine.lifespan)
        sim = self

        class Instrument(BaseHTTPMiddleware):
            async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
                start = time.perf_counter()
                response = await call_next(request)
                path = request.url.path
                if path not in HTTP_EXCLUDED and not path.startswith(("/simulator", "/dcgm")):
                    route = request.scope.get("route")
                    handler = getattr(route, "path", path)
                    sim.metrics.record_http(
                        handler,
                        request.method,
                        response.status_code,
                        int(request.headers.get("content-length", 0) or 0),
                        int(response.headers.get("content-length", 0) or 0),
                        time.perf_counter() - start,
                    )
                return response

        app.add_middleware(Instrument)

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200)

        @app.get("/version")
        async def version() -> dict[str, str]:
            return {"version": self.engine.settings.version or VERSION}

        @app.get("/metrics")
        async def metrics() -> Response:
            return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=1.0.0; charset=utf-8")

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            name = self.engine.settings.model
            return {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": int(self.engine.started),
                        "owned_by": "vllm",
                        "root": name,
                        "parent": None,
                        "max_model_len": self.engine.params.max_model_len,
                        "permission": [],
                    }
                ],
            }

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            body = await _json(request)
            if isinstance(body, Response):
                return body
            prompt = body.get("prompt", "")
            text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
            return await self._serve(request, body, count_tokens(text), chat=False)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            body = await _json(request)
            if isinstance(body, Response):
                return body
            messages = body.get("messages") or []
            text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
            return await self._serve(request, body, count_tokens(text) + 10, chat=True)

        return app

    async def _serve(self, request: Request, body: dict[str, Any], prompt_tokens: int, chat: bool) -> Response:
        eng = self.engine
        limit = eng.params.max_model_len
        if prompt_tokens + 1 > limit:
            return _error(
                400,
                f"This model's maximum context length is {limit} tokens. However, your prompt contains at least "
                f"{limit + 1} input tokens. Please reduce the length of the input prompt.",
            )
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        max_tokens = int(max_tokens) if max_tokens else (16 if not chat else limit - prompt_tokens)
        max_tokens = max(1, min(max_tokens, limit - prompt_tokens))
        n = max(1, int(body.get("n") or 1))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
        span_id = rid if chat else f"{rid}-0"
        params: dict[str, Any] = {k: body[k] for k in ("temperature", "top_p") if k in body}
        handle = eng.new_request(rid, prompt_tokens, max_tokens, n=n, ignore_eos=bool(body.get("ignore_eos")))
        headers = dict(request.headers)
        created = int(time.time())
        model = eng.settings.model

        def done() -> None:
            for s in handle.seqs:
                emit_span(self.engine, s, span_id, headers, params)
            self.metrics.on_user_request(handle.seqs)

        def usage() -> dict[str, Any]:
            completion = sum(s.generated for s in handle.seqs)
            return {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion,
                "completion_tokens": completion,
                "prompt_tokens_details": None,
            }

        if not body.get("stream"):
            try:
                await handle.wait()
            except BaseException:
                handle.abort()
                raise
            done()
            if chat:
                choices: list[dict[str, Any]] = [
                    {
                        "index": s.seq_index,
                        "message": {
                            "role": "assistant",
                            "content": handle.text(s),
                            "refusal": None,
                            "annotations": None,
                            "audio": None,
                            "function_call": None,
                            "tool_calls": [],
                            "reasoning_content": None,
                        },
                        "logprobs": None,
                        "finish_reason": finish_word(s.finish),
                        "stop_reason": None,
                    }
                    for s in handle.seqs
                ]
                obj = "chat.completion"
            else:
                choices = [
                    {
                        "index": s.seq_index,
                        "text": handle.text(s),
                        "logprobs": None,
                        "finish_reason": finish_word(s.finish),
                        "stop_reason": None,
                        "prompt_logprobs": None,
                    }
                    for s in handle.seqs
                ]
                obj = "text_completion"
            return JSONResponse(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": choices,
                    "usage": usage(),
                }
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def stream() -> AsyncIterator[bytes]:
            obj = "chat.completion.chunk" if chat else "text_completion"

            def chunk(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> bytes:
                payload = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}
                if include_usage and chat:
                    payload["usage"] = None
                payload.update(extra or {})
                return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()

            try:
                if chat:
                    for s in handle.seqs:
                        yield chunk(
                            [
                                {
                                    "index": s.seq_index,
                                    "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None,
                                    "finish_reason": None,
                                }
                            ]
                        )
                # Each token is one chunk; the last one carries the finish reason, so a token is held
                # back until the next event of its sequence says whether it was the last.
                held: dict[int, str] = {}

                def token_chunk(seq: Sequence, text: str, finish: str | None) -> bytes:
                    if chat:
                        c = {
                            "index": seq.seq_index,
                            "delta": {"content": text},
                            "logprobs": None,
                            "finish_reason": finish,
                        }
                    else:
                        c = {
                            "index": seq.seq_index,
                            "text": text,
                            "logprobs": None,
                            "finish_reason": finish,
                            "stop_reason": None,
                        }
                    return chunk([c])

                async for seq, kind in handle.events():
                    pending = held.pop(seq.seq_index, None)
                    if kind == "token":
                        if pending is not None:
                            yield token_chunk(seq, pending, None)
                        held[seq.seq_index] = eng.token_text(seq, seq.generated - 1)
                    elif pending is not None:
                        yield token_chunk(seq, pending, finish_word(seq.finish))
                if include_usage:
                    yield chunk([], {"usage": usage()})
                yield b"data: [DONE]\n\n"
                done()
            finally:
                handle.abort()  # the client went away mid-stream (no-op when finished)

        return StreamingResponse(stream(), media_type="text/event-stream")


async def _json(request: Request) -> dict[str, Any] | Response:
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "request body is not valid JSON")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object")
    return body


def _error(status: int, message: str) -> JSONResponse:
    kind = "BadRequestError" if status == 400 else "InternalServerError"
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status_code=status
    )


def create(engine: SimulatedEngine) -> tuple[FastAPI, VllmSim]:
    sim = VllmSim(engine)
    return sim.build_app(), sim
