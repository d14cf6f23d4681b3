"""Security headers on every answer of the collector (an ASGI middleware, :class:`SecurityHeaders`).

Every answer says ``X-Content-Type-Options: nosniff`` (a browser takes a JSON or text body for what its
``Content-Type`` says, never for HTML) and ``Referrer-Policy: no-referrer`` (an incident page's address
holds its signed key: a link followed from it must not carry that address away).

Every HTML answer also says ``X-Frame-Options: DENY`` and has a Content-Security-Policy with
``frame-ancestors 'none'`` (no page of the collector may be framed, so none can be clickjacked). A route
that sends its own policy keeps it (the incident page sends
:data:`~inferwatch.collector.incidents.page.CONTENT_SECURITY_POLICY`); any other HTML answer gets
:data:`STRICT_POLICY`, which allows nothing to load or run.

FastAPI's API documentation (``/docs``, Swagger UI; ``/redoc``; Swagger's OAuth2 redirect page) is the
exception: those pages load their scripts and styles from a CDN and start them with an inline script.
They get :data:`DOCS_POLICY`: scripts from the CDN and FastAPI's own inline scripts only, each allowed
by its SHA-256 hash, computed from the page as it is sent (the pages hold no alert or request data,
only the app's title and the OpenAPI document's address); styles and images as Swagger UI and ReDoc
need them; no plugin, no form target, no framing.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Collection
from typing import Final

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

BASE_HEADERS: Final = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
"""on every answer."""
HTML_HEADERS: Final = {"X-Frame-Options": "DENY"}
"""on every HTML answer, with a Content-Security-Policy."""
STRICT_POLICY: Final = "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
"""an HTML answer's policy unless its route sends one (or it is the API documentation)."""
DOCS_CDN: Final = "https://cdn.jsdelivr.net"
"""where FastAPI's documentation pages load Swagger UI and ReDoc from (FastAPI's defaults)."""
DOCS_POLICY: Final = (
    "default-src 'none'; script-src {scripts}; "
    f"style-src {DOCS_CDN} https://fonts.googleapis.com 'unsafe-inline'; "
    "img-src 'self' data: https://fastapi.tiangolo.com https://cdn.redoc.ly; font-src https://fonts.gstatic.com; "
    "connect-src 'self'; worker-src blob:; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
"""the API documentation's policy; ``{scripts}``: the CDN and the hashes of the page's inline scripts.
Styles may be inline (both UIs set styles from their scripts): a style cannot run code."""
INLINE_SCRIPT: Final = re.compile(rb"<script>(.*?)</script>", re.S)


def script_hash(body: bytes) -> str:
    """The CSP source that allows an inline script: ``'sha256-<base64 of its SHA-256>'``."""
    return f"'sha256-{base64.b64encode(hashlib.sha256(body).digest()).decode()}'"


def docs_policy(page: bytes) -> str:
    """:data:`DOCS_POLICY` for one documentation page: its inline scripts allowed by hash."""
    hashes = [script_hash(m.group(1)) for m in INLINE_SCRIPT.finditer(page)]
    return DOCS_POLICY.format(scripts=" ".join([DOCS_CDN, *dict.fromkeys(hashes)]))


def _is_html(headers: MutableHeaders) -> bool:
    return headers.get("content-type", "").lower().startswith("text/html")


class SecurityHeaders:
    """Adds :data:`BASE_HEADERS` to every HTTP answer; :data:`HTML_HEADERS` and a policy to HTML answers.

    ``docs_paths``: the API documentation's paths (:data:`DOCS_POLICY`); their answers, a few kilobytes,
    are held until complete to hash their inline scripts. Every other answer streams through unchanged
    but for its headers.
    """

    def __init__(self, app: ASGIApp, docs_paths: Collection[str] = ()) -> None:
        self.app = app
        self.docs_paths = frozenset(docs_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        if path in self.docs_paths:
            await self._docs(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                _add(headers, BASE_HEADERS)
                if _is_html(headers):
                    _add(headers, {**HTML_HEADERS, "Content-Security-Policy": STRICT_POLICY})
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _docs(self, scope: Scope, receive: Receive, send: Send) -> None:
        start: Message | None = None
        body = bytearray()

        async def hold(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body", False):
                return
            headers = MutableHeaders(scope=start)
            _add(headers, BASE_HEADERS)
            if _is_html(headers):
                _add(headers, {**HTML_HEADERS, "Content-Security-Policy": docs_policy(bytes(body))})
            await send(start)
            await send({"type": "http.response.body", "body": bytes(body), "more_body": False})

        await self.app(scope, receive, hold)


def _add(headers: MutableHeaders, values: dict[str, str]) -> None:
    """Each header of ``values`` the answer does not already have."""
    for name, value in values.items():
        if name not in headers:
            headers[name] = value
