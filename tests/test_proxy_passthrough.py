"""``inferwatch proxy`` as a pass-through (bytes, headers, hop-by-hop ones, timeouts, SSE chunks as they come,
LoRA adapters) and its faults: a down or slow upstream, a cut stream, oversize bodies, and 1,000 aborted streams
that must cancel the engine's work and leak nothing. The official clients and the engines:
``tests/test_proxy.py``.

Everything on 127.0.0.1 with free ports: a fake upstream (aiohttp) in a thread, or a simulator as a process
(stopped at the end); the proxy in a thread of this process with its own event loop (so that its tasks can be
counted).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator

import httpx
import pytest

from inferwatch.core import vocabulary as V
from inferwatch.proxy.apis import read_models
from inferwatch.proxy.measure import SseReader
from tests.conftest import free_port
from tests.helpers import has, value
from tests.support.proxy_harness import LOOPS, MODEL, echo_upstream, running_proxy, start_sim
from tests.support.stack import Processes


# -- pass-through ---------------------------------------------------------------------------------------
def test_pass_through_keeps_bytes_and_headers_but_not_hop_by_hop_ones() -> None:
    with echo_upstream() as echo, running_proxy(echo.url) as run:
        r = httpx.post(
            run.url + "/some/path?x=1&y=%2F",
            content=b"raw \x00 body",
            headers={
                "Authorization": "Bearer s3cret",
                "X-Custom": "1",
                "Connection": "keep-alive, X-Hop",
                "X-Hop": "1",
                "TE": "trailers",
            },
        )
        assert r.status_code == 207
        assert r.content == b"\x00binary\xffraw \x00 body"
        assert r.headers["x-upstream"] == "yes" and r.headers["set-cookie"] == "a=b"
        method, path, headers, body = echo.requests[-1]
        assert (method, path, body) == ("POST", "/some/path?x=1&y=%2F", b"raw \x00 body")
        assert headers["authorization"] == ["Bearer s3cret"] and headers["x-custom"] == ["1"]
        assert "te" not in headers and "x-hop" not in headers
        assert headers.get("connection", ["keep-alive"]) != ["keep-alive, X-Hop"]
        assert "user-agent" in headers  # the client's own (httpx), not one the proxy adds
        assert headers["user-agent"][0].startswith("python-httpx")
        # nothing measured for other paths
        assert not has(run.metrics(), V.CLIENT_REQUESTS.name)


@pytest.mark.parametrize("event_loop", LOOPS)
def test_generation_requests_keep_headers_but_not_hop_by_hop_ones(event_loop: str) -> None:
    """Generation requests go on connections of the proxy's own: the same header rules as every path."""
    with echo_upstream() as echo, running_proxy(echo.url, event_loop) as run:
        for _ in range(2):  # the second on the kept connection
            r = httpx.post(
                run.url + "/v1/completions?x=%2F",
                json={"model": "m", "stream": True},
                headers={"Authorization": "Bearer s3cret", "Connection": "keep-alive, X-Hop", "X-Hop": "1", "TE": "x"},
            )
            assert r.status_code == 200 and r.headers["x-upstream"] == "yes"
            assert r.text.count("data: ") == 4 and r.text.endswith("data: [DONE]\n\n")
            method, path, headers, body = echo.requests[-1]
            assert (method, path, json.loads(body)) == ("POST", "/v1/completions?x=%2F", {"model": "m", "stream": True})
            assert headers["authorization"] == ["Bearer s3cret"] and headers["host"] == [echo.url[7:]]
            assert "te" not in headers and "x-hop" not in headers and "connection" not in headers
            assert headers["user-agent"][0].startswith("python-httpx") and len(headers["user-agent"]) == 1
            assert headers["content-length"] == [str(len(body))]
        assert value(run.metrics(), V.CLIENT_REQUESTS.name, engine=V.UNKNOWN, model="m", outcome=V.OUTCOME_STOP) == 2


@pytest.mark.parametrize("event_loop", LOOPS)
def test_generation_requests_time_out_before_and_during_the_answer(event_loop: str) -> None:
    with echo_upstream() as echo, running_proxy(echo.url, event_loop, timeout=0.5) as run:
        t0 = time.monotonic()
        r = httpx.post(run.url + "/v1/completions?slow=1", json={"model": "m", "stream": True})
        assert r.status_code == 504 and r.json()["error"]["upstream"] == echo.url
        assert time.monotonic() - t0 < 3
        with (
            pytest.raises(httpx.RemoteProtocolError),
            httpx.stream("POST", run.url + "/v1/completions?stall=1", json={"model": "m", "stream": True}) as r,
        ):
            r.read()
        assert time.monotonic() - t0 < 5
        text = run.metrics()
        assert value(text, V.CLIENT_REQUESTS.name, engine=V.UNKNOWN, model="m", outcome=V.OUTCOME_ERROR) == 2
        assert sorted(rec.error or "" for rec in run.records(2)) == ["upstream_timeout", "upstream_timeout"]


