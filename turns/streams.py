"""Numbered stream buffers: one per reply key, replayed then followed live.

A buffer is an append-only list of events. Subscribers read it by index at
their own pace, so the turn never waits on a subscriber and one slow reader
cannot hold back the others; the list is bounded by the turn itself (the reply
record is at most ~1 MB) and dropped a minute after the turn ends.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

KEEP_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class StreamEvent:
    id: int
    event: str
    data: str  # JSON, encoded once at publish time


class ReplyStream(Protocol):
    """What a subscriber reads: this instance's buffer, or (with [cluster]) another's."""

    @property
    def done(self) -> bool: ...

    def batches(self, after: int = 0, idle: float = math.inf) -> AsyncIterator[list[StreamEvent]]:
        """The events after ``after``, in batches; an empty batch after ``idle`` quiet seconds."""
        ...


class StreamBuffer:
    def __init__(self, on_subscribers: Callable[[int], None] | None = None) -> None:
        self._events: list[StreamEvent] = []
        self._wakeup: anyio.Event | None = None
        self._closed_at: float | None = None
        self._on_subscribers = on_subscribers

    @property
    def done(self) -> bool:
        return self._closed_at is not None

    @property
    def last_id(self) -> int:
        return len(self._events)

    def publish(self, event: str, data: dict[str, Any]) -> None:
        self.publish_raw(event, json.dumps(data, ensure_ascii=False, separators=(",", ":")))

    def publish_delta(self, index: int, text: str) -> None:
        """A text or reasoning delta: one small string per token, no dict, no generic encoder."""
        self.publish_raw("delta", f'{{"index":{index},"text":{json.dumps(text, ensure_ascii=False)}}}')

    def publish_raw(self, event: str, data: str) -> None:
        if self._closed_at is not None:
            return
        self._events.append(StreamEvent(len(self._events) + 1, event, data))
        self._wake()

    def close(self) -> None:
        """End the stream; the last event published should be ``status``."""
        if self._closed_at is None:
            self._closed_at = time.monotonic()
            self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None

    async def events(self, after: int = 0) -> AsyncIterator[StreamEvent]:
        """Events with ids greater than ``after``: the buffered ones, then live ones."""
        async for batch in self.batches(after):
            for event in batch:
                yield event

    async def batches(
        self, after: int = 0, idle: float = math.inf
    ) -> AsyncIterator[list[StreamEvent]]:
        """Like :meth:`events`, but everything available at once, so a writer can send
        it in one write; an empty batch after ``idle`` seconds without an event."""
        if self._on_subscribers:
            self._on_subscribers(+1)
        try:
            async for batch in self.follow(after, idle):
                yield batch
        finally:
            if self._on_subscribers:
                self._on_subscribers(-1)

    async def follow(
        self, after: int = 0, idle: float = math.inf
    ) -> AsyncIterator[list[StreamEvent]]:
        """:meth:`batches` without counting a subscriber (for relays such as a mirror)."""
        index = max(after, 0)
        while True:
            self._settle()
            if index < len(self._events):
                batch = self._events[index:]
                index += len(batch)
                yield batch
                continue
            if self._closed_at is not None:
                return
            if self._wakeup is None:
                self._wakeup = anyio.Event()
            with anyio.move_on_after(idle) as scope:
                await self._wakeup.wait()
            if scope.cancelled_caught:
                yield []

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

    def open(self, did: str, skey: str, reply_key: str) -> StreamBuffer:
        self._purge()
        key = (did, skey, reply_key)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.done:
            buffer = self._buffers[key] = self._new_buffer(self._on_subscribers)
        return buffer

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
