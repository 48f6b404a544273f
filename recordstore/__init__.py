"""The PDS-shaped record store turnd stands on.

Everything above this package talks to a :class:`RecordStore`; the backends are
the embedded SQLite store (:mod:`recordstore.local`) and an account on a real PDS
(:mod:`recordstore.pds`). Records are addressed by ``(did, space, collection, key)``
where ``space`` is the space key (a conversation's TID, or ``self`` for the
settings space) and ``key`` is the key *within* that space. Only the classic-repo
layout (:func:`recordstore.keys.repo_rkey`) joins the two, at the storage boundary.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from recordstore.errors import (
    BlobNotFound,
    InvalidKey,
    InvalidRecord,
    InvalidSwap,
    RecordExists,
    RecordNotFound,
    StoreError,
)
from recordstore.keys import (
    validate_address,
    validate_collection,
    validate_did,
    validate_key,
    validate_limit,
    validate_space_key,
)

# The lexicon names, passed on from the one vocabulary module (whose __all__ lists them).
from recordstore.vocabulary import *  # noqa: F403
from recordstore.vocabulary import __all__ as _VOCABULARY

__all__ = [
    "BlobNotFound",
    "Change",
    "InvalidKey",
    "InvalidRecord",
    "InvalidSwap",
    "Op",
    "Record",
    "RecordExists",
    "RecordNotFound",
    "RecordStore",
    "StoreError",
    "Write",
    *_VOCABULARY,
]


Op = Literal["create", "update", "delete"]


@dataclass(frozen=True, slots=True)
class Record:
    did: str
    space: str
    collection: str
    key: str
    cid: str
    value: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Write:
    """One write of a batch (``apply_writes``): ``value`` is None for a delete."""

    op: Op
    space: str
    collection: str
    key: str
    value: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Change:
    """One op of the change feed.

    ``record`` is the new value for create/update (None for delete). When the
    stored record fails its lexicon, ``error`` carries the validator's message and
    ``record`` still holds the raw value, so a caller can answer it.
    ``live`` is False for ops read while catching up (a backfill), True for ops
    seen after the feed reached the head.
    """

    did: str
    space: str
    collection: str
    key: str
    op: Op
    cid: str | None
    record: dict[str, Any] | None
    error: str | None
    cursor: str
    live: bool


class RecordStore(abc.ABC):
    """The async, PDS-shaped interface. Every write is validated first.

    The operations with options (``list_records``, ``put_record``) check their arguments
    here, once for every backend, and hand them on to the backend's ``_list_records`` /
    ``_put_record``.
    """

    @abc.abstractmethod
    async def create_space(self, did: str, space_type: str, skey: str) -> None:
        """Create a space (idempotent)."""

    @abc.abstractmethod
    async def get_record(self, did: str, space: str, collection: str, key: str) -> Record | None:
        """The record, or None when the key is free."""

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
        """Records of one collection in one space, in key order; and the next cursor."""
        validate_did(did)
        validate_space_key(space)
        validate_collection(collection)
        if cursor is not None:
            validate_key(cursor, "cursor")
        validate_limit(limit)
        return await self._list_records(did, space, collection, cursor, limit, reverse)

    @abc.abstractmethod
    async def _list_records(
        self, did: str, space: str, collection: str, cursor: str | None, limit: int, reverse: bool
    ) -> tuple[list[Record], str | None]:
        """:meth:`list_records`, its arguments checked."""

    @abc.abstractmethod
    async def create_record(
        self, did: str, space: str, collection: str, key: str, value: dict[str, Any]
    ) -> Record:
        """Create-only write: raises RecordExists when ``key`` is taken (the claim)."""

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
        """Create or replace; with ``swap_cid`` only when the stored CID matches."""
        validate_address(did, space, collection, key)
        return await self._put_record(did, space, collection, key, value, swap_cid)

    @abc.abstractmethod
    async def _put_record(
        self, did: str, space: str, collection: str, key: str, value: dict[str, Any],
        swap: str | None,
    ) -> Record:
        """:meth:`put_record`, its address checked (``swap``: the ``swap_cid``)."""

    @abc.abstractmethod
    async def delete_record(
        self, did: str, space: str, collection: str, key: str, *, swap_cid: str | None = None
    ) -> None:
        """Delete (a no-op when absent, as on a PDS)."""

    @abc.abstractmethod
    async def upload_blob(self, did: str, data: bytes, mime_type: str) -> dict[str, Any]:
        """Store a blob; returns its blob ref ``{"$type": "blob", "ref": {"$link": cid}, ...}``."""

    @abc.abstractmethod
    async def get_blob(self, did: str, cid: str) -> bytes:
        """The blob's bytes; raises BlobNotFound."""

    @abc.abstractmethod
    def changes(self, cursor: str | None = None) -> AbstractAsyncContextManager[AsyncIterator[Change]]:
        """The change feed, from just after ``cursor`` (None: from the beginning).

        ``async with store.changes(cursor) as feed: async for change in feed: ...``;
        whatever runs the feed runs while the block lasts and stops when it ends.
        """

    async def aclose(self) -> None:  # noqa: B027 - optional for backends with nothing to close
        """Release connections and files."""

    async def __aenter__(self) -> RecordStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        # Shielded and bounded: a second signal cancels the daemon's exit, and a connection
        # left open (an aiosqlite worker thread) would keep the process alive after it.
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await self.aclose()
