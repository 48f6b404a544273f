"""Uploads that cannot hurt the others (SPEC §12): ``/api/attachments`` and ``uploadBlob``.

- At most :data:`UPLOADS_PER_ACCOUNT` uploads of one account run at once; the next
  is answered 429 before its body is read (the page uploads one file at a time).
- ``[accounts.X] maxStorageBytes`` caps the bytes of the account's blobs: an upload
  past it gets 413. The check and the write happen under one lock per account, so
  two uploads cannot both slip under the cap.
- A full disk (or quota) is 507 ``InsufficientStorage``; any other failure to store
  is 503. Nothing answers 500.
- ``X-Filename`` becomes a base name without control characters, at most 255 bytes.
"""

from __future__ import annotations

import errno
import re
import sqlite3
import unicodedata
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote

import anyio

from daemon.accounts import Account
from daemon.errors import NamedError
from recordstore import RecordStore, StoreError
from recordstore.abilities import BlobUsage

__all__ = [
    "UPLOADS_PER_ACCOUNT",
    "UploadError",
    "UploadGuard",
    "clean_filename",
    "disk_full",
    "storage_cap",
]

UPLOADS_PER_ACCOUNT = 2
MAX_FILENAME_BYTES = 255
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_BIDI_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f]")


class UploadError(NamedError):
    """An upload refused or failed; ``status``/``error`` are what the client gets."""


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the disk or the quota is full."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _FULL_ERRNOS:
            return True
        if isinstance(seen, sqlite3.Error) and (
            seen.sqlite_errorcode == sqlite3.SQLITE_FULL
            or "disk is full" in str(seen)
        ):
            return True
        if "database or disk is full" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def clean_filename(raw: str | None) -> str | None:
    """A file name as a client may show it: the last path segment, percent-decoded,
    without control or direction characters, at most 255 bytes; None when nothing is
    left."""
    if not raw:
        return None
    name = unquote(raw)
    name = re.split(r"[/\\]", name)[-1]
    name = "".join(c for c in name if unicodedata.category(c) != "Cc")
    name = _BIDI_CONTROLS.sub("", name).strip()
    if name in ("", ".", ".."):
        return None
    encoded = name.encode()
    if len(encoded) > MAX_FILENAME_BYTES:
        name = encoded[:MAX_FILENAME_BYTES].decode(errors="ignore")
    return name or None


class UploadGuard:
    """Per-account upload slots, storage caps and the disk-full answer."""

    def __init__(self) -> None:
        self._running: dict[str, int] = {}
        self._locks: dict[str, anyio.Lock] = {}

    @asynccontextmanager
    async def slot(self, did: str) -> AsyncIterator[None]:
        """One of the account's upload slots for the block, or 429 at once."""
        if self._running.get(did, 0) >= UPLOADS_PER_ACCOUNT:
            raise UploadError(
                429,
                "RateLimitExceeded",
                f"at most {UPLOADS_PER_ACCOUNT} uploads of one account at once",
            )
        self._running[did] = self._running.get(did, 0) + 1
        try:
            yield
        finally:
            self._running[did] -= 1
            if not self._running[did]:
                del self._running[did]

    async def store(
        self, store: RecordStore, did: str, data: bytes, mime: str, cap: int | None
    ) -> dict[str, Any]:
        """``store.upload_blob`` within the account's cap, failures as UploadError."""
        lock = self._locks.setdefault(did, anyio.Lock())
        async with lock:
            if cap is not None and isinstance(store, BlobUsage):
                used = await store.blob_usage(did)
                if used + len(data) > cap:
                    raise UploadError(
                        413,
                        "PayloadTooLarge",
                        f"this account's blobs may take {cap} bytes; {used} are used and "
                        f"this upload has {len(data)}",
                    )
            try:
                return await store.upload_blob(did, data, mime)
            except Exception as exc:
                if disk_full(exc):
                    raise UploadError(
                        507, "InsufficientStorage", "the disk is full; the upload was not stored"
                    ) from None
                if not _is_client_error(exc):
                    raise UploadError(
                        503, "Unavailable", "the upload could not be stored; try again"
                    ) from exc
                raise


def storage_cap(accounts: Iterable[Account], did: str) -> int | None:
    """``[accounts.X] maxStorageBytes`` of the account with ``did``."""
    for account in accounts:
        if account.did == did:
            return account.max_storage_bytes
    return None


def _is_client_error(exc: Exception) -> bool:
    # The store's refusals of bad input (a blob too large, a bad DID) stay 4xx.
    return isinstance(exc, StoreError) and not isinstance(
        exc.__cause__, sqlite3.Error | OSError
    )
