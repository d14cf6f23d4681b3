"""Debian's headless Chromium driven over the DevTools protocol, for tests that must see what a browser does.

No driver (``chromium-driver``) and no new dependency: the browser is started with
``--remote-debugging-port=0`` (it picks a free port on 127.0.0.1 and writes it to ``DevToolsActivePort``
in its new, empty profile) and aiohttp's websocket client speaks the protocol to it.

:func:`chromium_binary` finds the binary: skips without it, fails when ``CI`` is set. :func:`running_chromium`
starts the browser in its own process group and stops the whole group on exit (the renderer and GPU
helpers included). :meth:`Browser.load` opens a URL in a new tab and returns what a probe expression read in
the page after it loaded, with what the browser logged (a Content-Security-Policy violation is logged);
``serve=`` answers the requests for some URLs from the test itself (the Fetch domain: a body and headers of
the test's choosing, at URLs no server has, or instead of a CDN's).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fnmatch
import itertools
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import require_tool

FLAGS = (
    "--headless",
    "--no-sandbox",  # as root Chromium refuses to start with its sandbox
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--remote-debugging-port=0",
)
START_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 20.0


def chromium_binary() -> str:
    """Path of the chromium binary; skip without it, but fail when ``CI`` is set."""
    return require_tool("chromium")


@dataclass
class Loaded:
    """A page after its ``load`` event: what the probe returned (JSON-decoded) and what the browser logged."""

    url: str
    probe: Any
    log: list[str]

    def policy_violations(self) -> list[str]:
        return [line for line in self.log if "Content Security Policy" in line]


Answer = tuple[bytes, Mapping[str, str]]
"""a body and its headers, served by the test."""


@dataclass
class _Session:
    events: list[dict[str, Any]] = field(default_factory=list)
    serve: Mapping[str, Answer] = field(default_factory=dict)


class Browser:
    """One browser over one websocket; tabs are attached in flat mode (one ``sessionId`` each)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._sessions: dict[str, _Session] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def send(self, method: str, params: Mapping[str, Any] | None = None, session: str | None = None) -> Any:
        """One command; its result (an error answer raises)."""
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        message: dict[str, Any] = {"id": ident, "method": method, "params": dict(params or {})}
        if session is not None:
            message["sessionId"] = session
        await self._ws.send_str(json.dumps(message))
        answer = await asyncio.wait_for(future, COMMAND_TIMEOUT_S)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    async def read(self) -> None:
        """Dispatch answers and events until the websocket closes (a task of :func:`running_chromium`)."""
        async for frame in self._ws:
            if frame.type != aiohttp.WSMsgType.TEXT:
                continue
            message = json.loads(frame.data)
            if "id" in message:
                future = self._pending.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(message)
                continue
            state = self._sessions.get(message.get("sessionId", ""))
            if state is None:
                continue
            state.events.append(message)
            if message["method"] == "Fetch.requestPaused":
                task = asyncio.create_task(self._fulfil(message["sessionId"], message["params"], state.serve))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _fulfil(self, session: str, paused: Mapping[str, Any], serve: Mapping[str, Answer]) -> None:
        url = paused["request"]["url"]
        answer = next((a for pattern, a in serve.items() if fnmatch.fnmatchcase(url, pattern)), None)
        if answer is None:
            await self.send("Fetch.continueRequest", {"requestId": paused["requestId"]}, session)
            return
        body, headers = answer
        await self.send(
            "Fetch.fulfillRequest",
            {
                "requestId": paused["requestId"],
                "responseCode": 200,
                "responseHeaders": [{"name": k, "value": v} for k, v in headers.items()],
                "body": base64.b64encode(body).decode(),
            },
            session,
        )

    async def load(
        self,
        url: str,
        probe: str,
        *,
        serve: Mapping[str, Answer] | None = None,
        settle_s: float = 0.5,
        timeout_s: float = 20.0,
    ) -> Loaded:
        """Open ``url`` in a new tab, wait for its load event and ``settle_s`` more (timers, focus), evaluate
        ``probe`` (an expression returning JSON text). ``serve``: URL patterns (``*`` wildcards) answered by the
        test with a body and headers."""
        target = (await self.send("Target.createTarget", {"url": "about:blank"}))["targetId"]
        session = (await self.send("Target.attachToTarget", {"targetId": target, "flatten": True}))["sessionId"]
        state = self._sessions[session] = _Session(serve=dict(serve or {}))
        try:
            for method in ("Page.enable", "Runtime.enable", "Log.enable"):
                await self.send(method, session=session)
            await self.send("Emulation.setFocusEmulationEnabled", {"enabled": True}, session)
            if serve:
                patterns = [{"urlPattern": pattern, "requestStage": "Request"} for pattern in serve]
                await self.send("Fetch.enable", {"patterns": patterns}, session)
            navigated = await self.send("Page.navigate", {"url": url}, session)
            if navigated.get("errorText"):
                raise AssertionError(f"{url}: {navigated['errorText']}")
            deadline = time.monotonic() + timeout_s
            while not any(e["method"] == "Page.loadEventFired" for e in state.events):
                if time.monotonic() > deadline:
                    raise AssertionError(f"{url} did not load within {timeout_s:g} s")
                await asyncio.sleep(0.05)
            await asyncio.sleep(settle_s)
            result = await self.send("Runtime.evaluate", {"expression": probe, "returnByValue": True}, session)
            if "exceptionDetails" in result:
                raise AssertionError(f"the probe failed: {result['exceptionDetails']}")
            return Loaded(url, json.loads(result["result"]["value"]), _log_lines(state.events))
        finally:
            del self._sessions[session]
            await self.send("Target.closeTarget", {"targetId": target})


def _log_lines(events: list[dict[str, Any]]) -> list[str]:
    lines = []
    for event in events:
        params = event.get("params", {})
        if event["method"] == "Log.entryAdded":
            entry = params["entry"]
            lines.append(f"{entry['level']} {entry['source']}: {entry['text']}")
        elif event["method"] == "Runtime.consoleAPICalled":
            lines.append(f"console.{params['type']}: {[a.get('value') for a in params.get('args', [])]}")
        elif event["method"] == "Runtime.exceptionThrown":
            lines.append(f"exception: {params['exceptionDetails'].get('text')}")
    return lines


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """The browser's whole process group: SIGTERM, then SIGKILL for what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


@asynccontextmanager
async def running_chromium(binary: str, workdir: Path) -> AsyncIterator[Browser]:
    """Headless Chromium with a new profile under ``workdir``; its output in ``workdir/chromium.log``."""
    profile = workdir / "profile"
    profile.mkdir(parents=True)
    log = (workdir / "chromium.log").open("wb")
    proc = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (workdir / "chromium.log").read_text(errors="replace")[-2000:]
                raise AssertionError(f"chromium did not open its DevTools port (exit {proc.poll()}): {tail}")
            await asyncio.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=64 * 1024 * 1024) as ws,
        ):
            browser = Browser(ws)
            reader = asyncio.create_task(browser.read())
            try:
                yield browser
            finally:
                await ws.close()
                with contextlib.suppress(asyncio.CancelledError):
                    reader.cancel()
                    await reader
    finally:
        _stop(proc)
        log.close()
