"""SQLite on the event loop's own thread, for statements that never wait: no thread hop.

A statement through aiosqlite hands its work to a worker thread and the result back:
about 80 µs of CPU in hand-offs around a point read or a one-row write SQLite does in
10–30 µs. In WAL mode a reader never waits for a writer, and with ``synchronous=NORMAL``
a commit is a write to the WAL, never an fsync, so such statements can run where they
are asked for. They never wait for anything else either: these connections' busy
timeout is 0, and a statement that would wait (another connection writing, a WAL being
recovered), one asked for from another thread, or one that meets any SQLite error but a
constraint answers None. The caller then goes through its worker thread, which waits and
reports errors as it always did. A constraint (a create-only write's key taken) is the
statement's answer and is raised as :class:`sqlite3.IntegrityError`.

Checkpoints (the fsyncs) stay on the worker threads: :attr:`Quick.checkpoint_due` says
when the caller owes one.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CHECKPOINT_EVERY", "Quick", "Statement"]

CHECKPOINT_EVERY = 200  # commits between checkpoints; SQLite's own default is ~1000 pages

# (sql, parameters); the first of a write may carry a list of rows (executemany)
Statement = tuple[str, Sequence[Any]]


class Quick:
    """One connection to ``path`` for the thread that first uses it."""

    def __init__(self, path: Path, *, read_only: bool) -> None:
        self._path = path
        self._read_only = read_only
        self._conn: sqlite3.Connection | None = None
        self._thread: int | None = None
        self._broken = False
        self._commits = 0

    @property
    def checkpoint_due(self) -> bool:
        """A checkpoint is owed (see the module's docstring); then call :meth:`checkpointed`."""
        return self._commits >= CHECKPOINT_EVERY

    def checkpointed(self) -> None:
        self._commits = 0

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

    def write(self, statements: Sequence[Statement], *, many: bool = False) -> int | None:
        """The statements as one transaction; the last one's row count, or None when they
        could not be run at once on this thread (then nothing was written). ``many``: the
        first statement's parameters are a list of rows."""
        conn = self._connection()
        if conn is None:
            return None
        single = len(statements) == 1 and not many
        try:
            if not single:
                conn.execute("BEGIN IMMEDIATE")
            changed = 0
            for i, (sql, params) in enumerate(statements):
                run = conn.executemany if many and i == 0 else conn.execute
                changed = run(sql, params).rowcount
            if not single:
                conn.execute("COMMIT")
        except sqlite3.IntegrityError:
            self._roll_back(conn)
            raise
        except sqlite3.Error:
            self._roll_back(conn)
            return None
        self._commits += 1
        return changed

    def _roll_back(self, conn: sqlite3.Connection) -> None:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            self.close()  # a connection that cannot roll back is not used again

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
            if self._read_only:
                conn.execute("PRAGMA query_only = 1")
            else:
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute("PRAGMA wal_autocheckpoint = 0")  # the worker thread checkpoints
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
