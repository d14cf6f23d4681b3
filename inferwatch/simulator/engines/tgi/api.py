"""TGI's router API (``router/src/server.rs``): admission (validation: ``validation.py``), ``/generate``,
``/generate_stream``, ``/``, ``/v1/chat/completions``, ``/info``, ``/metrics`` and the timing headers."""

from __future__ import annotations

import asyncio
import json
import random
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from inferwatch.simulator.base import RequestHandle, SimulatedEngine
from inferwatch.simulator.engines.tgi.metrics import TgiMetrics
from inferwatch.simulator.engines.tgi.protocol import (
    BOS_ID,
    BOS_TEXT,
    COMPUTE_TYPE,
    DOCKER_LABEL,
    GENERATION_ERROR,
    MAX_BEST_OF,
    MAX_CLIENT_BATCH_SIZE,
    MAX_CONCURRENT_REQUESTS,
    MAX_STOP_SEQUENCES,
    PIPELINE_TAG,
    ROUTER,
    SHA,
    VALIDATION_WORKERS,
    VERSION,
    BodyError,
    Call,
    ChatBody,
    Params,
    chat_template,
    dumps,
    finish_reason,
    generated_text,
    parse_chat,
    parse_generate,
    rust_f64,
    sse,
    timings,
    token,
)
from inferwatch.simulator.engines.tgi.spans import TgiSpans, incoming_context
from inferwatch.simulator.engines.tgi.validation import Validation
from inferwatch.simulator.scheduler import Finish, Sequence
from inferwatch.simulator.sse import EventStream


class ClientGone(Exception):
    """The client disconnected before the response (nobody reads it)."""


