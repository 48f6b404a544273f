"""The local store's SQLite file: its data directory, its schema, and the two connections
every read and write of :class:`~recordstore.local.LocalStore` goes through.

The op log is written by triggers on ``records``: a record and its op-log row are one
statement, hence one transaction, and one round trip to SQLite's thread.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite
import anyio

from recordstore import CONVERSATION_REF, StoreError
from recordstore.files import private_dir, private_file
from recordstore.local_bell import Bell, bell_for
from recordstore.local_written import Written
from recordstore.sqlite_quick import CACHE, Quick

__all__ = ["COLLECTION_IS", "DB_NAME", "NEWEST_INDEXES", "OP_COLS", "RECORD_COLS", "LocalDb"]

DB_NAME = "store.sqlite3"
_APPLICATION_ID = 0x7475726E  # "turn": SQLite's header field for "which app owns this file"
_SCHEMA_VERSION = 1
_BUSY_TIMEOUT_MS = 10_000
# Quick reads let the loop run other tasks at most this often (seconds): a loop of them
# holds it no longer than a burst of quick writes may (recordstore.sqlite_quick.BURST).
READ_SLICE = 0.002

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS spaces (
        did TEXT NOT NULL, skey TEXT NOT NULL, type TEXT NOT NULL, created_at TEXT NOT NULL,
        PRIMARY KEY (did, skey)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS records (
        did TEXT NOT NULL, space TEXT NOT NULL, collection TEXT NOT NULL, key TEXT NOT NULL,
        cid TEXT NOT NULL, value TEXT NOT NULL,
        PRIMARY KEY (did, space, collection, key)) WITHOUT ROWID""",
    # AUTOINCREMENT: an op id is a cursor and must never be reused.
    """CREATE TABLE IF NOT EXISTS ops (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        did TEXT NOT NULL, space TEXT NOT NULL, collection TEXT NOT NULL, key TEXT NOT NULL,
        op TEXT NOT NULL CHECK (op IN ('create', 'update', 'delete')), cid TEXT, value TEXT)""",
    """CREATE TABLE IF NOT EXISTS blobs (
        did TEXT NOT NULL, cid TEXT NOT NULL, mime_type TEXT NOT NULL, size INTEGER NOT NULL,
        PRIMARY KEY (did, cid)) WITHOUT ROWID""",
    # Triggers keep the op log true to the records table whoever writes it.
    """CREATE TRIGGER IF NOT EXISTS records_create AFTER INSERT ON records BEGIN
        INSERT INTO ops (did, space, collection, key, op, cid, value)
        VALUES (new.did, new.space, new.collection, new.key, 'create', new.cid, new.value); END""",
    # A put of an identical record is a no-op, as on a PDS: no op, no feed event.
    """CREATE TRIGGER IF NOT EXISTS records_update AFTER UPDATE ON records
        WHEN old.cid IS NOT new.cid BEGIN
        INSERT INTO ops (did, space, collection, key, op, cid, value)
        VALUES (new.did, new.space, new.collection, new.key, 'update', new.cid, new.value); END""",
    """CREATE TRIGGER IF NOT EXISTS records_delete AFTER DELETE ON records BEGIN
        INSERT INTO ops (did, space, collection, key, op, cid, value)
        VALUES (old.did, old.space, old.collection, old.key, 'delete', NULL, NULL); END""",
]

# Pages read newest first (recordstore.abilities.NewestFirst): (collection, field) -> an
# index over that field of that collection's records only, so other writes never pay for it.
NEWEST_INDEXES = {(CONVERSATION_REF, "updatedAt"): "records_conversation_ref_updated"}
_INDEXES = [
    f"CREATE INDEX IF NOT EXISTS {name} ON records"
    f" (did, space, json_extract(value, '$.{field}'), key) WHERE collection = '{collection}'"
    for (collection, field), name in NEWEST_INDEXES.items()
]

RECORD_COLS = "did, space, collection, key, cid, value"
# A bound collection in a statement on ``records``, as an expression and not a bare ``?``.
# SQLite tests a bare ``collection = ?`` against the partial index's ``WHERE collection =
# '…'`` by the parameter's value, and a statement planned on a bound value is expired by
# every bind of it: each read and write of a record was parsed and planned again, its
# triggers too (a point read 17 → 8.5 µs, an update 256 → 195 µs here). The primary key
# serves ``= CAST(? AS TEXT)`` as it served ``= ?``.
COLLECTION_IS = "collection = CAST(? AS TEXT)"
OP_COLS = "id, did, space, collection, key, op, cid, value"


