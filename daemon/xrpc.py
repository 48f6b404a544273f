"""The local store served as a PDS would serve it: ``com.atproto.*`` over XRPC.

A script written with the stock atproto SDK against a PDS runs unchanged against
turnd: it logs in with ``createSession`` (an account of the config, its password),
writes records in the classic-repo layout (rkey ``<skey>:<key>``, SPEC §3) and
reads them back. Errors carry the reference PDS's names and status codes, so the
SDK raises the same exception types it raises against a PDS (400 ->
``BadRequestError``, 401 -> ``UnauthorizedError``).

One deliberate difference: a ``createRecord`` at a key that is taken answers
``400 InvalidRequest`` "record already exists", where the reference PDS gives a
bare 500. Clients can tell a lost claim from a failure without reading back.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

import recordstore
from daemon.auth import (
    ACCESS_SCOPE,
    REFRESH_SCOPE,
    SessionClaims,
    SessionTokens,
    TokenError,
    bearer_token,
    load_secret,
)
from recordstore import keys

log = logging.getLogger("turnd.xrpc")

__all__ = ["XrpcError", "router", "session_tokens"]

SECRET_FILE = "xrpc-session.key"
_CHAT_COLLECTIONS = [
    recordstore.CONVERSATION_REF,
    recordstore.INFO,
    recordstore.MESSAGE,
    recordstore.PREFERENCES,
]
# Image types the lexicon's imagePart accepts, by their magic bytes: the SDK's
# uploadBlob sends ``Content-Type: */*``, so the type is sniffed as a PDS does.
_MAGIC: list[tuple[bytes, int, str]] = [
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
    (b"WEBP", 8, "image/webp"),
]


_MIME_RE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*")
MAX_BLOB_BYTES = 50_000_000  # the largest blob the chat lexicons allow (filePart.file)


class XrpcError(Exception):
    """An error answered as a PDS answers it: ``{"error": name, "message": ...}``."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message


class _Account(Protocol):
    name: str
    handle: str
    did: str | None


class _Service(Protocol):
    # The parts of daemon.service.Service this module uses.
    store: recordstore.RecordStore
    accounts: list[Any]

    def account_for_login(self, identifier: str, password: str) -> Any: ...


def session_tokens(state_path: Path | None, audience: str) -> SessionTokens:
    """The session token issuer, its secret kept beside the state file."""
    secret = load_secret(state_path.with_name(SECRET_FILE) if state_path else None)
    return SessionTokens(secret, audience)


def sniff_mime(data: bytes, declared: str | None) -> str:
    """The declared type, unless it says nothing, then the sniffed one."""
    declared = (declared or "").split(";")[0].strip().lower()
    if _MIME_RE.fullmatch(declared) and declared not in ("*/*", "application/octet-stream"):
        return declared
    for magic, offset, mime in _MAGIC:
        if data[offset : offset + len(magic)] == magic and (offset == 0 or data[:4] == b"RIFF"):
            return mime
    return "application/octet-stream"


# -- errors ----------------------------------------------------------------------------


def error_response(status: int, error: str, message: str) -> JSONResponse:
    return JSONResponse({"error": error, "message": message}, status_code=status)


def _validation_message(err: RequestValidationError) -> str:
    # The PDS names the bad field as "Input/<field> ..." or "Params/<field> ...".
    first = err.errors()[0]
    where = {"body": "Input", "query": "Params"}.get(str(first["loc"][0]), "Input")
    path = "/".join(str(p) for p in first["loc"][1:])
    return f"{where}/{path}: {first['msg']}" if path else f"{where}: {first['msg']}"


