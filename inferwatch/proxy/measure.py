"""One generation request through the proxy: what its response stream shows, and its outcome.

:class:`SseReader` splits the forwarded bytes into SSE events without touching them (the proxy sends
every upstream read on as it came, before reading it). :class:`Exchange` times the client-visible
milestones (the first content, every gap between contents, the end), counts tokens, takes the usage
when the engine reports it, and turns the end into an outcome.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from inferwatch.core import vocabulary as V
from inferwatch.proxy.apis import Api, Ask, QuickReader, Reading
from inferwatch.proxy.client_metrics import ClientMetrics, Histogram

MAX_EVENT_BYTES: Final = 1 << 20
"""An SSE event longer than this stops the inspection of its stream (the bytes still pass)."""
MAX_BODY_BYTES: Final = 8 << 20
"""A non-streamed response longer than this is passed on without being read."""
DONE: Final = b"[DONE]"
NEWLINE: Final = ord("\n")
OPEN_BRACE: Final = ord("{")


class SseReader:
    """Incremental SSE parsing: complete events' ``data`` as JSON (``[DONE]`` and non-JSON skipped)."""

    __slots__ = ("broken", "buffer", "done")

    def __init__(self) -> None:
        self.buffer = b""
        self.broken = False
        self.done = False
        """``[DONE]`` went by: the stream is complete even if the client hangs up before its last byte."""

    def feed(self, data: bytes) -> list[Any]:
        if self.broken:
            return []
        if not self.buffer and data.startswith(b"data:") and data.find(b"\n") == len(data) - 2 and data[-1:] == b"\n":
            # the usual read: one whole one-line event, "data: <json>\n\n" (what the loop below makes of it too)
            value = data[6:-2] if data[5:6] == b" " else data[5:-2]
            if value == DONE:
                self.done = True
                return []
            try:
                return [loads(value)]
            except ValueError:
                return []
        buf = self.buffer + data if self.buffer else data
        if b"\r" not in buf:  # engines end events with "\n\n"
            *events, rest = buf.split(b"\n\n")
        else:
            events, rest = _split_crlf(buf)
        out: list[Any] = []
        for event in events:
            payload = _data(event)
            if payload is None:
                continue
            if payload == DONE:
                self.done = True
                continue
            try:
                out.append(loads(payload))
            except ValueError:
                continue
        if len(rest) > MAX_EVENT_BYTES:
            self.broken, rest = True, b""
        self.buffer = rest
        return out


def _split_crlf(buf: bytes) -> tuple[list[bytes], bytes]:
    """The complete events in ``buf``, each ended by ``\\n\\n`` or ``\\r\\n\\r\\n``, and what follows the last."""
    events: list[bytes] = []
    start = 0
    while True:
        end, sep = buf.find(b"\n\n", start), 2
        at = buf.find(b"\r\n\r\n", start)
        if at >= 0 and (end < 0 or at < end):
            end, sep = at, 4
        if end < 0:
            return events, buf[start:]
        events.append(buf[start:end])
        start = end + sep


