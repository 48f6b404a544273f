"""A reply's SSE response whose last frame goes out with the end of the body.

Starlette's streaming response sends each chunk with ``more_body`` and then an empty
body to end it: for a reply stream that is its ``status`` frame in one write and the
chunked body's terminator in another, each a pass through the middlewares' ``send``
and a wake-up of the reader. Once the stream says it has ended, the chunk in hand is
its last (a finished buffer publishes nothing more, and its frames end without waiting
for anything), so it is held until the iterator finishes and sent with the end. Should
another chunk follow after all, the held one goes first, as it would have.

uvicorn says ASGI 2.3 (its ``send`` does not raise once the client has gone), so
Starlette runs each streaming response beside a second task that waits for
``http.disconnect`` and cancels the first: a task group and a task per subscriber,
~60 µs of CPU a response. Served by :mod:`daemon.connections`, the response is told of
the lost connection by the protocol instead (``turnd.on_disconnect``) and cancels
itself; under any other server it keeps Starlette's listener.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping

import anyio
from fastapi.sse import EventSourceResponse
from starlette.types import Receive, Scope, Send

from daemon.connections import DISCONNECT_EXTENSION

__all__ = ["ReplyEvents"]


class ReplyEvents(EventSourceResponse):
    def __init__(
        self,
        content: AsyncIterator[bytes],
        ended: Callable[[], bool],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(content, headers=headers)
        self._ended = ended  # True once the stream has nothing after the chunk in hand

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        on_disconnect = scope.get("extensions", {}).get(DISCONNECT_EXTENSION)
        if on_disconnect is None:
            await super().__call__(scope, receive, send)
            return
        with anyio.CancelScope() as response:
            on_disconnect(response.cancel)
            await self.stream_response(send)
        if self.background is not None:
            await self.background()

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        held: bytes | None = None
        async for chunk in self.body_iterator:
            if held is not None:
                await send({"type": "http.response.body", "body": held, "more_body": True})
                held = None
            if self._ended():
                held = bytes(chunk)
                continue
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": held or b"", "more_body": False})
