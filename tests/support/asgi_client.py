"""A client that leaves mid-response, over raw ASGI (httpx's in-process transport buffers whole
responses, so it cannot go away part-way)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

from fastapi import FastAPI


def post_scope(path: str, length: int) -> dict[str, Any]:
    """The ASGI scope of a JSON ``POST path`` of ``length`` bytes from a client on 127.0.0.1."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(length).encode())],
        "client": ("127.0.0.1", 40000),
        "server": ("sim", 80),
        "state": {},
    }


async def leaving_client(
    app: FastAPI, path: str, body: Any, leave: asyncio.Event, after_events: int = 0
) -> tuple[int, int]:
    """POST ``body`` to ``path`` and disconnect once ``leave`` is set (or after ``after_events`` SSE
    events); the response status and the SSE events received."""
    payload = json.dumps(body).encode()
    sent = False
    status = events = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status, events
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            events += message.get("body", b"").count(b"data:")
            if after_events and events >= after_events:
                leave.set()

    scope = post_scope(path, len(payload))
    await app(scope, receive, send)
    return status, events
