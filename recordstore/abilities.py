"""Optional store abilities, as Protocols: what one backend does better than the interface.

Callers check with ``isinstance(store, Ability)`` and fall back to the plain
:class:`recordstore.RecordStore` operations when a backend lacks one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from recordstore import Record, Write

__all__ = [
    "BatchWrites",
    "BlobCollector",
    "BlobTypes",
    "BlobUsage",
    "KnownDids",
    "NewestFirst",
    "NewestQuery",
    "RepoCollections",
    "RepoLister",
    "RepoPage",
    "SpaceChanges",
]


@dataclass(frozen=True, slots=True)
class NewestQuery:
    """One page of ``collection``'s records in ``space``, by ``(order field, key)`` descending.

    The page holds ``(key, *fields)`` of up to ``limit`` records strictly before ``before``
    (an ``(order value, key)`` pair); ``match = (field, text)`` keeps records whose field
    contains ``text``, case-insensitively. A missing or non-string field reads as None.
    """

    space: str
    collection: str
    fields: Sequence[str]
    order: str
    limit: int
    before: tuple[str, str] | None = None
    match: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class RepoPage:
    """One page of a collection across every space, as XRPC ``listRecords`` pages it: by
    rkey (``<space>:<key>``), descending unless ``reverse``, from just after ``cursor`` (an
    rkey); the next cursor is the page's last rkey."""

    collection: str
    cursor: str | None = None
    limit: int = 100
    reverse: bool = False


@runtime_checkable
class NewestFirst(Protocol):
    """One page of a collection's records ordered by a field, newest first, in one read."""

    async def newest(self, did: str, query: NewestQuery) -> list[tuple[str | None, ...]]:
        """The page ``query`` describes, of ``did``'s records."""
        ...


@runtime_checkable
class BlobCollector(Protocol):
    """Blobs a backend keeps itself (a PDS collects unreferenced blobs on its own)."""

    async def blob_in_use(self, did: str, cid: str) -> bool:
        """Whether any record of ``did`` still references the blob ``cid``."""
        ...

    async def delete_blob(self, did: str, cid: str) -> None:
        """Forget ``did``'s blob ``cid`` (its bytes go once no account holds it)."""
        ...


@runtime_checkable
class BlobTypes(Protocol):
    """The stored type and size of a blob (a PDS serves its blobs with their type itself)."""

    async def blob_info(self, did: str, cid: str) -> tuple[str, int] | None:
        """``(mime type, size)`` of ``did``'s blob ``cid``, or None."""
        ...


@runtime_checkable
class BlobUsage(Protocol):
    """The bytes an account's blobs take (``[accounts.X] maxStorageBytes``)."""

    async def blob_usage(self, did: str) -> int: ...


@runtime_checkable
class RepoCollections(Protocol):
    """The collections an account has records in (``describeRepo.collections``)."""

    async def collections(self, did: str) -> list[str]: ...


@runtime_checkable
class BatchWrites(Protocol):
    """Several writes as one transaction (``applyWrites``): all of them, or none."""

    async def apply_writes(self, did: str, writes: Sequence[Write]) -> list[Record | None]: ...


@runtime_checkable
class RepoLister(Protocol):
    """One collection across every space, in classic-repo rkey order (XRPC ``listRecords``)."""

    async def list_repo_records(self, did: str, page: RepoPage) -> tuple[list[Record], str | None]:
        """The page of ``did``'s repo ``page`` describes, and the next page's cursor."""
        ...


@runtime_checkable
class SpaceChanges(Protocol):
    """What changed in a space since a point of the change feed, and the records of chosen
    keys: a reader that keeps a space's records reads only what changed since it read them.

    A cursor is the change feed's (``Change.cursor``): every write after it has a greater
    one, whoever made it.
    """

    async def change_cursor(self) -> str:
        """The cursor of the newest change so far."""
        ...

    async def keys_changed(
        self, did: str, space: str, collection: str, after: str, limit: int
    ) -> tuple[set[str], str] | None:
        """The keys of ``collection`` in ``space`` written (created, updated or deleted)
        after cursor ``after``, and the cursor that reaches; None when more than ``limit``
        changes of the whole store came after it (read the space instead)."""
        ...

    async def space_cids(self, did: str, space: str, collection: str) -> list[tuple[str, str]]:
        """``(key, cid)`` of every record of ``collection`` in ``space``, in key order."""
        ...

    async def space_records(
        self, did: str, space: str, collection: str, keys: Sequence[str]
    ) -> list[tuple[Record, int]]:
        """The records at ``keys`` that exist, each with its stored JSON's length."""
        ...


@runtime_checkable
class KnownDids(Protocol):
    """A backend that learns accounts' DIDs at login (a PDS account named by handle)."""

    def known_dids(self) -> dict[str, str]:
        """Login identifier (handle or DID) -> the DID it logged in as, for those logged in."""
        ...
