"""A reply's SSE response whose last frame goes out with the end of the body.

Starlette's streaming response sends each chunk with ``more_body`` and then an empty
body to end it: for a reply stream that is its ``status`` frame in one write and the
chunked body's terminator in another, each a pass through the middlewares' ``send``
and a wake-up of the reader. Once the stream says it has ended, the chunk in hand is
its last (a finished buffer publishes nothing more, and its frames end without waiting
for anything), so it is held until the iterator finishes and sent with the end. Should
another chunk follow after all, the held one goes first, as it would have.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping

from fastapi.sse import EventSourceResponse
from starlette.types import Send

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
