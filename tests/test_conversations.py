"""SPEC §15 managing conversations: rename, delete, the paged list, live events, presets,
preferences — the whole daemon on loopback, the real local store, the fake model."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from atproto import AsyncClient

from recordstore import CONVERSATION, CONVERSATION_REF, SETTINGS_SPACE, BlobNotFound
from recordstore.cid import record_cid
from recordstore.keys import new_tid
from recordstore.lexicon import validate_record
from testbed.fakemodel import FakeModel, Reply
from tests.support.accounts import ALICE, ALICE_PASSWORD, BOB_TOKEN
from tests.support.daemon import Daemon, running_daemon
from tests.support.records import INFO, MESSAGE, now_iso, text_part
from tests.support.sse import event as sse_event
from turns.tls import tls_context

pytestmark = pytest.mark.anyio

PNG_1PX = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cfc0f01f0005fe02fea7d6a5a00000000049454e44ae426082"
)


async def info(dm: Daemon, skey: str) -> dict[str, Any] | None:
    rec = await dm.service.store.get_record(ALICE, skey, INFO, "self")
    return rec.value if rec else None


async def ref(dm: Daemon, skey: str) -> dict[str, Any] | None:
    rec = await dm.service.store.get_record(ALICE, SETTINGS_SPACE, CONVERSATION_REF, skey)
    return rec.value if rec else None


async def requests_seen(fake: FakeModel, n: int) -> None:
    with anyio.fail_after(10):
        while fake.request_count < n:  # noqa: ASYNC110 - the fake counts in its own thread
            await anyio.sleep(0.01)


# -- rename ----------------------------------------------------------------------------------


async def test_patch_sets_a_user_title_everywhere_and_refuses_one_over_the_limits(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation(systemPrompt="be brief")
        r = await dm.http.patch(f"/api/conversations/{skey}", json={"title": "Trip to Lyon"})
        assert r.status_code == 200, r.text
        assert r.json()["info"]["title"] == "Trip to Lyon"
        assert r.json()["info"]["titleSource"] == "user"
        assert r.json()["info"]["systemPrompt"] == "be brief"  # untouched
        assert (await info(dm, skey))["titleSource"] == "user"
        assert (await ref(dm, skey))["title"] == "Trip to Lyon"
        listed = (await dm.http.get("/api/conversations")).json()["conversations"]
        assert listed[0] == {"skey": skey, "title": "Trip to Lyon", "updatedAt": listed[0]["updatedAt"]}

        before = await info(dm, skey)
        for title in ("x" * 3001, "👍🏽" * 301):  # chars, then graphemes
            r = await dm.http.patch(f"/api/conversations/{skey}", json={"title": title})
            assert r.status_code == 422, r.text
            assert "title" in r.json()["message"] and r.json()["error"]
        r = await dm.http.patch(f"/api/conversations/{skey}", json={"colour": "red"})
        assert r.status_code == 422 and "colour" in r.json()["message"]
        assert await info(dm, skey) == before  # nothing half-written

        r = await dm.http.patch(f"/api/conversations/{skey}", json={"systemPrompt": None})
        assert r.status_code == 200 and "systemPrompt" not in r.json()["info"]
        assert r.json()["info"]["title"] == "Trip to Lyon"

        async with dm.client(BOB_TOKEN) as bob:
            r = await bob.patch(f"/api/conversations/{skey}", json={"title": "mine now"})
            assert r.status_code == 404
        assert (await info(dm, skey))["title"] == "Trip to Lyon"


# -- delete ------------------------------------------------------------------------------------


async def test_delete_cancels_the_running_turn_and_removes_records_refs_and_its_own_blobs(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    fake_model.push(Reply.tokens(400).delayed(chunk_delay=0.02))
    async with running_daemon(tmp_path, fake_model) as dm:
        store = dm.service.store
        keep = await dm.conversation(title="keep me")
        doomed = await dm.conversation(title="delete me")
        own = await store.upload_blob(ALICE, b"only-in-doomed", "text/plain")
        shared = await store.upload_blob(ALICE, PNG_1PX, "image/png")
        file_part = {"$type": "network.sharedcomputer.chat.defs#filePart", "file": own, "name": "a.txt"}
        image_part = {"$type": "network.sharedcomputer.chat.defs#imagePart", "image": shared}
        await dm.http.post(
            f"/api/conversations/{keep}/messages", json={"parts": [image_part]}
        )
        posted = await dm.post(doomed, "a long answer, please", generation={})
        await dm.http.post(
            f"/api/conversations/{doomed}/messages",
            json={"parts": [file_part, image_part], "parent": posted["userKey"]},
        )
        await requests_seen(fake_model, 1)
        async with dm.client(BOB_TOKEN) as bob:  # another account's: 404, nothing deleted
            assert (await bob.delete(f"/api/conversations/{doomed}")).status_code == 404
        assert await info(dm, doomed) is not None

        r = await dm.http.delete(f"/api/conversations/{doomed}")
        assert r.status_code == 204 and r.content == b""
        left = await dm.store_keys()
        assert not [k for k in left if k[0] == doomed]
        assert (SETTINGS_SPACE, CONVERSATION_REF, doomed) not in left
        assert (SETTINGS_SPACE, CONVERSATION_REF, keep) in left
        with pytest.raises(BlobNotFound):
            await store.get_blob(ALICE, own["ref"]["$link"])
        assert await store.get_blob(ALICE, shared["ref"]["$link"]) == PNG_1PX  # still used
        # The turn was cancelled, not run to its end, and wrote nothing afterwards.
        assert fake_model.chat_requests[0].disconnected or not fake_model.chat_requests[0].finished
        await anyio.sleep(0.3)
        assert not [k for k in await dm.store_keys() if k[0] == doomed]
        assert (await dm.http.get(f"/api/conversations/{doomed}")).status_code == 404
        assert (await dm.http.delete(f"/api/conversations/{doomed}")).status_code == 404
        listed = (await dm.http.get("/api/conversations")).json()["conversations"]
        assert [c["skey"] for c in listed] == [keep]


def ref_value(i: int, skey: str) -> dict[str, Any]:
    return {
        "$type": CONVERSATION_REF,
        "conversation": f"at://{ALICE}/space/{CONVERSATION}/{skey}",
        "title": f"Recipe {i}" if i % 1000 == 0 else f"chat {i}",
        "updatedAt": f"2026-11-{1 + i // 1000:02d}T00:00:{i % 60:02d}.{i % 1000:03d}Z",
    }


async def seed_refs(dm: Daemon, n: int) -> list[str]:
    """``n`` conversationRefs in the store's file in one transaction (10,000 single writes
    through the store would take half a minute of a shared machine): the same rows, CIDs
    and JSON a put writes; the store then reads them as its own."""
    skeys = [new_tid() for _ in range(n)]
    rows = []
    for i, skey in enumerate(skeys):
        value = ref_value(i, skey)
        validate_record(CONVERSATION_REF, value)
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        rows.append((ALICE, SETTINGS_SPACE, CONVERSATION_REF, skey, record_cid(value), text))

    def write() -> None:
        with sqlite3.connect(dm.service.config.store_path / "store.sqlite3") as db:
            db.executemany(
                "INSERT INTO records (did, space, collection, key, cid, value)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )

    await anyio.to_thread.run_sync(write)
    return skeys


# -- the list ------------------------------------------------------------------------------------


async def test_ten_thousand_conversations_page_newest_first_and_search_titles(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        skeys = await seed_refs(dm, 10_000)
        first = await dm.http.get("/api/conversations")
        assert first.status_code == 200
        body = first.json()
        assert len(body["conversations"]) == 50 and body["cursor"]
        stamps = [c["updatedAt"] for c in body["conversations"]]
        assert stamps == sorted(stamps, reverse=True)

        seen: list[str] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if cursor:
                params["cursor"] = cursor
            page = (await dm.http.get("/api/conversations", params=params)).json()
            seen += [c["skey"] for c in page["conversations"]]
            cursor = page["cursor"]
            if cursor is None:
                break
        assert len(seen) == 10_000 and set(seen) == set(skeys)  # none twice, none lost

        found = (await dm.http.get("/api/conversations", params={"q": "rECIPE"})).json()
        assert sorted(c["title"] for c in found["conversations"]) == sorted(
            f"Recipe {i}" for i in range(0, 10_000, 1000)
        )
        assert found["cursor"] is None
        r = await dm.http.get("/api/conversations", params={"cursor": "not-a-cursor"})
        assert r.status_code == 422 and "cursor" in r.json()["message"]
        r = await dm.http.get("/api/conversations", params={"limit": 0})
        assert r.status_code == 422


# -- live events ----------------------------------------------------------------------------------


async def _next(events: Any, name: str) -> dict[str, Any]:
    with anyio.fail_after(10):
        async for sse in events:
            if sse.event == name:
                return sse_event(sse)
    raise AssertionError("stream ended")


async def test_the_events_streams_carry_a_direct_write_made_with_the_stock_sdk(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    from httpx_sse import aconnect_sse

    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation(title="watched")
        client = AsyncClient(dm.base_url)
        await client.login("alice.test", ALICE_PASSWORD, fetch_bsky_profile=False)
        async with (
            httpx.AsyncClient(base_url=dm.base_url, headers=dm.http.headers, timeout=20, verify=tls_context()) as http,
            aconnect_sse(http, "GET", f"/api/conversations/{skey}/events") as conversation,
            aconnect_sse(http, "GET", "/api/events") as account,
        ):
            assert conversation.response.status_code == 200
            records = conversation.aiter_sse()
            conversations = account.aiter_sse()
            key = new_tid()
            await client.com.atproto.repo.create_record(
                {
                    "repo": ALICE,
                    "collection": MESSAGE,
                    "rkey": f"{skey}:{key}",
                    "record": {
                        "$type": MESSAGE,
                        "role": "user",
                        "content": {
                            "$type": "network.sharedcomputer.chat.defs#plainContent",
                            "parts": [text_part("written by the SDK")],
                        },
                        "createdAt": now_iso(),
                    },
                }
            )
            got = await _next(records, "record")
            assert got["data"] == {
                "action": "create", "collection": MESSAGE, "key": key, "cid": got["data"]["cid"]
            }
            first_id = got["id"]
            current = (await dm.service.store.get_record(ALICE, skey, INFO, "self")).value
            await client.com.atproto.repo.put_record(
                {
                    "repo": ALICE,
                    "collection": INFO,
                    "rkey": f"{skey}:self",
                    "record": {**current, "title": "Renamed by a script", "titleSource": "user"},
                }
            )
            title = await _next(records, "title")
            assert title["data"] == {"title": "Renamed by a script", "titleSource": "user"}
            assert title["id"] > first_id
            renamed = await _next(conversations, "conversation")
            while renamed["data"]["title"] != "Renamed by a script":
                renamed = await _next(conversations, "conversation")
            assert renamed["data"] == {"action": "update", "skey": skey, "title": "Renamed by a script"}

        # Resuming after the first event gets what came after it, nothing before.
        async with (
            httpx.AsyncClient(base_url=dm.base_url, headers=dm.http.headers, timeout=20, verify=tls_context()) as http,
            aconnect_sse(
                http, "GET", f"/api/conversations/{skey}/events",
                headers={"Last-Event-ID": str(first_id)},
            ) as again,
        ):
            replay = again.aiter_sse()
            got = await _next(replay, "record")
            assert got["id"] > first_id and got["data"]["collection"] == INFO

        async with dm.client(BOB_TOKEN) as bob:
            assert (await bob.get(f"/api/conversations/{skey}/events")).status_code == 404


# -- presets and preferences ---------------------------------------------------------------------


async def test_presets_are_listed_and_fold_into_a_new_conversation(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    presets = {
        "translator": {
            "title": "Translation",
            "systemPrompt": "Translate everything into French.",
            "model": "fake:fake-model",
            "template": "Translate: ",
        }
    }
    async with running_daemon(tmp_path, fake_model, presets=presets) as dm:
        listed = (await dm.http.get("/api/presets")).json()
        assert listed == {"presets": [{"name": "translator", **presets["translator"]}]}
        r = await dm.http.post(
            "/api/conversations", json={"preset": "translator", "systemPrompt": "Be formal."}
        )
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["template"] == "Translate: "
        assert body["model"] == {"provider": "fake", "id": "fake-model"}
        value = await info(dm, body["skey"])
        assert value["title"] == "Translation"
        assert value["systemPrompt"] == "Translate everything into French.\n\nBe formal."
        posted = await dm.post(body["skey"], "Hello", generation={})
        await dm.final(body["skey"], posted["replyKey"])
        system = fake_model.last_request.json["messages"][0]["content"]
        assert system.endswith("Translate everything into French.\n\nBe formal.")

        r = await dm.http.post("/api/conversations", json={"preset": "pirate"})
        assert r.status_code == 422 and "preset" in r.json()["message"]
        r = await dm.http.post("/api/conversations", json={})
        assert r.status_code == 201 and set(r.json()) == {"skey"}


async def test_preferences_are_read_and_written_and_validated(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        assert (await dm.http.get("/api/preferences")).json() == {"preferences": {}}
        wanted = {"generateTitles": False, "timezone": "Europe/Paris", "defaultEffort": "low"}
        r = await dm.http.put("/api/preferences", json={"preferences": wanted})
        assert r.status_code == 200, r.text
        got = (await dm.http.get("/api/preferences")).json()["preferences"]
        assert {k: got[k] for k in wanted} == wanted and got["updatedAt"]
        r = await dm.http.put("/api/preferences", json={"preferences": {"generateTitles": "no"}})
        assert r.status_code == 422 and "generateTitles" in r.json()["message"]
        r = await dm.http.put("/api/preferences", json={"preferences": {"defaultEffort": "huge"}})
        assert r.status_code == 422 and "defaultEffort" in r.json()["message"]
        assert (await dm.http.get("/api/preferences")).json()["preferences"] == got
        async with dm.client(BOB_TOKEN) as bob:
            assert (await bob.get("/api/preferences")).json() == {"preferences": {}}


async def test_the_openapi_document_names_the_new_routes(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        paths = (await dm.http.get("/openapi.json")).json()["paths"]
        assert {"patch", "delete", "get"} <= set(paths["/api/conversations/{skey}"])
        for path in ("/api/events", "/api/conversations/{skey}/events", "/api/presets"):
            assert "get" in paths[path]
        assert {"get", "put"} <= set(paths["/api/preferences"])
        assert json.dumps(paths)  # serialisable


async def test_a_store_without_the_page_ability_pages_the_same(tmp_path: Path) -> None:
    """The listRecords path (a PDS): the same order, cursor and search as one SQL query."""
    from recordstore.local import LocalStore
    from turns import manage

    async with LocalStore.open(tmp_path / "data") as store:
        for i in range(250):
            skey = new_tid()
            await store.put_record(ALICE, SETTINGS_SPACE, CONVERSATION_REF, skey, ref_value(i, skey))
        fast = await manage.page(store, ALICE, limit=40)
        slow = await manage._scan(store, ALICE, 41, None, None)
        assert [c["skey"] for c in fast.conversations] == [s for s, _, _ in slow[:40]]
        after = manage._decode_cursor(fast.cursor or "")
        assert [s for s, _, _ in await manage._scan(store, ALICE, 40, after, None)] == [
            c["skey"] for c in (await manage.page(store, ALICE, limit=40, cursor=fast.cursor)).conversations
        ]
        found = await manage._scan(store, ALICE, 100, None, "RECIPE")
        assert sorted(t for _, t, _ in found) == ["Recipe 0"]


async def test_delete_with_a_queued_turn_claims_nothing_and_leaves_no_request(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    async with running_daemon(tmp_path, fake_model, turns={"ratePerMinute": 1}) as dm:
        skey = await dm.conversation(title="busy")
        first = await dm.post(skey, "one", generation={})
        await dm.final(skey, first["replyKey"])
        queued = await dm.post(skey, "two", generation={}, parent=first["replyKey"])
        assert queued["turn"] == "queued"
        assert [r for r in await dm.service.state.requests() if r.skey == skey]
        assert (await dm.http.delete(f"/api/conversations/{skey}")).status_code == 204
        assert not [r for r in await dm.service.state.requests() if r.skey == skey]
        await anyio.sleep(0.3)
        assert not [k for k in await dm.store_keys() if k[0] == skey]  # no reply was claimed


async def test_a_turns_ref_touch_keeps_what_another_writer_put_in_the_ref_meanwhile(
    tmp_path: Path,
) -> None:
    """turns.conversation_refs: a touch after one of this process's own is a put that
    swaps on the CID it wrote, not a read and a put. A rename made elsewhere in between
    (PATCH, another daemon, a direct write) fails that swap, and the touch reads it."""
    from recordstore.local import LocalStore
    from turns import account_space, conversations
    from turns.conversation_refs import ConversationRefs

    async with LocalStore.open(tmp_path / "data") as store:
        refs = ConversationRefs(store)
        skey = new_tid()
        await refs.touch(ALICE, skey, "first")
        first = await account_space.get_ref(store, ALICE, skey)
        assert first is not None and first.value["title"] == "first"
        await refs.touch(ALICE, skey)  # its own write: swapped on, title kept
        second = await account_space.get_ref(store, ALICE, skey)
        assert second is not None and second.value["title"] == "first"
        assert second.value["updatedAt"] >= first.value["updatedAt"]
        await conversations.touch_ref(store, ALICE, skey, "renamed")  # not through refs
        await refs.touch(ALICE, skey)
        third = await account_space.get_ref(store, ALICE, skey)
        assert third is not None and third.value["title"] == "renamed"
        # Deleted meanwhile: the touch writes it again, as a read-and-put touch did.
        await store.delete_record(ALICE, SETTINGS_SPACE, CONVERSATION_REF, skey)
        await refs.touch(ALICE, skey)
        again = await account_space.get_ref(store, ALICE, skey)
        assert again is not None and "title" not in again.value