class LocalDb:
    """One store file, open: a writer and a reader connection, and the write lock."""

    def __init__(self, root: Path, writer: aiosqlite.Connection, reader: aiosqlite.Connection):
        self.root = root
        self.path = root / DB_NAME
        self._writer = writer
        # Reads go through their own connection so they never queue behind a write.
        self._reader = reader
        self.write_lock = anyio.Lock()
        self.bell: Bell = bell_for(self.path)
        self._functions: set[str] = set()
        # Point reads and one-statement writes without a thread hop when SQLite can do
        # them at once, on one connection of the loop's thread, whose page cache keeps
        # what it wrote (recordstore.sqlite_quick); this process's own writes, which its
        # feeds need not validate again (recordstore.local_written).
        self._quick = Quick(self.path)
        self._read_at = -math.inf  # the last quick read
        self._slice_from = 0.0  # when the reads since the last pause or yield began
        self.written = Written()

    @classmethod
    async def open(cls, path: Path) -> LocalDb:
        """Open (creating if needed) the store file in data directory ``path``."""
        root = await anyio.to_thread.run_sync(_make_data_dir, path)
        db_path = root / DB_NAME
        writer = await _connect(db_path)
        try:
            await _prepare_schema(writer, db_path)
            for statement in _INDEXES:  # also for stores made before they existed
                await writer.execute(statement)
            reader = await _connect(db_path)
        except BaseException:
            await writer.close()
            raise
        return cls(root, writer, reader)

    async def aclose(self) -> None:
        # Shielded: an aiosqlite close() that is cancelled forgets its connection while
        # the worker thread still runs, so a second close returns at once, and the thread
        # later answers an event loop that has closed (a daemon stopped at once).
        with anyio.CancelScope(shield=True):
            self._quick.close()
            await self._writer.close()
            await self._reader.close()

    async def write(self, sql: str, params: Any) -> int:
        """Run one write statement (its own transaction); the number of rows it changed."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        # On the loop's thread while SQLite's write lock is free and the loop has time to
        # spare (recordstore.sqlite_quick); else through the worker thread, in turn. The
        # anyio lock is not taken here: SQLite's own lock orders this write against the
        # thread's (a write the thread is running makes this one busy, so it queues).
        changed = self._quick.write(sql, params)
        if changed is None:
            async with self.write_lock:
                return await self.write_locked(sql, params)
        if changed:
            self.bell.ring()
        return changed

    async def write_locked(self, sql: str, params: Any) -> int:
        """:meth:`write`, for a caller that holds :attr:`write_lock`."""
        try:
            cursor = await self._writer.execute(sql, params)
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: {e}") from e
        changed = cursor.rowcount
        if changed:
            self.bell.ring()
        return changed

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """The writer, inside one transaction: committed when the block ends, rolled back
        when it raises. The feeds are woken once it is committed."""
        async with self.write_lock:
            try:
                async with _immediate(self._writer):
                    yield self._writer
            except sqlite3.Error as e:
                raise StoreError(f"{self.path}: {e}") from e
            self.bell.ring()

    async def read(self, sql: str, params: Any) -> list[Any]:
        try:
            # fetchall runs the statement to its end, so no read snapshot lingers.
            return list(await self._reader.execute_fetchall(sql, params))
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: {e}") from e

    async def read_short(self, sql: str, params: Any) -> list[Any]:
        """:meth:`read` for a point read or a page along the primary key: on this thread
        when SQLite answers at once, else through the reader's thread.

        A cancellation point always; it lets the loop run other tasks only once quick
        reads have followed each other for :data:`READ_SLICE`. A yield each (a turn makes
        about four) cost a pass of the task through its whole await chain, ~3 µs each; a
        task that reads in a loop still gives the loop up at least every slice. The first
        read after a pause of a slice starts a new one and does not yield: a turn's first
        read (its conversation, on the claim's path) used to hand the loop to whatever was
        queued, the change feed's handling of the message just written among them. So a
        task that computes for more than a slice between two quick reads does not yield at
        them; none here does (a listing parses a page, ~0.3 ms, between its reads).
        """
        rows = self._quick.read(sql, params)
        if rows is None:
            return await self.read(sql, params)
        now = time.perf_counter()
        if now - self._read_at > READ_SLICE:
            self._slice_from = now
        self._read_at = now
        if now - self._slice_from >= READ_SLICE:
            self._slice_from = now
            await anyio.lowlevel.checkpoint()
        else:
            await anyio.lowlevel.checkpoint_if_cancelled()
        return rows

    async def reader_function(self, name: str, fn: Callable[[Any], Any]) -> None:
        """Make the one-argument SQL function ``name`` available to reads (once)."""
        if name not in self._functions:
            await self._reader.create_function(name, 1, fn, deterministic=True)
            self._functions.add(name)


@asynccontextmanager
async def _immediate(db: aiosqlite.Connection) -> AsyncIterator[None]:
    # BEGIN IMMEDIATE takes the write lock at once, so two processes never both
    # read-then-write.
    await db.execute("BEGIN IMMEDIATE")
    try:
        yield
        await db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            await db.execute("ROLLBACK")
        raise


def _make_data_dir(path: Path) -> Path:
    root = path.expanduser().resolve()
    if root.exists() and not root.is_dir():
        raise StoreError(f"{root}: not a turnd store (a file, where a data directory belongs)")
    try:
        private_dir(root)
        private_dir(root / "blobs")
    except OSError as e:
        raise StoreError(f"{root}: cannot create the data directory ({e.strerror})") from None
    if (root / DB_NAME).exists() and not (root / DB_NAME).is_file():
        raise StoreError(f"{root / DB_NAME}: not a turnd store (not a file)")
    try:
        private_file(root / DB_NAME)
    except OSError as e:
        raise StoreError(f"{root / DB_NAME}: cannot create ({e.strerror})") from None
    return root


async def _connect(db_path: Path) -> aiosqlite.Connection:
    try:
        # isolation_level=None: every statement is its own transaction, no implicit BEGIN.
        db = await aiosqlite.connect(db_path, isolation_level=None)
    except sqlite3.Error as e:
        raise StoreError(f"{db_path}: cannot open ({e})") from None
    try:
        await db.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        # In WAL mode NORMAL survives a killed process; only power loss may drop
        # the last commits.
        await db.execute("PRAGMA synchronous = NORMAL")
        await db.execute(CACHE)
    except sqlite3.Error as e:
        await db.close()
        raise StoreError(f"{db_path}: not a turnd store ({e})") from None
    return db


async def _prepare_schema(db: aiosqlite.Connection, db_path: Path) -> None:
    try:
        await _check_owner(db, db_path)
        await db.execute("PRAGMA journal_mode = WAL")
        if await _pragma(db, "application_id") == _APPLICATION_ID:
            return
        # Two processes opening a new store create it once.
        async with _immediate(db):
            if await _check_owner(db, db_path) != _APPLICATION_ID:
                for statement in _SCHEMA:
                    await db.execute(statement)
                await db.execute(f"PRAGMA application_id = {_APPLICATION_ID}")
                await db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
    except sqlite3.Error as e:
        raise StoreError(f"{db_path}: not a turnd store ({e})") from None


async def _check_owner(db: aiosqlite.Connection, db_path: Path) -> int:
    """The file's application id; StoreError unless it is ours or a blank database."""
    app_id = await _pragma(db, "application_id")
    if app_id == _APPLICATION_ID:
        version = await _pragma(db, "user_version")
        if version > _SCHEMA_VERSION:
            raise StoreError(f"{db_path}: made by a newer turnd (schema {version})")
        return app_id
    rows = await db.execute_fetchall("SELECT count(*) FROM sqlite_master")
    if app_id != 0 or list(rows)[0][0] != 0:
        raise StoreError(f"{db_path}: not a turnd store (an SQLite database of something else)")
    return app_id


async def _pragma(db: aiosqlite.Connection, name: str) -> int:
    rows = list(await db.execute_fetchall(f"PRAGMA {name}"))
    return int(rows[0][0])
