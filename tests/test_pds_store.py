"""The pds backend against the reference PDS: the same behaviours as the local store."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from atproto import AsyncClient

from recordstore import (
    MESSAGE,
    Change,
    InvalidKey,
    InvalidRecord,
    RecordExists,
    StoreError,
)
from recordstore.cid import record_cid
from recordstore.firehose import PdsFeed, decode_cursor
from recordstore.keys import new_tid
from recordstore.pds import PdsAccount, PdsStore
from recordstore.write import BlobRefError
from testbed.pds import Account, PdsServer
from testbed.ports import free_port
from tests.support.feeds import take
from tests.support.records import stored_message as message

pytestmark = [pytest.mark.anyio, pytest.mark.pds]

SPACE = "3m2a4b5c6d7e2"
MINIMAL_CID = "bafyreidlpnm5ajxotpgxx4ob3t2d2ujwczow3lvpfzhzazo4ehjba6hbce"




def account_of(pds: PdsServer, acct: Account) -> PdsAccount:
    return PdsAccount(identifier=acct.handle, password=acct.app_password, service=pds.url)


# A test of the firehose's own order and cursors runs with a sweep that never comes: on a
# loaded machine the firehose can lag past a 0.5 s sweep, which then reports a change first
# (without a cursor), as it should in service.
firehose_only = pytest.mark.parametrize("store", [60.0], indirect=True, ids=["firehose"])


@pytest.fixture
async def store(
    request: pytest.FixtureRequest, pds: PdsServer, pds_account: Account
) -> AsyncIterator[PdsStore]:
    interval = getattr(request, "param", 0.5)
    async with await PdsStore.open([account_of(pds, pds_account)], sweep_interval=interval) as s:
        yield s


@pytest.fixture
def did(pds_account: Account) -> str:
    return pds_account.did


@pytest.fixture
async def direct(pds: PdsServer, pds_account: Account) -> AsyncClient:
    """The stock SDK, as a direct-PDS client would use it."""
    client = AsyncClient(pds.url)
    await client.login(pds_account.handle, pds_account.password, fetch_bsky_profile=False)
    return client


@asynccontextmanager
async def started_feed(store: PdsStore, did: str) -> AsyncIterator[AsyncIterator[Change]]:
    """The feed from the start, made as ``store.changes()`` makes it but here, so that its
    ``complete`` can be read, and read past a marker once its first sweep of ``did`` is
    done (a generator runs from its first read).

    A feed from the start sweeps every repo while its firehose replays; a record written
    while that sweep lists may be listed before the firehose brings it, and is then
    reported once, by the sweep, not live. On a loaded machine the sweep can outlast the
    first marker, so markers are written until one is read after it."""
    source = PdsFeed(store, sweep_interval=store.sweep_interval)
    async with source.changes() as feed:
        with anyio.fail_after(20):
            while True:
                marker = await store.create_record(did, "0start", MESSAGE, new_tid(), message())
                async for change in feed:
                    if change.space == "0start" and change.key == marker.key:
                        break
                else:
                    raise AssertionError("the feed ended")
                if did in source.complete:
                    break
        yield feed


# --- records -------------------------------------------------------------------------------


async def test_a_create_whose_answer_was_lost_reads_back_as_ours(store: PdsStore, did: str) -> None:
    # The shared cases (create, put, delete, list, blobs) are in tests/test_store_contract.py.
    first = await store.create_record(did, SPACE, MESSAGE, "k", message("one"))
    # The PDS answers a second create with a bare 500; the read-back shows another CID: taken.
    with pytest.raises(RecordExists):
        await store.create_record(did, SPACE, MESSAGE, "k", message("two"))
    # The same bytes again read back as our own write (a create whose answer was lost):
    # why racing writers must never write byte-identical records.
    assert await store.create_record(did, SPACE, MESSAGE, "k", message("one")) == first


async def test_list_records_beyond_one_pds_page(store: PdsStore, did: str) -> None:
    keys = [f"k{i:04}" for i in range(130)]
    async with anyio.create_task_group() as tg:
        for k in keys:
            tg.start_soon(store.create_record, did, SPACE, MESSAGE, k, message(k))
    page, cursor = await store.list_records(did, SPACE, MESSAGE, limit=1000)
    assert [r.key for r in page] == keys and cursor is None
    page, cursor = await store.list_records(did, SPACE, MESSAGE, limit=120)
    assert [r.key for r in page] == keys[:120] and cursor == keys[119]


async def test_refusals_write_nothing(store: PdsStore, did: str) -> None:
    with pytest.raises(InvalidRecord):
        await store.create_record(did, SPACE, MESSAGE, "k", {"role": "user"})
    with pytest.raises(InvalidRecord):
        await store.create_record(did, SPACE, MESSAGE, "k", message(score=1.5))
    with pytest.raises(InvalidKey):
        await store.create_record(did, "a:b", MESSAGE, "k", message())
    with pytest.raises(StoreError, match="not an account"):
        await store.create_record("did:plc:nobody", SPACE, MESSAGE, "k", message())
    assert await store.get_record(did, SPACE, MESSAGE, "k") is None


async def test_blob_references_are_checked_by_the_pds_and_named_alike(
    store: PdsStore, did: str
) -> None:
    """The same prepare_write as the local store; the PDS checks the references itself
    and its names come back as the local store's (BlobRefError.error)."""
    ref = await store.upload_blob(did, b"a note, no signature", "text/plain")
    missing = {**ref, "ref": {"$link": "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"}}
    for key, blob, name in [
        ("no-blob", missing, "BlobNotFound"),
        ("bad-mime", {**ref, "mimeType": "text/csv"}, "InvalidMimeType"),
        ("bad-size", {**ref, "size": ref["size"] + 1}, "InvalidSize"),
    ]:
        value = message()
        value["content"]["parts"].append(
            {"$type": "network.sharedcomputer.chat.defs#filePart", "file": blob}
        )
        with pytest.raises(BlobRefError) as info:
            await store.create_record(did, SPACE, MESSAGE, key, value)
        assert info.value.error == name
        assert await store.get_record(did, SPACE, MESSAGE, key) is None
    # An integral number is the integer, with the CID the PDS computes for it.
    rec = await store.create_record(did, SPACE, MESSAGE, "integral", message(extra=7.0))
    assert rec.value["extra"] == 7 and rec.cid == record_cid(message(extra=7))


