"""Connections cannot be exhausted (SPEC §12): what uvicorn does not do by itself.

The server speaks HTTP/1.1 through uvicorn's httptools protocol (llhttp, in C: a
small request costs about a third less CPU than with h11, docs/performance-history.md,
"Issue 18, fifth round, the edge"). uvicorn offers a keep-alive timeout, which starts only after a
response, and ``limit_concurrency``, which answers 503 only once a request head has
arrived. Nothing closes a connection that never completes its first head, so 300
clients sending a header byte every few seconds hold 300 sockets forever; nothing
bounds an unfinished head (h11 stopped at 16 KiB, httptools keeps all of it); and
nothing stops accepting before the process runs out of descriptors. This protocol
adds:

- **header timeout**: a connection whose request head is not complete within
  ``[http] header_timeout`` of its opening (or of the end of its previous response)
  is closed;
- **head size**: a request head still unfinished after 16 KiB gets 431
  ``HeadersTooLarge`` and the connection is closed;
- **max connections**: past ``[http] max_connections`` open connections (never more
  than the process's descriptor limit allows, less a reserve for the store, the
  model clients and the logs) a new connection is answered 503 at once and closed.

- **idle subscribers**: an SSE response registers its reply's stream buffer through
  the scope extension ``turnd.subscriber``; once that turn has ended, a connection
  whose writes stay blocked (the client reads nothing) for 60 s is closed.
- **disconnects**: a response registers a callback through ``turnd.on_disconnect``,
  called when its connection is lost (an SSE response cancels itself with it, where
  Starlette would run a second task per response waiting for ``http.disconnect``).

And :class:`AcceptErrorLog`: asyncio reports every failed ``accept()`` (EMFILE)
through the loop's exception handler, with a traceback, once a second per socket;
it is logged at most once per 10 s, one line, with the count of those left out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections.abc import Callable
from typing import Any, Protocol

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from daemon.head_with_body import HeadWithBody

__all__ = [
    "DISCONNECT_EXTENSION",
    "SUBSCRIBER_EXTENSION",
    "AcceptErrorLog",
    "GuardedHttp",
    "connection_limit",
    "guarded_protocol",
]

log = logging.getLogger("turnd.http")

FD_RESERVE_MIN = 64  # descriptors kept for everything but client connections
REFUSED_LINGER = 1.0  # seconds a refused connection may take to read its answer
ACCEPT_LOG_EVERY = 10.0
MAX_HEAD_BYTES = 16 * 1024  # an unfinished request head (h11's default limit, kept)
IDLE_SUBSCRIBER_SECONDS = 60.0  # after the turn ended, with nothing read meanwhile
SUBSCRIBER_EXTENSION = "turnd.subscriber"
DISCONNECT_EXTENSION = "turnd.on_disconnect"


def _json_answer(status_line: bytes, error: str, message: str, *headers: bytes) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, with an ``{error, message}`` body."""
    body = json.dumps({"error": error, "message": message}).encode()
    head = [status_line, b"content-type: application/json", *headers, b"connection: close",
            b"content-length: %d" % len(body)]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


_BUSY_RESPONSE = _json_answer(
    b"HTTP/1.1 503 Service Unavailable", "Unavailable", "too many connections; try again shortly",
    b"retry-after: 1",
)
_HEAD_TOO_LARGE = _json_answer(
    b"HTTP/1.1 431 Request Header Fields Too Large", "HeadersTooLarge",
    "the request head is too large",
)


