"""A server-sent-events response for the simulated engines' streaming APIs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class EventStream(StreamingResponse):
    """A streamed response that runs ``on_close`` once it ends, however it ends (finished, or the client
    gone): the simulators free the request's slot or sequence there."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        on_close: Callable[[], None],
        *,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
    ) -> None:
        super().__init__(content, headers=dict(headers or {}), media_type=media_type)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
