"""``com.atproto.repo.*``: records in the classic-repo layout (rkey ``<skey>:<key>``, SPEC §3).

Writes need an access token of the repo's owner; reads follow SPEC §12's privacy
(:mod:`daemon.xrpc_access`). Every write is checked against turnd's lexicons,
and a record's ``$type`` is filled in as a PDS does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from fastapi import Query, Request
from pydantic import BaseModel, ConfigDict, Field

import recordstore
from daemon.accounts import Account
from daemon.xrpc_access import XrpcAccess
from daemon.xrpc_errors import XrpcError, invalid_request, not_served
from recordstore import keys
from recordstore.abilities import BatchWrites, RepoCollections, RepoLister, RepoPage
from recordstore.lexicon import has_lexicon

__all__ = ["RepoMethods"]

log = logging.getLogger("turnd.xrpc")

SWAP_COMMIT = "swapCommit is not supported by this store"


class _Input(BaseModel):
    # Lexicon inputs are open: unknown fields pass, as on a PDS.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


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


class RepoMethods:
    def __init__(self, access: XrpcAccess) -> None:
        self._access = access

    @property
    def _store(self) -> recordstore.RecordStore:
        return self._access.service.store

    async def describe_repo(
        self, request: Request, repo: Annotated[str, Query()]
    ) -> dict[str, Any]:
        account = self._access.repo(repo, "user")
        self._access.reader(request, account)
        if not isinstance(store := self._store, RepoCollections):
            raise not_served()
        return {
            "handle": account.handle,
            "did": account.did,
            "didDoc": _did_doc(account, str(request.base_url).rstrip("/")),
            "collections": await store.collections(_did(account)),
            "handleIsCorrect": True,
        }

    async def _answer(self, written: Iterable[tuple[recordstore.Op, recordstore.Record]]) -> None:
        """Start the turns the written messages ask for, as the change feed would, and
        return once each is claimed (or queued): the write is answered after its claim,
        as a POST is. The turn then waits neither for the feed to read the write back nor
        for the write's answer to go out (on loopback that send can give the client the
        daemon's core for ~0.5 ms). The feed still sees the write and finds the turn
        started; it starts any turn that could not be started here."""
        messages = [(op, rec) for op, rec in written if rec.collection == recordstore.MESSAGE]
        if not messages:
            return
        service = self._access.service
        owners = service.owners()
        for op, rec in messages:
            change = recordstore.Change(
                rec.did, rec.space, rec.collection, rec.key, op, rec.cid, rec.value, None,
                cursor="", live=True,
            )
            try:
                await service.engine.on_written(change, owners, here=True)
            except Exception as err:  # noqa: BLE001 - the write stands; the feed retries
                log.warning("could not start the turn of %s/%s: %s", rec.space, rec.key, err)

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
        did = self._access.writer(request, body.repo)
        _no_swap_commit(body.swapCommit)
        collection = keys.validate_collection(body.collection)
        status = _validation(collection, body.validate_)
        rkey = body.rkey if body.rkey is not None else keys.new_tid()
        space, key = keys.split_repo_rkey(rkey)
        value = _typed(body.record, collection)
        rec = await self._store.create_record(did, space, collection, key, value)
        await self._answer([("create", rec)])
        await self._space(did, space)
        return _write_result(rec, rkey, status)

    async def put_record(self, request: Request, body: PutRecordInput) -> dict[str, Any]:
        did = self._access.writer(request, body.repo)
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
        await self._answer([("update", rec)])
        await self._space(did, space)
        return _write_result(rec, body.rkey, status)

    async def delete_record(self, request: Request, body: DeleteRecordInput) -> dict[str, Any]:
        did = self._access.writer(request, body.repo)
        _no_swap_commit(body.swapCommit)
        collection = keys.validate_collection(body.collection)
        space, key = keys.split_repo_rkey(body.rkey)
        await self._store.delete_record(did, space, collection, key, swap_cid=body.swapRecord)
        return {}

    async def apply_writes(self, request: Request, body: ApplyWritesInput) -> dict[str, Any]:
        """Creates, updates and deletes in one transaction: all of them, or none."""
        did = self._access.writer(request, body.repo)
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
        if not isinstance(store := self._store, BatchWrites):
            raise not_served()
        records = await store.apply_writes(did, writes)
        await self._answer((w.op, r) for w, r in zip(writes, records, strict=True) if r is not None)
        results: list[dict[str, Any]] = []
        for write, rec, rkey, status in zip(writes, records, rkeys, statuses, strict=True):
            if rec is None:
                results.append({"$type": "com.atproto.repo.applyWrites#deleteResult"})
                continue
            await self._space(did, write.space)
            result = _write_result(rec, rkey, status)
            results.append({"$type": f"com.atproto.repo.applyWrites#{write.op}Result", **result})
        return {"results": results}

    async def get_record(
        self,
        request: Request,
        repo: Annotated[str, Query()],
        collection: Annotated[str, Query()],
        rkey: Annotated[str, Query()],
        cid: Annotated[str | None, Query()] = None,
    ) -> dict[str, Any]:
        account = self._access.repo(repo)
        self._access.reader(request, account)
        keys.validate_collection(collection)
        space, key = keys.split_repo_rkey(rkey)
        did = _did(account)
        rec = await self._store.get_record(did, space, collection, key)
        uri = f"at://{did}/{collection}/{rkey}"
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
        account = self._access.repo(repo)
        self._access.reader(request, account)
        keys.validate_collection(collection)
        did = _did(account)
        records, next_cursor = await _list_repo(
            self._store, did, collection, limit=limit, cursor=cursor, reverse=reverse
        )
        out: dict[str, Any] = {
            "records": [
                {
                    "uri": f"at://{did}/{collection}/{keys.repo_rkey(r.space, r.key)}",
                    "cid": r.cid,
                    "value": r.value,
                }
                for r in records
            ]
        }
        if next_cursor is not None:
            out["cursor"] = next_cursor
        return out


def _did(account: Account) -> str:
    # XrpcAccess finds only accounts that have their DID.
    assert account.did is not None
    return account.did


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
        raise invalid_request(SWAP_COMMIT)


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
        raise invalid_request(f"Unknown lexicon type: {collection}")
    return None if validate is False else "unknown"


def _write_result(rec: recordstore.Record, rkey: str, status: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"uri": f"at://{rec.did}/{rec.collection}/{rkey}", "cid": rec.cid}
    if status is not None:
        out["validationStatus"] = status
    return out


def _did_doc(account: Account, endpoint: str) -> dict[str, Any]:
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
        return await store.list_repo_records(did, RepoPage(collection, cursor, limit, reverse))
    if cursor is None or ":" not in cursor:
        raise invalid_request(
            "this store lists one space at a time: pass cursor '<skey>:' "
            "(with reverse=true for key order)"
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
