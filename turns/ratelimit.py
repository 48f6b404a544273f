"""Per-user turn rate limit: a sliding minute, and a queue that claims nothing."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol

import anyio


class Limiter(Protocol):
    """What the engine needs of a rate limiter: this process's, or one shared on Redis."""

    @property
    def waiting(self) -> int: ...

    async def admit(self, user: str, per_minute: int, turn: str = "") -> bool:
        """Start ``turn`` now if the window allows it and nobody waits before it."""
        ...

    async def acquire(self, user: str, per_minute: int, turn: str = "") -> None:
        """Wait, first come first served, until ``turn`` may start."""
        ...

    async def enter_queue(self, user: str, max_queued: int, turn: str = "") -> bool:
        """Take a place in ``user``'s queue; False when ``max_queued`` are already waiting."""
        ...

    async def exit_queue(self, user: str, turn: str = "") -> None:
        """Give the place back (never raises, even when cancelled)."""
        ...


class WaitLine:
    """The turns waiting for the rate limit, first come, first served per user."""

    def __init__(self) -> None:
        self._locks: dict[str, anyio.Lock] = {}
        self.waiting = 0

    def held(self, user: str) -> bool:
        """Whether a turn of ``user`` waits already (a new one must not pass it)."""
        lock = self._locks.get(user)
        return lock is not None and lock.locked()

    @asynccontextmanager
    async def first_in_line(self, user: str) -> AsyncIterator[None]:
        """Entered once every turn of ``user`` that came before has left."""
        lock = self._locks.setdefault(user, anyio.Lock())
        self.waiting += 1
        try:
            async with lock:
                yield
        finally:
            self.waiting -= 1


class RateLimiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        # The clock is injectable so a test can let the minute pass without waiting it.
        self._clock = clock
        self._starts: dict[str, deque[float]] = {}
        self._line = WaitLine()
        self._queued: dict[str, int] = {}

    @property
    def waiting(self) -> int:
        return self._line.waiting

    def _window(self, user: str, now: float) -> deque[float]:
        starts = self._starts.setdefault(user, deque())
        while starts and now - starts[0] >= 60.0:
            starts.popleft()
        return starts

    def try_acquire(self, user: str, per_minute: int) -> bool:
        now = self._clock()
        starts = self._window(user, now)
        if len(starts) < per_minute and not self._line.held(user):
            starts.append(now)
            return True
        return False

    async def admit(self, user: str, per_minute: int, turn: str = "") -> bool:
        """:meth:`try_acquire` as the :class:`Limiter` protocol has it (a shared one awaits)."""
        return self.try_acquire(user, per_minute)

    def join_queue(self, user: str, max_queued: int) -> bool:
        """Take a place in ``user``'s queue; False when ``max_queued`` are already waiting.

        Synchronous, so that a burst of starts cannot all pass the bound before any
        of them is counted.
        """
        queued = self._queued.get(user, 0)
        if queued >= max_queued:
            return False
        self._queued[user] = queued + 1
        return True

    def leave_queue(self, user: str) -> None:
        queued = self._queued.get(user, 0) - 1
        if queued > 0:
            self._queued[user] = queued
        else:
            self._queued.pop(user, None)

    def queued(self, user: str) -> int:
        return self._queued.get(user, 0)

    async def enter_queue(self, user: str, max_queued: int, turn: str = "") -> bool:
        # No await before the count: a burst of starts still cannot pass the bound.
        return self.join_queue(user, max_queued)

    async def exit_queue(self, user: str, turn: str = "") -> None:
        self.leave_queue(user)

    async def acquire(self, user: str, per_minute: int, turn: str = "") -> None:
        """Wait (first come, first served per user) until a turn may start."""
        async with self._line.first_in_line(user):
            while True:
                now = self._clock()
                starts = self._window(user, now)
                if len(starts) < per_minute:
                    starts.append(now)
                    return
                # Re-check at least every second: the window may be changed
                # by a config reload.
                await anyio.sleep(min(60.0 - (now - starts[0]) + 0.01, 1.0))