def loads(payload: bytes) -> Any:
    """JSON as the standard library reads it, parsed by orjson (3x faster on the per-chunk path) when it can:
    orjson refuses ``NaN``/``Infinity``, integers beyond 64 bits and lone surrogates, which ``json`` takes."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload)


def _data(event: bytes) -> bytes | None:
    """The ``data`` of one event (its ``data:`` lines joined), ``None`` without any."""
    if event.startswith(b"data:") and b"\n" not in event:  # the usual one-line event
        value = event[5:]
        return value[1:] if value.startswith(b" ") else value
    parts = []
    for line in event.split(b"\n"):
        line = line.rstrip(b"\r")
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(parts) if parts else None


@dataclass
class Exchange:
    """The measurement of one generation request, from its arrival (``start``, perf_counter seconds)."""

    api: Api
    ask: Ask
    model: str
    adapter: str | None
    start: float
    metrics: ClientMetrics
    tenant: str = V.TENANT_ANONYMOUS
    """who sent it (:mod:`~inferwatch.proxy.tenants`): its span's."""
    tenant_label: str = V.TENANT_ANONYMOUS
    """its ``tenant`` label value in the metrics (the tenant, or ``other`` beyond the busiest)."""
    status: int = 0
    streamed: bool = False
    first_content: float | None = None
    last_content: float | None = None
    end: float | None = None
    contents: int = 0
    tokens: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    response_id: str | None = None
    error: str | None = None
    outcome: str | None = None
    sse: SseReader | None = None
    body: bytearray | None = None
    final: bool = False
    gaps: Histogram | None = field(default=None, repr=False)
    """the chunk-gap series of this request's labels, taken at the first gap (valid while ``gaps_epoch`` is the
    metrics' epoch: a tenant that leaves the busiest has its series dropped and its next gap counted anew)."""
    gaps_epoch: int = field(default=-1, repr=False)
    quick: QuickReader | None = field(default=None, repr=False)
    """the API's short way for the usual event (:data:`~inferwatch.proxy.apis.QuickReader`), set for a stream."""

    # -- the response ---------------------------------------------------------------------------------
    def begin(self, status: int, content_type: str) -> None:
        """The upstream's status and content type: SSE is read event by event, JSON at its end."""
        self.status = status
        if status >= 400:
            return
        if content_type.startswith("text/event-stream"):
            self.streamed = True
            self.sse = SseReader()
            self.quick = self.api.quick
        elif "json" in content_type:
            self.body = bytearray()

    def feed(self, data: bytes, now: float) -> None:
        """Bytes just forwarded to the client at ``now``."""
        sse = self.sse
        if sse is None:
            if self.body is not None:
                if len(self.body) + len(data) > MAX_BODY_BYTES:
                    self.body = None
                else:
                    self.body += data
            return
        objs: Iterable[Any]
        if (
            not sse.buffer
            and data.find(b"\n") == len(data) - 2
            and data[-1] == NEWLINE
            and data.startswith(b"data: ")
            and data[6] == OPEN_BRACE
            and not sse.broken
        ):  # the usual read, once per chunk: one whole one-line event (as SseReader reads it), a JSON object
            try:
                objs = (orjson.loads(data[6:-2]),)
            except orjson.JSONDecodeError:  # NaN, a huge integer, a lone surrogate...: SseReader reads it
                objs = sse.feed(data)
        else:
            objs = sse.feed(data)
        quick = self.quick
        for obj in objs:
            pieces = quick(obj) if quick is not None and self.response_id is not None else -1
            if pieces > 0:
                self.arrived(now)
                self.contents += pieces
                self.tokens += pieces
            elif pieces < 0:
                self.take(self.api.event(obj), now)

    def arrived(self, now: float) -> None:
        """Content reached the client at ``now``: the first (time to first token) or the next (a chunk gap)."""
        if self.first_content is None:
            self.first_content = now
            self.metrics.observe(V.CLIENT_TIME_TO_FIRST_TOKEN, self.model, now - self.start, self.tenant_label)
        elif self.last_content is not None:
            gaps, epoch = self.gaps, self.metrics.epoch
            if gaps is None or self.gaps_epoch != epoch:
                gaps = self.gaps = self.metrics.histogram(V.CLIENT_CHUNK_GAP, self.model, self.tenant_label)
                self.gaps_epoch = epoch
            gaps.observe(now - self.last_content)
        self.last_content = now

    def take(self, reading: Reading, now: float) -> None:
        if reading.content and self.streamed:
            self.arrived(now)
        self.contents += reading.content
        self.tokens += reading.tokens
        if reading.finish_reasons:
            self.finish_reasons += reading.finish_reasons
        if reading.prompt_tokens is not None:
            self.prompt_tokens = reading.prompt_tokens
        if reading.completion_tokens is not None:
            self.completion_tokens = reading.completion_tokens
        if reading.error is not None and self.error is None:
            self.error = reading.error
        if self.response_id is None:
            self.response_id = reading.response_id
        if reading.final:
            self.final = True

    @property
    def complete(self) -> bool:
        """The client has had the whole response (the end marker or the last event went by): hanging up
        now, before the connection's last byte (the OpenAI client stops at ``[DONE]``), is no abort."""
        return self.final or (self.sse is not None and self.sse.done)

    def gone(self, now: float) -> str:
        """The client went away."""
        return self.finish(now, None if self.complete else V.OUTCOME_ABORT)

    # -- the end ---------------------------------------------------------------------------------------
    def finish(self, now: float, outcome: str | None = None, error: str | None = None, headers: Any = None) -> str:
        """The request is over (``outcome`` forced for aborts and failures); records it once."""
        if self.outcome is not None:
            return self.outcome
        self.end = now
        if self.body is not None and outcome is None:
            with contextlib.suppress(ValueError):  # not JSON after all: nothing to read
                self.take(self.api.body(loads(bytes(self.body)), headers or {}), now)
            self.body = None
        if error is not None:
            self.error = error
        if outcome is None:
            outcome = self._outcome()
        self.outcome = outcome
        prompt = (self.prompt_tokens, False) if self.prompt_tokens is not None else None
        generated = self.generated
        self.metrics.finished(self.model, outcome, now - self.start, prompt, generated, self.tenant_label)
        if (
            self.streamed
            and outcome in (V.OUTCOME_STOP, V.OUTCOME_LENGTH)
            and self.first_content is not None
            and generated is not None
            and generated[0] > 1
        ):
            tpot = (now - self.first_content) / (generated[0] - 1)
            self.metrics.observe(V.CLIENT_TIME_PER_OUTPUT_TOKEN, self.model, tpot, self.tenant_label)
        return outcome

    @property
    def generated(self) -> tuple[int, bool] | None:
        """(generated tokens, estimated): the engine's usage, else the proxy's count."""
        if self.completion_tokens is not None:
            return self.completion_tokens, False
        if self.tokens or self.status < 400:
            return self.tokens, True
        return None

    @property
    def ttft(self) -> float | None:
        return None if self.first_content is None else self.first_content - self.start

    def _outcome(self) -> str:
        if self.status >= 400 or self.error is not None:
            return V.OUTCOME_ERROR
        outcomes = [self.api.finish.get(r, V.OUTCOME_STOP) for r in self.finish_reasons]
        if V.OUTCOME_LENGTH in outcomes:
            return V.OUTCOME_LENGTH
        budget = self.ask.max_tokens
        if self.api.count_length and budget is not None and self.generated and self.generated[0] >= budget:
            return V.OUTCOME_LENGTH
        return V.OUTCOME_STOP
