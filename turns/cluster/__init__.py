"""Scale-out on Redis (SPEC §18): shared streams, cancel, limits, behind ``[cluster]``.

Nothing here decides who runs a turn: that stays the store's create-only claim.
Redis carries streams, questions between instances, and counters; when it is
unreachable every part falls back to in-process state and the turns go on.
:class:`Cluster` is what the engine and the HTTP side are given; without
``[cluster]`` they get None and nothing of this package is imported.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.abc

from turns.cluster.control import Address, Control
from turns.cluster.limits import SharedQueue, SharedQuotaCounter, SharedRateLimiter
from turns.cluster.link import RedisLink
from turns.cluster.streams import ClusterStreams, RemoteStream
from turns.quota import QuotaCounter
from turns.streams import StreamBuffer

__all__ = ["Address", "Cluster", "RemoteStream"]

log = logging.getLogger("turnd.cluster")

StoredStatus = Callable[[Address], Awaitable[dict[str, Any] | None]]


class Cluster:
    """One instance's part of the cluster: ``async with Cluster(url, instance):``."""

    def __init__(self, url: str, instance: str) -> None:
        self.link = RedisLink(url, instance=instance)
        self.queue = SharedQueue(self.link)
        self.limiter = SharedRateLimiter(self.link, self.queue)
        self._cancel: Callable[[Address], Awaitable[bool]] | None = None
        self._streams: ClusterStreams | None = None
        self._control = Control(self.link, self._handle)
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def up(self) -> bool:
        """Connected: what /healthz says as ``cluster``."""
        return self.link.up and self._control.listening

    async def __aenter__(self) -> Cluster:
        async with AsyncExitStack() as stack:
            stack.push_async_callback(self.link.aclose)
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(self._tg.cancel_scope.cancel)  # runs first: ends the loops
            self._tg.start_soon(self.link.probe)
            self._tg.start_soon(self._control.listen)
            self._tg.start_soon(self.queue.heartbeat)
            # Start connected when Redis is there (tests and /healthz read it at once);
            # a Redis that is down does not hold up the start.
            with anyio.move_on_after(2):
                await self.link.connected.wait()
                await self._control.subscribed.wait()
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._stack is not None
        await self._stack.__aexit__(*exc)

    def quota_counter(self, local: QuotaCounter) -> SharedQuotaCounter:
        """Quota usage summed over the instances (``local``: this instance's own rows)."""
        return SharedQuotaCounter(self.link, local)

    # -- streams and cancel -------------------------------------------------------------

    def streams(self, on_subscribers: Callable[[int], None] | None = None) -> ClusterStreams:
        """The engine's stream registry (one per engine)."""
        assert self._tg is not None, "enter the cluster first"
        self._streams = ClusterStreams(self.link, self._tg, on_subscribers)
        return self._streams

    def serve_cancel(self, cancel: Callable[[Address], Awaitable[bool]]) -> None:
        """What this instance does when another asks to cancel a reply (runs it or not)."""
        self._cancel = cancel

    async def cancel(self, address: Address) -> bool:
        """Cancel a reply another instance runs: true once its runner has cancelled it."""
        rank, _ = await self._control.ask("cancel", address)
        return rank > 0

    async def local_stream(self, buffer: StreamBuffer | None) -> StreamBuffer | None:
        """The engine's buffer for a reply if this instance serves it (see ClusterStreams)."""
        return await self._streams.readable(buffer) if self._streams is not None else buffer

    async def remote_stream(self, address: Address, stored: StoredStatus) -> RemoteStream | None:
        """The stream of a reply another instance runs (or ran within the last minute)."""
        if self._streams is None:
            return None
        rank, runner = await self._control.ask("watch", address)
        if not rank or runner is None:
            return None

        async def status() -> dict[str, Any] | None:
            return await stored(address)

        async def watch() -> bool:
            rank, again = await self._control.ask("watch", address)
            return rank > 0 and again == runner

        return self._streams.remote(runner, address, status, watch)

    async def _handle(self, op: str, address: Address) -> int:
        if op == "cancel" and self._cancel is not None:
            return int(await self._cancel(address))
        if op == "watch" and self._streams is not None:
            return self._streams.watch(address)
        return 0