async def test_session_logs_in_again_when_its_tokens_are_gone(store: PdsStore, did: str) -> None:
    s = (await store._session_for(did)).client
    session = s._session
    assert session is not None
    # Revoke the refresh token, then spoil the access token's signature.
    await s.com.atproto.server.delete_session(
        headers={"Authorization": f"Bearer {session.refresh_jwt}"}
    )
    head, payload, _ = session.access_jwt.split(".")
    session.access_jwt = f"{head}.{payload}.AAAA"
    rec = await store.create_record(did, SPACE, MESSAGE, "after", message())
    assert (await store.get_record(did, SPACE, MESSAGE, "after")) == rec


# --- the change feed -------------------------------------------------------------------------


@firehose_only
async def test_feed_from_start_then_a_direct_write_live(
    direct: AsyncClient, store: PdsStore, did: str
) -> None:
    await store.create_record(did, SPACE, MESSAGE, "a", message("a"))
    two = await store.put_record(did, SPACE, MESSAGE, "b", message("b"))
    async with store.changes() as feed:
        backfill = await take(feed, 2)
        assert sorted((c.key, c.op, c.live) for c in backfill) == [
            ("a", "create", False),
            ("b", "create", False),
        ]
        b = next(c for c in backfill if c.key == "b")
        assert (b.cid, b.record, b.did, b.space, b.error) == (two.cid, two.value, did, SPACE, None)

        # A stock-SDK write lands in the feed, as live (how soon: `python -m bench.pds`).
        out = await direct.com.atproto.repo.create_record(
            {"repo": did, "collection": MESSAGE, "rkey": f"{SPACE}:direct", "record": message()}
        )
        [seen] = await take(feed, 1, within=30)
        assert (seen.key, seen.op, seen.live, seen.cid) == ("direct", "create", True, out.cid)

        await direct.com.atproto.repo.delete_record(
            {"repo": did, "collection": MESSAGE, "rkey": f"{SPACE}:direct"}
        )
        [gone] = await take(feed, 1)
        assert (gone.key, gone.op, gone.cid, gone.record, gone.live) == (
            "direct",
            "delete",
            None,
            None,
            True,
        )
        # Records outside the layout or the chat collections are not reported.
        await direct.com.atproto.repo.create_record(
            {"repo": did, "collection": MESSAGE, "rkey": "nospace", "record": message()}
        )
        await direct.com.atproto.repo.create_record(
            {
                "repo": did,
                "collection": "app.example.thing",
                "rkey": f"{SPACE}:x",
                "record": {"$type": "app.example.thing"},
            }
        )
        await store.create_record(did, SPACE, MESSAGE, "c", message("c"))
        [c] = await take(feed, 1)
        assert c.key == "c"


@firehose_only
async def test_feed_resumes_from_its_cursor_exactly_once(store: PdsStore, did: str) -> None:
    async with started_feed(store, did) as feed:
        for i in range(12):
            await store.create_record(did, SPACE, MESSAGE, f"k{i:03}", message())
        first = await take(feed, 12)
    cursor = first[-1].cursor
    assert first[-1].live
    for i in range(12, 30):
        await store.create_record(did, SPACE, MESSAGE, f"k{i:03}", message())
    async with store.changes(cursor) as feed:
        rest = await take(feed, 18)
        await store.create_record(did, SPACE, MESSAGE, "k030", message())
        [last] = await take(feed, 1)
        # Nothing else arrives: no repeats.
        with anyio.move_on_after(1.0):
            extra = await take(feed, 1)
            pytest.fail(f"repeated: {extra}")
    keys = [c.key for c in first + rest + [last]]
    assert keys == [f"k{i:03}" for i in range(31)]
    assert all(c.live for c in first)
    assert not any(c.live for c in rest) and last.live
    positions = [next(iter(decode_cursor(c.cursor).values())) for c in first + rest + [last]]
    assert positions == sorted(positions) and len(set(positions)) == 31


