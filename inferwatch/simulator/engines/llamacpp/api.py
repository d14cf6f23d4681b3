"""llama.cpp server's routes: health, ``/metrics``, ``/props``, ``/models``, ``/slots`` and the completion
routes, behind the ``server-http.cpp`` middleware (``Server: llama.cpp``, CORS origin echo, 503 while the
model loads) and its JSON 404. The routes and the middleware were read in ``tools/server/server.cpp`` and
``server-http.cpp`` at aa6192d38defc9a5d9fb2987413f71b18f214270; the bodies are held to the real b11312
build (ggml-org/llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f,
``tests/fixtures/engines/llamacpp/b11312-cpu``): ``props.json``, ``models.json``, ``raw/health-*.json``,
``raw/*-disabled.json`` and ``raw/error-exceed-context.json``."""

from __future__ import annotations

import asyncio
import json
import random
import string
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferwatch.simulator.base import RequestHandle, SimulatedEngine, count_tokens
from inferwatch.simulator.engines.llamacpp import protocol as P
from inferwatch.simulator.engines.llamacpp.metrics import LlamacppMetrics
from inferwatch.simulator.engines.llamacpp.protocol import BadRequest, dumps, error_body, sse
from inferwatch.simulator.engines.llamacpp.results import CHAT, COMPLETION, NATIVE, Call, final, partial
from inferwatch.simulator.engines.llamacpp.slots import Slots, Task
from inferwatch.simulator.scheduler import Finish, Sequence
from inferwatch.simulator.sse import EventStream

TRUE_WORDS = ("1", "true", "on", "enabled", "yes")
MODELS_PATHS = ("/models", "/v1/models", "/api/tags")
NO_METRICS = "This server does not support metrics endpoint. Start it with `--metrics`"
NO_SLOTS = "This server does not support slots endpoint. Start it with `--slots`"
LOADING_HTML = b"<html><body>Loading model...</body></html>"


@dataclass
class LlamacppOptions:
    """The launch options the simulator honours, as ``llama-server`` flags (and their environment variables)."""

    parallel: int | None = None
    """``-np/--parallel`` (``LLAMA_ARG_N_PARALLEL``); unset: 4, as main() does for the default of 1."""
    endpoint_metrics: bool = True
    """``--metrics`` (``LLAMA_ARG_ENDPOINT_METRICS``): on here so the demo and the exporter have a page."""
    endpoint_slots: bool = True
    """``--slots`` / ``--no-slots`` (``LLAMA_ARG_ENDPOINT_SLOTS``): on by default in the b11312 build."""
    endpoint_props: bool = False
    """``--props`` (``LLAMA_ARG_ENDPOINT_PROPS``): lets ``POST /props`` change global properties."""
    load_seconds: float = 0.0
    """Simulated seconds the model takes to load (``/health`` answers 503 meanwhile)."""


def options_from_env(environ: Mapping[str, str]) -> LlamacppOptions:
    """The options from llama-server's own environment variables (unset ones keep the simulator's defaults)."""

    def flag(name: str, default: bool) -> bool:
        value = environ.get(name)
        return default if value is None else value.strip().lower() in TRUE_WORDS

    parallel = environ.get("LLAMA_ARG_N_PARALLEL")
    return LlamacppOptions(
        parallel=int(parallel) if parallel else None,
        endpoint_metrics=flag("LLAMA_ARG_ENDPOINT_METRICS", True),
        endpoint_slots=flag("LLAMA_ARG_ENDPOINT_SLOTS", True),
        endpoint_props=flag("LLAMA_ARG_ENDPOINT_PROPS", False),
    )


