"""Numbered stream buffers: one per reply key, replayed then followed live.

A buffer is an append-only list of events. Subscribers read it by index at
their own pace, so the turn never waits on a subscriber and one slow reader
cannot hold back the others; the list is bounded by the turn itself (the reply
record is at most ~1 MB) and dropped a minute after the turn ends.

Each event is kept as the bytes a subscriber is sent (SSE, framed once when it
is published): however many subscribers a reply has, none frames it again, and
a batch is one join. When the turn ends the frames are packed into one
compressed string, which is what a finished reply costs for its minute of
replay (a reply's frames repeat themselves: 20 deltas take ~1.4 KB framed, ~0.3
KB packed, against ~3.4 KB as event objects).
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from fastapi.sse import format_sse_event

from recordstore.stored_json import compact

KEEP_SECONDS = 60.0
BEAT_SECONDS = 1.0  # a registry's heartbeat: a keepalive goes up to this much before `idle`
_END = b"\n\n"  # ends every frame, and only ends them: event data is JSON, one line


@dataclass(frozen=True, slots=True)
class StreamEvent:
    id: int
    event: str
    data: str  # JSON, encoded once at publish time


def frame(event: str, data: str, id: int) -> bytes:
    """One event as SSE (``event``, ``data``, ``id`` lines), as fastapi.sse frames it."""
    return format_sse_event(event=event, data_str=data, id=str(id))


def frame_id(framed: bytes) -> int:
    """The id of one frame made by :func:`frame` (its last line, before the blank one)."""
    return int(framed[framed.rindex(b"id: ") + 4 : -2])


def frame_events(events: list[StreamEvent]) -> bytes:
    return b"".join(frame(e.event, e.data, e.id) for e in events)


def parse_frames(framed: bytes) -> list[StreamEvent]:
    """The events of frames made by :func:`frame` (for readers that need the fields)."""
    out = []
    for one in framed.split(_END)[:-1]:
        event, data, id_ = one.decode().split("\n")
        out.append(StreamEvent(int(id_[4:]), event[7:], data[6:]))
    return out


class ReplyStream(Protocol):
    """What a subscriber reads: this instance's buffer, or (with [cluster]) another's."""

    @property
    def done(self) -> bool: ...

    def frames(self, after: int = 0, idle: float = math.inf) -> AsyncIterator[bytes]:
        """The events after ``after`` as SSE, everything available at once; ``b""``
        after ``idle`` quiet seconds."""
        ...


class StreamBuffer:
    # A finished buffer is kept a minute per reply: no per-instance dict for it.
    __slots__ = ("_frames", "_packed", "_count", "_wakeup", "_closed_at", "_on_subscribers", "beat")

    def __init__(self, on_subscribers: Callable[[int], None] | None = None) -> None:
        self._frames: list[bytes] = []  # while the turn runs
        self._packed: bytes | None = None  # once it ended: every frame, compressed
        self._count = 0
        self._wakeup: anyio.Event | None = None
        self._closed_at: float | None = None
        self._on_subscribers = on_subscribers
        # The period of the heartbeat that wakes this buffer's subscribers (its registry's,
        # while that runs), or None: each wait then has a timeout of its own.
        self.beat: float | None = None

    @property
    def done(self) -> bool:
        return self._closed_at is not None

    @property
    def last_id(self) -> int:
        return self._count

    def publish(self, event: str, data: dict[str, Any]) -> None:
        self.publish_raw(event, compact(data))

    def publish_delta(self, index: int, text: str) -> None:
        """A text or reasoning delta: one small string per token, no dict, no generic encoder."""
        self._append_delta(index, compact(text))

    def publish_raw(self, event: str, data: str) -> None:
        if self._closed_at is not None:
            return
        self._count += 1
        self._frames.append(frame(event, data, self._count))
        self._wake()

    def _append_delta(self, index: int, text_json: str) -> None:
        if self._closed_at is not None:
            return
        self._count += 1
        # The bytes frame() makes for it (JSON has no line break to split), built in
        # one step: this runs once per token.
        self._frames.append(
            f'event: delta\ndata: {{"index":{index},"text":{text_json}}}\nid: {self._count}\n\n'
            .encode()
        )
        self._wake()

    def close(self) -> None:
        """End the stream; the last event published should be ``status``."""
        if self._closed_at is None:
            self._closed_at = time.monotonic()
            # A small window and hash (4 KB, memLevel 2): zlib's defaults (32 KB and
            # 128 KB) took ~30 µs to set up for each reply's few hundred bytes; the
            # output is as small (a 5-token reply 32 -> 6.4 µs, 200 tokens 47 -> 30 µs).
            packer = zlib.compressobj(1, zlib.DEFLATED, 12, 2)
            self._packed = packer.compress(b"".join(self._frames)) + packer.flush()
            self._frames.clear()
            self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None

    def framed_after(self, index: int) -> bytes:
        """The frames of the events after the first ``index`` (all published ones)."""
        if self._packed is None:
            return b"".join(self._frames[index:])
        framed = zlib.decompress(self._packed)
        at = 0
        for _ in range(index):
            at = framed.index(_END, at) + len(_END)
        return framed[at:]

    def published(self) -> list[StreamEvent]:
        """Every event so far (for readers that need the fields, not the bytes)."""
        self._settle()
        return parse_frames(self.framed_after(0))

    async def events(self, after: int = 0) -> AsyncIterator[StreamEvent]:
        """Events with ids greater than ``after``: the buffered ones, then live ones."""
        async for batch in self.batches(after):
            for event in batch:
                yield event

    async def batches(
        self, after: int = 0, idle: float = math.inf
    ) -> AsyncIterator[list[StreamEvent]]:
        """Like :meth:`events`, but everything available at once; an empty batch after
        ``idle`` seconds without an event."""
        async for framed in self.frames(after, idle):
            yield parse_frames(framed)

    async def frames(self, after: int = 0, idle: float = math.inf) -> AsyncIterator[bytes]:
        """What a subscriber is sent: the frames of everything it has not seen, at once,
        so a writer sends it in one write; ``b""`` after ``idle`` seconds without one."""
        if self._on_subscribers:
            self._on_subscribers(+1)
        try:
            async for framed in self._follow_frames(after, idle):
                yield framed
        finally:
            if self._on_subscribers:
                self._on_subscribers(-1)

    async def follow(
        self, after: int = 0, idle: float = math.inf
    ) -> AsyncIterator[list[StreamEvent]]:
        """:meth:`batches` without counting a subscriber (for relays such as a mirror)."""
        async for framed in self._follow_frames(after, idle):
            yield parse_frames(framed)

    async def _follow_frames(self, after: int, idle: float) -> AsyncIterator[bytes]:
        index = max(after, 0)
        sent = time.monotonic()  # when this subscriber was last sent something
        while True:
            self._settle()
            if index < self._count:
                framed = self.framed_after(index)
                index = self._count
                sent = time.monotonic()
                yield framed
                continue
            if self._closed_at is not None:
                return
            if self._wakeup is None:
                self._wakeup = anyio.Event()
            beat = self.beat
            if beat is not None and idle >= beat:
                # Woken by an event or by the heartbeat: no timer per wait, which cost
                # a cancel scope's entry and exit at every token a subscriber waited for.
                # The keepalive goes at the first beat a beat short of `idle`: never later
                # than `idle` after what was sent before it (SPEC §6: every 15 seconds).
                await self._wakeup.wait()
                now = time.monotonic()
                if index == self._count and self._closed_at is None and now - sent >= idle - beat:
                    sent = now
                    yield b""
                continue
            with anyio.move_on_after(idle) as scope:
                await self._wakeup.wait()
            if scope.cancelled_caught:
                sent = time.monotonic()
                yield b""

    def wake_waiting(self) -> None:
        """The heartbeat: waiting subscribers look at how long they have been quiet."""
        self._wake()

    def _settle(self) -> None:
        """Make pending events readable; a coalescing buffer freezes its open delta here."""

    def expired(self, now: float) -> bool:
        return self._closed_at is not None and now - self._closed_at > KEEP_SECONDS


class StreamRegistry:
    """Buffers by reply, opened at the claim (or when queued), dropped a minute after the end."""

    def __init__(
        self,
        on_subscribers: Callable[[int], None] | None = None,
        buffer: Callable[[Callable[[int], None] | None], StreamBuffer] = StreamBuffer,
    ) -> None:
        self._buffers: dict[tuple[str, str, str], StreamBuffer] = {}
        self._purged_at = 0.0
        self._on_subscribers = on_subscribers
        self._new_buffer = buffer
        self._beat: float | None = None  # the heartbeat's period while it runs
        self._heart = anyio.CancelScope()

    def open(self, did: str, skey: str, reply_key: str) -> StreamBuffer:
        self._purge()
        key = (did, skey, reply_key)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.done:
            buffer = self._buffers[key] = self._new_buffer(self._on_subscribers)
            buffer.beat = self._beat
        return buffer

    async def heartbeat(self, period: float = BEAT_SECONDS) -> None:
        """Wake the subscribers of every open buffer once a ``period`` until cancelled, so
        that each sends its keepalive when it has been quiet long enough without a
        timer of its own at every wait (buffers opened meanwhile rely on it)."""
        self._beat = period
        try:
            with self._heart:
                while True:
                    await anyio.sleep(period)
                    for buffer in list(self._buffers.values()):
                        buffer.wake_waiting()
        finally:
            self._beat = None
            for buffer in self._buffers.values():
                buffer.beat = None
                buffer.wake_waiting()  # back to a timer of their own

    def stop_heartbeat(self) -> None:
        self._heart.cancel()

    def claimed(self, did: str, skey: str, reply_key: str) -> None:
        """The reply's claim is this process's (a shared registry publishes only those)."""

    def lost(self, did: str, skey: str, reply_key: str) -> None:
        """Another runner holds the reply's claim."""

    def get(self, did: str, skey: str, reply_key: str) -> StreamBuffer | None:
        self._purge()
        return self._buffers.get((did, skey, reply_key))

    def _purge(self) -> None:
        now = time.monotonic()
        if now - self._purged_at < 1.0:
            return  # a scan per call would cost O(buffers) on every subscribe
        self._purged_at = now
        for key in [k for k, b in self._buffers.items() if b.expired(now)]:
            del self._buffers[key]
