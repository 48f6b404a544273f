"""In-process wake-ups of the local store's change feeds.

A write rings the bell of its database file; every feed on that file in this process
(and thread) wakes instead of waiting for its next poll. It wakes once the callbacks the
loop already has queued have run: a POST or a direct write starts its turn just after
writing the message, and the turn (its claim, the model's request) then goes before the
feed's handling of that write, which only finds the turn started. The rings of one pass
of the loop wake the feeds once.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from pathlib import Path

import anyio

__all__ = ["Bell", "bell_for"]


class Bell:
    """Wakes the change feeds of every LocalStore on one file in this process.

    Only waiters on the ringing thread are woken: anyio events are not
    thread-safe. Feeds in other threads (and processes) see the write by polling.
    """

    def __init__(self) -> None:
        self._waiters: dict[anyio.Event, int] = {}
        # Loops with a wake-up queued (weakly: a loop closed before it ran goes away).
        self._ringing: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

    def arm(self) -> anyio.Event:
        event = anyio.Event()
        self._waiters[event] = threading.get_ident()
        return event

    def disarm(self, event: anyio.Event) -> None:
        self._waiters.pop(event, None)

    def ring(self) -> None:
        me = threading.get_ident()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop on this thread: nothing queued to go first
            self._wake(None, me)
            return
        if loop not in self._ringing:
            self._ringing.add(loop)
            loop.call_soon(self._wake, loop, me)

    def _wake(self, loop: asyncio.AbstractEventLoop | None, thread: int) -> None:
        if loop is not None:
            self._ringing.discard(loop)
        for event, waiter_thread in list(self._waiters.items()):
            if waiter_thread == thread:
                event.set()


_bells: dict[Path, Bell] = {}
_bells_lock = threading.Lock()


def bell_for(db_path: Path) -> Bell:
    """The one bell of the database file ``db_path`` in this process."""
    with _bells_lock:
        return _bells.setdefault(db_path, Bell())
