"""SQLite statements on the event loop's own thread, when they need not wait: no thread hop.

A statement through aiosqlite hands its work to a worker thread and the result back:
about 80 µs of CPU in hand-offs around a point read SQLite does in 10–30 µs. In WAL mode
a reader never waits for a writer, so such reads can run where they are asked for. They
never wait for anything else either: the connection's busy timeout is 0, and a read that
would wait (a WAL being recovered), one asked for from another thread, or one that meets
any SQLite error answers None. The caller then goes through its worker thread, which
waits and reports errors as it always did.

Reads go through the same connection as the writes. A WAL connection empties its page
cache whenever another connection has committed since its last statement, and in a
running daemon nearly every read followed one of this process's writes: on a read-only
connection of its own each read began by reading its pages again (``pread``), on the
writer's they are still in its cache (a point read 33 -> 27 µs; ``bench.ab --paired``,
CPU a short turn B/A 0.976 and 0.988).

Writes (:class:`Quick`) run here only while they are cheap for the loop: one that would
wait for SQLite's write lock (another connection or process is writing) answers None, and
so does every write once the loop has spent its share of time writing. Run on the loop
without that share, writes stalled it under 1000 concurrent turns (docs/performance-history.md,
"third round"); through the worker thread SQLite runs beside the loop, on the other core.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["CACHE", "Quick"]

T = TypeVar("T")

# The store's page cache per connection: 512 KiB, not SQLite's 2 MB default. The worker
# thread's reader's is cleared whenever another connection wrote since its last read
# (WAL), nearly every read in a running daemon; the loop's connection holds the pages its
# writes walk (the indexes' upper levels and the newest leaves) and its reads find. It took ~1.5 MB off RSS after 1000 turns (SPEC
# §10's growth). CPU per turn was compared at 1 MB (unchanged within the noise), not
# at 512 KiB separately.
CACHE = "PRAGMA cache_size = -512"  # KiB


# The loop's share of time for writes (a token bucket in seconds): at most SHARE of the
# loop's time on average, and BURST at once. A write on the loop costs 20-60 µs of CPU
# against ~120 µs through aiosqlite's thread, and on the claim's path the hops cost
# more in latency than in CPU (README, "Benchmarks").
SHARE = 0.1
BURST = 0.002
# SQLite checkpoints the WAL in the connection that commits past 1000 pages: not this one
# (a checkpoint syncs the file). Every CHECKPOINT_EVERY-th write goes to the worker thread
# instead, whose commit checkpoints as SQLite always does.
CHECKPOINT_EVERY = 64
_PRAGMAS = (
    "PRAGMA busy_timeout = 0",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA wal_autocheckpoint = 0",
    CACHE,
)


class Quick:
    """One connection to ``path`` for the thread that first uses it, for its reads and its
    writes (None elsewhere, and for good once it could not be opened or was closed).

    ``read`` answers a ``SELECT``'s rows. ``write`` answers the number of rows changed, or
    None when the statement was not run (busy, over the share, another thread, a broken
    connection): the caller then runs it through its worker thread, which waits,
    checkpoints and reports errors as it always did. ``sqlite3.IntegrityError`` is raised
    as it is: that is the statement's answer.
    """

    def __init__(self, path: Path, *, share: float | None = None, burst: float | None = None) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None
        self._thread: int | None = None
        self._broken = False
        self._share = SHARE if share is None else share
        self._burst = BURST if burst is None else burst
        self._tokens = self._burst
        self._refilled = time.perf_counter()
        self._count = 0

    def _connection(self) -> sqlite3.Connection | None:
        if self._broken:
            return None
        if self._conn is not None:
            return self._conn if threading.get_ident() == self._thread else None
        try:
            # check_same_thread=False only so that close() may come from anywhere:
            # every statement checks the thread itself.
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            for pragma in _PRAGMAS:
                conn.execute(pragma)
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

    def read(self, sql: str, params: Any) -> list[Any] | None:
        """The rows of a ``SELECT``, or None when they cannot be had at once on this thread
        (or ``sql`` is something else: a read never writes)."""
        if not sql.startswith("SELECT"):
            return None
        conn = self._connection()
        if conn is None or conn.in_transaction:
            return None  # never inside a write left open (a failed rollback): not committed
        try:
            # fetchall runs the statement to its end, so no read snapshot lingers.
            return conn.execute(sql, params).fetchall()
        except sqlite3.Error:
            return None

    def write(self, sql: str, params: Any, *, many: bool = False) -> int | None:
        """Run ``sql`` with ``params`` (``many``: with each of them, as ``executemany``)."""
        now = self._spend()
        if now is None:
            return None
        if not many:
            return self._write(lambda conn: conn.execute(sql, params).rowcount, now)
        changed = self.write_all([(sql, params, True)], now=now)
        return None if changed is None else changed[0]

    def write_all(
        self, statements: Sequence[tuple[str, Any, bool]], *, now: float | None = None
    ) -> list[int] | None:
        """Run ``(sql, params, many)`` statements in one transaction: all or none, and one
        commit. The rows each changed, or None as for :meth:`write`."""
        now = self._spend() if now is None else now
        if now is None:
            return None

        def run(conn: sqlite3.Connection) -> list[int]:
            # All or none: autocommit would commit each statement, and a write that stops
            # busy part-way would be run again whole by the worker thread.
            conn.execute("BEGIN IMMEDIATE")
            try:
                changed = [
                    (conn.executemany if many else conn.execute)(sql, params).rowcount
                    for sql, params, many in statements
                ]
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return changed

        return self._write(run, now)

    def _spend(self) -> float | None:
        """The time a write starts at, or None when it is not for this thread's loop now."""
        now = time.perf_counter()
        self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._share)
        self._refilled = now
        self._count += 1
        if self._tokens <= 0 or self._count % CHECKPOINT_EVERY == 0:
            return None
        return now

    def _write(self, run: Callable[[sqlite3.Connection], T], now: float) -> T | None:
        conn = self._connection()
        if conn is None:
            return None
        try:
            return run(conn)
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error:
            return None  # busy (no wait here), or a real error the worker thread reports
        finally:
            self._tokens -= time.perf_counter() - now