def _store_error(exc: recordstore.StoreError) -> XrpcError:
    if isinstance(exc, recordstore.InvalidRecord):
        return XrpcError(400, "InvalidRecord", str(exc))
    if isinstance(exc, recordstore.InvalidSwap):
        return XrpcError(400, "InvalidSwap", str(exc) or "Record was at a different CID")
    if isinstance(exc, recordstore.RecordNotFound):
        return XrpcError(400, "RecordNotFound", str(exc) or "Could not locate record")
    if isinstance(exc, recordstore.BlobNotFound):
        return XrpcError(400, "BlobNotFound", "Blob not found")
    if isinstance(exc, recordstore.RecordExists):
        return XrpcError(400, "InvalidRequest", "record already exists")
    if isinstance(exc, recordstore.InvalidKey):
        return XrpcError(400, "InvalidRequest", str(exc))
    return XrpcError(500, "InternalServerError", "Internal Server Error")


class _XrpcRoute(APIRoute):
    """Answers every failure of an XRPC method in the PDS's error shape.

    FastAPI's app-wide handlers answer the /api way; an XRPC client expects
    ``400 InvalidRequest`` for bad input, so the conversion happens here, per route.
    """

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except XrpcError as exc:
                return error_response(exc.status, exc.error, exc.message)
            except TokenError as exc:
                return error_response(exc.status, exc.error, exc.message)
            except RequestValidationError as exc:
                return error_response(400, "InvalidRequest", _validation_message(exc))
            except recordstore.StoreError as exc:
                err = _store_error(exc)
                if err.status >= 500:
                    log.exception("store error in %s", request.url.path)
                return error_response(err.status, err.error, err.message)

        return route


# -- input models ----------------------------------------------------------------------


class _Input(BaseModel):
    # Lexicon inputs are open: unknown fields pass, as on a PDS.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class CreateSessionInput(_Input):
    identifier: str
    password: str
    authFactorToken: str | None = None
    allowTakendown: bool | None = None


class CreateRecordInput(_Input):
    repo: str
    collection: str
    rkey: str | None = Field(default=None, max_length=512)
    validate_: bool | None = Field(default=None, alias="validate")
    record: dict[str, Any]
    swapCommit: str | None = None  # accepted and ignored: the local store has no commits


class PutRecordInput(_Input):
    repo: str
    collection: str
    rkey: str = Field(max_length=512)
    validate_: bool | None = Field(default=None, alias="validate")
    record: dict[str, Any]
    swapRecord: str | None = None
    swapCommit: str | None = None


class DeleteRecordInput(_Input):
    repo: str
    collection: str
    rkey: str
    swapRecord: str | None = None
    swapCommit: str | None = None


# -- the router --------------------------------------------------------------------------


def router(service: _Service, tokens: SessionTokens | None = None) -> APIRouter:
    """The ``/xrpc`` routes for ``service``'s local store and accounts."""
    if tokens is None:
        config = getattr(service, "config", None)
        tokens = session_tokens(getattr(config, "state_path", None), "did:web:localhost")
    x = _Xrpc(service, tokens)
    r = APIRouter(prefix="/xrpc", route_class=_XrpcRoute, tags=["xrpc"])
    server, repo, sync = "com.atproto.server", "com.atproto.repo", "com.atproto.sync"
    r.add_api_route(f"/{server}.createSession", x.create_session, methods=["POST"])
    r.add_api_route(f"/{server}.refreshSession", x.refresh_session, methods=["POST"])
    r.add_api_route(f"/{server}.getSession", x.get_session, methods=["GET"])
    r.add_api_route(f"/{server}.describeServer", x.describe_server, methods=["GET"])
    r.add_api_route(f"/{repo}.createRecord", x.create_record, methods=["POST"])
    r.add_api_route(f"/{repo}.putRecord", x.put_record, methods=["POST"])
    r.add_api_route(f"/{repo}.deleteRecord", x.delete_record, methods=["POST"])
    r.add_api_route(f"/{repo}.getRecord", x.get_record, methods=["GET"])
    r.add_api_route(f"/{repo}.listRecords", x.list_records, methods=["GET"])
    r.add_api_route(f"/{repo}.describeRepo", x.describe_repo, methods=["GET"])
    r.add_api_route(f"/{repo}.uploadBlob", x.upload_blob, methods=["POST"])
    r.add_api_route(f"/{sync}.getBlob", x.get_blob, methods=["GET"])
    # Anything else is a method this server does not serve, as a PDS says it.
    r.add_api_route("/{nsid}", _not_implemented, methods=["GET", "POST"], include_in_schema=False)
    return r


