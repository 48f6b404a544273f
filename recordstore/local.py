"""The embedded record store: SQLite (WAL) in a data directory, blobs as files.

Layout of a data directory::

    store.sqlite3   spaces, records, the op log (the change feed), blob index
    blobs/<cid>     blob bytes, named by their CID

Several processes may open the same directory. ``create_record`` is one INSERT
against the primary key, so the create-only claim holds between processes. The op
log is written by triggers on ``records``: a record and its op-log row are one
statement, hence one transaction, and one round trip to SQLite's thread.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import tempfile
import threading
from collections.abc import AsyncIterator, Generator, Sequence
from contextlib import aclosing, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiosqlite
import anyio

from recordstore import (
    CONVERSATION_REF,
    BlobNotFound,
    Change,
    InvalidRecord,
    InvalidSwap,
    Record,
    RecordExists,
    RecordNotFound,
    RecordStore,
    StoreError,
    Write,
)
from recordstore.cid import blob_cid
from recordstore.files import private_dir, private_file
from recordstore.keys import (
    repo_rkey,
    validate_collection,
    validate_did,
    validate_key,
    validate_space_key,
)
from recordstore.lexicon import validate_record
from recordstore.mime import blob_mime
from recordstore.write import MAX_BLOB_BYTES, MAX_RECORD_BYTES, PreparedWrite, prepare_write

__all__ = ["DB_NAME", "LocalStore", "MAX_BLOB_BYTES", "MAX_RECORD_BYTES"]

DB_NAME = "store.sqlite3"
_APPLICATION_ID = 0x7475726E  # "turn": SQLite's header field for "which app owns this file"
_SCHEMA_VERSION = 1
_BUSY_TIMEOUT_MS = 10_000
_FEED_BATCH = 256
_CID_RE = re.compile(r"^b[a-z2-7]{20,}$")

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
_NEWEST_INDEXES = {(CONVERSATION_REF, "updatedAt"): "records_conversation_ref_updated"}
_INDEXES = [
    f"CREATE INDEX IF NOT EXISTS {name} ON records"
    f" (did, space, json_extract(value, '$.{field}'), key) WHERE collection = '{collection}'"
    for (collection, field), name in _NEWEST_INDEXES.items()
]

_RECORD_COLS = "did, space, collection, key, cid, value"
_OP_COLS = "id, did, space, collection, key, op, cid, value"


class LocalStore(RecordStore):
    """The SQLite record store. Open with ``await LocalStore.open(path)``.

    ``async with LocalStore.open(path) as store:`` opens and closes it.
    """

    def __init__(
        self,
        root: Path,
        writer: aiosqlite.Connection,
        reader: aiosqlite.Connection,
        poll_interval: float,
    ) -> None:
        self.root = root
        self.db_path = root / DB_NAME
        self._blobs = root / "blobs"
        self._writer = writer
        # Reads go through their own connection so they never queue behind a write.
        self._reader = reader
        self._write_lock = anyio.Lock()
        self._poll_interval = poll_interval
        self._bell = _bell_for(self.db_path)
        self._casefold_ready = False

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, poll_interval: float = 0.2) -> _Opening:
        """Open (creating if needed) the store in data directory ``path``.

        ``poll_interval`` bounds how late the change feed sees other processes'
        writes; writes made in this process wake it at once.
        """
        return _Opening(cls._open(Path(path), poll_interval))

    @classmethod
    async def _open(cls, path: Path, poll_interval: float) -> LocalStore:
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
        return cls(root, writer, reader, poll_interval)

    async def aclose(self) -> None:
        await self._writer.close()
        await self._reader.close()

    # --- spaces and records ---------------------------------------------------

    async def create_space(self, did: str, space_type: str, skey: str) -> None:
        validate_did(did)
        validate_collection(space_type)
        validate_space_key(skey)
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        await self._write(
            "INSERT INTO spaces (did, skey, type, created_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            (did, skey, space_type, now),
        )

    async def get_record(self, did: str, space: str, collection: str, key: str) -> Record | None:
        _check_address(did, space, collection, key)
        rows = await self._read(
            f"SELECT {_RECORD_COLS} FROM records"
            " WHERE did = ? AND space = ? AND collection = ? AND key = ?",
            (did, space, collection, key),
        )
        return _record(rows[0]) if rows else None

    async def list_records(
        self,
        did: str,
        space: str,
        collection: str,
        *,
        cursor: str | None = None,
        limit: int = 100,
        reverse: bool = False,
    ) -> tuple[list[Record], str | None]:
        validate_did(did)
        validate_space_key(space)
        validate_collection(collection)
        if cursor is not None:
            validate_key(cursor, "cursor")
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        after, order = ("<", "DESC") if reverse else (">", "ASC")
        sql = f"SELECT {_RECORD_COLS} FROM records WHERE did = ? AND space = ? AND collection = ?"
        params: list[Any] = [did, space, collection]
        if cursor is not None:
            sql += f" AND key {after} ?"
            params.append(cursor)
        # One row more than asked tells whether there is a next page.
        sql += f" ORDER BY key {order} LIMIT ?"
        params.append(limit + 1)
        rows = await self._read(sql, params)
        records = [_record(r) for r in rows[:limit]]
        return records, (records[-1].key if len(rows) > limit else None)

    async def list_repo_records(
        self,
        did: str,
        collection: str,
        *,
        cursor: str | None = None,
        limit: int = 100,
        reverse: bool = False,
    ) -> tuple[list[Record], str | None]:
        """One collection across every space, in classic-repo rkey order (``<space>:<key>``).

        PDS semantics, for XRPC ``listRecords``: descending unless ``reverse``; the
        cursor is an rkey and the next cursor the last rkey of the page.
        """
        validate_did(did)
        validate_collection(collection)
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        after, order = (">", "ASC") if reverse else ("<", "DESC")
        rkey = "(space || ':' || key)"
        sql = f"SELECT {_RECORD_COLS} FROM records WHERE did = ? AND collection = ?"
        params: list[Any] = [did, collection]
        if cursor is not None:
            sql += f" AND {rkey} {after} ?"
            params.append(cursor)
        sql += f" ORDER BY {rkey} {order} LIMIT ?"
        params.append(limit + 1)
        rows = await self._read(sql, params)
        records = [_record(r) for r in rows[:limit]]
        more = repo_rkey(records[-1].space, records[-1].key) if len(rows) > limit else None
        return records, more

    async def create_record(
        self, did: str, space: str, collection: str, key: str, value: dict[str, Any]
    ) -> Record:
        _check_address(did, space, collection, key)
        w = await self.prepare(did, collection, value)
        try:
            await self._write(
                f"INSERT INTO records ({_RECORD_COLS}) VALUES (?, ?, ?, ?, ?, ?)",
                (did, space, collection, key, w.cid, w.text),
            )
        except sqlite3.IntegrityError:
            raise RecordExists(f"{collection}/{space}:{key} already exists") from None
        return Record(did, space, collection, key, w.cid, w.value)

    async def put_record(
        self,
        did: str,
        space: str,
        collection: str,
        key: str,
        value: dict[str, Any],
        *,
        swap_cid: str | None = None,
    ) -> Record:
        _check_address(did, space, collection, key)
        w = await self.prepare(did, collection, value)
        cid, text, value = w.cid, w.text, w.value
        if swap_cid is None:
            await self._write(
                f"INSERT INTO records ({_RECORD_COLS}) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (did, space, collection, key) DO UPDATE"
                " SET cid = excluded.cid, value = excluded.value"
                " WHERE cid IS NOT excluded.cid",
                (did, space, collection, key, cid, text),
            )
        else:
            changed = await self._write(
                "UPDATE records SET cid = ?, value = ?"
                " WHERE did = ? AND space = ? AND collection = ? AND key = ? AND cid = ?",
                (cid, text, did, space, collection, key, swap_cid),
            )
            if not changed:
                raise InvalidSwap(f"{collection}/{space}:{key} is not at {swap_cid}")
        return Record(did, space, collection, key, cid, value)

    async def apply_writes(self, did: str, writes: Sequence[Write]) -> list[Record | None]:
        """Several writes as one transaction: all of them happen, or none.

        Creates are create-only (RecordExists); updates and deletes need the record to be
        there (RecordNotFound). The result holds each write's record (None: a delete).
        """
        prepared: list[tuple[Write, PreparedWrite | None]] = []
        for w in writes:
            _check_address(did, w.space, w.collection, w.key)
            p = None if w.op == "delete" else await self.prepare(did, w.collection, w.value or {})
            prepared.append((w, p))
        where = "did = ? AND space = ? AND collection = ? AND key = ?"
        async with self._write_lock:
            db = self._writer
            try:
                await db.execute("BEGIN IMMEDIATE")
                try:
                    for w, p in prepared:
                        address = (did, w.space, w.collection, w.key)
                        if p is None:
                            cursor = await db.execute(f"DELETE FROM records WHERE {where}", address)
                        elif w.op == "create":
                            try:
                                cursor = await db.execute(
                                    f"INSERT INTO records ({_RECORD_COLS})"
                                    " VALUES (?, ?, ?, ?, ?, ?)",
                                    (*address, p.cid, p.text),
                                )
                            except sqlite3.IntegrityError:
                                raise RecordExists(
                                    f"{w.collection}/{w.space}:{w.key} already exists"
                                ) from None
                        else:
                            cursor = await db.execute(
                                f"UPDATE records SET cid = ?, value = ? WHERE {where}",
                                (p.cid, p.text, *address),
                            )
                        if not cursor.rowcount:
                            raise RecordNotFound(
                                f"Could not {w.op} {w.collection}/{w.space}:{w.key}: no such record"
                            )
                    await db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        await db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as e:
                raise StoreError(f"{self.db_path}: {e}") from e
            self._bell.ring()
        return [
            None if p is None else Record(did, w.space, w.collection, w.key, p.cid, p.value)
            for w, p in prepared
        ]

    async def collections(self, did: str) -> list[str]:
        """The collections ``did`` has records in, sorted."""
        validate_did(did)
        rows = await self._read(
            "SELECT DISTINCT collection FROM records WHERE did = ? ORDER BY collection", (did,)
        )
        return [r[0] for r in rows]

    async def delete_record(
        self, did: str, space: str, collection: str, key: str, *, swap_cid: str | None = None
    ) -> None:
        _check_address(did, space, collection, key)
        where = "did = ? AND space = ? AND collection = ? AND key = ?"
        params: tuple[Any, ...] = (did, space, collection, key)
        if swap_cid is None:
            await self._write(f"DELETE FROM records WHERE {where}", params)
            return
        async with self._write_lock:
            sql = f"DELETE FROM records WHERE {where} AND cid = ?"
            if await self._write_locked(sql, (*params, swap_cid)):
                return
            # As on a PDS: deleting an absent record is a no-op, even with a swap.
            if await self._read(f"SELECT 1 FROM records WHERE {where}", params):
                raise InvalidSwap(f"{collection}/{space}:{key} is not at {swap_cid}")

    async def prepare(self, did: str, collection: str, value: dict[str, Any]) -> PreparedWrite:
        """:func:`~recordstore.write.prepare_write` against ``did``'s blobs."""
        return await prepare_write(collection, value, blobs=lambda cid: self._blob_info(did, cid))

    async def _blob_info(self, did: str, cid: str) -> tuple[str, int] | None:
        rows = await self._read(
            "SELECT mime_type, size FROM blobs WHERE did = ? AND cid = ?", (did, cid)
        )
        return (rows[0][0], rows[0][1]) if rows else None

    # --- blobs ------------------------------------------------------------------

    async def upload_blob(self, did: str, data: bytes, mime_type: str) -> dict[str, Any]:
        """Store a blob; its type is the one its bytes show, else ``mime_type`` (as a PDS)."""
        validate_did(did)
        if len(data) > MAX_BLOB_BYTES:
            raise StoreError(f"blob of {len(data)} bytes exceeds {MAX_BLOB_BYTES}")
        mime_type = blob_mime(data, mime_type if isinstance(mime_type, str) else None)
        cid = blob_cid(data)
        await anyio.to_thread.run_sync(_write_file, self._blobs / cid, bytes(data))
        # The latest upload's type wins, so the ref answered is always what is stored
        # (the same bytes only differ in type when they have no signature).
        await self._write(
            "INSERT INTO blobs (did, cid, mime_type, size) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (did, cid) DO UPDATE SET mime_type = excluded.mime_type"
            " WHERE mime_type IS NOT excluded.mime_type",
            (did, cid, mime_type, len(data)),
        )
        return {"$type": "blob", "ref": {"$link": cid}, "mimeType": mime_type, "size": len(data)}

    async def blob_usage(self, did: str) -> int:
        """Bytes of ``did``'s blobs, for ``[accounts.X] maxStorageBytes`` (SPEC §12)."""
        validate_did(did)
        rows = await self._read("SELECT COALESCE(SUM(size), 0) FROM blobs WHERE did = ?", (did,))
        return int(rows[0][0])

    async def blob_info(self, did: str, cid: str) -> tuple[str, int] | None:
        """``(mime type, size)`` of ``did``'s blob ``cid``, or None."""
        validate_did(did)
        return await self._blob_info(did, cid)

    async def get_blob(self, did: str, cid: str) -> bytes:
        validate_did(did)
        # The CID becomes a file name: only base32 CIDs, never a path.
        if not isinstance(cid, str) or _CID_RE.match(cid) is None:
            raise BlobNotFound(f"no blob {cid!r}")
        if not await self._read("SELECT 1 FROM blobs WHERE did = ? AND cid = ?", (did, cid)):
            raise BlobNotFound(f"no blob {cid} for {did}")
        try:
            return await anyio.Path(self._blobs / cid).read_bytes()
        except FileNotFoundError:
            raise BlobNotFound(f"blob {cid} is indexed but its file is missing") from None

    async def blob_in_use(self, did: str, cid: str) -> bool:
        """recordstore.abilities.BlobCollector: a record of ``did`` naming ``cid``."""
        validate_did(did)
        rows = await self._read(
            "SELECT 1 FROM records WHERE did = ? AND instr(value, ?) > 0 LIMIT 1",
            (did, f'"$link":"{cid}"'),
        )
        return bool(rows)

    async def delete_blob(self, did: str, cid: str) -> None:
        validate_did(did)
        if not isinstance(cid, str) or _CID_RE.match(cid) is None:
            raise BlobNotFound(f"no blob {cid!r}")
        await self._write("DELETE FROM blobs WHERE did = ? AND cid = ?", (did, cid))
        if not await self._read("SELECT 1 FROM blobs WHERE cid = ? LIMIT 1", (cid,)):
            await anyio.to_thread.run_sync(_unlink, self._blobs / cid)

    async def newest(
        self,
        did: str,
        space: str,
        collection: str,
        fields: Sequence[str],
        *,
        order: str,
        limit: int,
        before: tuple[str, str] | None = None,
        match: tuple[str, str] | None = None,
    ) -> list[tuple[str | None, ...]]:
        """recordstore.abilities.NewestFirst: one query, sorted and cut in SQLite."""
        validate_did(did)
        validate_space_key(space)
        validate_collection(collection)
        for name in (*fields, order, *(match[:1] if match else ())):
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", name):
                raise ValueError(f"not a top-level field name: {name!r}")
        columns = "".join(f", json_extract(value, '$.{name}')" for name in fields)
        if (collection, order) in _NEWEST_INDEXES:
            # Word for word the index's expression and condition, so SQLite walks the
            # index and stops after `limit` rows instead of sorting the collection.
            ordering = f"json_extract(value, '$.{order}')"
            sql = (
                f"SELECT key{columns} FROM records WHERE did = ? AND space = ?"
                f" AND collection = '{collection}'"
            )
            params: list[Any] = [did, space]
        else:
            ordering = f"coalesce(json_extract(value, '$.{order}'), '')"
            sql = f"SELECT key{columns} FROM records WHERE did = ? AND space = ? AND collection = ?"
            params = [did, space, collection]
        if before is not None:
            sql += f" AND ({ordering}, key) < (?, ?)"
            params += list(before)
        if match is not None:
            await self._casefold()
            sql += f" AND instr(turnd_casefold(json_extract(value, '$.{match[0]}')), ?) > 0"
            params.append(match[1].casefold())
        sql += f" ORDER BY {ordering} DESC, key DESC LIMIT ?"
        params.append(limit)
        rows = await self._read(sql, params)
        return [tuple(v if isinstance(v, str) else None for v in row) for row in rows]

    async def _casefold(self) -> None:
        if not self._casefold_ready:
            # Python's casefold, so a search matches "É" with "é" as the page shows them.
            await self._reader.create_function(
                "turnd_casefold", 1, _casefold, deterministic=True
            )
            self._casefold_ready = True

    # --- the change feed ----------------------------------------------------------

    @asynccontextmanager
    async def changes(self, cursor: str | None = None) -> AsyncIterator[AsyncIterator[Change]]:
        after = _parse_cursor(cursor)
        head = await self._head()
        if after > head:
            raise StoreError(f"cursor {after} is ahead of the store's last op {head}")
        async with aclosing(self._follow(after, head)) as feed:
            yield feed

    async def _follow(self, after: int, head: int) -> AsyncIterator[Change]:
        """The op log from just after ``after``; ops past ``head`` are live."""
        while True:
            # Arm before reading, so a write landing between the read and the
            # wait still wakes us.
            waiter = self._bell.arm()
            try:
                rows = await self._read(
                    f"SELECT {_OP_COLS} FROM ops WHERE id > ? ORDER BY id LIMIT {_FEED_BATCH}",
                    (after,),
                )
                if not rows:
                    with anyio.move_on_after(self._poll_interval):
                        await waiter.wait()
            finally:
                self._bell.disarm(waiter)
            for row in rows:
                after = row[0]
                yield _change(row, live=after > head)

    async def _head(self) -> int:
        rows = await self._read("SELECT seq FROM sqlite_sequence WHERE name = 'ops'", ())
        return rows[0][0] if rows else 0

    # --- SQLite -----------------------------------------------------------------

    async def _write(self, sql: str, params: Any) -> int:
        """Run one write statement (its own transaction); the number of rows it changed."""
        async with self._write_lock:
            return await self._write_locked(sql, params)

    async def _write_locked(self, sql: str, params: Any) -> int:
        try:
            cursor = await self._writer.execute(sql, params)
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as e:
            raise StoreError(f"{self.db_path}: {e}") from e
        changed = cursor.rowcount
        if changed:
            self._bell.ring()
        return changed

    async def _read(self, sql: str, params: Any) -> list[Any]:
        try:
            # fetchall runs the statement to its end, so no read snapshot lingers.
            return list(await self._reader.execute_fetchall(sql, params))
        except sqlite3.Error as e:
            raise StoreError(f"{self.db_path}: {e}") from e


