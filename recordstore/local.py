"""The embedded record store: SQLite (WAL) in a data directory, blobs as files.

Layout of a data directory::

    store.sqlite3   spaces, records, the op log (the change feed), blob index
    blobs/<cid>     blob bytes, named by their CID

Several processes may open the same directory. ``create_record`` is one INSERT
against the primary key, so the create-only claim holds between processes. The file
and its schema are :mod:`recordstore.local_db`; pages of records
:mod:`recordstore.local_listing`; blobs :mod:`recordstore.local_blobs`; the change feed
(the op log) :mod:`recordstore.local_feed`.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator, Coroutine, Generator, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from recordstore import Change, Record, RecordStore, Write
from recordstore.abilities import NewestQuery, RepoPage
from recordstore.errors import InvalidSwap, RecordExists, RecordNotFound
from recordstore.keys import (
    validate_address,
    validate_collection,
    validate_did,
    validate_limit,
    validate_space_key,
)
from recordstore.local_blobs import LocalBlobs
from recordstore.local_db import COLLECTION_IS, DB_NAME, RECORD_COLS, LocalDb
from recordstore.local_feed import change_head, changes, keys_changed, parse_cursor
from recordstore.local_listing import (
    newest,
    record_of,
    repo_page,
    space_cids,
    space_page,
    space_records,
)
from recordstore.times import now_iso
from recordstore.write import MAX_BLOB_BYTES, MAX_RECORD_BYTES, PreparedWrite, prepare_write

__all__ = ["DB_NAME", "LocalStore", "MAX_BLOB_BYTES", "MAX_RECORD_BYTES"]

_WHERE_KEY = f"did = ? AND space = ? AND {COLLECTION_IS} AND key = ?"
_INSERT = f"INSERT INTO records ({RECORD_COLS}) VALUES (?, ?, ?, ?, ?, ?)"
_SPACE_EXISTS = "SELECT 1 FROM spaces WHERE did = ? AND skey = ?"


class LocalStore(RecordStore):
    """The SQLite record store. Open with ``await LocalStore.open(path)``.

    ``async with LocalStore.open(path) as store:`` opens and closes it.
    """

    def __init__(self, db: LocalDb, poll_interval: float) -> None:
        self.root = db.root
        self.db_path = db.path
        self._db = db
        self._blobs = LocalBlobs(db)
        self._poll_interval = poll_interval

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, poll_interval: float = 0.2) -> _Opening:
        """Open (creating if needed) the store in data directory ``path``.

        ``poll_interval`` bounds how late the change feed sees other processes'
        writes; writes made in this process wake it at once.
        """
        return _Opening(cls._open(Path(path), poll_interval))

    @classmethod
    async def _open(cls, path: Path, poll_interval: float) -> LocalStore:
        return cls(await LocalDb.open(path), poll_interval)

    async def aclose(self) -> None:
        await self._db.aclose()

    # --- spaces and records ---------------------------------------------------

    async def create_space(self, did: str, space_type: str, skey: str) -> None:
        validate_did(did)
        validate_collection(space_type)
        validate_space_key(skey)
        # Most calls are for a space that exists (every XRPC write makes its space, as an
        # /api write does): a read on the loop's thread, not a write through the writer's,
        # which would hold the write lock a claim's placeholder is waiting for.
        if await self._db.read_short(_SPACE_EXISTS, (did, skey)):
            return
        await self._db.write(
            "INSERT INTO spaces (did, skey, type, created_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            (did, skey, space_type, now_iso()),
        )

    async def get_record(self, did: str, space: str, collection: str, key: str) -> Record | None:
        validate_address(did, space, collection, key)
        rows = await self._db.read_short(
            f"SELECT {RECORD_COLS} FROM records WHERE {_WHERE_KEY}", (did, space, collection, key)
        )
        return record_of(rows[0]) if rows else None

    async def _list_records(
        self, did: str, space: str, collection: str, cursor: str | None, limit: int, reverse: bool
    ) -> tuple[list[Record], str | None]:
        return await space_page(self._db, did, space, collection, cursor, limit, reverse)

    async def change_cursor(self) -> str:
        """recordstore.abilities.SpaceChanges: the newest op's id."""
        return str(await change_head(self._db))

    async def keys_changed(
        self, did: str, space: str, collection: str, after: str, limit: int
    ) -> tuple[set[str], str] | None:
        """recordstore.abilities.SpaceChanges: keys written since op ``after``."""
        validate_did(did)
        validate_space_key(space)
        validate_collection(collection)
        return await keys_changed(self._db, did, space, collection, parse_cursor(after), limit)

    async def space_cids(self, did: str, space: str, collection: str) -> list[tuple[str, str]]:
        """recordstore.abilities.SpaceChanges: keys and CIDs, in key order."""
        validate_did(did)
        validate_space_key(space)
        validate_collection(collection)
        return await space_cids(self._db, did, space, collection)

    async def space_records(
        self, did: str, space: str, collection: str, keys: Sequence[str]
    ) -> list[tuple[Record, int]]:
        """recordstore.abilities.SpaceChanges: the records at ``keys``, with their JSON's length."""
        for key in keys:
            validate_address(did, space, collection, key)
        return await space_records(self._db, did, space, collection, keys)

    async def list_repo_records(self, did: str, page: RepoPage) -> tuple[list[Record], str | None]:
        """recordstore.abilities.RepoLister: a page of the repo in classic-repo rkey order."""
        validate_did(did)
        validate_collection(page.collection)
        validate_limit(page.limit)
        return await repo_page(self._db, did, page)

    async def newest(self, did: str, query: NewestQuery) -> list[tuple[str | None, ...]]:
        """recordstore.abilities.NewestFirst: one query, sorted and cut in SQLite."""
        validate_did(did)
        validate_space_key(query.space)
        validate_collection(query.collection)
        return await newest(self._db, did, query)

    async def collections(self, did: str) -> list[str]:
        """The collections ``did`` has records in, sorted."""
        validate_did(did)
        rows = await self._db.read(
            "SELECT DISTINCT collection FROM records WHERE did = ? ORDER BY collection", (did,)
        )
        return [r[0] for r in rows]

    async def create_record(
        self, did: str, space: str, collection: str, key: str, value: dict[str, Any]
    ) -> Record:
        validate_address(did, space, collection, key)
        w = await self.prepare(did, collection, value)
        try:
            await self._db.write(_INSERT, (did, space, collection, key, w.cid, w.text))
        except sqlite3.IntegrityError:
            raise RecordExists(f"{collection}/{space}:{key} already exists") from None
        self._db.written.add(did, space, collection, key, w.cid, w.text)
        return Record(did, space, collection, key, w.cid, w.value)

    async def _put_record(
        self, did: str, space: str, collection: str, key: str, value: dict[str, Any],
        swap: str | None,
    ) -> Record:
        w = await self.prepare(did, collection, value)
        cid, text, value = w.cid, w.text, w.value
        if swap is None:
            await self._db.write(
                f"{_INSERT} ON CONFLICT (did, space, collection, key) DO UPDATE"
                " SET cid = excluded.cid, value = excluded.value"
                " WHERE cid IS NOT excluded.cid",
                (did, space, collection, key, cid, text),
            )
        else:
            changed = await self._db.write(
                f"UPDATE records SET cid = ?, value = ? WHERE {_WHERE_KEY} AND cid = ?",
                (cid, text, did, space, collection, key, swap),
            )
            if not changed:
                raise InvalidSwap(f"{collection}/{space}:{key} is not at {swap}")
        self._db.written.add(did, space, collection, key, cid, text)
        return Record(did, space, collection, key, cid, value)

    async def apply_writes(self, did: str, writes: Sequence[Write]) -> list[Record | None]:
        """Several writes as one transaction: all of them happen, or none.

        Creates are create-only (RecordExists); updates and deletes need the record to be
        there (RecordNotFound). The result holds each write's record (None: a delete).
        """
        prepared: list[tuple[Write, PreparedWrite | None]] = []
        for w in writes:
            validate_address(did, w.space, w.collection, w.key)
            p = None if w.op == "delete" else await self.prepare(did, w.collection, w.value or {})
            prepared.append((w, p))
        async with self._db.transaction() as db:
            for w, p in prepared:
                address = (did, w.space, w.collection, w.key)
                if p is None:
                    cursor = await db.execute(f"DELETE FROM records WHERE {_WHERE_KEY}", address)
                elif w.op == "create":
                    try:
                        cursor = await db.execute(_INSERT, (*address, p.cid, p.text))
                    except sqlite3.IntegrityError:
                        raise RecordExists(
                            f"{w.collection}/{w.space}:{w.key} already exists"
                        ) from None
                else:
                    cursor = await db.execute(
                        f"UPDATE records SET cid = ?, value = ? WHERE {_WHERE_KEY}",
                        (p.cid, p.text, *address),
                    )
                if not cursor.rowcount:
                    raise RecordNotFound(
                        f"Could not {w.op} {w.collection}/{w.space}:{w.key}: no such record"
                    )
        for w, p in prepared:
            if p is not None:
                self._db.written.add(did, w.space, w.collection, w.key, p.cid, p.text)
        return [
            None if p is None else Record(did, w.space, w.collection, w.key, p.cid, p.value)
            for w, p in prepared
        ]

    async def delete_record(
        self, did: str, space: str, collection: str, key: str, *, swap_cid: str | None = None
    ) -> None:
        validate_address(did, space, collection, key)
        params: tuple[Any, ...] = (did, space, collection, key)
        if swap_cid is None:
            await self._db.write(f"DELETE FROM records WHERE {_WHERE_KEY}", params)
            return
        async with self._db.write_lock:
            sql = f"DELETE FROM records WHERE {_WHERE_KEY} AND cid = ?"
            if await self._db.write_locked(sql, (*params, swap_cid)):
                return
            # As on a PDS: deleting an absent record is a no-op, even with a swap.
            if await self._db.read(f"SELECT 1 FROM records WHERE {_WHERE_KEY}", params):
                raise InvalidSwap(f"{collection}/{space}:{key} is not at {swap_cid}")

    async def prepare(self, did: str, collection: str, value: dict[str, Any]) -> PreparedWrite:
        """:func:`~recordstore.write.prepare_write` against ``did``'s blobs."""
        return await prepare_write(collection, value, blobs=lambda cid: self._blobs.info(did, cid))

    # --- blobs (recordstore.local_blobs) ------------------------------------------

    async def upload_blob(self, did: str, data: bytes, mime_type: str) -> dict[str, Any]:
        """Store a blob; its type is the one its bytes show, else ``mime_type`` (as a PDS)."""
        return await self._blobs.upload(did, data, mime_type)

    async def blob_usage(self, did: str) -> int:
        """Bytes of ``did``'s blobs, for ``[accounts.X] maxStorageBytes`` (SPEC §12)."""
        return await self._blobs.usage(did)

    async def blob_info(self, did: str, cid: str) -> tuple[str, int] | None:
        """``(mime type, size)`` of ``did``'s blob ``cid``, or None."""
        validate_did(did)
        return await self._blobs.info(did, cid)

    async def get_blob(self, did: str, cid: str) -> bytes:
        return await self._blobs.get(did, cid)

    async def blob_in_use(self, did: str, cid: str) -> bool:
        """recordstore.abilities.BlobCollector: a record of ``did`` naming ``cid``."""
        return await self._blobs.in_use(did, cid)

    async def delete_blob(self, did: str, cid: str) -> None:
        await self._blobs.delete(did, cid)

    # --- the change feed (recordstore.local_feed) ----------------------------------

    def changes(self, cursor: str | None = None) -> AbstractAsyncContextManager[AsyncIterator[Change]]:
        return changes(self._db, cursor, self._poll_interval)


class _Opening:
    """What ``LocalStore.open`` returns: awaitable, or an async context manager."""

    def __init__(self, coro: Coroutine[Any, Any, LocalStore]) -> None:
        self._coro = coro
        self._store: LocalStore | None = None

    def __await__(self) -> Generator[Any, None, LocalStore]:
        return self._coro.__await__()

    async def __aenter__(self) -> LocalStore:
        self._store = await self._coro
        return self._store

    async def __aexit__(self, *exc: object) -> None:
        assert self._store is not None
        await self._store.__aexit__(*exc)

