"""The proxy's per-chunk fast paths read exactly what its general paths read (issue 35: a cheaper hot path).

A whole read of the usual shape (one chunk, one one-line SSE event) takes a short way in ``Body.feed`` and
``SseReader.feed``; the same bytes fed one at a time never do, so the two must agree on every input, odd
ones included. ``openai_event`` is checked on malformed events, and a stream's cached chunk-gap series
on a tenant leaving the busiest mid-stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson
import pytest
from multidict import CIMultiDict

from inferwatch.cli.common import loop_factory
from inferwatch.core import vocabulary as V
from inferwatch.proxy import apis as A
from inferwatch.proxy.client_metrics import ClientMetrics
from inferwatch.proxy.measure import Exchange, SseReader
from inferwatch.proxy.server import Proxy, ProxySettings
from inferwatch.proxy.upstream import Body, Head, UpstreamError


def chunked() -> Body:
    return Body(Head("HTTP/1.1", 200, "OK", CIMultiDict({"Transfer-Encoding": "chunked"})), False)


def feed_all(body: Body, reads: list[bytes]) -> tuple[bytes, str | None]:
    out = b""
    try:
        for r in reads:
            out += body.feed(r)
    except UpstreamError as exc:
        return out, str(exc)
    return out, None


@pytest.mark.parametrize(
    "wire",
    [
        b"5\r\nhello\r\n",
        b"A\r\n0123456789\r\n",
        b"a\r\n0123456789\r\n",
        b"05\r\nhello\r\n",
        b"5;x=1\r\nhello\r\n",
        b"5\r\nhello\r\n5\r\nworld\r\n",
        b"5\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhel",
        b"5\r\nhelloXX",
        b"6\r\nhello\r\n",
        b"4\r\nhello\r\n",
        b"zz\r\nhello\r\n",
        b"+5\r\nhello\r\n",
        b"0\r\n\r\n",
        b"1_0\r\n0123456789abcdef\r\n",
        b"\r\nhello\r\n",
    ],
)
def test_a_whole_read_is_framed_as_the_same_bytes_one_at_a_time(wire: bytes) -> None:
    whole, error = feed_all(chunked(), [wire])
    bytewise, bytewise_error = feed_all(chunked(), [wire[k : k + 1] for k in range(len(wire))])
    assert error == bytewise_error
    if error is None:  # (a read that fails returns nothing: what came before the error, byte by byte, differs)
        assert whole == bytewise


@pytest.mark.parametrize(
    "wire",
    [
        b"5\r\nhello\r\n5\r\nworld\r\n3\r\nabc\r\n",
        b"5\r\nhello\r\n5;x\r\nworld\r\n",
        b"5\r\nhello\r\n5\r\nwor",
        b"5\r\nhello\r\n5\r\nworldXX",
        b"5\r\nhello\r\nzz\r\nworld\r\n",
        b"5\r\nhello\r\n\r\nworld\r\n",
        b"5\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhello\r\n0\r\n\r\n5\r\nhello\r\n",
        b"5\r\nhello\r\n6\r\nworld\r\n",
        b"5\r\nhello\r\n4\r\nworld\r\n",
        b"5\r\nhello\r\n" + b"1" * 20 + b"\r\n",
    ],
)
def test_several_whole_chunks_in_one_read_are_framed_as_the_same_bytes_one_at_a_time(wire: bytes) -> None:
    whole, error = feed_all(chunked(), [wire])
    bytewise, bytewise_error = feed_all(chunked(), [wire[k : k + 1] for k in range(len(wire))])
    assert error == bytewise_error
    if error is None:
        assert whole == bytewise


def test_a_chunk_after_the_end_is_an_error_on_the_short_way_too() -> None:
    bodiless = Body(Head("HTTP/1.1", 200, "OK", CIMultiDict({"Transfer-Encoding": "chunked"})), True)
    with pytest.raises(UpstreamError, match="after the end"):
        bodiless.feed(b"5\r\nhello\r\n")
    body = chunked()
    assert body.feed(b"5\r\nhello\r\n0\r\n\r\n") == b"hello" and body.done
    with pytest.raises(UpstreamError, match="after the end"):
        body.feed(b"5\r\nhello\r\n")


@pytest.mark.parametrize(
    "read",
    [
        b'data: {"a": 1}\n\n',
        b'data:{"a": 1}\n\n',
        b"data: [DONE]\n\n",
        b"data:[DONE]\n\n",
        b"data: not json\n\n",
        b'data: {"a": \n\n',
        b"data: 123456789012345678901234567890\n\n",
        b'data: {"a": 1}\r\n\r\n',
        b'data: {"a": 1}\rx\n\n',
        b'event: x\ndata: {"a": 1}\n\n',
        b'data: {"a": 1}\n\ndata: {"b": 2}\n\n',
        b'data: {"a": 1}\n',
        b'data:  {"a": 1}\n\n',
        b"data: \n\n",
        b': comment {"a": 1}\n\n',
    ],
)
def test_a_whole_event_is_read_as_the_same_bytes_one_at_a_time(read: bytes) -> None:
    whole, bytewise = SseReader(), SseReader()
    got = whole.feed(read)
    want = [obj for k in range(len(read)) for obj in bytewise.feed(read[k : k + 1])]
    assert got == want
    assert (whole.done, whole.buffer) == (bytewise.done, bytewise.buffer)


def test_openai_events_malformed_or_odd() -> None:
    ev = A.openai_event
    assert ev("text") == A.Reading()
    assert ev({"choices": None, "id": ""}) == A.Reading()
    assert ev({"choices": ["x", {"text": ""}], "id": 7}) == A.Reading()
    assert ev({"choices": [{"text": "", "delta": "x"}]}) == A.Reading()
    r = ev({"id": "c1", "choices": [{"text": "", "delta": {"content": "hi"}, "finish_reason": 3}]})
    assert (r.content, r.tokens, r.finish_reasons, r.response_id) == (1, 1, [], "c1")
    r = ev({"choices": [{"delta": {"tool_calls": [{}]}}, {"delta": {"reasoning_content": "."}}, {"text": "a"}]})
    assert (r.content, r.tokens) == (3, 3)
    r = ev(
        {"choices": [{"text": "a", "finish_reason": "length"}], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}
    )
    assert (r.finish_reasons, r.prompt_tokens, r.completion_tokens) == (["length"], 4, 2)
    assert ev({"usage": {}}).prompt_tokens is None
    assert ev({"error": "boom"}).error == "boom"
    assert ev({"error": {"message": "m"}}).error == "m"
    assert ev({"error": 3}).error == "error"
    assert ev({"error": None}).error is None


ODD_OPENAI_EVENTS: list[object] = [
    {"id": "c", "choices": [{"index": 0, "text": " tok", "finish_reason": None}]},
    {"id": "c", "choices": [{"delta": {"role": "assistant", "content": ""}}]},
    {"id": "c", "choices": [{"delta": {"content": "hi"}, "finish_reason": None}], "usage": None},
    {"id": "c", "choices": [{"delta": {"tool_calls": [{}]}}]},
    {"id": "c", "choices": [{"delta": {"reasoning_content": "."}}]},
    {"id": "c", "choices": [{"delta": "x"}]},
    {"id": "c", "choices": [{"text": "", "delta": None}]},
    {"id": "c", "choices": [{"text": "a", "finish_reason": "length"}]},
    {"id": "c", "choices": [{"text": "a", "finish_reason": 3}]},
    {"id": "c", "choices": [{"text": "a"}, {"text": "b"}]},
    {"id": "c", "choices": []},
    {"id": "c", "choices": ["x"]},
    {"id": "c", "choices": None},
    {"id": "c", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
    {"id": "c", "choices": [{"text": "a"}], "usage": {}},
    {"id": "c", "choices": [{"text": "a"}], "usage": {"prompt_tokens": 5, "completion_tokens": 3}},
    {"id": "c", "choices": [{"text": "a"}], "error": {"message": "m"}},
    {"id": "c", "choices": [{"text": "a"}], "error": None},
    {"choices": [{"text": "a"}]},
    ["not", "an", "object"],
    "text",
    None,
]


@pytest.mark.parametrize("obj", ODD_OPENAI_EVENTS)
def test_the_quick_openai_reader_counts_what_the_full_one_does_or_declines(obj: object) -> None:
    pieces = A.openai_quick(obj)
    if pieces < 0:
        return
    r = A.openai_event(obj)
    assert (r.content, r.tokens) == (pieces, pieces)
    assert (r.finish_reasons, r.prompt_tokens, r.completion_tokens, r.error, r.final) == ([], None, None, None, False)


def _state(ex: Exchange, metrics: ClientMetrics) -> tuple[Any, ...]:
    hists = {spec: {k: (h.counts, h.total) for k, h in series.items()} for spec, series in metrics.histograms.items()}
    return (
        ex.contents, ex.tokens, ex.finish_reasons, ex.prompt_tokens, ex.completion_tokens, ex.error,
        ex.response_id, ex.final, ex.first_content, ex.last_content, ex.complete, hists,
    )  # fmt: skip


@pytest.mark.parametrize("split", ["whole", "bytewise"])
def test_an_exchange_reads_a_stream_alike_on_its_short_ways_and_the_long_one(split: str) -> None:
    """A stream fed read by read with the quick reader (the short ways) and byte by byte without it (the
    general way only) ends with the same measurement: counts, finish reasons, usage, error, times, metrics."""
    events = [b"data: " + orjson.dumps(e) + b"\n\n" for e in ODD_OPENAI_EVENTS if isinstance(e, dict)]
    reads = [
        b'data: {"id": "c", "choices": [{"text": "first"}]}\n\n',
        *events,
        b"data: NaN\n\n",
        b'data: {"id": "c", "choices": [{"text": "big"}], "n": 123456789012345678901234567890}\n\n',
        b"".join(events[:3]),
        b'data: {"id": "c", "choices": [{"text": "crlf"}]}\r\n\r\n',
        b'event: x\ndata: {"id": "c", "choices": [{"text": "named"}]}\n\n',
        b'data:{"id": "c", "choices": [{"text": "no space"}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    results = []
    for quick in (True, False):
        metrics = ClientMetrics("vllm", V.Vocabulary())
        ex = Exchange(A.OPENAI_CHAT, A.Ask("m", None, True, 9), "m", None, 0.0, metrics)
        ex.begin(200, "text/event-stream")
        if not quick:
            ex.quick = None
        for k, read in enumerate(reads):
            pieces = [read] if quick or split == "whole" else [read[i : i + 1] for i in range(len(read))]
            for piece in pieces:
                ex.feed(piece, 1.0 + k)
        results.append(_state(ex, metrics))
    assert results[0] == results[1]
    assert results[0][0] > 10 and results[0][2] == ["length"] and results[0][10]


def test_a_streams_gap_series_follows_its_tenant_leaving_the_busiest() -> None:
    kept = {"t1"}
    metrics = ClientMetrics("vllm", V.Vocabulary(), lambda t: t if t in kept else V.TENANT_OTHER)
    ex = Exchange(A.OPENAI_COMPLETIONS, A.Ask("m", None, True, 9), "m", None, 0.0, metrics, "t1", "t1")
    ex.begin(200, "text/event-stream")
    event = b'data: {"choices": [{"text": "a"}]}\n\n'
    for k in range(3):
        ex.feed(event, 1.0 + k)
    gaps = metrics.histograms[V.CLIENT_CHUNK_GAP]
    assert sum(gaps[("m", "t1")].counts) == 2
    kept.clear()
    metrics.forget(["t1"])  # re-ranked: t1 is no longer among the busiest
    ex.feed(event, 4.0)
    assert ("m", "t1") not in gaps
    assert sum(gaps[("m", V.TENANT_OTHER)].counts) == 1


EVENTS = (b'data: {"choices": [{"text": "a"}]}\n\n', b'data: {"choices": [{"text": "b"}]}\n\n', b"data: [DONE]\n\n")


def _frame(payload: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(payload), payload)


async def _read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """(head, the chunked body's payload), read up to the end (``0\r\n\r\n``)."""
    head = await reader.readuntil(b"\r\n\r\n")
    payload = b""
    while size := int(await reader.readuntil(b"\r\n"), 16):
        payload += (await reader.readexactly(size + 2))[:-2]
    assert await reader.readexactly(2) == b"\r\n"
    return head, payload


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("ending", ["with the last chunk", "by itself", "with the head"])
def test_the_end_of_a_stream_goes_out_once_however_the_engine_wrote_it(event_loop: str, ending: str) -> None:
    """The read that ends the engine's body ends the client's response in the same write (the last chunk and
    ``0\\r\\n\\r\\n``); the client gets the same bytes whatever reads the engine's answer came in, the end
    once (twice, the next response on the connection would start with a stray one), and the same outcome."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
    frames = [_frame(e) for e in EVENTS]

    engines: list[asyncio.StreamWriter] = []

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        engines.append(writer)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(int(request.lower().split(b"content-length: ")[1].split(b"\r\n")[0]))
                if ending == "with the head":
                    writer.write(head + b"".join(frames) + b"0\r\n\r\n")
                    continue
                writer.write(head)
                for f in frames[:-1]:
                    await asyncio.sleep(0.01)
                    writer.write(f)
                await asyncio.sleep(0.01)
                if ending == "by itself":
                    writer.write(frames[-1])
                    await asyncio.sleep(0.01)
                    writer.write(b"0\r\n\r\n")
                else:
                    writer.write(frames[-1] + b"0\r\n\r\n")
        writer.close()

    async def test() -> None:
        server = await asyncio.start_server(engine, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        proxy = Proxy(ProxySettings(upstream=url, port=0, engine="vllm", discover_models=False))
        await proxy.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            body = b'{"model": "m", "stream": true}'
            request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
            for _ in range(2):  # the second on the same connection: nothing left over from the first
                writer.write(request)
                got_head, raw = await asyncio.wait_for(_read_response(reader), 10)
                assert got_head.startswith(b"HTTP/1.1 200 ")
                assert raw == b"".join(EVENTS)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 200 ")
            writer.close()
            await writer.wait_closed()
            assert proxy.metrics.requests == {("m", V.TENANT_ANONYMOUS, V.OUTCOME_STOP): 2}
            assert proxy.pool.idle  # the engine's connection was read whole: kept
        finally:
            await proxy.stop()
            server.close()
            for w in engines:
                w.close()
                with contextlib.suppress(ConnectionError):
                    await w.wait_closed()
            await server.wait_closed()

    with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
        runner.run(test())
