"""The record store on a real atproto PDS, over XRPC with the ``atproto`` SDK.

Each served account logs in with an app password (``createSession``); the SDK's
``AsyncClient`` refreshes the access token before it expires, and a session whose refresh
token is gone (expired, revoked) is replaced by a new login. Records live in the
classic-repo layout (:func:`recordstore.keys.repo_rkey`): the space key and the key within
it joined as ``<space>:<key>``, so one space is one contiguous range of record keys.

What the reference PDS does that shapes this module (SPEC §4):

- ``createRecord`` at a taken key fails with a bare HTTP 500, not a named error, and
  ``putRecord`` without a swap overwrites. So :meth:`PdsStore.create_record` reads the key
  back after *any* failure and compares CIDs: our CID means our write landed (the error
  came after it, e.g. a lost response), another CID means the key is taken
  (:class:`RecordExists`), nothing means the write did not happen (retried, then
  :class:`StoreError`). A network error is never taken for "taken". This is sound only if
  two writers never create byte-identical records at one key: callers that race for a key
  (the turn engine's claim) must put something writer-unique into the record.
- ``validate: true`` on an unpublished lexicon is refused, so turnd validates every write
  itself (:func:`recordstore.lexicon.validate_record`) and sends ``validate`` unset.

The change feed is :mod:`recordstore.firehose`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from atproto_client import AsyncClient
from atproto_client.exceptions import (
    BadRequestError,
    LoginRequiredError,
    NetworkError,
    RequestErrorBase,
    UnauthorizedError,
)
from atproto_client.models.dot_dict import DotDict
from atproto_client.request import AsyncRequest

from recordstore import (
    BlobNotFound,
    Change,
    InvalidRecord,
    InvalidSwap,
    Record,
    RecordExists,
    RecordStore,
    StoreError,
)
from recordstore.firehose import FeedAccount, PdsFeed
from recordstore.keys import (
    repo_rkey,
    validate_collection,
    validate_did,
    validate_key,
    validate_space_key,
)
from recordstore.write import MAX_RECORD_BYTES, BlobRefError, prepare_write

__all__ = ["MAX_RECORD_BYTES", "PdsAccount", "PdsStore", "open_pds_store"]

log = logging.getLogger(__name__)

_PAGE = 100  # listRecords' largest page
_TOKEN_ERRORS = {"ExpiredToken", "InvalidToken", "AuthenticationRequired", "AuthMissing"}
# create_record: how often a write that left nothing behind is tried again, and how often
# the read-back after a failed write is tried before the outcome counts as unknown.
_CREATE_TRIES = 3
_READBACK_TRIES = 5
# put_record with a swap: how long an unreachable PDS (or its 5xx) is retried.
_PUT_RETRY_SECONDS = 60.0


@dataclass(slots=True)
class PdsAccount:
    """One account turnd serves on a PDS.

    ``service`` is where it logs in (its PDS, or an entryway); after login the SDK talks to
    the PDS named in the account's DID document. ``password`` is an app password.
    """

    identifier: str  # handle or DID
    password: str = field(repr=False)
    service: str
    did: str | None = None


@dataclass(slots=True)
class _Session:
    account: PdsAccount
    client: AsyncClient
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    logged_in: bool = False

    @property
    def did(self) -> str | None:
        return self.account.did

    @property
    def identifier(self) -> str:
        return self.account.identifier

    @property
    def endpoint(self) -> str:
        """The PDS this account's records are on (known after login)."""
        session = self.client._session  # the SDK keeps the DID document's PDS there
        if session is not None and session.pds_endpoint:
            return session.pds_endpoint.rstrip("/").removesuffix("/xrpc")
        return self.account.service.rstrip("/")


