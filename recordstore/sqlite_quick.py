"""SQLite reads on the event loop's own thread, for statements that never wait: no thread hop.

A statement through aiosqlite hands its work to a worker thread and the result back:
about 80 µs of CPU in hand-offs around a point read SQLite does in 10–30 µs. In WAL mode
a reader never waits for a writer, so such reads can run where they are asked for. They
never wait for anything else either: the connection's busy timeout is 0, and a read that
would wait (a WAL being recovered), one asked for from another thread, or one that meets
any SQLite error answers None. The caller then goes through its worker thread, which
waits and reports errors as it always did.

Writes stay on the worker thread: run on the loop's, they stalled the loop under 1000
concurrent turns (README, "Issue 18, third round").
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

__all__ = ["CACHE", "Quick"]

# The store's page cache per connection: 512 KiB, not SQLite's 2 MB default. A reader's
# is cleared whenever another connection wrote since its last read (WAL), nearly every
# read in a running daemon; the writer's holds the pages its inserts walk (the indexes'
# upper levels and the newest leaves). It took ~1.5 MB off RSS after 1000 turns (SPEC
# §10's growth). CPU per turn was compared at 1 MB (unchanged within the noise), not
# at 512 KiB separately.
CACHE = "PRAGMA cache_size = -512"  # KiB


class Quick:
    """One read-only connection to ``path`` for the thread that first uses it."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None
        self._thread: int | None = None
        self._broken = False

    def read(self, sql: str, params: Any) -> list[Any] | None:
        """The rows, or None when they cannot be had at once on this thread."""
        conn = self._connection()
        if conn is None:
            return None
        try:
            # fetchall runs the statement to its end, so no read snapshot lingers.
            return conn.execute(sql, params).fetchall()
        except sqlite3.Error:
            return None

    def _connection(self) -> sqlite3.Connection | None:
        if self._broken:
            return None
        if self._conn is not None:
            return self._conn if threading.get_ident() == self._thread else None
        try:
            # check_same_thread=False only so that close() may come from anywhere:
            # every statement checks the thread itself.
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA query_only = 1")
            conn.execute(CACHE)
        except sqlite3.Error:
            self._broken = True
            return None
        self._conn, self._thread = conn, threading.get_ident()
        return conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._broken = True