@firehose_only
async def test_multi_op_commit_cursor_waits_for_its_last_op(
    direct: AsyncClient, store: PdsStore, did: str
) -> None:
    async with started_feed(store, did) as feed:
        await store.create_record(did, SPACE, MESSAGE, "before", message())
        [before] = await take(feed, 1)
        writes = [
            {
                "$type": "com.atproto.repo.applyWrites#create",
                "collection": MESSAGE,
                "rkey": f"{SPACE}:w{i}",
                "value": message(str(i)),
            }
            for i in range(3)
        ]
        await direct.com.atproto.repo.apply_writes({"repo": did, "writes": writes})
        ops = await take(feed, 3)
    assert [c.key for c in ops] == ["w0", "w1", "w2"]
    # Only the commit's last op moves the cursor past it.
    assert ops[0].cursor == ops[1].cursor == before.cursor
    assert ops[2].cursor != before.cursor


async def test_feed_from_a_cursor_ahead_of_the_pds_sweeps(store: PdsStore, did: str) -> None:
    await store.create_record(did, SPACE, MESSAGE, "old", message())
    endpoint = (await store._session_for(did)).endpoint
    ahead = json.dumps({endpoint: 10**9})
    async with store.changes(ahead) as feed:
        # FutureCursor: the firehose restarts from now and a sweep reports what is there.
        [old] = await take(feed, 1)
        assert (old.key, old.op, old.live) == ("old", "create", False)
        await store.create_record(did, SPACE, MESSAGE, "new", message())
        [new] = await take(feed, 1)
        assert (new.key, new.live) == ("new", True)
        assert decode_cursor(new.cursor)[endpoint] < 10**9
    with pytest.raises(StoreError, match="cursor"):
        async with store.changes("nope") as feed:
            await take(feed, 1)


async def test_feed_reports_invalid_records_written_directly(
    direct: AsyncClient, store: PdsStore, did: str
) -> None:
    async with started_feed(store, did) as feed:
        await direct.com.atproto.repo.create_record(
            {
                "repo": did,
                "collection": MESSAGE,
                "rkey": f"{SPACE}:bad",
                "record": {"$type": MESSAGE, "role": "user"},
            }
        )
        [bad] = await take(feed, 1)
    assert bad.key == "bad" and bad.record == {"$type": MESSAGE, "role": "user"}
    assert bad.error and "content" in bad.error



async def test_an_unreachable_pds_stops_no_other_account(
    pds: PdsServer, pds_account: Account, did: str
) -> None:
    down = PdsAccount(
        identifier="ghost.test", password="x", service=f"http://localhost:{free_port()}"
    )
    async with await PdsStore.open(
        [down, account_of(pds, pds_account)], sweep_interval=0.5
    ) as store:
        assert store.dids == [did]
        async with started_feed(store, did) as feed:
            await store.create_record(did, SPACE, MESSAGE, "k", message())
            [c] = await take(feed, 1)
            assert c.key == "k"


async def test_two_accounts_one_feed(pds: PdsServer, pds_account: Account) -> None:
    other = pds.create_account()
    async with await PdsStore.open(
        [account_of(pds, pds_account), account_of(pds, other)], sweep_interval=0.5
    ) as store:
        async with started_feed(store, pds_account.did) as feed:
            await store.create_record(pds_account.did, SPACE, MESSAGE, "a", message())
            await store.create_record(other.did, SPACE, MESSAGE, "b", message())
            got = await take(feed, 2)
    # One feed carries both accounts; their order depends on which replay or sweep sees
    # each first.
    assert sorted((c.did, c.key) for c in got) == sorted([(pds_account.did, "a"), (other.did, "b")])


@firehose_only
async def test_firehose_delivers_every_write_once_in_order(store: PdsStore, did: str) -> None:
    """200 writes one after another, each out of the feed before the next is made.

    The latency of this path is a benchmark figure (``python -m bench.pds``), not a test.
    """
    async with started_feed(store, did) as feed:
        for i in range(200):
            record = await store.create_record(did, SPACE, MESSAGE, f"l{i:03}", message())
            [c] = await take(feed, 1)
            assert (c.key, c.op, c.cid, c.live) == (f"l{i:03}", "create", record.cid, True)


async def test_feed_of_a_store_used_without_async_with(
    pds: PdsServer, pds_account: Account
) -> None:
    """The daemon's pattern: ``await open()``, ``aclose()`` later, and a plain ``async for``
    (the generator then owns the feed's tasks; scopes must enclose its whole life)."""
    store = await PdsStore.open([account_of(pds, pds_account)], sweep_interval=0.5)
    try:
        did = pds_account.did
        await store.create_record(did, SPACE, MESSAGE, "a", message())
        keys: list[str] = []
        with anyio.fail_after(30):
            async with store.changes() as feed:
                async for change in feed:
                    keys.append(change.key)
                    if change.key == "a":
                        await store.create_record(did, SPACE, MESSAGE, "b", message())
                    if change.key == "b":
                        assert change.live
                        break
        assert keys == ["a", "b"]
    finally:
        await store.aclose()
