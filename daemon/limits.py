"""Request body limits, enforced while the body arrives (413 before it is read whole)."""

from __future__ import annotations

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from daemon.errors import error_response

# JSON bodies: a record write is at most 1,000,000 bytes on a PDS, plus its envelope.
JSON_BODY_LIMIT = 1_048_576
# Where a body is a blob, the larger limit applies.
BLOB_PATHS = frozenset({"/api/attachments", "/xrpc/com.atproto.repo.uploadBlob"})


class BodyLimit:
    """Refuses request bodies over the limit (413) without reading them whole.

    A declared Content-Length over the limit is answered at once; a chunked body
    is counted as it is received and the read fails at the first byte over. The
    failure is an HTTPException, which FastAPI passes through its body parsing
    (anything else there would become a 400) to the app's handler.
    """

    def __init__(self, app: ASGIApp, *, json_limit: int, blob_limit: int) -> None:
        self.app = app
        self.json_limit = json_limit
        self.blob_limit = blob_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.blob_limit if scope["path"] in BLOB_PATHS else self.json_limit
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            response = error_response(413, f"request body of {declared} bytes exceeds {limit} bytes")
            await response(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, f"request body exceeds {limit} bytes")
            return message

        await self.app(scope, counting_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
