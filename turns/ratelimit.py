"""Per-user turn rate limit: a sliding minute, and a queue that claims nothing."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import anyio


class RateLimiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        # The clock is injectable so a test can let the minute pass without waiting it.
        self._clock = clock
        self._starts: dict[str, deque[float]] = {}
        self._lock: dict[str, anyio.Lock] = {}
        self._queued: dict[str, int] = {}
        self.waiting = 0

    def _window(self, user: str, now: float) -> deque[float]:
        starts = self._starts.setdefault(user, deque())
        while starts and now - starts[0] >= 60.0:
            starts.popleft()
        return starts

    def try_acquire(self, user: str, per_minute: int) -> bool:
        now = self._clock()
        starts = self._window(user, now)
        if len(starts) < per_minute and not self._lock_held(user):
            starts.append(now)
            return True
        return False

    def _lock_held(self, user: str) -> bool:
        lock = self._lock.get(user)
        return lock is not None and lock.locked()

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

    async def acquire(self, user: str, per_minute: int) -> None:
        """Wait (first come, first served per user) until a turn may start."""
        lock = self._lock.setdefault(user, anyio.Lock())
        self.waiting += 1
        try:
            async with lock:
                while True:
                    now = self._clock()
                    starts = self._window(user, now)
                    if len(starts) < per_minute:
                        starts.append(now)
                        return
                    # Re-check at least every second: the window may be changed
                    # by a config reload.
                    await anyio.sleep(min(60.0 - (now - starts[0]) + 0.01, 1.0))
        finally:
            self.waiting -= 1
