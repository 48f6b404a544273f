"""The PDS store's blobs: ``uploadBlob`` as the account, ``sync.getBlob`` read as bytes.

The PDS finds a blob's type from its bytes and collects unreferenced blobs itself, so
the store keeps no blob index of its own.
"""

from __future__ import annotations

from typing import Any

import httpx
from atproto_client.exceptions import RequestErrorBase

from recordstore.errors import BlobNotFound, StoreError
from recordstore.pds_auth import PdsSessions
from recordstore.pds_errors import store_error

__all__ = ["PdsBlobs"]


class PdsBlobs:
    """Blob calls of the accounts in ``sessions``; ``http`` reads the public blob route."""

    def __init__(self, sessions: PdsSessions, http: httpx.AsyncClient) -> None:
        self._sessions = sessions
        self._http = http

    async def upload(self, did: str, data: bytes, mime_type: str) -> dict[str, Any]:
        if not isinstance(mime_type, str) or "/" not in mime_type:
            raise StoreError(f"invalid blob mime type {mime_type!r}")
        try:
            out = await self._sessions.call(
                did,
                "procedure",
                "com.atproto.repo.uploadBlob",
                content=bytes(data),
                headers={"Content-Type": mime_type},
            )
        except RequestErrorBase as e:
            raise store_error(e, "uploadBlob") from None
        blob = out["blob"]
        return {
            "$type": "blob",
            "ref": {"$link": blob["ref"]["$link"]},
            "mimeType": blob["mimeType"],
            "size": blob["size"],
        }

    async def get(self, did: str, cid: str) -> bytes:
        s = await self._sessions.session_for(did)
        # sync.getBlob is public and answers with the blob's own content type; the SDK
        # would parse a JSON blob into a dict, so its bytes are read with plain httpx.
        try:
            resp = await self._http.get(
                f"{s.endpoint}/xrpc/com.atproto.sync.getBlob", params={"did": did, "cid": cid}
            )
        except httpx.HTTPError as e:
            raise StoreError(f"getBlob {cid}: {type(e).__name__}: {e}") from None
        if resp.status_code == 200:
            return resp.content
        try:
            name = resp.json().get("error")
        except ValueError:
            name = None
        if name in {"BlobNotFound", "RepoNotFound"} or resp.status_code == 404:
            raise BlobNotFound(f"no blob {cid} for {did}")
        if name == "InvalidRequest" and resp.status_code == 400:
            raise BlobNotFound(f"no blob {cid!r} for {did} ({resp.text[:200]})")
        raise StoreError(f"getBlob {cid}: {resp.status_code} {resp.text[:200]}")
