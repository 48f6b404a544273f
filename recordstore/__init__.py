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

# The collection names, re-exported from the one vocabulary module.
from recordstore.vocabulary import (
    CONVERSATION,
    CONVERSATION_REF,
    INFO,
    MESSAGE,
    NSID,
    PREFERENCES,
    SETTINGS,
    SETTINGS_SPACE,
    SUMMARY,
)

__all__ = [
    "Change",
    "InvalidKey",
    "InvalidRecord",
    "InvalidSwap",
    "Record",
    "RecordExists",
    "RecordNotFound",
    "RecordStore",
    "StoreError",
    "Write",
    "BlobNotFound",
    "CONVERSATION",
    "SETTINGS",
    "SETTINGS_SPACE",
    "MESSAGE",
    "INFO",
    "PREFERENCES",
    "CONVERSATION_REF",
    "SUMMARY",
    "NSID",
]


Op = Literal["create", "update", "delete"]


class StoreError(Exception):
    """Base of every error the store raises on purpose."""


class RecordExists(StoreError):
    """``create_record`` found the key taken: somebody else owns it."""


class RecordNotFound(StoreError):
    pass


class BlobNotFound(StoreError):
    pass


class InvalidSwap(StoreError):
    """The compare-and-swap CID did not match the stored record."""


class InvalidRecord(StoreError):
    """The record does not follow its lexicon; the message names the bad field."""


class InvalidKey(StoreError, ValueError):
    """A key that is not a valid record key (or space key)."""


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
    """The async, PDS-shaped interface. Every write is validated first."""

    @abc.abstractmethod
    async def create_space(self, did: str, space_type: str, skey: str) -> None:
        """Create a space (idempotent)."""

    @abc.abstractmethod
    async def get_record(self, did: str, space: str, collection: str, key: str) -> Record | None:
        """The record, or None when the key is free."""

    @abc.abstractmethod
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

    @abc.abstractmethod
    async def create_record(
        self, did: str, space: str, collection: str, key: str, value: dict[str, Any]
    ) -> Record:
        """Create-only write: raises RecordExists when ``key`` is taken (the claim)."""

    @abc.abstractmethod
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
        await self.aclose()
