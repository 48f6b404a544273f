"""Writes of the state file on the event loop's own thread: no thread hop.

Every turn writes its claim row, its usage rows, its timing and drops the claim: four
hand-offs to aiosqlite's worker thread, each costing more CPU than the statement. The
state file is this process's own (SPEC §12), in WAL mode with ``synchronous=NORMAL``, so
a commit is a write to the WAL and never an fsync; it runs where it is asked for. It
never waits: the connection's busy timeout is 0, and a write that would wait (another
connection writing), one asked for from another thread, or any SQLite error answers
None — the caller then writes through the worker thread, which waits and reports
errors as it always did. Checkpoints (the fsyncs) stay on the worker thread:
:attr:`QuickWriter.due` says when one is owed.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CHECKPOINT_EVERY", "QuickWriter", "Statement"]

CHECKPOINT_EVERY = 200  # commits between checkpoints; SQLite's own default is ~1000 pages

# (sql, parameters) or (sql, [parameters, ...]) for executemany
Statement = tuple[str, Sequence[Any]]


class QuickWriter:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None
        self._thread: int | None = None
        self._broken = False
        self._commits = 0

    @property
    def due(self) -> bool:
        """A checkpoint is owed (see the module's docstring); reset by :meth:`checkpointed`."""
        return self._commits >= CHECKPOINT_EVERY

    def checkpointed(self) -> None:
        self._commits = 0

    def run(self, statements: Sequence[Statement], many: bool = False) -> int | None:
        """Run ``statements`` as one transaction; the last one's row count, or None when
        it could not be done at once on this thread (then nothing was written).
        ``many``: the first statement's parameters are a list of rows (executemany)."""
        conn = self._connection()
        if conn is None:
            return None
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            return None
        try:
            changed = 0
            for i, (sql, params) in enumerate(statements):
                cursor = conn.executemany(sql, params) if many and i == 0 else conn.execute(sql, params)
                changed = cursor.rowcount
            conn.execute("COMMIT")
        except sqlite3.Error:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error:
                self.close()  # a connection that cannot roll back is not used again
            return None
        self._commits += 1
        return changed

    def _connection(self) -> sqlite3.Connection | None:
        if self._broken:
            return None
        if self._conn is not None:
            return self._conn if threading.get_ident() == self._thread else None
        try:
            # check_same_thread=False only so that close() may come from anywhere:
            # writes check the thread themselves.
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 0")
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