class PdsStore(RecordStore):
    """Accounts on one or more PDSes as a :class:`RecordStore`.

    Open with ``await PdsStore.open(accounts)`` (or ``async with``); ``sweep_interval``
    is how often the change feed checks each repo for what the firehose may have missed.
    """

    def __init__(
        self,
        accounts: Sequence[PdsAccount],
        *,
        request_timeout: float = 30.0,
        sweep_interval: float = 60.0,
    ) -> None:
        if not accounts:
            raise StoreError("a pds store needs at least one account")
        self._timeout = request_timeout
        self.sweep_interval = sweep_interval
        self._sessions: list[_Session] = [
            _Session(a, AsyncClient(a.service, request=AsyncRequest(timeout=request_timeout)))
            for a in accounts
        ]
        self._http = httpx.AsyncClient(timeout=request_timeout)
        self._by_did: dict[str, _Session] = {}
        for s in self._sessions:
            if s.account.did:
                self._by_did[validate_did(s.account.did)] = s

    @classmethod
    async def open(
        cls,
        accounts: Sequence[PdsAccount],
        *,
        request_timeout: float = 30.0,
        sweep_interval: float = 60.0,
    ) -> PdsStore:
        """Log every account in. Rejected credentials are an error; an unreachable PDS is
        not (its accounts log in on first use), so one PDS being down stops nobody else."""
        store = cls(accounts, request_timeout=request_timeout, sweep_interval=sweep_interval)
        try:
            async with anyio.create_task_group() as tg:
                for s in store._sessions:
                    tg.start_soon(store._first_login, s)
        except BaseException:
            await store.aclose()
            raise
        return store

    async def _first_login(self, s: _Session) -> None:
        try:
            await self._login(s)
        except (NetworkError, httpx.TransportError) as e:
            log.warning(
                "%s: PDS %s unreachable, will retry: %s", s.account.identifier, s.account.service, e
            )

    async def aclose(self) -> None:
        for s in self._sessions:
            await s.client.request.close()
        await self._http.aclose()

    # --- sessions -----------------------------------------------------------------

    @property
    def dids(self) -> list[str]:
        """The DIDs served (of the accounts logged in so far)."""
        return list(self._by_did)

    def sessions(self) -> list[_Session]:
        return list(self._sessions)

    def known_dids(self) -> dict[str, str]:
        """Login identifier -> DID, for the accounts logged in (:class:`~recordstore.abilities.KnownDids`)."""
        return {s.account.identifier: s.account.did for s in self._sessions if s.account.did}

    def feed_accounts(self) -> list[_Session]:
        """The accounts the change feed follows (:class:`recordstore.firehose.FeedSource`)."""
        return list(self._sessions)

    async def log_in(self, account: FeedAccount) -> None:
        assert isinstance(account, _Session), account  # one of feed_accounts()
        await self._login(account)

    async def _login(self, s: _Session) -> None:
        async with s.lock:
            await self._login_locked(s)

    async def _login_locked(self, s: _Session) -> None:
        try:
            await s.client.login(s.account.identifier, s.account.password, fetch_bsky_profile=False)
        except (BadRequestError, UnauthorizedError) as e:
            raise StoreError(f"{s.account.identifier}: login refused: {_describe(e)}") from None
        session = s.client._session
        assert session is not None
        if s.account.did and session.did != s.account.did:
            raise StoreError(
                f"{s.account.identifier}: logged in as {session.did}, configured {s.account.did}"
            )
        s.account.did = session.did
        self._by_did[session.did] = s
        s.logged_in = True

    async def _session_for(self, did: str) -> _Session:
        validate_did(did)
        s = self._by_did.get(did)
        if s is None:
            # An account whose PDS was down at open may be this DID: try them now.
            for pending in self._sessions:
                if not pending.logged_in and pending.account.did in (None, did):
                    try:
                        await self._login(pending)
                    except (NetworkError, httpx.TransportError):
                        continue
            s = self._by_did.get(did)
        if s is None:
            raise StoreError(f"{did} is not an account this store serves")
        if not s.logged_in:
            await self._login(s)
        return s

    async def _call(self, did: str, kind: str, nsid: str, **kwargs: Any) -> Any:
        """One XRPC call as ``did``; a dead session (refresh token gone) logs in again."""
        s = await self._session_for(did)
        for attempt in (1, 2):
            try:
                if kind == "query":
                    resp = await s.client.invoke_query(nsid, **kwargs)
                else:
                    resp = await s.client.invoke_procedure(nsid, **kwargs)
                return resp.content
            except (LoginRequiredError, BadRequestError, UnauthorizedError) as e:
                if attempt == 2 or not (
                    isinstance(e, LoginRequiredError) or _error_name(e) in _TOKEN_ERRORS
                ):
                    raise
                log.info("%s: session ended (%s), logging in again", did, _describe(e))
                await self._login(s)
        raise AssertionError("unreachable")

    # --- records ------------------------------------------------------------------

    async def create_space(self, did: str, space_type: str, skey: str) -> None:
        # A classic repo has no spaces: a space exists as its records' key range.
        validate_collection(space_type)
        validate_space_key(skey)
        await self._session_for(did)

    async def get_record(self, did: str, space: str, collection: str, key: str) -> Record | None:
        rkey = _rkey(space, key)
        validate_collection(collection)
        try:
            out = await self._call(
                did,
                "query",
                "com.atproto.repo.getRecord",
                params=DotDict({"repo": did, "collection": collection, "rkey": rkey}),
            )
        except RequestErrorBase as e:
            if _error_name(e) == "RecordNotFound":
                return None
            raise _store_error(e, f"getRecord {collection}/{rkey}") from None
        return Record(did, space, collection, key, out["cid"], out["value"])

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
        validate_space_key(space)
        validate_collection(collection)
        if cursor is not None:
            validate_key(cursor, "cursor")
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        prefix = f"{space}:"
        # The PDS lists ascending with reverse=true, from just after its cursor; descending
        # otherwise, from just before it. ';' is the character after ':', so "<space>;"
        # starts a descending scan at the space's last key.
        if cursor is not None:
            pds_cursor = prefix + cursor
        else:
            pds_cursor = prefix if not reverse else f"{space};"
        records: list[Record] = []
        more = False
        while True:
            out = await self._list(did, collection, pds_cursor, _PAGE, ascending=not reverse)
            page = out.get("records", [])
            for item in page:
                rkey = item["uri"].rsplit("/", 1)[1]
                if not rkey.startswith(prefix):
                    page = []  # left the space's key range: no more
                    break
                if len(records) == limit:
                    more = True
                    break
                records.append(
                    Record(did, space, collection, rkey[len(prefix) :], item["cid"], item["value"])
                )
            if more or not page or not out.get("cursor") or len(out["records"]) < _PAGE:
                break
            pds_cursor = out["cursor"]
        return records, (records[-1].key if more else None)

    async def _list(
        self, did: str, collection: str, cursor: str | None, limit: int, *, ascending: bool
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"repo": did, "collection": collection, "limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        if ascending:
            params["reverse"] = True
        try:
            return await self._call(
                did, "query", "com.atproto.repo.listRecords", params=DotDict(params)
            )
        except RequestErrorBase as e:
            raise _store_error(e, f"listRecords {collection}") from None

    async def iter_repo(
        self, did: str, collection: str
    ) -> AsyncIterator[tuple[str, str, dict[str, Any]]]:
        """Every record of ``collection`` in the repo, in key order: ``(rkey, cid, value)``."""
        cursor: str | None = None
        while True:
            out = await self._list(did, collection, cursor, _PAGE, ascending=True)
            for item in out.get("records", []):
                yield item["uri"].rsplit("/", 1)[1], item["cid"], item["value"]
            cursor = out.get("cursor")
            if not cursor or len(out.get("records", [])) < _PAGE:
                return

    async def latest_rev(self, did: str) -> str:
        """The repo's current revision (a TID), for the change feed's gap check."""
        try:
            out = await self._call(
                did, "query", "com.atproto.sync.getLatestCommit", params=DotDict({"did": did})
            )
        except RequestErrorBase as e:
            raise _store_error(e, "getLatestCommit") from None
        return str(out["rev"])

    async def create_record(
        self, did: str, space: str, collection: str, key: str, value: dict[str, Any]
    ) -> Record:
        rkey = _rkey(space, key)
        # The PDS checks blob references itself (BlobNotFound, InvalidMimeType, ...).
        w = await prepare_write(collection, value)
        value, cid = w.value, w.cid
        payload = json.dumps(
            {"repo": did, "collection": collection, "rkey": rkey, "record": value},
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode()
        last_error: Exception | None = None
        for attempt in range(_CREATE_TRIES):
            if attempt:
                await anyio.sleep(0.2 * 2**attempt)
            try:
                out = await self._post(did, "com.atproto.repo.createRecord", payload)
            except RequestErrorBase as e:
                # Whatever the error, only the key's content tells what happened.
                last_error = e
            else:
                if out.get("cid") != cid:  # pragma: no cover - a PDS that encodes differently
                    raise StoreError(
                        f"PDS stored {collection}/{rkey} as {out.get('cid')}, turnd computed {cid}"
                    )
                return Record(did, space, collection, key, cid, value)
            found = await self._read_back(did, space, collection, key, last_error)
            if found is not None:
                if found.cid == cid:
                    return Record(did, space, collection, key, cid, value)  # ours landed
                raise RecordExists(f"{collection}/{rkey} already exists")
            if isinstance(last_error, BadRequestError):
                break  # refused, and nothing is there: trying again will not help
        assert last_error is not None
        raise _store_error(last_error, f"createRecord {collection}/{rkey}")

    async def _read_back(
        self, did: str, space: str, collection: str, key: str, cause: Exception | None
    ) -> Record | None:
        for attempt in range(_READBACK_TRIES):
            if attempt:
                await anyio.sleep(0.1 * 2**attempt)
            try:
                return await self.get_record(did, space, collection, key)
            except StoreError as e:
                log.warning("read-back of %s/%s:%s failed: %s", collection, space, key, e)
        raise StoreError(
            f"createRecord {collection}/{space}:{key}: outcome unknown "
            f"({_describe(cause) if cause else 'no answer'}; the key could not be read back)"
        )

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
        rkey = _rkey(space, key)
        w = await prepare_write(collection, value)
        value, cid = w.value, w.cid
        body: dict[str, Any] = {
            "repo": did,
            "collection": collection,
            "rkey": rkey,
            "record": value,
        }
        if swap_cid is not None:
            body["swapRecord"] = swap_cid
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        # A put with a swap is safe to send again: a replay cannot overwrite someone
        # else's write, and one that landed although its answer was lost shows as our
        # CID on read-back. So while the PDS is unreachable (restarting, say) it is tried
        # for a while — the turn engine's final write must not leave a reply `pending`.
        deadline = anyio.current_time() + (_PUT_RETRY_SECONDS if swap_cid is not None else 0)
        delay = 0.25
        retried = False
        while True:
            try:
                await self._post(did, "com.atproto.repo.putRecord", payload)
                return Record(did, space, collection, key, cid, value)
            except RequestErrorBase as e:
                if _error_name(e) == "InvalidSwap":
                    if retried:
                        found = await self.get_record(did, space, collection, key)
                        if found is not None and found.cid == cid:
                            return found  # an earlier try landed
                    raise InvalidSwap(f"{collection}/{rkey} is not at {swap_cid}") from None
                if not _transient(e) or anyio.current_time() + delay > deadline:
                    raise _store_error(e, f"putRecord {collection}/{rkey}") from None
                if not retried:
                    log.warning("putRecord %s/%s: %s; retrying", collection, rkey, _describe(e))
                retried = True
            await anyio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def delete_record(
        self, did: str, space: str, collection: str, key: str, *, swap_cid: str | None = None
    ) -> None:
        rkey = _rkey(space, key)
        validate_collection(collection)
        body: dict[str, Any] = {"repo": did, "collection": collection, "rkey": rkey}
        if swap_cid is not None:
            body["swapRecord"] = swap_cid
        try:
            await self._post(did, "com.atproto.repo.deleteRecord", json.dumps(body).encode())
        except RequestErrorBase as e:
            if _error_name(e) == "InvalidSwap":
                # As the local store: deleting an absent record is a no-op, even with a swap.
                if await self.get_record(did, space, collection, key) is None:
                    return
                raise InvalidSwap(f"{collection}/{rkey} is not at {swap_cid}") from None
            raise _store_error(e, f"deleteRecord {collection}/{rkey}") from None

    async def _post(self, did: str, nsid: str, payload: bytes) -> dict[str, Any]:
        out = await self._call(
            did, "procedure", nsid, content=payload, headers={"Content-Type": "application/json"}
        )
        return out if isinstance(out, dict) else {}

    # --- blobs ----------------------------------------------------------------------

    async def upload_blob(self, did: str, data: bytes, mime_type: str) -> dict[str, Any]:
        if not isinstance(mime_type, str) or "/" not in mime_type:
            raise StoreError(f"invalid blob mime type {mime_type!r}")
        try:
            out = await self._call(
                did,
                "procedure",
                "com.atproto.repo.uploadBlob",
                content=bytes(data),
                headers={"Content-Type": mime_type},
            )
        except RequestErrorBase as e:
            raise _store_error(e, "uploadBlob") from None
        blob = out["blob"]
        return {
            "$type": "blob",
            "ref": {"$link": blob["ref"]["$link"]},
            "mimeType": blob["mimeType"],
            "size": blob["size"],
        }

    async def get_blob(self, did: str, cid: str) -> bytes:
        s = await self._session_for(did)
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

    # --- the change feed --------------------------------------------------------------

    def changes(self, cursor: str | None = None) -> AbstractAsyncContextManager[AsyncIterator[Change]]:
        return PdsFeed(self, sweep_interval=self.sweep_interval).changes(cursor)


async def open_pds_store(service: str | None, accounts: Iterable[Any]) -> PdsStore:
    """Open the store from the daemon's config: ``[store] service`` and its accounts
    (objects with ``handle``, ``password`` — the app password — and optional ``did``)."""
    if not service:
        raise StoreError('store.service: required when store.kind is "pds"')
    pds_accounts = []
    for a in accounts:
        if not getattr(a, "password", None):
            raise StoreError(f"account {a.handle}: a pds store needs its app password")
        pds_accounts.append(
            PdsAccount(
                identifier=getattr(a, "did", None) or a.handle,
                password=a.password,
                service=service,
                did=getattr(a, "did", None),
            )
        )
    return await PdsStore.open(pds_accounts)


# --- helpers ---------------------------------------------------------------------------


def _rkey(space: str, key: str) -> str:
    return repo_rkey(space, key)


def _error_name(e: BaseException) -> str | None:
    response = getattr(e, "response", None)
    content = getattr(response, "content", None)
    return getattr(content, "error", None)


def _transient(e: BaseException) -> bool:
    """The PDS could not be reached, or failed on its side: worth another try."""
    response = getattr(e, "response", None)
    if response is None:
        return isinstance(e, NetworkError)  # no answer: refused, reset, timed out
    return response.status_code >= 500  # (the SDK's NetworkError also covers 409 and 413)


def _describe(e: BaseException) -> str:
    response = getattr(e, "response", None)
    if response is None:
        cause = e.__cause__ or e.__context__
        return f"{type(e).__name__}: {cause or e}"
    content = getattr(response, "content", None)
    name = getattr(content, "error", None)
    message = getattr(content, "message", None)
    parts = [str(response.status_code), name, message]
    return " ".join(str(p) for p in parts if p)


_BLOB_ERRORS = {"BlobNotFound", "InvalidMimeType", "InvalidSize"}


def _store_error(e: BaseException, what: str) -> StoreError:
    response = getattr(e, "response", None)
    name = _error_name(e)
    if name in _BLOB_ERRORS:
        content = getattr(response, "content", None)
        return BlobRefError(str(name), str(getattr(content, "message", None) or name))
    if response is not None and response.status_code == 413:
        return InvalidRecord(f"{what}: too large for the PDS (413)")
    return StoreError(f"{what}: {_describe(e)}")