async def _not_implemented(nsid: str) -> Response:
    return error_response(501, "MethodNotImplemented", "Method Not Implemented")


class _Xrpc:
    def __init__(self, service: _Service, tokens: SessionTokens) -> None:
        self._service = service
        self._tokens = tokens

    @property
    def _store(self) -> recordstore.RecordStore:
        return self._service.store

    # -- accounts and sessions ---------------------------------------------------------

    def _account(self, repo: str) -> Any | None:
        """The served account whose DID or handle is ``repo``."""
        handle = repo.lower()
        for account in self._service.accounts:
            if account.did and (account.did == repo or account.handle.lower() == handle):
                return account
        return None

    def _repo(self, repo: str, what: str = "repo") -> Any:
        account = self._account(repo)
        if account is None:
            raise XrpcError(400, "InvalidRequest", f"Could not find {what}: {repo}")
        return account

    def _claims(self, request: Request, scope: str) -> SessionClaims:
        token = bearer_token(request)
        if token is None:
            if request.headers.get("authorization"):
                raise XrpcError(400, "InvalidToken", "Unexpected authorization type")
            raise XrpcError(401, "AuthMissing", "Authentication Required")
        claims = self._tokens.verify(token, scope)  # type: ignore[arg-type]
        if not any(a.did == claims.did for a in self._service.accounts):
            raise XrpcError(403, "AccountNotFound", "Account not found")
        return claims

    def _writer(self, request: Request, repo: str) -> str:
        """The DID of ``repo`` when the caller holds an access token of its owner."""
        claims = self._claims(request, ACCESS_SCOPE)
        account = self._repo(repo)
        if account.did != claims.did:
            raise XrpcError(401, "AuthenticationRequired", "Authentication Required")
        return account.did

    def _reader(self, request: Request, account: Any) -> None:
        """SPEC §12: the local store is private. A read needs the owner's session or
        its /api bearer token, unless ``[xrpc] public_reads`` opens it."""
        if getattr(getattr(self._service, "config", None), "public_reads", False):
            return
        token = bearer_token(request)
        lookup = getattr(self._service, "account_for_token", None)
        by_token = lookup(token) if token and lookup is not None else None
        if by_token is not None:
            if by_token.did != account.did:
                raise XrpcError(401, "AuthenticationRequired", "Authentication Required")
            return
        claims = self._claims(request, ACCESS_SCOPE)
        if claims.did != account.did:
            raise XrpcError(401, "AuthenticationRequired", "Authentication Required")

    def _session(self, account: Any) -> dict[str, Any]:
        return {
            "accessJwt": self._tokens.issue(account.did, ACCESS_SCOPE),
            "refreshJwt": self._tokens.issue(account.did, REFRESH_SCOPE),
            "handle": account.handle,
            "did": account.did,
            "active": True,
        }

    async def create_session(self, body: CreateSessionInput) -> dict[str, Any]:
        account = self._service.account_for_login(body.identifier, body.password)
        if account is None or not account.did:
            raise XrpcError(401, "AuthenticationRequired", "Invalid identifier or password")
        return self._session(account)

    async def refresh_session(self, request: Request) -> dict[str, Any]:
        claims = self._claims(request, REFRESH_SCOPE)
        return self._session(self._repo(claims.did, "account"))

    async def get_session(self, request: Request) -> dict[str, Any]:
        claims = self._claims(request, ACCESS_SCOPE)
        account = self._repo(claims.did, "account")
        return {"handle": account.handle, "did": account.did, "active": True}

    async def describe_server(self) -> dict[str, Any]:
        return {
            "did": self._tokens.audience,
            "availableUserDomains": [],
            "inviteCodeRequired": True,  # accounts come from the config, not from clients
        }

    async def describe_repo(
        self, request: Request, repo: Annotated[str, Query()]
    ) -> dict[str, Any]:
        account = self._repo(repo, "user")
        self._reader(request, account)
        return {
            "handle": account.handle,
            "did": account.did,
            "didDoc": _did_doc(account, str(request.base_url).rstrip("/")),
            "collections": _CHAT_COLLECTIONS,
            "handleIsCorrect": True,
        }

    # -- records --------------------------------------------------------------------------

    async def _space(self, did: str, space: str) -> None:
        # After a write succeeds (a refused one leaves nothing behind), its space is
        # made as an /api write makes it; idempotent.
        kind = (
            recordstore.SETTINGS
            if space == recordstore.SETTINGS_SPACE
            else recordstore.CONVERSATION
        )
        await self._store.create_space(did, kind, space)

    async def create_record(self, request: Request, body: CreateRecordInput) -> dict[str, Any]:
        did = self._writer(request, body.repo)
        collection = keys.validate_collection(body.collection)
        rkey = body.rkey if body.rkey is not None else keys.new_tid()
        space, key = keys.split_repo_rkey(rkey)
        value = _typed(body.record, collection)
        rec = await self._store.create_record(did, space, collection, key, value)
        await self._space(did, space)
        return _write_result(rec, rkey)

    async def put_record(self, request: Request, body: PutRecordInput) -> dict[str, Any]:
        did = self._writer(request, body.repo)
        collection = keys.validate_collection(body.collection)
        space, key = keys.split_repo_rkey(body.rkey)
        value = _typed(body.record, collection)
        rec = await self._store.put_record(
            did, space, collection, key, value, swap_cid=body.swapRecord
        )
        await self._space(did, space)
        return _write_result(rec, body.rkey)

    async def delete_record(self, request: Request, body: DeleteRecordInput) -> dict[str, Any]:
        did = self._writer(request, body.repo)
        collection = keys.validate_collection(body.collection)
        space, key = keys.split_repo_rkey(body.rkey)
        await self._store.delete_record(did, space, collection, key, swap_cid=body.swapRecord)
        return {}

    async def get_record(
        self,
        request: Request,
        repo: Annotated[str, Query()],
        collection: Annotated[str, Query()],
        rkey: Annotated[str, Query()],
        cid: Annotated[str | None, Query()] = None,
    ) -> dict[str, Any]:
        account = self._repo(repo)
        self._reader(request, account)
        keys.validate_collection(collection)
        space, key = keys.split_repo_rkey(rkey)
        rec = await self._store.get_record(account.did, space, collection, key)
        uri = f"at://{account.did}/{collection}/{rkey}"
        if rec is None or (cid is not None and rec.cid != cid):
            raise XrpcError(400, "RecordNotFound", f"Could not locate record: {uri}")
        return {"uri": uri, "cid": rec.cid, "value": rec.value}

    async def list_records(
        self,
        request: Request,
        repo: Annotated[str, Query()],
        collection: Annotated[str, Query()],
        limit: Annotated[int, Query(ge=1, le=100)] = 50,
        cursor: Annotated[str | None, Query()] = None,
        reverse: Annotated[bool, Query()] = False,
    ) -> dict[str, Any]:
        account = self._repo(repo)
        self._reader(request, account)
        keys.validate_collection(collection)
        records, next_cursor = await _list_repo(
            self._store, account.did, collection, limit=limit, cursor=cursor, reverse=reverse
        )
        out: dict[str, Any] = {
            "records": [
                {
                    "uri": f"at://{account.did}/{collection}/{keys.repo_rkey(r.space, r.key)}",
                    "cid": r.cid,
                    "value": r.value,
                }
                for r in records
            ]
        }
        if next_cursor is not None:
            out["cursor"] = next_cursor
        return out

    # -- blobs ------------------------------------------------------------------------------

    async def upload_blob(self, request: Request) -> dict[str, Any]:
        did = self._claims(request, ACCESS_SCOPE).did
        data = await request.body()
        if not data:
            raise XrpcError(400, "InvalidRequest", "Request body is empty")
        if len(data) > MAX_BLOB_BYTES:
            raise XrpcError(413, "PayloadTooLarge", f"blobs may be at most {MAX_BLOB_BYTES} bytes")
        mime = sniff_mime(data, request.headers.get("content-type"))
        blob = await self._store.upload_blob(did, data, mime)
        return {"blob": blob}

    async def get_blob(
        self, request: Request, did: Annotated[str, Query()], cid: Annotated[str, Query()]
    ) -> Response:
        account = self._account(did)
        if account is None:
            raise XrpcError(400, "RepoNotFound", f"Could not find repo for DID: {did}")
        self._reader(request, account)
        data = await self._store.get_blob(account.did, cid)
        return Response(
            data,
            media_type=sniff_mime(data, None),
            headers={
                # As a PDS serves blobs: never rendered as a page of this origin.
                "x-content-type-options": "nosniff",
                "content-security-policy": "default-src 'none'; sandbox",
            },
        )


