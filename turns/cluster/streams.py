"""Reply streams as Redis Streams, so any instance serves any reply's stream.

The runner keeps its in-process buffer (its own subscribers read it as before)
and mirrors it to a Redis Stream only once another instance asks for that reply:
only while someone may subscribe elsewhere. Each event is one stream entry whose
id is its sequence number (``<n>-1``), so ``Last-Event-ID`` means the same thing
on every instance; a batch of events goes out in one pipelined round trip; the
key is bounded (``MAXLEN``) and expires 60 s after the end, like the buffer.

Deltas are coalesced: the deltas of one part that arrive before any reader
(a local subscriber or the mirror) looks are one ``delta`` event, so an XADD
carries a batch of tokens, never one token. The freeze happens when a reader
reads, so every reader — here or on another instance — sees the same events
with the same ids.

After the last event the mirror writes one more entry, ``<n>-2``, that is not an
event: it tells readers elsewhere that the stream has ended (a queued turn
stopped by a shutdown ends without a ``status``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from recordstore.stored_json import compact
from turns.cluster.control import Address
from turns.cluster.link import RedisLink
from turns.streams import (
    KEEP_SECONDS,
    StreamBuffer,
    StreamEvent,
    StreamRegistry,
    frame_events,
)

log = logging.getLogger("turnd.cluster")

MAXLEN = 100_000  # entries per reply stream; a reply record is at most ~1 MB anyway
LIVE_TTL = 900  # seconds: refreshed while the turn runs, so a dead runner's key goes too
END_TTL = int(KEEP_SECONDS)
SETTLE_SECONDS = 5.0  # a claim is one store write; past this, the buffer is not served
_REDIS_ERRORS: tuple[type[BaseException], ...] = (OSError, TimeoutError)


def _redis_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisError

    return (RedisError, *_REDIS_ERRORS)


class MirroredBuffer(StreamBuffer):
    """An in-process buffer that coalesces deltas and can be mirrored to Redis."""

    def __init__(self, on_subscribers: Callable[[int], None] | None = None) -> None:
        super().__init__(on_subscribers)
        self._open_index = -1
        self._open_chunks: list[str] = []
        self.mirroring = False
        self.claimed = False  # set by the engine once the claim is ours
        self.settled = anyio.Event()  # claimed here, or lost to another runner
        self.lost = False

    def publish_delta(self, index: int, text: str) -> None:
        if self._closed_at is not None:
            return
        if self._open_chunks and self._open_index == index:
            self._open_chunks.append(text)
            return  # the readers were woken by the first chunk and have not looked yet
        self._settle()
        self._open_index = index
        self._open_chunks = [text]
        self._wake()

    def publish_raw(self, event: str, data: str) -> None:
        self._settle()
        super().publish_raw(event, data)

    def close(self) -> None:
        self._settle()
        super().close()

    @property
    def last_id(self) -> int:
        self._settle()
        return super().last_id

    def _settle(self) -> None:
        if self._open_chunks:
            text = compact("".join(self._open_chunks))
            self._open_chunks = []
            self._append_delta(self._open_index, text)

    async def mirror(self, link: RedisLink, key: str) -> None:
        """Copy the buffer into the Redis Stream ``key`` until it ends (or Redis fails)."""
        redis = link.redis
        try:
            # Continue after what is there: a Redis that kept its data across a restart
            # already has the first entries, and an XADD at or below the top id fails.
            top = await redis.xrevrange(key, count=1)
            after = int(top[0][0].split(b"-")[0]) if top else 0
            async for batch in self.follow(after, idle=LIVE_TTL / 3):
                pipe = redis.pipeline(transaction=False)
                for ev in batch:
                    pipe.xadd(
                        key, {"e": ev.event, "d": ev.data}, id=f"{ev.id}-1",
                        maxlen=MAXLEN, approximate=True,
                    )
                # close() settles the open delta, so a closed buffer has nothing pending.
                ended = self.done and batch[-1].id == self._count
                if ended:
                    pipe.xadd(key, {"e": ""}, id=f"{self._count}-2")
                    pipe.expire(key, END_TTL)
                else:
                    pipe.expire(key, LIVE_TTL)
                await pipe.execute()
                if ended:
                    return
            # follow() returned: closed and every event already written by an earlier batch.
            await _end(redis, key, self._count)
        except _redis_errors() as err:
            link.mark_down(err)
            log.warning("cluster: stream %s not mirrored any more: %s", key, type(err).__name__)
        finally:
            self.mirroring = False


async def _end(redis: Any, key: str, last: int) -> None:
    pipe = redis.pipeline(transaction=False)
    pipe.xadd(key, {"e": ""}, id=f"{last}-2")
    pipe.expire(key, END_TTL)
    from redis.exceptions import ResponseError

    try:
        await pipe.execute()
    except ResponseError:
        pass  # the end marker exists already (a second mirror of the same buffer)


StoredStatus = Callable[[], Awaitable[dict[str, Any] | None]]
Watch = Callable[[], Awaitable[bool]]


class RemoteStream:
    """A reply running on another instance, read from its Redis Stream with XREAD BLOCK.

    It has the buffer's ``batches`` interface, so the SSE route serves it the same
    way. If Redis goes away mid-stream, the reader falls back to the store: once
    the reply is final it sends the stored ``status``; when Redis is back it asks
    the runner to mirror again and goes on from the last id it sent.
    """

    def __init__(self, link: RedisLink, key: str, stored: StoredStatus, watch: Watch) -> None:
        self._link = link
        self._key = key
        self._stored = stored
        self._watch = watch
        self.done = False  # the reply has ended (what the idle-subscriber watchdog reads)

    async def batches(
        self, after: int = 0, idle: float = math.inf
    ) -> AsyncIterator[list[StreamEvent]]:
        async for batch in self._batches(max(after, 0), idle):
            yield batch
        self.done = True

    async def frames(self, after: int = 0, idle: float = math.inf) -> AsyncIterator[bytes]:
        """:meth:`batches` as SSE (what the stream route sends)."""
        async for batch in self.batches(after, idle):
            yield frame_events(batch)

    async def _batches(self, last: int, idle: float) -> AsyncIterator[list[StreamEvent]]:
        first = last
        block_ms = int(min(idle, 15.0) * 1000)
        while True:
            try:
                found = await self._link.blocking.xread(
                    {self._key: f"{last}-1"}, block=block_ms, count=1000
                )
            except _redis_errors() as err:
                self._link.mark_down(err)
                status = await self._through_outage()
                if status is not None:
                    yield [StreamEvent(last + 1, "status", json.dumps(status))]
                    return
                continue
            if not found:
                yield []  # the keepalive; and is anyone still running this reply?
                if not await self._watch():
                    status = await self._stored()
                    if status is not None:
                        yield [StreamEvent(last + 1, "status", json.dumps(status))]
                    return
                continue
            batch: list[StreamEvent] = []
            ended = False
            for entry_id, fields in _entries(found):
                seq, _, sub = entry_id.partition(b"-")
                if sub != b"1":
                    ended = True
                    break
                last = int(seq)
                batch.append(StreamEvent(last, fields[b"e"].decode(), fields[b"d"].decode()))
            if batch:
                yield batch
            if ended and last == first:
                # At or past the last event of a finished reply: its stored status (§12).
                self.done = True
                status = await self._stored()
                if status is not None:
                    yield [StreamEvent(last + 1, "status", json.dumps(status))]
                return
            if ended or (batch and batch[-1].event == "status"):
                return

    async def _through_outage(self) -> dict[str, Any] | None:
        """Until Redis is back and the runner mirrors again: the stored status once final."""
        while True:
            status = await self._stored()
            if status is None or status.get("status") != "pending":
                return status or {"status": "pending"}
            if self._link.up and await self._watch():
                return None
            await anyio.sleep(0.25)


def _entries(found: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    return [entry for _, entries in found for entry in entries]  # RESP2: [[key, entries]]


class ClusterStreams(StreamRegistry):
    """The engine's stream registry, plus mirroring on request and remote readers."""

    def __init__(
        self,
        link: RedisLink,
        task_group: anyio.abc.TaskGroup,
        on_subscribers: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(on_subscribers, buffer=MirroredBuffer)
        self._link = link
        self._tg = task_group

    def key(self, instance: str, address: Address) -> str:
        # One key per runner: two instances that both hold a buffer for one reply (a
        # duplicate queued by two change feeds) never write into each other's stream.
        return self._link.key("stream", instance, *address)

    def claimed(self, did: str, skey: str, reply: str) -> None:
        buffer = self.get(did, skey, reply)
        if isinstance(buffer, MirroredBuffer):
            buffer.claimed = True
            buffer.settled.set()

    def lost(self, did: str, skey: str, reply: str) -> None:
        """Another runner holds the claim: this buffer is nobody's stream any more."""
        buffer = self._buffers.pop((did, skey, reply), None)
        if isinstance(buffer, MirroredBuffer):
            buffer.lost = True
            buffer.settled.set()

    async def readable(self, buffer: StreamBuffer | None) -> StreamBuffer | None:
        """``buffer`` if it is this instance's stream to serve, else None (ask the others).

        Every instance's change feed may start a message; a buffer opened for a claim
        not yet decided is waited on (briefly), so that a subscriber here gets the live
        stream when we win and the runner's, through Redis, when we lose."""
        if not isinstance(buffer, MirroredBuffer):
            return buffer
        if not (buffer.claimed or buffer.lost or buffer.last_id > 0):
            with anyio.move_on_after(SETTLE_SECONDS):
                await buffer.settled.wait()
        if buffer.lost:
            return None
        return buffer if buffer.claimed or buffer.last_id > 0 else None

    def watch(self, address: Address) -> int:
        """Another instance has a subscriber for ``address``: mirror it if it is ours.

        2: claimed here (running or finished); 1: queued here; 0: not ours (a buffer
        opened for a claim not yet made has nothing to say)."""
        buffer = self.get(*address)
        if not isinstance(buffer, MirroredBuffer):
            return 0
        rank = 2 if buffer.claimed else (1 if buffer.last_id > 0 else 0)
        if rank and not buffer.mirroring:
            buffer.mirroring = True
            self._tg.start_soon(buffer.mirror, self._link, self.key(self._link.instance, address))
        return rank

    def remote(
        self, instance: str, address: Address, stored: StoredStatus, watch: Watch
    ) -> RemoteStream:
        return RemoteStream(self._link, self.key(instance, address), stored, watch)
