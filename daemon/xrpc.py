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

import base64
import logging
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

import recordstore
from daemon import uploads
from daemon.auth import (
    ACCESS_SCOPE,
    REFRESH_SCOPE,
    SessionClaims,
    SessionTokens,
    TokenError,
    bearer_token,
    load_secret,
)
from daemon.sessions import LoginLimiter, SessionStore
from recordstore import keys
from recordstore.abilities import BatchWrites, BlobTypes, RepoCollections, RepoLister
from recordstore.lexicon import has_lexicon
from recordstore.mime import OCTET_STREAM
from recordstore.write import MAX_BLOB_BYTES, BlobRefError

log = logging.getLogger("turnd.xrpc")
_A = TypeVar("_A")

__all__ = ["XrpcError", "router", "session_tokens"]

SECRET_FILE = "xrpc-session.key"
# getBlob's answer, as the reference PDS serves blobs (with Content-Disposition:
# attachment; filename="<cid>"): never rendered as a page of this origin, never sniffed.
BLOB_HEADERS = {
    "x-content-type-options": "nosniff",
    "content-security-policy": "default-src 'none'; sandbox",
}
SWAP_COMMIT = "swapCommit is not supported by this store"
SESSIONS_FILE = "xrpc-sessions.sqlite3"  # beside the secret (SPEC §12: rotation, revocation)


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
    if isinstance(exc, BlobRefError):
        return XrpcError(400, exc.error, str(exc))
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
    swapCommit: str | None = None  # refused: the local store has no commits


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


class _ApplyCreate(_Input):
    type_: Literal["com.atproto.repo.applyWrites#create"] = Field(alias="$type")
    collection: str
    rkey: str | None = Field(default=None, max_length=512)
    value: dict[str, Any]


class _ApplyUpdate(_Input):
    type_: Literal["com.atproto.repo.applyWrites#update"] = Field(alias="$type")
    collection: str
    rkey: str = Field(max_length=512)
    value: dict[str, Any]


class _ApplyDelete(_Input):
    type_: Literal["com.atproto.repo.applyWrites#delete"] = Field(alias="$type")
    collection: str
    rkey: str = Field(max_length=512)


class ApplyWritesInput(_Input):
    repo: str
    validate_: bool | None = Field(default=None, alias="validate")
    writes: list[
        Annotated[_ApplyCreate | _ApplyUpdate | _ApplyDelete, Field(discriminator="type_")]
    ] = Field(max_length=200)
    swapCommit: str | None = None


def router(service: _Service, tokens: SessionTokens | None = None) -> APIRouter:
    """The ``/xrpc`` routes for ``service``'s local store and accounts."""
    if tokens is None:
        config = getattr(service, "config", None)
        tokens = session_tokens(getattr(config, "state_path", None), "did:web:localhost")
    state_path = getattr(getattr(service, "config", None), "state_path", None)
    sessions = SessionStore(
        state_path.with_name(SESSIONS_FILE) if state_path else None,
        tokens.secret,
        tokens.refresh_ttl,
    )
    x = _Xrpc(service, tokens, sessions)
    r = APIRouter(
        prefix="/xrpc",
        route_class=_XrpcRoute,
        tags=["xrpc"],
        dependencies=[Depends(x.live_session)],
    )
    server, repo, sync = "com.atproto.server", "com.atproto.repo", "com.atproto.sync"
    r.add_api_route(f"/{server}.createSession", x.create_session, methods=["POST"])
    r.add_api_route(f"/{server}.refreshSession", x.refresh_session, methods=["POST"])
    r.add_api_route(f"/{server}.getSession", x.get_session, methods=["GET"])
    r.add_api_route(f"/{server}.deleteSession", x.delete_session, methods=["POST"])
    r.add_api_route(f"/{server}.describeServer", x.describe_server, methods=["GET"])
    r.add_api_route(f"/{repo}.createRecord", x.create_record, methods=["POST"])
    r.add_api_route(f"/{repo}.putRecord", x.put_record, methods=["POST"])
    r.add_api_route(f"/{repo}.deleteRecord", x.delete_record, methods=["POST"])
    r.add_api_route(f"/{repo}.getRecord", x.get_record, methods=["GET"])
    r.add_api_route(f"/{repo}.listRecords", x.list_records, methods=["GET"])
    r.add_api_route(f"/{repo}.describeRepo", x.describe_repo, methods=["GET"])
    r.add_api_route(f"/{repo}.applyWrites", x.apply_writes, methods=["POST"])
    r.add_api_route(f"/{repo}.uploadBlob", x.upload_blob, methods=["POST"])
    r.add_api_route(f"/{sync}.getBlob", x.get_blob, methods=["GET"])
    r.add_api_route("/com.atproto.identity.resolveHandle", x.resolve_handle, methods=["GET"])
    # Anything else is a method this server does not serve, as a PDS says it.
    r.add_api_route("/{nsid}", _not_implemented, methods=["GET", "POST"], include_in_schema=False)
    return r


