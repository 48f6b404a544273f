"""A model request's head and body in one ``send``.

httpcore writes an HTTP/1.1 request's head and then its body, two ``send`` calls. The
first wakes the model server, which reads an unfinished request and waits; on one
machine it is run on the daemon's core, and the turn's thread was preempted there in
most turns, 0.5-0.9 ms each, before the body (and so the model's clock) went out
(README, "Benchmarks"). These streams hold what is written until the connection is
read from, which an HTTP client does once its request is out, and send it together.
A body past :data:`HOLD_BYTES` goes out as it comes, so an upload is not held in memory.

They also answer the pool's liveness question (``is_readable``, asked of every idle
connection at each request) from the socket they keep, with httpcore's own ``poll``: anyio built
the stream's whole attribute table for it, ``getpeername`` included, each time (5 % of
the CPU of a short turn with 20 connections in the pool, by py-spy).

:func:`model_transport` is httpx2's own transport on a pool whose connections use them.
Behind a proxy from the environment the stock client stays (its proxy transports are
made by httpx), with its two sends.
"""

# ruff: noqa: ASYNC109 - httpcore's stream and backend interface takes its timeouts so

from __future__ import annotations

import math
import socket
import ssl
import urllib.request
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any

import anyio
import anyio.abc
import anyio.streams.tls
import httpcore2
import httpx2
from httpcore2._utils import is_socket_readable  # the check httpcore's own streams make

__all__ = ["HOLD_BYTES", "OneSendBackend", "model_transport", "uses_env_proxy"]

HOLD_BYTES = 64 * 1024


class _OneSendStream(httpcore2.AsyncNetworkStream):
    """httpcore's anyio stream (``httpcore2.AnyIOBackend``'s), holding writes until the
    next read. Its reads and writes are made here, with the same timeouts and the same
    errors: httpcore's wrap each in two generator context managers (``fail_after``,
    ``map_exceptions``), ~15 µs a read or write, and a model call makes four or five."""

    def __init__(self, stream: anyio.abc.ByteStream, sock: socket.socket | None) -> None:
        self._stream = stream
        self._socket = sock
        self._held: list[bytes] = []
        self._held_bytes = 0

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
        with anyio.CancelScope(deadline=_deadline(timeout)):
            try:
                await self._stream.send(data)
                return
            except _BROKEN as exc:
                raise httpcore2.WriteError(exc) from exc
        raise httpcore2.WriteTimeout("timed out")  # only the deadline cancels this scope

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        await self._send(timeout)
        with anyio.CancelScope(deadline=_deadline(timeout)):
            try:
                return await self._stream.receive(max_bytes)
            except anyio.EndOfStream:
                return b""
            except _BROKEN as exc:
                raise httpcore2.ReadError(exc) from exc
        raise httpcore2.ReadTimeout("timed out")

    async def aclose(self) -> None:
        self._held.clear()  # a request closed before it was read from was abandoned
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        await self._send(timeout)
        try:
            with anyio.fail_after(timeout):
                tls = await anyio.streams.tls.TLSStream.wrap(
                    self._stream, ssl_context=ssl_context, hostname=server_hostname,
                    standard_compatible=False, server_side=False,
                )
        except TimeoutError as exc:
            await self.aclose()
            raise httpcore2.ConnectTimeout(exc) from exc
        except (anyio.BrokenResourceError, anyio.EndOfStream, ssl.SSLError) as exc:
            await self.aclose()
            raise httpcore2.ConnectError(exc) from exc
        return _OneSendStream(tls, self._socket)

    def get_extra_info(self, info: str) -> Any:
        # What httpcore's own stream answers.
        if info == "is_readable":
            return is_socket_readable(self._socket)
        if info == "socket":
            return self._socket
        if info == "ssl_object":
            return self._stream.extra(anyio.streams.tls.TLSAttribute.ssl_object, None)
        if info == "client_addr":
            return self._stream.extra(anyio.abc.SocketAttribute.local_address, None)
        if info == "server_addr":
            return self._stream.extra(anyio.abc.SocketAttribute.remote_address, None)
        return None


_BROKEN = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)


def _deadline(timeout: float | None) -> float:
    return math.inf if timeout is None else anyio.current_time() + timeout


class OneSendBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's anyio backend, its streams holding writes until the next read."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        return await self._connect(
            partial(anyio.connect_tcp, host, port, local_host=local_address),
            timeout, socket_options,
        )

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        return await self._connect(partial(anyio.connect_unix, path), timeout, socket_options)

    async def _connect(
        self,
        connect: Callable[[], Awaitable[anyio.abc.SocketStream]],
        timeout: float | None,
        socket_options: Iterable[Any] | None,
    ) -> httpcore2.AsyncNetworkStream:
        # As httpcore2.AnyIOBackend connects (asyncio's TCP sockets have TCP_NODELAY).
        try:
            with anyio.fail_after(timeout):
                stream = await connect()
        except TimeoutError as exc:
            raise httpcore2.ConnectTimeout(exc) from exc
        except (OSError, anyio.BrokenResourceError) as exc:
            raise httpcore2.ConnectError(exc) from exc
        sock = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
        for option in socket_options or ():
            sock.setsockopt(*option)
        return _OneSendStream(stream, sock)

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
