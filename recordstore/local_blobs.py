"""The local store's blobs: bytes as files named by their CID, an index row per account.

``blobs/<cid>`` holds the bytes once, whoever uploaded them; the ``blobs`` table says
which accounts hold a blob, with the type it was uploaded as (SPEC §12: an account's
storage is the sum of its blobs' sizes).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import anyio

from recordstore import BlobNotFound, StoreError
from recordstore.cid import blob_cid
from recordstore.keys import validate_did
from recordstore.local_db import LocalDb
from recordstore.mime import blob_mime
from recordstore.write import MAX_BLOB_BYTES

__all__ = ["LocalBlobs"]

_CID_RE = re.compile(r"^b[a-z2-7]{20,}$")


class LocalBlobs:
    """The blobs of one local store (its ``blobs/`` directory and ``blobs`` table)."""

    def __init__(self, db: LocalDb) -> None:
        self._db = db
        self._dir = db.root / "blobs"

    async def upload(self, did: str, data: bytes, mime_type: str) -> dict[str, Any]:
        """Store a blob; its type is the one its bytes show, else ``mime_type`` (as a PDS)."""
        validate_did(did)
        if len(data) > MAX_BLOB_BYTES:
            raise StoreError(f"blob of {len(data)} bytes exceeds {MAX_BLOB_BYTES}")
        mime_type = blob_mime(data, mime_type if isinstance(mime_type, str) else None)
        cid = blob_cid(data)
        await anyio.to_thread.run_sync(_write_file, self._dir / cid, bytes(data))
        # The latest upload's type wins, so the ref answered is always what is stored
        # (the same bytes only differ in type when they have no signature).
        await self._db.write(
            "INSERT INTO blobs (did, cid, mime_type, size) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (did, cid) DO UPDATE SET mime_type = excluded.mime_type"
            " WHERE mime_type IS NOT excluded.mime_type",
            (did, cid, mime_type, len(data)),
        )
        return {"$type": "blob", "ref": {"$link": cid}, "mimeType": mime_type, "size": len(data)}

    async def usage(self, did: str) -> int:
        """Bytes of ``did``'s blobs."""
        validate_did(did)
        rows = await self._db.read("SELECT COALESCE(SUM(size), 0) FROM blobs WHERE did = ?", (did,))
        return int(rows[0][0])

    async def info(self, did: str, cid: str) -> tuple[str, int] | None:
        """``(mime type, size)`` of ``did``'s blob ``cid``, or None (``did`` not checked)."""
        rows = await self._db.read(
            "SELECT mime_type, size FROM blobs WHERE did = ? AND cid = ?", (did, cid)
        )
        return (rows[0][0], rows[0][1]) if rows else None

    async def get(self, did: str, cid: str) -> bytes:
        validate_did(did)
        _check_cid(cid)
        if not await self._db.read("SELECT 1 FROM blobs WHERE did = ? AND cid = ?", (did, cid)):
            raise BlobNotFound(f"no blob {cid} for {did}")
        try:
            return await anyio.Path(self._dir / cid).read_bytes()
        except FileNotFoundError:
            raise BlobNotFound(f"blob {cid} is indexed but its file is missing") from None

    async def in_use(self, did: str, cid: str) -> bool:
        """Whether a record of ``did`` names ``cid``."""
        validate_did(did)
        rows = await self._db.read(
            "SELECT 1 FROM records WHERE did = ? AND instr(value, ?) > 0 LIMIT 1",
            (did, f'"$link":"{cid}"'),
        )
        return bool(rows)

    async def delete(self, did: str, cid: str) -> None:
        validate_did(did)
        _check_cid(cid)
        await self._db.write("DELETE FROM blobs WHERE did = ? AND cid = ?", (did, cid))
        if not await self._db.read("SELECT 1 FROM blobs WHERE cid = ? LIMIT 1", (cid,)):
            await anyio.to_thread.run_sync(_unlink, self._dir / cid)


def _check_cid(cid: Any) -> None:
    # The CID becomes a file name: only base32 CIDs, never a path.
    if not isinstance(cid, str) or _CID_RE.match(cid) is None:
        raise BlobNotFound(f"no blob {cid!r}")


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
