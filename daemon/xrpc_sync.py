"""Blobs over XRPC: ``com.atproto.repo.uploadBlob`` and ``com.atproto.sync.getBlob``.

SPEC §12: two uploads at once per account, the account's storage cap, 507 on a
full disk (:mod:`daemon.uploads`, shared with ``/api/attachments``). A blob is
served as the reference PDS serves it: an attachment, never rendered as a page of
this origin, never sniffed.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Request, Response

from daemon import uploads
from daemon.auth import ACCESS_SCOPE
from daemon.xrpc_access import XrpcAccess
from daemon.xrpc_errors import XrpcError, invalid_request, not_served
from recordstore.abilities import BlobTypes
from recordstore.mime import OCTET_STREAM
from recordstore.write import MAX_BLOB_BYTES

__all__ = ["BLOB_HEADERS", "BlobMethods"]

# getBlob's answer, as the reference PDS serves blobs (with Content-Disposition:
# attachment; filename="<cid>"): never rendered as a page of this origin, never sniffed.
BLOB_HEADERS = {
    "x-content-type-options": "nosniff",
    "content-security-policy": "default-src 'none'; sandbox",
}


class BlobMethods:
    def __init__(self, access: XrpcAccess) -> None:
        self._access = access
        self._service = access.service

    async def upload_blob(self, request: Request) -> dict[str, Any]:
        did = self._access.claims(request, ACCESS_SCOPE).did
        guard = self._service.uploads
        # SPEC §12: two at once per account, the account's cap, 507 on a full disk;
        # a refusal (UploadError) is answered by the route in the PDS's shape.
        async with guard.slot(did):
            data = await request.body()
            if not data:
                raise invalid_request("Request body is empty")
            if len(data) > MAX_BLOB_BYTES:
                raise XrpcError(
                    413, "PayloadTooLarge", f"blobs may be at most {MAX_BLOB_BYTES} bytes"
                )
            # The store types the blob from its bytes (the declared type is the
            # fallback) and answers the ref it stored.
            cap = uploads.storage_cap(self._service.accounts, did)
            mime = request.headers.get("content-type", "")
            blob = await guard.store(self._service.store, did, data, mime, cap)
        return {"blob": blob}

    async def get_blob(
        self, request: Request, did: Annotated[str, Query()], cid: Annotated[str, Query()]
    ) -> Response:
        account = self._access.account(did)
        if account is None or account.did is None:
            raise XrpcError(400, "RepoNotFound", f"Could not find repo for DID: {did}")
        self._access.reader(request, account)
        store = self._service.store
        if not isinstance(store, BlobTypes):
            raise not_served()
        data = await store.get_blob(account.did, cid)
        info = await store.blob_info(account.did, cid)
        headers = {**BLOB_HEADERS, "content-disposition": f'attachment; filename="{cid}"'}
        return Response(data, media_type=info[0] if info else OCTET_STREAM, headers=headers)