class TgiError(Exception):
    """An ``InferError`` as the router returns it."""

    def __init__(self, status: int, message: str, error_type: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type

    def body(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type}


class TgiSim:
    """The simulated TGI router: API routes, metrics and spans around a :class:`SimulatedEngine`."""

    def __init__(self, engine: SimulatedEngine) -> None:
        self.engine = engine
        self.max_total_tokens = engine.params.max_model_len
        self.max_input_tokens = self.max_total_tokens - 1
        self.validation = Validation(self.max_input_tokens, self.max_total_tokens)
        self.metrics = TgiMetrics(engine, self.max_input_tokens, self.max_total_tokens)
        self.rng = random.Random(engine.settings.seed * 31 + 17)
        engine.add_observer(self.metrics)
        self.trace = TgiSpans(engine, self.rng)
        engine.on_internal_finish.append(self._internal_done)
        engine.load.submit = self._submit_internal

    # -- admission ----------------------------------------------------------------------------------
    def permits_in_use(self) -> int:
        m = self.engine.model
        return len(m.running) + len(m.waiting)

    def admit(self, call: Call) -> RequestHandle:
        """``Infer::generate_stream``: permit, validation, then the queue. Raises :class:`TgiError`."""
        if self.permits_in_use() >= MAX_CONCURRENT_REQUESTS:
            self.metrics.failure("overloaded")
            raise TgiError(429, "Model is overloaded", "overloaded")
        try:
            input_length, total_new = self.validation.validate(call.inputs, call.params)
        except ValueError as exc:
            self.metrics.failure("validation")
            error = TgiError(422, f"Input validation error: {exc}", "validation")
            self.trace.emit_rejected(call, error.message)
            raise error from None
        call.input_length = input_length
        seed = call.params.seed if call.params.seed is not None else self.rng.getrandbits(64)
        call.seed = seed if call.params.do_sample else None
        eng = self.engine
        return eng.new_request(f"tgi-{eng.next_id()}", input_length, max(1, total_new))

    def _submit_internal(
        self, prompt: int, max_tokens: int, output: int, prefix_key: str | None, prefix_tokens: int
    ) -> None:
        """The built-in load as requests to ``/generate``: counted, limited and validated like them."""
        self.metrics.request()
        if self.permits_in_use() >= MAX_CONCURRENT_REQUESTS:
            self.metrics.failure("overloaded")
            return
        try:
            self.validation.check_lengths(prompt, max_tokens)
        except ValueError:
            self.metrics.failure("validation")
            return
        self.engine.submit_internal(prompt, max_tokens, output, prefix_key, prefix_tokens)

    def _internal_done(self, seq: Sequence) -> None:
        params = Params(max_new_tokens=seq.max_tokens, details=True)
        call = Call("generate", "", params, input_length=seq.prompt_tokens)
        self.trace.emit(seq, call)

    def drop(self, handle: RequestHandle | None) -> None:
        """The client went away before the end: TGI counts ``err="dropped"``."""
        if handle is not None and any(s.finish is None for s in handle.seqs):
            handle.abort()
            self.metrics.failure("dropped")

    # -- tokens -------------------------------------------------------------------------------------
    def prefill_tokens(self, call: Call) -> list[dict[str, Any]]:
        """``decoder_input_details``: the prompt tokens (the first one has no logprob)."""
        out: list[dict[str, Any]] = [{"id": BOS_ID, "text": BOS_TEXT, "logprob": None}]
        for i in range(1, call.input_length):
            piece = call.inputs[4 * (i - 1) : 4 * i] or " "
            lp = -((zlib.crc32(f"{call.inputs}:{i}".encode()) % 4000) / 1000.0)
            out.append({"id": 100 + zlib.crc32(piece.encode()) % 32000, "text": piece, "logprob": lp})
        return out

    def output(self, seq: Sequence, call: Call) -> str:
        text = generated_text(self.engine, seq, call)
        return call.inputs + text if call.params.return_full_text else text

    # -- responses ----------------------------------------------------------------------------------
    def timing_headers(self, seq: Sequence, call: Call) -> dict[str, str]:
        t = timings(seq)
        return {
            "x-compute-type": COMPUTE_TYPE,
            "x-compute-time": rust_f64(t.total / 1e9),
            "x-compute-characters": str(len(call.inputs)),
            "x-total-time": str(t.total // 1_000_000),
            "x-validation-time": str(t.validation // 1_000_000),
            "x-queue-time": str(t.queue // 1_000_000),
            "x-inference-time": str(t.inference // 1_000_000),
            "x-time-per-token": str(t.per_token // 1_000_000),
            "x-prompt-tokens": str(call.input_length),
            "x-generated-tokens": str(seq.generated),
        }

    def stream_headers(self, call: Call) -> dict[str, str]:
        return {
            "content-type": "text/event-stream",
            "cache-control": "no-cache",
            "x-compute-type": COMPUTE_TYPE,
            "x-compute-characters": str(len(call.inputs)),
            "x-accel-buffering": "no",
        }

    async def generate_internal(self, call: Call, request: Request) -> Sequence:
        """``generate_internal``: count, admit, wait; the finished sequence or a :class:`TgiError`."""
        self.metrics.request()
        handle = self.admit(call)
        await self.wait(handle, request)
        seq = handle.seqs[0]
        self.trace.emit(seq, call)
        if seq.finish is Finish.ERROR:
            raise TgiError(424, GENERATION_ERROR, "generation")
        return seq

    async def wait(self, handle: RequestHandle, request: Request) -> None:
        """Wait for the end; a client that disconnects meanwhile drops the request (axum drops the future)."""
        finished = asyncio.ensure_future(handle.wait())
        gone = asyncio.ensure_future(disconnected(request))
        try:
            await asyncio.wait({finished, gone}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self.drop(handle)
            raise
        finally:
            finished.cancel()
            gone.cancel()
        if not finished.done() or finished.cancelled():
            self.drop(handle)
            raise ClientGone

    def generate_body(self, seq: Sequence, call: Call) -> dict[str, Any]:
        body: dict[str, Any] = {"generated_text": self.output(seq, call)}
        if call.params.details or call.params.decoder_input_details:
            body["details"] = {
                "finish_reason": finish_reason(seq, call),
                "generated_tokens": seq.generated,
                "seed": call.seed,
                "prefill": self.prefill_tokens(call) if call.params.decoder_input_details else [],
                "tokens": [token(self.engine, seq, i, call) for i in range(seq.generated)],
            }
        return body

    async def generate(self, call: Call, request: Request, wrap: bool) -> Response:
        try:
            seq = await self.generate_internal(call, request)
        except TgiError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        except ClientGone:
            return Response(status_code=499)
        body = self.generate_body(seq, call)
        return Response(
            dumps([body] if wrap else body), media_type="application/json", headers=self.timing_headers(seq, call)
        )

    def admit_stream(self, call: Call) -> RequestHandle:
        """The streaming-only checks of ``generate_stream_internal``, then :meth:`admit`."""
        if call.params.best_of not in (None, 1):
            self.metrics.failure("validation")
            raise TgiError(
                422, "Input validation error: `best_of` != 1 is not supported when streaming tokens", "validation"
            )
        if call.params.decoder_input_details:
            self.metrics.failure("validation")
            raise TgiError(
                422,
                "Input validation error: `decoder_input_details` == true is not supported when streaming tokens",
                "validation",
            )
        return self.admit(call)

    def generate_stream(self, call: Call) -> Response:
        """``generate_stream_internal``: the headers go first; validation and queueing happen in the stream,
        so their errors arrive as SSE events of a 200 response."""
        self.metrics.request()
        admitted: list[RequestHandle] = []

        async def events() -> AsyncIterator[bytes]:
            try:
                handle = self.admit_stream(call)
            except TgiError as error:
                yield self.openai_error(error) if call.chat else sse(error.body())
                if call.chat:
                    yield b"data:[DONE]\n\n"
                return
            admitted.append(handle)
            seq = handle.seqs[0]
            async for index, tok, final in self.tokens(handle, call):
                if call.chat:
                    for chunk in self.chat_chunks(seq, call, tok, final):
                        yield sse(chunk)
                    continue
                details = None
                if final and call.params.details:
                    details = {
                        "finish_reason": finish_reason(seq, call),
                        "generated_tokens": seq.generated,
                        "seed": call.seed,
                        "input_length": call.input_length,
                    }
                yield sse(
                    {
                        "index": index,
                        "token": tok,
                        "generated_text": self.output(seq, call) if final else None,
                        "details": details,
                    }
                )
            if seq.finish is Finish.ERROR:
                err = TgiError(424, GENERATION_ERROR, "generation")
                yield self.openai_error(err) if call.chat else sse(err.body())
            if call.chat:
                yield b"data:[DONE]\n\n"

        def close() -> None:
            for handle in admitted:
                self.drop(handle)

        return EventStream(events(), close, headers=self.stream_headers(call))

    async def tokens(self, handle: RequestHandle, call: Call) -> AsyncIterator[tuple[int, dict[str, Any], bool]]:
        """(index, token, is_last) per generated token; the last one is held until the finish event."""
        seq = handle.seqs[0]
        held: int | None = None
        seen = 0
        async for _, kind in handle.events():
            if kind == "token":
                if held is not None:
                    yield held + 1, token(self.engine, seq, held, call), False
                held = seen
                seen += 1
                continue
            if seq.finish in (Finish.STOP, Finish.LENGTH) and held is not None:
                self.trace.emit(seq, call)
                yield held + 1, token(self.engine, seq, held, call), True
            elif seq.finish is Finish.ERROR:
                self.trace.emit(seq, call)

    # -- chat ---------------------------------------------------------------------------------------
    def fingerprint(self) -> str:
        return f"{self.version}-{DOCKER_LABEL}"

    @property
    def version(self) -> str:
        return self.engine.settings.version or VERSION

    def chat_model(self, body: ChatBody) -> str:
        return self.engine.settings.model if body.model in (None, "tgi") else str(body.model)

    def chat_chunks(self, seq: Sequence, call: Call, tok: dict[str, Any], final: bool) -> list[dict[str, Any]]:
        created = int(time.time())
        delta = {"role": "assistant", "content": "" if tok["special"] else tok["text"]}
        logprobs = None
        if call.logprobs:
            logprobs = {"content": [{"token": tok["text"], "logprob": tok["logprob"], "top_logprobs": []}]}
        finish = None
        if final:
            finish = "stop" if finish_reason(seq, call) == "eos_token" else finish_reason(seq, call)
        chunks: list[dict[str, Any]] = [
            {
                "object": "chat.completion.chunk",
                "id": "",
                "created": created,
                "model": call.model,
                "system_fingerprint": self.fingerprint(),
                "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
                "usage": None,
            }
        ]
        if final and call.include_usage:
            chunks.append(
                {
                    "object": "chat.completion.chunk",
                    "id": "",
                    "created": created,
                    "model": call.model,
                    "system_fingerprint": self.fingerprint(),
                    "choices": [],
                    "usage": {
                        "prompt_tokens": call.input_length,
                        "completion_tokens": seq.generated,
                        "total_tokens": call.input_length + seq.generated,
                    },
                }
            )
        return chunks

    @staticmethod
    def openai_error(error: TgiError) -> bytes:
        return sse({"error": {"message": error.message, "http_status_code": 422}})

    async def chat(self, request: Request, body: ChatBody) -> Response:
        self.metrics.request()  # chat_completions counts once, generate_internal once more (+2)
        inputs = chat_template(body.messages)
        model = self.chat_model(body)
        call = Call(
            "chat_completions",
            inputs,
            body.params,
            stream=body.stream,
            chat=True,
            parent=incoming_context(request.headers),
            model=model,
            logprobs=body.logprobs,
            include_usage=body.include_usage,
        )
        if body.stream:
            return self.generate_stream(call)
        try:
            seq = await self.generate_internal(call, request)
        except TgiError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        except ClientGone:
            return Response(status_code=499)
        reason = finish_reason(seq, call)
        logprobs = None
        if body.logprobs:
            logprobs = {
                "content": [
                    {"token": t["text"], "logprob": t["logprob"], "top_logprobs": []}
                    for t in (token(self.engine, seq, i, call) for i in range(seq.generated))
                ]
            }
        payload = {
            "object": "chat.completion",
            "id": "",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": self.fingerprint(),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": generated_text(self.engine, seq, call)},
                    "logprobs": logprobs,
                    "finish_reason": "stop" if reason == "eos_token" else reason,
                }
            ],
            "usage": {
                "prompt_tokens": call.input_length,
                "completion_tokens": seq.generated,
                "total_tokens": call.input_length + seq.generated,
            },
        }
        return Response(dumps(payload), media_type="application/json", headers=self.timing_headers(seq, call))

    # -- API ----------------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """``struct Info`` in field order."""
        return {
            "model_id": self.engine.settings.model,
            "model_sha": None,
            "model_pipeline_tag": PIPELINE_TAG,
            "max_concurrent_requests": MAX_CONCURRENT_REQUESTS,
            "max_best_of": MAX_BEST_OF,
            "max_stop_sequences": MAX_STOP_SEQUENCES,
            "max_input_tokens": self.max_input_tokens,
            "max_total_tokens": self.max_total_tokens,
            "validation_workers": VALIDATION_WORKERS,
            "max_client_batch_size": MAX_CLIENT_BATCH_SIZE,
            "router": ROUTER,
            "version": self.version,
            "sha": SHA,
            "docker_label": DOCKER_LABEL,
        }

    def build_app(self) -> FastAPI:
        app = FastAPI(
            title=f"simulated TGI {VERSION}",
            lifespan=self.engine.lifespan,
            docs_url="/docs",
            openapi_url="/api-doc/openapi.json",
            redoc_url=None,
        )

        def ok() -> Response:
            return Response(status_code=200)

        @app.get("/")
        async def root_health() -> Response:
            return ok()

        @app.get("/health")
        async def health() -> Response:
            return ok()

        @app.get("/ping")
        async def ping() -> Response:
            return ok()

        @app.get("/info")
        async def info() -> Response:
            return Response(dumps(self.info()), media_type="application/json")

        @app.get("/v1/models")
        async def models() -> Response:
            name = self.engine.settings.model
            body = {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": name}]}
            return Response(dumps(body), media_type="application/json")

        @app.get("/metrics")
        async def metrics() -> Response:
            return PlainTextResponse(self.metrics.render())

        @app.post("/generate")
        async def generate(request: Request) -> Response:
            try:
                inputs, params, _ = parse_generate(await read_json(request))
            except BodyError as exc:
                return exc.response()
            call = Call("generate", inputs, params, parent=incoming_context(request.headers))
            return await self.generate(call, request, wrap=False)

        @app.post("/generate_stream")
        async def generate_stream(request: Request) -> Response:
            try:
                inputs, params, _ = parse_generate(await read_json(request))
            except BodyError as exc:
                return exc.response()
            call = Call("generate_stream", inputs, params, stream=True, parent=incoming_context(request.headers))
            return self.generate_stream(call)

        @app.post("/")
        async def compat_generate(request: Request) -> Response:
            try:
                inputs, params, stream = parse_generate(await read_json(request), compat=True)
            except BodyError as exc:
                return exc.response()
            if params.return_full_text is None:
                params.return_full_text = PIPELINE_TAG == "text-generation"
            parent = incoming_context(request.headers)
            if stream:
                call = Call("generate_stream", inputs, params, stream=True, compat=True, parent=parent)
                return self.generate_stream(call)
            return await self.generate(Call("generate", inputs, params, compat=True, parent=parent), request, wrap=True)

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Response:
            try:
                body = parse_chat(await read_json(request))
            except BodyError as exc:
                return exc.response()
            return await self.chat(request, body)

        return app


async def disconnected(request: Request) -> None:
    """Returns once the client has gone (the request body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def read_json(request: Request) -> Any:
    """axum's ``Json`` extractor: content type, then syntax, then (by the caller) the target type."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not (ctype == "application/json" or (ctype.startswith("application/") and ctype.endswith("+json"))):
        raise BodyError(415, "Expected request with `Content-Type: application/json`")
    raw = await request.body()
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise BodyError(400, f"Failed to parse the request body as JSON: {exc}") from None


def create(engine: SimulatedEngine) -> tuple[FastAPI, TgiSim]:
    sim = TgiSim(engine)
    return sim.build_app(), sim
