"""The record store contract, run against both backends: local (SQLite) and pds (the
reference ``@atproto/pds``). What only one backend does (the local op log, the PDS's
read-back of a lost create, feeds) stays in tests/test_local_store.py and
tests/test_pds_store.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from recordstore import INFO, MESSAGE, BlobNotFound, InvalidSwap, RecordExists, RecordStore
from recordstore.cid import record_cid
from recordstore.keys import new_tid
from recordstore.local import LocalStore
from recordstore.pds import PdsAccount, PdsStore
from tests.support.records import stored_message as message

pytestmark = pytest.mark.anyio

SPACE = "3m2a4b5c6d7e2"
# The reference PDS gave this CID for the minimal message (tests/vectors/cids.json).
MINIMAL_CID = "bafyreidlpnm5ajxotpgxx4ob3t2d2ujwczow3lvpfzhzazo4ehjba6hbce"


@dataclass
class Backend:
    kind: str
    store: RecordStore
    did: str
    root: Path | None = None  # the local store's data directory


@pytest.fixture(params=["local", pytest.param("pds", marks=pytest.mark.pds)])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "local":
        async with LocalStore.open(tmp_path) as store:
            yield Backend("local", store, "did:plc:alice", tmp_path)
        return
    pds = request.getfixturevalue("pds")
    account = request.getfixturevalue("pds_account")
    login = PdsAccount(identifier=account.handle, password=account.app_password, service=pds.url)
    async with await PdsStore.open([login], sweep_interval=0.5) as store:
        yield Backend("pds", store, account.did)




async def test_create_get_and_cid_as_a_pds(backend: Backend) -> None:
    store, did = backend.store, backend.did
    without_type = {k: v for k, v in message().items() if k != "$type"}
    rec = await store.create_record(did, SPACE, MESSAGE, "k1", without_type)
    assert rec.cid == MINIMAL_CID
    assert rec.value["$type"] == MESSAGE
    assert await store.get_record(did, SPACE, MESSAGE, "k1") == rec
    assert await store.get_record(did, SPACE, MESSAGE, "k2") is None


async def test_create_is_create_only(backend: Backend) -> None:
    store, did = backend.store, backend.did
    first = await store.create_record(did, SPACE, MESSAGE, "k", message("one"))
    with pytest.raises(RecordExists):
        await store.create_record(did, SPACE, MESSAGE, "k", message("two"))
    assert await store.get_record(did, SPACE, MESSAGE, "k") == first


async def test_put_and_swap(backend: Backend) -> None:
    store, did = backend.store, backend.did
    with pytest.raises(InvalidSwap):  # a swap on an absent record is a mismatch
        await store.put_record(did, SPACE, MESSAGE, "k", message(), swap_cid=record_cid(message()))
    assert await store.get_record(did, SPACE, MESSAGE, "k") is None
    one = await store.put_record(did, SPACE, MESSAGE, "k", message("one"))
    with pytest.raises(InvalidSwap):
        await store.put_record(
            did, SPACE, MESSAGE, "k", message("two"), swap_cid=record_cid(message("x"))
        )
    assert await store.get_record(did, SPACE, MESSAGE, "k") == one
    two = await store.put_record(did, SPACE, MESSAGE, "k", message("two"), swap_cid=one.cid)
    assert await store.get_record(did, SPACE, MESSAGE, "k") == two


async def test_delete(backend: Backend) -> None:
    store, did = backend.store, backend.did
    rec = await store.create_record(did, SPACE, MESSAGE, "k", message())
    with pytest.raises(InvalidSwap):
        await store.delete_record(did, SPACE, MESSAGE, "k", swap_cid=record_cid(message("x")))
    assert await store.get_record(did, SPACE, MESSAGE, "k") is not None
    await store.delete_record(did, SPACE, MESSAGE, "k", swap_cid=rec.cid)
    assert await store.get_record(did, SPACE, MESSAGE, "k") is None
    # Absent: a no-op, as on a PDS, with or without a swap.
    await store.delete_record(did, SPACE, MESSAGE, "k")
    await store.delete_record(did, SPACE, MESSAGE, "k", swap_cid=rec.cid)
    await store.create_record(did, SPACE, MESSAGE, "k", message())  # the key is free again


async def test_list_records_order_and_pages(backend: Backend) -> None:
    store, did = backend.store, backend.did
    keys = [new_tid() for _ in range(7)]
    for k in reversed(keys):
        await store.create_record(did, SPACE, MESSAGE, k, message(k))
    await store.create_record(did, SPACE, INFO, "self", {"createdAt": "2026-01-01T00:00:00.000Z"})
    # Neighbouring spaces on both sides of SPACE's key range.
    await store.create_record(did, "3m2a4b5c6d7e3", MESSAGE, keys[0], message())
    await store.create_record(did, "3m2a4b5c6d7e", MESSAGE, "zzz", message())

    page, cursor = await store.list_records(did, SPACE, MESSAGE)
    assert [r.key for r in page] == keys and cursor is None
    assert all(r.space == SPACE and r.did == did for r in page)

    seen: list[str] = []
    cursor = None
    while True:
        page, cursor = await store.list_records(did, SPACE, MESSAGE, cursor=cursor, limit=3)
        seen += [r.key for r in page]
        if cursor is None:
            break
        assert len(page) == 3
    assert seen == keys

    page, cursor = await store.list_records(did, SPACE, MESSAGE, reverse=True, limit=4)
    assert [r.key for r in page] == keys[::-1][:4]
    page, cursor = await store.list_records(did, SPACE, MESSAGE, reverse=True, cursor=cursor)
    assert [r.key for r in page] == keys[::-1][4:] and cursor is None

    page, _ = await store.list_records(did, SPACE, INFO)
    assert [r.key for r in page] == ["self"]
    assert await store.list_records(did, "3m2a4b5c6d7e4", MESSAGE) == ([], None)


async def test_blobs(backend: Backend) -> None:
    store, did = backend.store, backend.did
    ref = await store.upload_blob(did, b"\x89PNG...", "image/png")
    cid = ref["ref"]["$link"]
    assert ref == {"$type": "blob", "ref": {"$link": cid}, "mimeType": "image/png", "size": 7}
    assert cid.startswith("bafkrei")
    # The reference PDS keeps a blob no record references as temporary; a record makes it
    # permanent, and readable with getBlob.
    value = message()
    value["content"]["parts"].append(
        {"$type": "network.sharedcomputer.chat.defs#imagePart", "image": ref}
    )
    await store.create_record(did, SPACE, MESSAGE, "with-image", value)
    assert await store.get_blob(did, cid) == b"\x89PNG..."
    with pytest.raises(BlobNotFound):
        await store.get_blob(did, "bafkreinothere2222222222222222222")
