"""In-process wake-ups of the local store's change feeds.

A write rings the bell of its database file; every feed on that file in this process
(and thread) wakes at once instead of waiting for its next poll.
"""

from __future__ import annotations

import threading
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

    def arm(self) -> anyio.Event:
        event = anyio.Event()
        self._waiters[event] = threading.get_ident()
        return event

    def disarm(self, event: anyio.Event) -> None:
        self._waiters.pop(event, None)

    def ring(self) -> None:
        me = threading.get_ident()
        for event, thread in list(self._waiters.items()):
            if thread == me:
                event.set()


_bells: dict[Path, Bell] = {}
_bells_lock = threading.Lock()


def bell_for(db_path: Path) -> Bell:
    """The one bell of the database file ``db_path`` in this process."""
    with _bells_lock:
        return _bells.setdefault(db_path, Bell())