def test_sse_chunks_go_on_as_they_arrive() -> None:
    with echo_upstream() as echo, running_proxy(echo.url) as run:
        arrivals = []
        t0 = time.perf_counter()
        with httpx.stream("POST", run.url + "/v1/completions", json={"model": "m", "stream": True}) as r:
            for chunk in r.iter_raw():
                arrivals.append((time.perf_counter() - t0, chunk))
        data = [c for _, c in arrivals if c.startswith(b"data: {")]
        assert len(data) == 3  # one read per upstream write: boundaries kept
        assert arrivals[0][0] < 0.25  # the first chunk did not wait for the rest
        assert arrivals[-1][0] > 0.8
        text = run.metrics()
        assert value(text, V.CLIENT_CHUNK_GAP.name + "_count", engine=V.UNKNOWN, model="m") == 2
        assert value(text, V.CLIENT_REQUESTS.name, engine=V.UNKNOWN, model="m", outcome=V.OUTCOME_STOP) == 1


def test_a_client_that_hangs_up_after_the_end_marker_did_not_abort() -> None:
    """The OpenAI client stops reading at ``[DONE]`` and closes the connection, possibly before the
    response's last byte (seen with the real vLLM): the request is complete, not aborted."""
    with echo_upstream() as echo, running_proxy(echo.url) as run:
        with httpx.stream("POST", run.url + "/v1/completions?linger=1", json={"model": "m", "stream": True}) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    break
        (record,) = run.records(1)
        assert record.attributes["inferwatch.proxy.outcome"] == V.OUTCOME_STOP
        text = run.metrics()
        assert value(text, V.CLIENT_REQUESTS.name, engine=V.UNKNOWN, model="m", outcome=V.OUTCOME_STOP) == 1


def test_lora_adapter_resolved_through_the_models_list() -> None:
    with echo_upstream() as echo, running_proxy(echo.url, engine="vllm") as run:
        deadline = time.monotonic() + 10
        while not run.proxy.adapters and time.monotonic() < deadline:
            time.sleep(0.05)
        with httpx.stream("POST", run.url + "/v1/completions", json={"model": "sql-lora", "stream": True}) as r:
            r.read()
        text = run.metrics()
        assert value(text, V.CLIENT_REQUESTS.name, engine="vllm", model="base", outcome=V.OUTCOME_STOP) == 1
        (record,) = run.records(1)
        assert (record.model, record.lora_adapter, record.engine) == ("base", "sql-lora", "vllm")


def test_read_models() -> None:
    assert read_models({"model_id": "m"}) == ("m", {})
    assert read_models({"data": [{"id": "a"}, {"id": "l", "parent": "a"}]}) == ("a", {"l": "a"})
    assert read_models({"data": [{"id": "a"}, {"id": "b"}]}) == (None, {})


def test_sse_reader_handles_split_crlf_multiline_and_oversize_events() -> None:
    r = SseReader()
    assert r.feed(b'data: {"a"') == []
    assert r.feed(b': 1}\n\ndata:{"b":2}\r\n\r\n: comment\n\nevent: x\ndata: [1,\ndata: 2]\n\ndata: [DONE]\n\n') == [
        {"a": 1},
        {"b": 2},
        [1, 2],
    ]
    r.feed(b"data: " + b"x" * (2 << 20))
    assert r.broken and r.feed(b'\n\ndata: {"c": 3}\n\n') == []


# -- faults -----------------------------------------------------------------------------------------------
def test_upstream_down_is_502_naming_the_upstream() -> None:
    port = free_port()
    with running_proxy(f"http://user:pw@127.0.0.1:{port}", engine="vllm") as run:
        r = httpx.post(run.url + "/v1/completions", json={"model": "m", "prompt": "x"})
        assert r.status_code == 502
        error = r.json()["error"]
        assert error["upstream"] == f"http://127.0.0.1:{port}" and "pw" not in r.text
        assert httpx.get(run.url + "/readyz").status_code == 503
        assert httpx.get(run.url + "/healthz").status_code == 200
        text = run.metrics()
        assert value(text, V.CLIENT_REQUESTS.name, engine="vllm", model="m", outcome=V.OUTCOME_ERROR) == 1