class ServerMiddleware:
    """``server-http.cpp``'s pre-routing handler and defaults: ``Server`` and CORS headers on every
    response, and 503 for everything but the model list until the model is loaded."""

    def __init__(self, app: ASGIApp, ready: Callable[[], bool]) -> None:
        self.app = app
        self.ready = ready

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = b""
        for key, value in scope.get("headers", []):
            if key == b"origin":
                origin = value

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"server"]
                headers += [(b"server", b"llama.cpp"), (b"access-control-allow-origin", origin)]
                message = {**message, "headers": headers}
            await send(message)

        path = scope["path"]
        if not self.ready() and path not in MODELS_PATHS:
            if path == "/" or path.rsplit(".", 1)[-1] == "html":
                response = Response(LOADING_HTML, 503, media_type="text/html; charset=utf-8")
            else:
                status, body = P.loading_body()
                response = Response(dumps(body), status, media_type=P.JSON_TYPE)
            await response(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)


class LlamacppSim:
    """The simulated llama-server: slots, metrics and routes around a :class:`SimulatedEngine`."""

    def __init__(self, engine: SimulatedEngine, options: LlamacppOptions | None = None) -> None:
        self.engine = engine
        self.options = options or LlamacppOptions()
        p = engine.params
        self.n_parallel = max(1, self.options.parallel or P.DEFAULT_PARALLEL)
        self.n_ctx = p.num_blocks * p.block_size
        self.n_ctx_slot = min(self.n_ctx // self.n_parallel, P.N_CTX_TRAIN)
        # each slot owns its share of the context: the scheduler never runs more sequences than slots,
        # nor a sequence longer than its slot, so it never preempts (llama.cpp has no preemption)
        p.max_num_seqs = self.n_parallel
        p.max_model_len = self.n_ctx_slot
        engine.load.max_model_len = self.n_ctx_slot
        self.slots = Slots(self.n_parallel, self.n_ctx_slot)
        self.metrics = LlamacppMetrics(engine, self.n_parallel, self.slots)
        engine.add_observer(self.metrics)
        self.rng = random.Random(engine.settings.seed * 131 + 7)
        self.ready_at = engine.clock.now() + self.options.load_seconds
        self.t_start = int(time.monotonic() * 1e6)
        self.task_ids = 0
        self.model_path = f"models/{engine.settings.model}.gguf"
        alphabet = string.ascii_letters + string.digits
        self.media_marker = "<__media_" + "".join(self.rng.choice(alphabet) for _ in range(32)) + "__>"
        """A random marker drawn at start (``/props`` ``media_marker``)."""
        self.recent: deque[str] = deque(maxlen=self.n_parallel)
        """The last prompts, one per slot: what the slots' caches hold."""

    # -- state ------------------------------------------------------------------------------------------
    def ready(self) -> bool:
        return self.engine.clock.now() >= self.ready_at

    def next_task_id(self) -> int:
        self.task_ids += 1
        return self.task_ids - 1

    def cmpl_id(self) -> str:
        alphabet = string.digits + string.ascii_uppercase + string.ascii_lowercase
        return "chatcmpl-" + "".join(self.rng.choice(alphabet) for _ in range(32))

    # -- bodies -----------------------------------------------------------------------------------------
    def props(self) -> dict[str, Any]:
        """``get_props`` in its key order (``b11312-cpu/props.json``)."""
        o = self.options
        return {
            "default_generation_settings": {"params": P.TaskParams().to_json(True), "n_ctx": self.n_ctx_slot},
            "total_slots": self.n_parallel,
            "model_alias": self.engine.settings.model,
            "model_ftype": P.MODEL_FTYPE,
            "model_path": self.model_path,
            "modalities": {"vision": False, "video": False, "audio": False},
            "media_marker": self.media_marker,
            "endpoint_slots": o.endpoint_slots,
            "endpoint_props": o.endpoint_props,
            "endpoint_metrics": o.endpoint_metrics,
            "ui": True,
            "ui_settings": {},
            "chat_template": P.CHAT_TEMPLATE,
            "chat_template_caps": dict(P.CHAT_TEMPLATE_CAPS),
            "bos_token": P.BOS_TOKEN,
            "eos_token": P.EOS_TOKEN,
            "build_info": P.BUILD_INFO,
            "is_sleeping": False,
            "cors_proxy_enabled": False,
        }

    def models(self) -> dict[str, Any]:
        """``get_models``: the Ollama-style ``models`` list, then the OpenAI ``data`` list (``meta`` once loaded),
        as ``b11312-cpu/models.json``."""
        name = self.engine.settings.model
        details = {
            "parent_model": "",
            "format": "gguf",
            "family": "",
            "families": [""],
            "parameter_size": "",
            "quantization_level": "",
        }
        meta = None
        if self.ready():
            meta = {
                "vocab_type": 2,
                "n_vocab": P.N_VOCAB,
                "n_ctx": self.n_ctx_slot,
                "n_ctx_train": P.N_CTX_TRAIN,
                "n_embd": 4096,
                "n_params": 8030261248,
                "size": 4920734720,
                "ftype": P.MODEL_FTYPE,
            }
        entry = {
            "name": name,
            "model": name,
            "modified_at": "",
            "size": "",
            "digest": "",
            "type": "model",
            "description": "",
            "tags": [""],
            "capabilities": ["completion"],
            "parameters": "",
            "details": details,
        }
        data = {
            "id": name,
            "aliases": [name],
            "tags": [],
            "object": "model",
            "created": int(time.time()),
            "owned_by": "llamacpp",
            "meta": meta,
        }
        return {"models": [entry], "object": "list", "data": [data]}

    # -- completions ------------------------------------------------------------------------------------
    def prompts(self, prompt: Any) -> list[tuple[str, int]]:
        """``tokenize_input_prompts``: (detokenized text, tokens) per prompt; text gets a BOS token."""
        if isinstance(prompt, str):
            return [(P.BOS_TOKEN + prompt, count_tokens(prompt) + 1)]
        if isinstance(prompt, list) and prompt:
            if all(isinstance(t, int) for t in prompt):
                return [(" ".join(map(str, prompt)), len(prompt))]
            if all(isinstance(t, int | str) for t in prompt) and any(isinstance(t, int) for t in prompt):
                tokens = sum(1 if isinstance(t, int) else count_tokens(t) for t in prompt)
                return [(P.BOS_TOKEN + "".join(t for t in prompt if isinstance(t, str)), tokens + 1)]
            if all(isinstance(p, str | list) for p in prompt):
                return [item for p in prompt for item in self.prompts(p)]
        raise BadRequest(
            '"prompt" must be a string, an list of tokens, a list of mixed strings & tokens, or a list of prompts'
        )

    def cache_hint(self, text: str, n_tokens: int) -> tuple[str | None, int]:
        """The prompt's longest common prefix with a prompt the slots hold (``cache_prompt``), as a key of the
        serving model's prefix cache: a prefix is reused from its second sharer on (the first one stores it)."""
        best = max((common_prefix(text, seen) for seen in self.recent), default=0)
        self.recent.append(text)
        tokens = min(count_tokens(text[:best]), n_tokens - 1) if best else 0
        if tokens < 1:
            return None, 0
        return f"lcp-{zlib.crc32(text[:best].encode())}", tokens

    def admit(self, data: Any, kind: str) -> list[tuple[Call, RequestHandle]]:
        """``handle_completions_impl`` up to the queue; a prompt too long for a slot fails as at launch."""
        if not isinstance(data, dict) or "prompt" not in data:
            raise BadRequest("[json.exception.out_of_range.403] key 'prompt' not found")
        prompts = self.prompts(data["prompt"])
        params = P.params_from_json(data, self.engine.settings.model)
        cmpl_id, created = self.cmpl_id(), int(time.time())
        admitted: list[tuple[Call, RequestHandle]] = []
        for index, (text, n_tokens) in enumerate(prompts):
            if n_tokens >= self.n_ctx_slot:
                for _, handle in admitted:
                    handle.abort()
                raise ContextExceeded(n_tokens, self.n_ctx_slot)
            limit = self.n_ctx_slot - n_tokens
            max_tokens = min(limit, max(1, params.n_predict)) if params.n_predict >= 0 else limit
            call = Call(kind, params, cmpl_id, text, n_tokens, index, created)
            key, cached = self.cache_hint(text, n_tokens) if params.cache_prompt else (None, 0)
            rid = f"task-{self.task_ids}"
            handle = self.engine.new_request(
                rid, n_tokens, max_tokens, ignore_eos=params.ignore_eos, prefix_key=key, prefix_tokens=cached
            )
            self.slots.register(handle.seqs[0], Task(self.next_task_id(), params))
            admitted.append((call, handle))
        return admitted

    def release(self, admitted: list[tuple[Call, RequestHandle]]) -> None:
        """The response is over (sent, failed or abandoned): cancel what still runs, forget the slots."""
        for _, handle in admitted:
            handle.abort()
            for seq in handle.seqs:
                self.slots.forget(seq)

    def result(self, call: Call, seq: Sequence) -> Any:
        return final(self.engine, call, seq, self.slots.slot_of(seq))

    async def complete(self, request: Request, kind: str) -> Response:
        try:
            data = json.loads(await request.body())
        except ValueError as exc:
            return error_response(f"[json.exception.parse_error.101] parse error: {exc}", P.SERVER)
        try:
            if kind == CHAT:
                data = P.chat_to_completion(data if isinstance(data, dict) else {})
            admitted = self.admit(data, kind)
        except BadRequest as exc:
            return error_response(exc.message, exc.kind)
        except ContextExceeded as exc:
            return exc.response()
        if admitted[0][0].params.stream:
            return await self.stream(admitted)
        try:
            finished = await wait_all([h for _, h in admitted], request)
            if not finished:
                return Response(status_code=200)  # the connection is closed: nothing is written
            failed = next((s for _, h in admitted for s in h.seqs if s.finish is Finish.ERROR), None)
            if failed is not None:
                return error_response("Compute error.", P.SERVER)
            results = [self.result(call, h.seqs[0]) for call, h in admitted]
        finally:
            self.release(admitted)
        body = results[0] if len(results) == 1 else results
        return Response(dumps(body), media_type=P.JSON_TYPE)

    async def stream(self, admitted: list[tuple[Call, RequestHandle]]) -> Response:
        """Partial results per token, then each task's final one (``[DONE]`` for the OpenAI shapes). The
        server waits for the first result before it answers: an error there is a plain JSON error."""
        calls = {id(h.seqs[0]): c for c, h in admitted}
        sent = dict.fromkeys(calls, 0)
        events = merged([h for _, h in admitted])
        try:
            first = await anext(events)
        except BaseException:
            self.release(admitted)
            raise
        if first[0].finish is Finish.ERROR:
            self.release(admitted)
            return error_response("Compute error.", P.SERVER)

        async def body() -> AsyncIterator[bytes]:
            event: tuple[Sequence, str] | None = first
            while event is not None:
                seq, kind = event
                call = calls[id(seq)]
                if kind == "token":
                    yield sse(partial(self.engine, call, seq, sent[id(seq)]))
                    sent[id(seq)] += 1
                elif seq.finish is Finish.ERROR:
                    yield sse({"error": P.error_data("Compute error.", P.SERVER)})
                    return
                elif seq.finish is not Finish.ABORT:
                    yield sse(self.result(call, seq))
                event = await anext(events, None)
            if admitted[0][0].kind != NATIVE:
                yield b"data: [DONE]\n\n"

        return EventStream(body(), lambda: self.release(admitted), media_type="text/event-stream")

    # -- routes -----------------------------------------------------------------------------------------
    def build_app(self) -> FastAPI:
        app = FastAPI(title="simulated llama.cpp server", lifespan=self.engine.lifespan, docs_url=None, redoc_url=None)
        app.add_middleware(ServerMiddleware, ready=self.ready)

        @app.exception_handler(StarletteHTTPException)
        async def not_found(request: Request, exc: StarletteHTTPException) -> Response:
            status, body = error_body("File Not Found", P.NOT_FOUND)
            return Response(dumps(body), status, media_type=P.JSON_TYPE)

        async def health() -> Response:
            return json_response({"status": "ok"})

        async def metrics() -> Response:
            if not self.options.endpoint_metrics:
                return error_response(NO_METRICS, P.NOT_SUPPORTED)
            self.next_task_id()
            # the content type exactly as the server sets it (Starlette would append a charset to text/*)
            headers = {"Process-Start-Time-Unix": str(self.t_start), "Content-Type": P.METRICS_TYPE}
            return Response(self.metrics.render().encode(), headers=headers)

        async def slots(request: Request) -> Response:
            if not self.options.endpoint_slots:
                return error_response(NO_SLOTS, P.NOT_SUPPORTED)
            self.next_task_id()
            self.slots.sweep(self.engine.clock.now())
            if request.query_params.get("fail_on_no_slot") and self.slots.idle == 0:
                return error_response("no slot available", P.UNAVAILABLE)
            return json_response(self.slots.to_json())

        async def props() -> Response:
            return json_response(self.props())

        async def post_props() -> Response:
            if not self.options.endpoint_props:
                return error_response(
                    "This server does not support changing global properties. Start it with `--props`", P.NOT_SUPPORTED
                )
            return json_response({"success": True})

        async def models() -> Response:
            return json_response(self.models())

        def completion_route(kind: str) -> Callable[[Request], Any]:
            async def route(request: Request) -> Response:
                return await self.complete(request, kind)

            return route

        for path in ("/health", "/v1/health"):
            app.add_api_route(path, health, methods=["GET"])
        app.add_api_route("/metrics", metrics, methods=["GET"])
        app.add_api_route("/props", props, methods=["GET"])
        app.add_api_route("/props", post_props, methods=["POST"])
        for path in MODELS_PATHS:
            app.add_api_route(path, models, methods=["GET"])
        app.add_api_route("/slots", slots, methods=["GET"])
        routes = {
            "/completion": NATIVE,
            "/completions": NATIVE,
            "/v1/completions": COMPLETION,
            "/chat/completions": CHAT,
            "/v1/chat/completions": CHAT,
        }
        for path, kind in routes.items():
            app.add_api_route(path, completion_route(kind), methods=["POST"])
        return app


class ContextExceeded(Exception):
    """``the request exceeds the available context size``: the launch-time error of a too long prompt."""

    def __init__(self, n_prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(P.exceed_context_message(n_prompt_tokens, n_ctx))
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx

    def response(self) -> Response:
        status, body = error_body(str(self), P.EXCEED_CONTEXT, n_prompt_tokens=self.n_prompt_tokens, n_ctx=self.n_ctx)
        return Response(dumps(body), status, media_type=P.JSON_TYPE)


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def json_response(data: Any, status: int = 200) -> Response:
    return Response(dumps(data), status, media_type=P.JSON_TYPE)


def error_response(message: str, kind: str) -> Response:
    status, body = error_body(message, kind)
    return json_response(body, status)


async def merged(handles: list[RequestHandle]) -> AsyncIterator[tuple[Sequence, str]]:
    """The events of several requests as they come (one task per prompt)."""
    if len(handles) == 1:
        async for event in handles[0].events():
            yield event
        return
    queue: asyncio.Queue[tuple[Sequence, str] | None] = asyncio.Queue()

    async def pump(handle: RequestHandle) -> None:
        async for event in handle.events():
            queue.put_nowait(event)
        queue.put_nowait(None)

    tasks = [asyncio.ensure_future(pump(h)) for h in handles]
    try:
        open_ = len(tasks)
        while open_:
            item = await queue.get()
            if item is None:
                open_ -= 1
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()


async def wait_all(handles: list[RequestHandle], request: Request) -> bool:
    """Wait for every task; ``False`` when the client went away first (``should_stop``)."""

    async def all_done() -> None:
        for h in handles:
            await h.wait()

    done: asyncio.Future[None] = asyncio.ensure_future(all_done())
    gone: asyncio.Future[None] = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if done.done() and not done.cancelled():
        return True
    done.cancel()
    return False


async def disconnected(request: Request) -> None:
    """Returns once the client has gone (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create(engine: SimulatedEngine, options: LlamacppOptions | None = None) -> tuple[FastAPI, LlamacppSim]:
    sim = LlamacppSim(engine, options)
    return sim.build_app(), sim