async def _not_implemented(nsid: str) -> Response:
    return error_response(501, "MethodNotImplemented", "Method Not Implemented")


class _Xrpc:
    def __init__(self, service: _Service, tokens: SessionTokens, sessions: SessionStore) -> None:
        self._service = service
        self._tokens = tokens
        self._sessions = sessions
        self._limiter = LoginLimiter()

    @property
    def limiter(self) -> LoginLimiter:
        # The service may hold one (tests give it a clock of their own).
        found = getattr(self._service, "login_limiter", None)
        return found if isinstance(found, LoginLimiter) else self._limiter

    def _password(self, did: str) -> str | None:
        account = next((a for a in self._service.accounts if a.did == did), None)
        return getattr(account, "password", None)

    async def live_session(self, request: Request) -> None:
        """Every XRPC call with a session access token: its session must stand (not
        revoked, not deleted, made with the account's current password)."""
        token = bearer_token(request)
        if token is None or token.count(".") != 2:
            return  # none, or an /api bearer token: the route decides
        try:
            claims = self._tokens.verify(token, ACCESS_SCOPE)
        except TokenError:
            return  # the route's own check answers it as a PDS would
        if claims.sid is None or not await self._sessions.valid(
            claims.sid, claims.did, self._password(claims.did)
        ):
            raise XrpcError(400, "ExpiredToken", "Token has been revoked")

    @property
    def _store(self) -> recordstore.RecordStore:
        return self._service.store

    def _able(self, ability: type[_A]) -> _A:
        store = self._service.store
        if not isinstance(store, ability):  # XRPC is served for the local store, which can
            raise XrpcError(501, "MethodNotImplemented", "Method Not Implemented")
        return store

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

    def _session(self, account: Any, sid: str, jti: str) -> dict[str, Any]:
        return {
            "accessJwt": self._tokens.issue(account.did, ACCESS_SCOPE, sid=sid),
            "refreshJwt": self._tokens.issue(account.did, REFRESH_SCOPE, sid=sid, jti=jti),
            "handle": account.handle,
            "did": account.did,
            "active": True,
        }

    def _login_keys(self, request: Request, identifier: str) -> tuple[str, str]:
        # A handle and its DID share one counter; anything else counts as typed.
        who = identifier.strip().lower()[:256]
        for account in self._service.accounts:
            if who in (account.handle.lower(), (account.did or "").lower()):
                who = f"account:{account.name}"
                break
        address = request.client.host if request.client else "unknown"
        return f"handle:{who}", f"addr:{address}"

    async def create_session(self, request: Request, body: CreateSessionInput) -> Response:
        keys_ = self._login_keys(request, body.identifier)
        wait = self.limiter.retry_after(*keys_)
        if wait is not None:
            return _rate_limited(wait)
        account = self._service.account_for_login(body.identifier, body.password)
        if account is None or not account.did:
            self.limiter.failed(*keys_)
            raise XrpcError(401, "AuthenticationRequired", "Invalid identifier or password")
        sid, jti = await self._sessions.create(account.did, account.password)
        return JSONResponse(self._session(account, sid, jti))

    async def refresh_session(self, request: Request) -> dict[str, Any]:
        claims = self._claims(request, REFRESH_SCOPE)
        account = self._repo(claims.did, "account")
        if claims.sid is None or claims.jti is None:
            raise XrpcError(400, "ExpiredToken", "Token has been revoked")
        # One use: the next refresh token replaces this one; a reused one ends it all.
        jti = await self._sessions.rotate(claims.sid, claims.jti, account.password)
        if jti is None:
            raise XrpcError(400, "ExpiredToken", "Token has been revoked")
        return self._session(account, claims.sid, jti)

    async def delete_session(self, request: Request) -> Response:
        # As on a PDS: called with the refresh token; an access token of the session
        # ends it too.
        token = bearer_token(request)
        scope = REFRESH_SCOPE if token and '"refresh+jwt"' in _jwt_header(token) else ACCESS_SCOPE
        claims = self._claims(request, scope)
        if claims.sid is not None:
            await self._sessions.revoke(claims.sid)
        return Response(status_code=200)

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
            "collections": await self._able(RepoCollections).collections(account.did),
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
        _no_swap_commit(body.swapCommit)
        collection = keys.validate_collection(body.collection)
        status = _validation(collection, body.validate_)
        rkey = body.rkey if body.rkey is not None else keys.new_tid()
        space, key = keys.split_repo_rkey(rkey)
        value = _typed(body.record, collection)
        rec = await self._store.create_record(did, space, collection, key, value)
        await self._space(did, space)
        return _write_result(rec, rkey, status)

    async def put_record(self, request: Request, body: PutRecordInput) -> dict[str, Any]:
        did = self._writer(request, body.repo)
        _no_swap_commit(body.swapCommit)
        collection = keys.validate_collection(body.collection)
        status = _validation(collection, body.validate_)
        space, key = keys.split_repo_rkey(body.rkey)
        value = _typed(body.record, collection)
        if body.swapRecord is None and "swapRecord" in body.model_fields_set:
            # An explicit null swap: the record must not exist yet (create-if-absent, as a
            # PDS reads it); a missing field is an unconditional put.
            try:
                rec = await self._store.create_record(did, space, collection, key, value)
            except recordstore.RecordExists:
                found = await self._store.get_record(did, space, collection, key)
                raise XrpcError(
                    400, "InvalidSwap", f"Record was at {found.cid if found else 'null'}"
                ) from None
        else:
            rec = await self._store.put_record(
                did, space, collection, key, value, swap_cid=body.swapRecord
            )
        await self._space(did, space)
        return _write_result(rec, body.rkey, status)

    async def delete_record(self, request: Request, body: DeleteRecordInput) -> dict[str, Any]:
        did = self._writer(request, body.repo)
        _no_swap_commit(body.swapCommit)
        collection = keys.validate_collection(body.collection)
        space, key = keys.split_repo_rkey(body.rkey)
        await self._store.delete_record(did, space, collection, key, swap_cid=body.swapRecord)
        return {}

    async def apply_writes(self, request: Request, body: ApplyWritesInput) -> dict[str, Any]:
        """Creates, updates and deletes in one transaction: all of them, or none."""
        did = self._writer(request, body.repo)
        _no_swap_commit(body.swapCommit)
        writes: list[recordstore.Write] = []
        statuses: list[str | None] = []
        rkeys: list[str] = []
        for w in body.writes:
            collection = keys.validate_collection(w.collection)
            rkey = w.rkey if w.rkey is not None else keys.new_tid()
            space, key = keys.split_repo_rkey(rkey)
            rkeys.append(rkey)
            if isinstance(w, _ApplyDelete):
                writes.append(recordstore.Write("delete", space, collection, key))
                statuses.append(None)
                continue
            statuses.append(_validation(collection, body.validate_))
            op: Literal["create", "update"] = "create" if isinstance(w, _ApplyCreate) else "update"
            writes.append(
                recordstore.Write(op, space, collection, key, _typed(w.value, collection))
            )
        records = await self._able(BatchWrites).apply_writes(did, writes)
        results: list[dict[str, Any]] = []
        for w, rec, rkey, status in zip(writes, records, rkeys, statuses, strict=True):
            if rec is None:
                results.append({"$type": "com.atproto.repo.applyWrites#deleteResult"})
                continue
            await self._space(did, w.space)
            result = _write_result(rec, rkey, status)
            results.append({"$type": f"com.atproto.repo.applyWrites#{w.op}Result", **result})
        return {"results": results}

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
        guard = uploads.guard_for(self._service)
        try:
            # SPEC §12: two at once per account, the account's cap, 507 on a full disk.
            async with guard.slot(did):
                data = await request.body()
                if not data:
                    raise XrpcError(400, "InvalidRequest", "Request body is empty")
                if len(data) > MAX_BLOB_BYTES:
                    raise XrpcError(
                        413, "PayloadTooLarge", f"blobs may be at most {MAX_BLOB_BYTES} bytes"
                    )
                # The store types the blob from its bytes (the declared type is the
                # fallback) and answers the ref it stored.
                cap = uploads.storage_cap(self._service, did)
                mime = request.headers.get("content-type", "")
                blob = await guard.store(self._store, did, data, mime, cap)
        except uploads.UploadError as err:
            raise XrpcError(err.status, err.error, err.message) from None
        return {"blob": blob}

    async def get_blob(
        self, request: Request, did: Annotated[str, Query()], cid: Annotated[str, Query()]
    ) -> Response:
        account = self._account(did)
        if account is None:
            raise XrpcError(400, "RepoNotFound", f"Could not find repo for DID: {did}")
        self._reader(request, account)
        data = await self._store.get_blob(account.did, cid)
        info = await self._able(BlobTypes).blob_info(account.did, cid)
        headers = {**BLOB_HEADERS, "content-disposition": f'attachment; filename="{cid}"'}
        return Response(data, media_type=info[0] if info else OCTET_STREAM, headers=headers)

    # -- identity ----------------------------------------------------------------------------

    async def resolve_handle(self, handle: Annotated[str, Query()]) -> dict[str, Any]:
        """The DID of a configured account's handle (the only handles this server knows)."""
        if "." not in handle or handle.startswith("did:"):
            raise XrpcError(
                400, "InvalidRequest", f"Error: handle must be a valid handle: {handle}"
            )
        wanted = handle.lower()
        for account in self._service.accounts:
            if account.did and account.handle.lower() == wanted:
                return {"did": account.did}
        raise XrpcError(400, "HandleNotFound", "Unable to resolve handle")