# -- helpers -------------------------------------------------------------------------------


def _typed(record: dict[str, Any], collection: str) -> dict[str, Any]:
    """The record with its ``$type``, filled in as a PDS does; a mismatch is refused."""
    declared = record.get("$type")
    if declared is None:
        return {"$type": collection, **record}
    if declared != collection:
        raise XrpcError(
            400, "InvalidRecord", f"Invalid $type: expected {collection}, got {declared}"
        )
    return record


def _write_result(rec: recordstore.Record, rkey: str) -> dict[str, Any]:
    return {
        "uri": f"at://{rec.did}/{rec.collection}/{rkey}",
        "cid": rec.cid,
        # Every write is checked against turnd's lexicons before it is stored.
        "validationStatus": "valid",
    }


def _did_doc(account: Any, endpoint: str) -> dict[str, Any]:
    return {
        "@context": ["https://www.w3.org/ns/did/v1"],
        "id": account.did,
        "alsoKnownAs": [f"at://{account.handle}"],
        "service": [
            {
                "id": "#atproto_pds",
                "type": "AtprotoPersonalDataServer",
                "serviceEndpoint": endpoint,
            }
        ],
    }


async def _list_repo(
    store: recordstore.RecordStore,
    did: str,
    collection: str,
    *,
    limit: int,
    cursor: str | None,
    reverse: bool,
) -> tuple[list[recordstore.Record], str | None]:
    """One page of ``collection`` in PDS order: by rkey, descending unless ``reverse``.

    The cursor is an rkey; the page starts just after it. The store interface
    lists one space at a time, so the page stays within the cursor's space
    ``<skey>:`` (the way a client lists one conversation); with a store that can
    list the whole repo (``list_repo_records``), it spans spaces as on a PDS.
    """
    lister = getattr(store, "list_repo_records", None)
    if lister is not None:
        return await lister(did, collection, cursor=cursor, limit=limit, reverse=reverse)
    if cursor is None or ":" not in cursor:
        raise XrpcError(
            400,
            "InvalidRequest",
            "this store lists one space at a time: pass cursor '<skey>:' "
            "(with reverse=true for key order)",
        )
    space, _, after = cursor.partition(":")
    keys.validate_space_key(space)
    if not after and not reverse:
        return [], None  # descending from "<skey>:": no key of this space sorts before it
    # The store lists ascending by default; a PDS lists descending unless reverse.
    records, more = await store.list_records(
        did, space, collection, cursor=after or None, limit=limit, reverse=not reverse
    )
    return records, (keys.repo_rkey(space, more) if more is not None else None)
