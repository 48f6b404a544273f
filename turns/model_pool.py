"""A provider's connections in several small pools instead of one large one.

httpcore's pool walks every connection it holds at each request and at each response's
close (``_assign_requests_to_connections``): with 200 streams at once that walk was ~6 %
of turnd's CPU in the 200-stream run, and it grows with the number of connections
(README, "Benchmarks"). :class:`ShardedTransport` keeps ``len(pools)`` pools and sends each
request to the first one with fewer than ``fill`` requests in flight (the least busy
when all are), so a quiet daemon reuses the connections of one pool, one with up to
``len(pools) * fill`` calls at once walks about ``fill`` connections a request, and a
busier one about its calls in flight over ``len(pools)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import httpx2

__all__ = ["ShardedTransport"]


class _Pool:
    __slots__ = ("in_flight", "transport")

    def __init__(self, transport: httpx2.AsyncBaseTransport) -> None:
        self.transport = transport
        self.in_flight = 0


class _Released(httpx2.AsyncByteStream):
    """A response body that gives its request's place in the pool back when closed."""

    def __init__(self, stream: httpx2.AsyncByteStream, pool: _Pool) -> None:
        self._stream = stream
        self._pool: _Pool | None = pool

    def __aiter__(self) -> AsyncIterator[bytes]:
        # The body's own iterator: no generator of ours between it and each chunk.
        return self._stream.__aiter__()

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.in_flight -= 1
        await self._stream.aclose()


class ShardedTransport(httpx2.AsyncBaseTransport):
    """Requests spread over ``transports``, each filled to ``fill`` before the next."""

    def __init__(self, transports: Sequence[httpx2.AsyncBaseTransport], fill: int) -> None:
        if not transports:
            raise ValueError("ShardedTransport needs at least one transport")
        self._pools = [_Pool(t) for t in transports]
        self._fill = fill

    @property
    def in_flight(self) -> tuple[int, ...]:
        """Requests each pool holds now, from the send to the body's close."""
        return tuple(p.in_flight for p in self._pools)

    def _choose(self) -> _Pool:
        for pool in self._pools:
            if pool.in_flight < self._fill:
                return pool
        return min(self._pools, key=lambda p: p.in_flight)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        pool = self._choose()
        pool.in_flight += 1
        try:
            response = await pool.transport.handle_async_request(request)
        except BaseException:
            pool.in_flight -= 1
            raise
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)  # an async transport's answer
        response.stream = _Released(stream, pool)
        return response

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.transport.aclose()