def connection_limit(configured: int) -> int:
    """``configured``, lowered to what the descriptor limit leaves for connections."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return configured
    reserve = max(FD_RESERVE_MIN, soft // 8)
    return max(1, min(configured, soft - reserve))


class _Finishable(Protocol):
    @property
    def done(self) -> bool: ...


class GuardedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header timeout, a head size cap and a
    connection cap."""

    header_timeout: float = 10.0
    max_connections: int = 1000

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._head_timer: asyncio.TimerHandle | None = None
        self._awaiting_head = True  # from the connection's start, or a response's end
        self._request_done = True  # the last request's body is all read (none yet: True)
        self._head_bytes = 0
        self._refused = False
        self._stream: _Finishable | None = None  # the SSE response's buffer, if any
        self._stuck_timer: asyncio.TimerHandle | None = None
        self._stuck_since: float | None = None  # blocked writes after the turn ended
        self._on_lost: Callable[[], object] | None = None  # the response's, until it ends

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # A response's head and its body in one send (daemon.head_with_body).
        super().connection_made(HeadWithBody(transport, self.loop))
        # The descriptor limit is read per connection: it can be changed while running.
        if len(self.connections) > connection_limit(self.max_connections):
            self._refuse()
            return
        self._arm_head_timer()

    def _refuse(self) -> None:
        # Not counted: a refused connection only reads its answer and goes.
        self.connections.discard(self)
        self._answer_and_close(_BUSY_RESPONSE)

    def _answer_and_close(self, answer: bytes) -> None:
        # What the client still sends is read and dropped (``_refused``) while the answer
        # lingers: closing with its request unread would reset the connection and lose
        # the answer. Half-closed at once, closed after a moment.
        self._refused = True
        self._cancel_head_timer()
        self.transport.write(answer)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(REFUSED_LINGER, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the request of a refused connection is read and dropped
        if self._awaiting_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # httptools keeps an unfinished head in memory however long it grows (h11 stops
        # at 16 KiB): a head still unfinished past that is refused.
        too_large = self._awaiting_head and self._head_bytes > MAX_HEAD_BYTES
        if too_large and not self.transport.is_closing():
            self._answer_and_close(_HEAD_TOO_LARGE)

    def eof_received(self) -> None:
        if self._refused:
            self.transport.close()
            return
        super().eof_received()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # The request's task is created once its head is complete: its scope gets the
        # extension through which an SSE response registers (see :meth:`_watch`).
        extensions = self.scope.setdefault("extensions", {})  # type: ignore[typeddict-item]
        extensions[SUBSCRIBER_EXTENSION] = self._watch
        extensions[DISCONNECT_EXTENSION] = self._on_disconnect

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._request_done = False
        self._head_bytes = 0
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # A response may have been sent before the request's body was all read (a 413,
        # say): the next head is only awaited once both are over.
        self._request_done = True
        if self.cycle is not None and self.cycle.response_complete and not self.pipeline:
            self._await_next_head()

    def _watch(self, stream: _Finishable) -> None:
        self._stream = stream

    def _on_disconnect(self, callback: Callable[[], object]) -> None:
        self._on_lost = callback

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stream is not None and self._stuck_timer is None:
            self._stuck_timer = self.loop.call_later(self._check_every(), self._check_stuck)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stuck_since = None  # the client read something
        if self._stuck_timer is not None:
            self._stuck_timer.cancel()
            self._stuck_timer = None

    @staticmethod
    def _check_every() -> float:
        return max(0.05, IDLE_SUBSCRIBER_SECONDS / 6)

    def _check_stuck(self) -> None:
        self._stuck_timer = None
        if self._stream is None or not self.flow.write_paused or self.transport.is_closing():
            return
        if self._stream.done:
            now = self.loop.time()
            if self._stuck_since is None:
                self._stuck_since = now
            elif now - self._stuck_since >= IDLE_SUBSCRIBER_SECONDS:
                log.info(
                    "closing a stream subscriber that read nothing for %.0f s after its "
                    "turn ended",
                    now - self._stuck_since,
                )
                # abort, not close: close would wait for the buffer it cannot send.
                self.transport.abort()
                return
        self._stuck_timer = self.loop.call_later(self._check_every(), self._check_stuck)

    def on_response_complete(self) -> None:
        self._stream = None
        self._on_lost = None
        super().on_response_complete()
        if self._request_done and not self.pipeline:
            self._await_next_head()

    def _await_next_head(self) -> None:
        # A kept-alive connection gets the same time for its next head.
        if not self.transport.is_closing():
            self._awaiting_head = True
            self._head_bytes = 0
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._stuck_timer is not None:
            self._stuck_timer.cancel()
            self._stuck_timer = None
        super().connection_lost(exc)
        if self._on_lost is not None:
            on_lost, self._on_lost = self._on_lost, None
            on_lost()

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._awaiting_head and not self.transport.is_closing():
            self.transport.close()


def guarded_protocol(header_timeout: float, max_connections: int) -> type[GuardedHttp]:
    """A :class:`GuardedHttp` with these limits, for ``uvicorn.Config(http=...)``."""
    return type(
        "GuardedHttp",
        (GuardedHttp,),
        {
            "header_timeout": header_timeout,
            "max_connections": max_connections,
        },
    )


class AcceptErrorLog:
    """A loop exception handler: ``accept()`` failures at most once per 10 s, the rest
    passed on to the handler that was there before."""

    MESSAGE = "socket.accept() out of system resource"

    def __init__(
        self,
        previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._previous = previous
        self._clock = clock
        self._last: float | None = None
        self._left_out = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != self.MESSAGE:
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        now = self._clock()
        if self._last is not None and now - self._last < ACCEPT_LOG_EVERY:
            self._left_out += 1
            return
        self._last = now
        more = f" ({self._left_out} more since the last report)" if self._left_out else ""
        self._left_out = 0
        log.error(
            "cannot accept connections: %s; lower [http] max_connections or raise the "
            "open-file limit%s",
            context.get("exception") or "out of resources",
            more,
        )
