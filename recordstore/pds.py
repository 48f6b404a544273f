"""The record store on a real atproto PDS, over XRPC with the ``atproto`` SDK.

Each served account logs in with an app password (its sessions:
:mod:`recordstore.pds_auth`; its blobs: :mod:`recordstore.pds_blobs`). Records live in the
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
from typing import Any, Protocol

import anyio
import httpx
from atproto_client.exceptions import BadRequestError, RequestErrorBase
from atproto_client.models.dot_dict import DotDict

from recordstore import Change, Record, RecordStore
from recordstore.errors import InvalidSwap, RecordExists, StoreError
from recordstore.firehose import FeedAccount, PdsFeed
from recordstore.keys import repo_rkey, validate_collection, validate_space_key
from recordstore.pds_auth import PdsAccount, PdsSession, PdsSessions
from recordstore.pds_blobs import PdsBlobs
from recordstore.pds_errors import describe, error_name, store_error, transient
from recordstore.stored_json import compact
from recordstore.write import MAX_RECORD_BYTES, prepare_write

__all__ = ["MAX_RECORD_BYTES", "PdsAccount", "PdsLogin", "PdsStore", "open_pds_store"]

log = logging.getLogger(__name__)

_PAGE = 100  # listRecords' largest page
# create_record: how often a write that left nothing behind is tried again, and how often
# the read-back after a failed write is tried before the outcome counts as unknown.
_CREATE_TRIES = 3
_READBACK_TRIES = 5
# put_record with a swap: how long an unreachable PDS (or its 5xx) is retried.
_PUT_RETRY_SECONDS = 60.0


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
        self.sweep_interval = sweep_interval
        self._sessions = PdsSessions(accounts, request_timeout=request_timeout)
        self._http = httpx.AsyncClient(timeout=request_timeout)
        self._blobs = PdsBlobs(self._sessions, self._http)

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
            await store._sessions.first_logins()
        except BaseException:
            await store.aclose()
            raise
        return store

    async def aclose(self) -> None:
        await self._sessions.aclose()
        await self._http.aclose()

    # --- sessions (recordstore.pds_auth) ---------------------------------------------

    @property
    def dids(self) -> list[str]:
        """The DIDs served (of the accounts logged in so far)."""
        return self._sessions.dids

    def known_dids(self) -> dict[str, str]:
        """Login identifier -> DID, for the accounts logged in (:class:`~recordstore.abilities.KnownDids`)."""
        return self._sessions.known_dids()

    def feed_accounts(self) -> list[PdsSession]:
        """The accounts the change feed follows (:class:`recordstore.firehose.FeedSource`)."""
        return list(self._sessions.all)

    async def log_in(self, account: FeedAccount) -> None:
        assert isinstance(account, PdsSession), account  # one of feed_accounts()
        await self._sessions.login(account)

    async def _session_for(self, did: str) -> PdsSession:
        return await self._sessions.session_for(did)

    # --- records ------------------------------------------------------------------

    async def create_space(self, did: str, space_type: str, skey: str) -> None:
        # A classic repo has no spaces: a space exists as its records' key range.
        validate_collection(space_type)
        validate_space_key(skey)
        await self._session_for(did)

    async def get_record(self, did: str, space: str, collection: str, key: str) -> Record | None:
        rkey = repo_rkey(space, key)
        validate_collection(collection)
        try:
            out = await self._sessions.call(
                did,
                "query",
                "com.atproto.repo.getRecord",
                params=DotDict({"repo": did, "collection": collection, "rkey": rkey}),
            )
        except RequestErrorBase as e:
            if error_name(e) == "RecordNotFound":
                return None
            raise store_error(e, f"getRecord {collection}/{rkey}") from None
        return Record(did, space, collection, key, out["cid"], out["value"])

    async def _list_records(
        self, did: str, space: str, collection: str, cursor: str | None, limit: int, reverse: bool
    ) -> tuple[list[Record], str | None]:
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
            return await self._sessions.call(
                did, "query", "com.atproto.repo.listRecords", params=DotDict(params)
            )
        except RequestErrorBase as e:
            raise store_error(e, f"listRecords {collection}") from None

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
            out = await self._sessions.call(
                did, "query", "com.atproto.sync.getLatestCommit", params=DotDict({"did": did})
            )
        except RequestErrorBase as e:
            raise store_error(e, "getLatestCommit") from None
        return str(out["rev"])

    async def create_record(
        self, did: str, space: str, collection: str, key: str, value: dict[str, Any]
    ) -> Record:
        rkey = repo_rkey(space, key)
        # The PDS checks blob references itself (BlobNotFound, InvalidMimeType, ...).
        w = await prepare_write(collection, value)
        value, cid = w.value, w.cid
        payload = compact(
            {"repo": did, "collection": collection, "rkey": rkey, "record": value}
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
        raise store_error(last_error, f"createRecord {collection}/{rkey}")

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
            f"({describe(cause) if cause else 'no answer'}; the key could not be read back)"
        )

    async def _put_record(
        self, did: str, space: str, collection: str, key: str, value: dict[str, Any],
        swap: str | None,
    ) -> Record:
        rkey = repo_rkey(space, key)
        w = await prepare_write(collection, value)
        value, cid = w.value, w.cid
        body: dict[str, Any] = {
            "repo": did,
            "collection": collection,
            "rkey": rkey,
            "record": value,
        }
        if swap is not None:
            body["swapRecord"] = swap
        payload = compact(body).encode()
        # A put with a swap is safe to send again: a replay cannot overwrite someone
        # else's write, and one that landed although its answer was lost shows as our
        # CID on read-back. So while the PDS is unreachable (restarting, say) it is tried
        # for a while — the turn engine's final write must not leave a reply `pending`.
        deadline = anyio.current_time() + (_PUT_RETRY_SECONDS if swap is not None else 0)
        delay = 0.25
        retried = False
        while True:
            try:
                await self._post(did, "com.atproto.repo.putRecord", payload)
                return Record(did, space, collection, key, cid, value)
            except RequestErrorBase as e:
                if error_name(e) == "InvalidSwap":
                    if retried:
                        found = await self.get_record(did, space, collection, key)
                        if found is not None and found.cid == cid:
                            return found  # an earlier try landed
                    raise InvalidSwap(f"{collection}/{rkey} is not at {swap}") from None
                if not transient(e) or anyio.current_time() + delay > deadline:
                    raise store_error(e, f"putRecord {collection}/{rkey}") from None
                if not retried:
                    log.warning("putRecord %s/%s: %s; retrying", collection, rkey, describe(e))
                retried = True
            await anyio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def delete_record(
        self, did: str, space: str, collection: str, key: str, *, swap_cid: str | None = None
    ) -> None:
        rkey = repo_rkey(space, key)
        validate_collection(collection)
        body: dict[str, Any] = {"repo": did, "collection": collection, "rkey": rkey}
        if swap_cid is not None:
            body["swapRecord"] = swap_cid
        try:
            await self._post(did, "com.atproto.repo.deleteRecord", json.dumps(body).encode())
        except RequestErrorBase as e:
            if error_name(e) == "InvalidSwap":
                # As the local store: deleting an absent record is a no-op, even with a swap.
                if await self.get_record(did, space, collection, key) is None:
                    return
                raise InvalidSwap(f"{collection}/{rkey} is not at {swap_cid}") from None
            raise store_error(e, f"deleteRecord {collection}/{rkey}") from None

    async def _post(self, did: str, nsid: str, payload: bytes) -> dict[str, Any]:
        out = await self._sessions.call(
            did, "procedure", nsid, content=payload, headers={"Content-Type": "application/json"}
        )
        return out if isinstance(out, dict) else {}

    # --- blobs (recordstore.pds_blobs) ----------------------------------------------

    async def upload_blob(self, did: str, data: bytes, mime_type: str) -> dict[str, Any]:
        return await self._blobs.upload(did, data, mime_type)

    async def get_blob(self, did: str, cid: str) -> bytes:
        return await self._blobs.get(did, cid)

    # --- the change feed --------------------------------------------------------------

    def changes(self, cursor: str | None = None) -> AbstractAsyncContextManager[AsyncIterator[Change]]:
        return PdsFeed(self, sweep_interval=self.sweep_interval).changes(cursor)


class PdsLogin(Protocol):
    """An account as the daemon's config holds it (``[accounts.X]``)."""

    @property
    def handle(self) -> str: ...
    @property
    def password(self) -> str | None:
        """The app password."""
        ...
    @property
    def did(self) -> str | None: ...


async def open_pds_store(service: str | None, accounts: Iterable[PdsLogin]) -> PdsStore:
    """Open the store from the daemon's config: ``[store] service`` and its accounts."""
    if not service:
        raise StoreError('store.service: required when store.kind is "pds"')
    pds_accounts = []
    for a in accounts:
        if not a.password:
            raise StoreError(f"account {a.handle}: a pds store needs its app password")
        login = PdsAccount(a.did or a.handle, password=a.password, service=service, did=a.did)
        pds_accounts.append(login)
    return await PdsStore.open(pds_accounts)
