"""A model request's head and body in one ``send``, over asyncio's own streams.

httpcore writes an HTTP/1.1 request's head and then its body, two ``send`` calls. The
first wakes the model server, which reads an unfinished request and waits; on one
machine it is run on the daemon's core, and the turn's thread was preempted there in
most turns, 0.5-0.9 ms each, before the body (and so the model's clock) went out
(README, "Benchmarks"). These streams hold what is written until the connection is
read from, which an HTTP client does once its request is out, and send it together.
A body past :data:`HOLD_BYTES` goes out as it comes, so an upload is not held in memory.

They are asyncio's ``StreamReader`` and ``StreamWriter`` (what ``asyncio.open_connection``
gives), not anyio's socket stream, which httpcore's anyio backend uses. anyio's stream
yields to the loop before every send, and stops the socket's reading after every receive
and starts it again before the next wait (two ``epoll_ctl`` calls a wait); asyncio's
writer sends at once and waits only when its buffer is full, and its reader reads as data
comes. CPU a short turn, ``bench.ab --paired``: B/A 0.970. The timeouts are still anyio's
cancel scopes, and the errors httpcore's own.

They also answer the pool's liveness question (``is_readable``, asked of every idle
connection at each request) from the socket, with httpcore's own ``poll``: a socket the
server closed stays readable, and one asyncio closed on an error has no descriptor, which
counts as readable too. (Bytes a server sent on an idle connection without closing it
are already in the reader's buffer and not seen: the next response read fails on them,
a protocol error the SDK retries.)

:func:`model_transport` is httpx2's own transport on a pool whose connections use them.
Behind a proxy from the environment the stock client stays (its proxy transports are
made by httpx), with its two sends.
"""

# ruff: noqa: ASYNC109 - httpcore's stream and backend interface takes its timeouts so

from __future__ import annotations

import asyncio
import math
import ssl
import urllib.request
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any

import anyio
import httpcore2
import httpx2
from httpcore2._utils import is_socket_readable  # the check httpcore's own streams make

__all__ = ["HOLD_BYTES", "OneSendBackend", "model_transport", "uses_env_proxy"]

HOLD_BYTES = 64 * 1024


class _OneSendStream(httpcore2.AsyncNetworkStream):
    """One connection's reader and writer, holding writes until the next read. A write
    that fits in the transport's buffer does not wait; one that fills it waits for it to
    drain, within the write timeout."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._socket = writer.get_extra_info("socket")
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._closed = False

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        self._held.append(buffer)
        self._held_bytes += len(buffer)
        if self._held_bytes >= HOLD_BYTES:
            await self._send(timeout)

    async def _send(self, timeout: float | None) -> None:
        if not self._held:
            return
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held.clear()
        self._held_bytes = 0
        if self._closed or self._writer.is_closing():
            raise httpcore2.WriteError("the connection is closed")
        try:
            self._writer.write(data)
            if not self._writer.transport.get_write_buffer_size():
                return
            with anyio.CancelScope(deadline=_deadline(timeout)):
                await self._writer.drain()
                return
        except OSError as exc:
            raise httpcore2.WriteError(exc) from exc
        raise httpcore2.WriteTimeout("timed out")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        await self._send(timeout)
        if self._closed:
            raise httpcore2.ReadError("the connection is closed")
        with anyio.CancelScope(deadline=_deadline(timeout)):
            try:
                return await self._reader.read(max_bytes)
            except OSError as exc:
                raise httpcore2.ReadError(exc) from exc
        raise httpcore2.ReadTimeout("timed out")

    async def aclose(self) -> None:
        self._held.clear()
        if not self._closed:
            self._closed = True
            self._writer.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        await self._send(timeout)
        try:
            with anyio.fail_after(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError as exc:
            await self.aclose()
            raise httpcore2.ConnectTimeout(exc) from exc
        except OSError as exc:  # ssl.SSLError is one
            await self.aclose()
            raise httpcore2.ConnectError(exc) from exc
        return self  # the same reader and writer, now over TLS

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            return self._reader.at_eof() or is_socket_readable(self._socket)
        if info == "socket":
            return self._socket
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        return None


def _deadline(timeout: float | None) -> float:
    return math.inf if timeout is None else anyio.current_time() + timeout


class OneSendBackend(httpcore2.AsyncNetworkBackend):
    """An httpcore2 network backend on asyncio's streams, holding writes until the next read."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        return await self._connect(
            partial(asyncio.open_connection, host, port,
                    local_addr=(local_address, 0) if local_address else None),
            timeout, socket_options,
        )

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        return await self._connect(partial(asyncio.open_unix_connection, path), timeout, socket_options)

    async def _connect(
        self,
        connect: Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]],
        timeout: float | None,
        socket_options: Iterable[Any] | None,
    ) -> httpcore2.AsyncNetworkStream:
        # As httpcore2.AnyIOBackend connects; asyncio sets TCP_NODELAY on TCP sockets.
        try:
            with anyio.fail_after(timeout):
                reader, writer = await connect()
        except TimeoutError as exc:
            raise httpcore2.ConnectTimeout(exc) from exc
        except OSError as exc:
            raise httpcore2.ConnectError(exc) from exc
        sock = writer.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return _OneSendStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


def uses_env_proxy() -> bool:
    """Whether the environment names a proxy that httpx would use for a provider."""
    proxies = urllib.request.getproxies()
    return any(proxies.get(scheme) for scheme in ("http", "https", "all"))


def model_transport(verify: ssl.SSLContext, limits: httpx2.Limits) -> httpx2.AsyncHTTPTransport:
    """httpx2's transport, with ``limits``, whose requests go out in one send each."""
    transport = httpx2.AsyncHTTPTransport(verify=verify, limits=limits)
    # httpx2's transport takes no network backend; its pool is replaced by the same
    # pool with ours (tests/test_one_send.py checks the requests still go through it).
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=verify,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=OneSendBackend(),
    )
    return transport
