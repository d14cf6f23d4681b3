"""The KServe v2 HTTP API with the generate extension on the ensemble, and ``/metrics`` on the same port."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from inferwatch.simulator.base import RequestHandle, SimulatedEngine, count_tokens
from inferwatch.simulator.engines.triton.metrics import TritonMetrics, to_string6
from inferwatch.simulator.engines.triton.repository import (
    ENSEMBLE,
    ENSEMBLE_INPUTS,
    ENSEMBLE_REQUIRED,
    MODEL_TENSORS,
    MODEL_VERSION,
    MODELS,
    Tensor,
)
from inferwatch.simulator.scheduler import Finish, Sequence

VERSION = "2.56.0"
"""Triton server version of the 25.03 container."""
EXTENSIONS = (
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
)


class TritonSim:
    """The simulated Triton server: KServe v2 HTTP API with the generate extension, and ``/metrics``."""

    def __init__(self, engine: SimulatedEngine) -> None:
        self.engine = engine
        self.metrics = TritonMetrics(engine)
        engine.add_observer(self.metrics)

    # -- helpers ------------------------------------------------------------------------------------
    def unknown_model(self, model: str, version: str | None) -> JSONResponse | None:
        if model not in MODELS:
            return _error(f"Request for unknown model: '{model}' is not found")
        if version not in (None, "", MODEL_VERSION):
            return _error(f"Request for unknown model: '{model}' version {version} is not found")
        return None

    def orca_header(self, request: Request) -> dict[str, str]:
        """Triton's ORCA load report (``endpoint-load-metrics-format: text|json``) from the KV gauges."""
        fmt = request.headers.get("endpoint-load-metrics-format", "").lower()
        if fmt not in ("text", "json"):
            return {}
        kv = self.metrics.kv
        usage = to_string6(kv["used"] / kv["max"]) if kv["max"] else 0.0
        capacity = int(kv["max"] * kv["tokens_per"])
        if fmt == "json":
            body = json.dumps({"named_metrics": {"kv_cache_utilization": usage, "max_token_capacity": capacity}})
            return {"endpoint-load-metrics": f"JSON {body}"}
        return {
            "endpoint-load-metrics": f"TEXT named_metrics.kv_cache_utilization={usage:.6f}, "
            f"named_metrics.max_token_capacity={capacity}"
        }

    def response_object(self, text: str, tokens: int) -> dict[str, Any]:
        """One ensemble response as the generate extension renders it (all outputs, keys sorted)."""
        return {
            "batch_index": 0,
            "context_logits": 0.0,
            "cum_log_probs": 0.0,
            "generation_logits": 0.0,
            "model_name": ENSEMBLE,
            "model_version": MODEL_VERSION,
            "output_log_probs": [0.0] * tokens,
            "sequence_end": False,
            "sequence_id": 0,
            "sequence_index": 0,
            "sequence_start": False,
            "text_output": text,
        }

    def engine_error(self, seq: Sequence) -> str:
        return (
            f"in ensemble '{ENSEMBLE}', Executor failed process requestId {seq.request_id} due to the following "
            "error: Encountered an error in forwardAsync function: [TensorRT-LLM][ERROR] Assertion failed: "
            "simulated engine failure"
        )

    # -- API ----------------------------------------------------------------------------------------
    def build_app(self) -> FastAPI:
        app = FastAPI(title=f"simulated Triton {VERSION} (TensorRT-LLM backend)", lifespan=self.engine.lifespan)

        @app.get("/metrics")
        async def metrics() -> Response:
            return PlainTextResponse(self.metrics.render(), media_type=TritonMetrics.content_type)

        @app.get("/v2/health/live")
        async def live() -> Response:
            return Response(status_code=200)

        @app.get("/v2/health/ready")
        async def ready() -> Response:
            return Response(status_code=200)

        @app.get("/v2")
        async def server_metadata() -> dict[str, Any]:
            return {
                "name": "triton",
                "version": self.engine.settings.version or VERSION,
                "extensions": list(EXTENSIONS),
            }

        @app.post("/v2/repository/index")
        async def repository_index() -> list[dict[str, str]]:
            return [{"name": m, "version": MODEL_VERSION, "state": "READY"} for m in sorted(MODELS)]

        @app.get("/v2/models/{model}")
        async def model_metadata(model: str) -> Response:
            return self.model_metadata(model, None)

        @app.get("/v2/models/{model}/versions/{version}")
        async def model_version_metadata(model: str, version: str) -> Response:
            return self.model_metadata(model, version)

        @app.get("/v2/models/{model}/ready")
        async def model_ready(model: str) -> Response:
            return self.unknown_model(model, None) or Response(status_code=200)

        @app.get("/v2/models/{model}/versions/{version}/ready")
        async def model_version_ready(model: str, version: str) -> Response:
            return self.unknown_model(model, version) or Response(status_code=200)

        @app.post("/v2/models/{model}/generate")
        async def generate(model: str, request: Request) -> Response:
            return await self.generate(request, model, None, stream_endpoint=False)

        @app.post("/v2/models/{model}/versions/{version}/generate")
        async def generate_version(model: str, version: str, request: Request) -> Response:
            return await self.generate(request, model, version, stream_endpoint=False)

        @app.post("/v2/models/{model}/generate_stream")
        async def generate_stream(model: str, request: Request) -> Response:
            return await self.generate(request, model, None, stream_endpoint=True)

        @app.post("/v2/models/{model}/versions/{version}/generate_stream")
        async def generate_stream_version(model: str, version: str, request: Request) -> Response:
            return await self.generate(request, model, version, stream_endpoint=True)

        return app

    def model_metadata(self, model: str, version: str | None) -> Response:
        err = self.unknown_model(model, version)
        if err is not None:
            return err
        platform, inputs, outputs = MODEL_TENSORS[model]

        def tensors(items: Iterable[Tensor]) -> list[dict[str, Any]]:
            return [{"name": n, "datatype": d, "shape": s} for n, d, s in items]

        return JSONResponse(
            {
                "name": model,
                "versions": [MODEL_VERSION],
                "platform": platform,
                "inputs": tensors(inputs),
                "outputs": tensors(outputs),
            }
        )

    async def generate(self, request: Request, model: str, version: str | None, stream_endpoint: bool) -> Response:
        err = self.unknown_model(model, version)
        if err is not None:
            return err
        try:
            body = await request.json()
        except ValueError:
            return _error("failed to parse the request JSON buffer: Invalid value. at 0")
        if not isinstance(body, dict):
            return _error("generate request must be a JSON object")
        fields = [k for k in body if k not in ("parameters", "id")]
        if model != ENSEMBLE:
            known = {t[0] for t in MODEL_TENSORS[model][1]}
            stray = next((k for k in fields if k not in known), None)
            if stray is not None:
                return _error(f"[request id: <id_unknown>] unexpected inference input '{stray}' for model '{model}'")
            return _error(f"[request id: <id_unknown>] model '{model}' takes token tensors, not generate text")
        missing = [n for n in ENSEMBLE_REQUIRED if n not in body]
        if missing:
            return _error(
                f"[request id: <id_unknown>] expected number of inputs between {len(ENSEMBLE_REQUIRED)} and "
                f"{len(ENSEMBLE_INPUTS)} but got {len(fields)} inputs for model '{ENSEMBLE}'. Got input(s) "
                f"{fields}, but missing required input(s) {missing}. Please provide all required input(s)."
            )
        text = body["text_input"]
        if isinstance(text, list) and text:
            text = text[0]
        max_tokens = body["max_tokens"]
        if isinstance(max_tokens, list) and max_tokens:
            max_tokens = max_tokens[0]
        if not isinstance(text, str) or not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            return _error("Unable to parse 'data': text_input must be a string and max_tokens an integer")
        eng = self.engine
        limit = eng.params.max_model_len
        prompt_tokens = count_tokens(text)
        if prompt_tokens + 1 > limit:
            self.metrics.on_rejected(prompt_tokens)
            return _error(
                f"in ensemble '{ENSEMBLE}', Executor failed process requestId {eng.next_id()} due to the following "
                f"error: Encountered an error in forwardAsync function: [TensorRT-LLM][ERROR] Assertion failed: "
                f"Prompt length ({prompt_tokens}) exceeds maximum input length ({limit - 1}). Set log level to info "
                f"and check TRTGptModel logs for how maximum input length is set"
            )
        max_tokens = max(1, min(max_tokens, limit - prompt_tokens))  # the executor clamps to max_seq_len
        streaming = bool(body.get("stream", False))
        handle = eng.new_request(str(eng.next_id()), prompt_tokens, max_tokens)
        seq = handle.seqs[0]
        min_tokens = body.get("min_tokens")
        if isinstance(min_tokens, int) and not isinstance(min_tokens, bool):
            seq.output_tokens = max(seq.output_tokens, min_tokens)
        self.metrics.set_streaming(seq, streaming)
        headers = self.orca_header(request)
        if not stream_endpoint:
            try:
                await handle.wait()
            finally:
                self._release(handle)
            if seq.finish is Finish.ERROR:
                return _error(self.engine_error(seq))
            return JSONResponse(self.response_object(handle.text(seq), seq.generated), headers=headers)
        return StreamingResponse(
            self._stream(handle, streaming), media_type="text/event-stream; charset=utf-8", headers=headers
        )

    async def _stream(self, handle: RequestHandle, streaming: bool) -> AsyncIterator[bytes]:
        """generate_stream: one SSE ``data:`` event per response (per token when ``stream`` is true)."""
        seq = handle.seqs[0]
        try:
            if streaming:
                index = 0
                async for s, kind in handle.events():
                    if kind == "token":
                        yield _sse(self.response_object(self.engine.token_text(s, index), 1))
                        index += 1
                    elif s.finish is Finish.ERROR:
                        yield _sse({"error": self.engine_error(s)})
            else:
                await handle.wait()
                if seq.finish is Finish.ERROR:
                    yield _sse({"error": self.engine_error(seq)})
                else:
                    yield _sse(self.response_object(handle.text(seq), seq.generated))
        finally:
            self._release(handle)  # the client went away mid-stream (no-op when finished)

    def _release(self, handle: RequestHandle) -> None:
        handle.abort()
        for s in handle.seqs:
            if s.finish is Finish.ABORT:
                self.metrics.on_abort(s)


def _sse(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create(engine: SimulatedEngine) -> tuple[FastAPI, TritonSim]:
    sim = TritonSim(engine)
    return sim.build_app(), sim