def test_upstream_timeout_is_504() -> None:
    with echo_upstream() as echo, running_proxy(echo.url, timeout=0.5) as run:
        t0 = time.monotonic()
        r = httpx.get(run.url + "/slow")
        assert r.status_code == 504 and r.json()["error"]["upstream"] == echo.url
        assert time.monotonic() - t0 < 3


def test_a_stream_cut_by_the_upstream_is_cut_for_the_client() -> None:
    with echo_upstream() as echo, running_proxy(echo.url) as run:
        with (
            pytest.raises(httpx.RemoteProtocolError),
            httpx.stream("POST", run.url + "/v1/completions?cut=1", json={"model": "m", "stream": True}) as r,
        ):
            r.read()
        time.sleep(0.2)
        assert value(run.metrics(), V.CLIENT_REQUESTS.name, engine=V.UNKNOWN, model="m", outcome=V.OUTCOME_ERROR) == 1
        (record,) = run.records(1)
        assert record.error == "stream_cut"


def test_oversize_bodies_are_413_and_malformed_json_reaches_the_engine(procs: Processes) -> None:
    with echo_upstream() as echo, running_proxy(echo.url, max_body_bytes=1000) as run:
        assert httpx.post(run.url + "/v1/completions", content=b"x" * 1001).status_code == 413

        def chunked() -> Iterator[bytes]:
            yield b"x" * 600
            yield b"x" * 600

        assert httpx.post(run.url + "/v1/completions", content=chunked()).status_code == 413
        assert not echo.requests
        bad = b'{"model": "m", "prompt": '
        httpx.post(run.url + "/v1/completions", content=bad, headers={"Content-Type": "application/json"})
        assert echo.requests[-1][3] == bad
    sim = start_sim(procs, "vllm")
    with running_proxy(sim, engine="vllm") as run:
        direct = httpx.post(sim + "/v1/completions", content=b"{nope")
        proxied = httpx.post(run.url + "/v1/completions", content=b"{nope")
        assert (proxied.status_code, proxied.content) == (direct.status_code, direct.content) == (400, direct.content)


@pytest.mark.parametrize("event_loop", LOOPS)
def test_thousand_aborted_streams_cancel_the_engine_and_leak_nothing(procs: Processes, event_loop: str) -> None:
    sim = start_sim(procs, "vllm")
    with running_proxy(sim, event_loop, engine="vllm") as run:
        httpx.post(run.url + "/v1/completions", json={"model": MODEL, "prompt": "warm", "max_tokens": 2})
        time.sleep(0.5)
        fds0, tasks0 = len(os.listdir("/proc/self/fd")), run.tasks()
        host, port = "127.0.0.1", run.proxy.port
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1000, "ignore_eos": True, "stream": True})
        request = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}"
        ).encode()

        async def one() -> None:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request)
            while b"data:" not in await reader.read(4096):
                pass
            writer.close()

        async def all_of_them() -> float:
            sem = asyncio.Semaphore(50)

            async def bounded() -> None:
                async with sem:
                    await one()

            await asyncio.gather(*(bounded() for _ in range(1000)))
            return time.monotonic()

        last = asyncio.run(all_of_them())
        # within a second every connection is closed, the client's and the one to the engine (each an fd)
        while len(os.listdir("/proc/self/fd")) > fds0 + 5 and time.monotonic() - last < 5:
            time.sleep(0.02)
        assert time.monotonic() - last < 1.0, "connections to the engine still open a second later"
        assert len(os.listdir("/proc/self/fd")) <= fds0 + 5
        deadline = time.monotonic() + 5
        while run.tasks() > tasks0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run.tasks() <= tasks0
        # the engine aborted them all (the simulator notices some disconnects late, directly as well)
        deadline = time.monotonic() + 15
        while httpx.get(sim + "/simulator/state").json()["running"] and time.monotonic() < deadline:
            time.sleep(0.1)
        state = httpx.get(sim + "/simulator/state").json()
        assert state["running"] == 0 and state["waiting"] == 0, state
        text = run.metrics()
        assert value(text, V.CLIENT_REQUESTS.name, engine="vllm", model=MODEL, outcome=V.OUTCOME_ABORT) == 1000
        assert value(text, V.CLIENT_TIME_TO_FIRST_TOKEN.name + "_count", engine="vllm", model=MODEL) == 1000