class _Opening:
    """What ``LocalStore.open`` returns: awaitable, or an async context manager."""

    def __init__(self, coro: Any) -> None:
        self._coro = coro
        self._store: LocalStore | None = None

    def __await__(self) -> Generator[Any, None, LocalStore]:
        return self._coro.__await__()

    async def __aenter__(self) -> LocalStore:
        self._store = await self._coro
        return self._store

    async def __aexit__(self, *exc: object) -> None:
        assert self._store is not None
        await self._store.aclose()


# --- helpers ------------------------------------------------------------------


def _check_address(did: str, space: str, collection: str, key: str) -> None:
    validate_did(did)
    validate_space_key(space)
    validate_collection(collection)
    validate_key(key)


def _record(row: Any) -> Record:
    did, space, collection, key, cid, value = row
    return Record(did, space, collection, key, cid, json.loads(value))


def _change(row: Any, *, live: bool) -> Change:
    op_id, did, space, collection, key, op, cid, text = row
    record: dict[str, Any] | None = None
    error: str | None = None
    if op != "delete":
        # Rows may have been written by another version or straight into the file:
        # validate on the way out too.
        try:
            record = json.loads(text)
            validate_record(collection, record)
        except InvalidRecord as e:
            error = str(e)
        except (TypeError, ValueError) as e:
            error = f"stored record is not JSON: {e}"
    return Change(did, space, collection, key, op, cid, record, error, str(op_id), live)