# -- helpers -------------------------------------------------------------------------------


def _rate_limited(wait: float) -> JSONResponse:
    seconds = max(1, math.ceil(wait))
    return JSONResponse(
        {
            "error": "RateLimitExceeded",
            "message": f"too many failed logins; try again in {seconds} s",
        },
        status_code=429,
        headers={"Retry-After": str(seconds)},
    )


def _jwt_header(token: str) -> str:
    head = token.split(".", 1)[0]
    try:
        return base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return ""


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


def _no_swap_commit(swap_commit: str | None) -> None:
    # The local store has records but no repo commits: a swap on one cannot hold.
    if swap_commit is not None:
        raise XrpcError(400, "InvalidRequest", SWAP_COMMIT)


def _validation(collection: str, validate: bool | None) -> str | None:
    """The ``validationStatus`` a write will answer, as a PDS decides it.

    Every write is checked against turnd's lexicons whatever ``validate`` says (the
    store holds only records turnd can read), so a collection turnd has a lexicon for
    is ``valid``. Others get the data-model checks only: ``unknown``, or refused when
    the client asked for validation.
    """
    if has_lexicon(collection):
        return "valid"
    if validate is True:
        raise XrpcError(400, "InvalidRequest", f"Unknown lexicon type: {collection}")
    return None if validate is False else "unknown"


def _write_result(rec: recordstore.Record, rkey: str, status: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"uri": f"at://{rec.did}/{rec.collection}/{rkey}", "cid": rec.cid}
    if status is not None:
        out["validationStatus"] = status
    return out


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
    if isinstance(store, RepoLister):
        return await store.list_repo_records(
            did, collection, cursor=cursor, limit=limit, reverse=reverse
        )
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