def _parse_cursor(cursor: str | None) -> int:
    if cursor is None:
        return 0
    try:
        value = int(cursor)
    except (TypeError, ValueError):
        raise StoreError(f"invalid change-feed cursor {cursor!r}") from None
    if value < 0:
        raise StoreError(f"invalid change-feed cursor {cursor!r}")
    return value


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


def _casefold(value: Any) -> str | None:
    return value.casefold() if isinstance(value, str) else None


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _write_file(path: Path, data: bytes) -> None:
    if path.exists():  # content-addressed: the same name holds the same bytes
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


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
        # BEGIN IMMEDIATE: two processes opening a new store create it once.
        await db.execute("BEGIN IMMEDIATE")
        try:
            if await _check_owner(db, db_path) != _APPLICATION_ID:
                for statement in _SCHEMA:
                    await db.execute(statement)
                await db.execute(f"PRAGMA application_id = {_APPLICATION_ID}")
                await db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
            await db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                await db.execute("ROLLBACK")
            raise
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


# --- in-process wake-ups --------------------------------------------------------


class _Bell:
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


_bells: dict[Path, _Bell] = {}
_bells_lock = threading.Lock()


def _bell_for(db_path: Path) -> _Bell:
    with _bells_lock:
        return _bells.setdefault(db_path, _Bell())
