"""turns.message_cache: long conversations' messages kept parsed by CID, on a real store."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from plugins import BEFORE_MODEL, Plugin, PluginSet
from recordstore import MESSAGE, InvalidKey, Record, local_listing
from recordstore.keys import new_tid
from recordstore.local import LocalStore
from tests.support.records import stored_message as message
from tests.support.records import text_part
from tests.support.turnkit import DID, turn_kit
from turns import message_cache
from turns.message_cache import MessageCache, all_records

pytestmark = pytest.mark.anyio

SPACE = "3m2a4b5c6d7e2"


class CountingStore(LocalStore):
    """The real local store, counting the records a cache asks it for by key."""

    asked: list[str]

    async def space_records(
        self, did: str, space: str, collection: str, keys: Sequence[str]
    ) -> list[tuple[Record, int]]:
        self.asked.extend(keys)
        return await super().space_records(did, space, collection, keys)


def _text(value: dict[str, Any]) -> str:
    return value["content"]["parts"][0]["text"]


async def _stored(store: LocalStore) -> dict[str, dict[str, Any]]:
    return {r.key: r.value for r in await all_records(store, DID, SPACE, MESSAGE)}


async def _add(store: LocalStore, text: str) -> str:
    value = message()
    value["content"]["parts"][0]["text"] = text
    key = new_tid()
    await store.create_record(DID, SPACE, MESSAGE, key, value)
    return key


async def test_a_short_conversation_is_read_whole_and_nothing_is_kept(tmp_path: Path) -> None:
    async with CountingStore.open(tmp_path) as store:
        store.asked = []
        cache = MessageCache(store, cached_from=10)
        for i in range(9):
            await _add(store, f"m{i}")
        for _ in range(3):
            assert await cache.messages(DID, SPACE) == await _stored(store)
        assert cache.chars == 0 and store.asked == []


async def test_a_long_conversation_reads_only_what_is_new_or_changed(tmp_path: Path) -> None:
    async with CountingStore.open(tmp_path) as store:
        store.asked = []
        cache = MessageCache(store, cached_from=10)
        keys = [await _add(store, f"m{i}") for i in range(12)]
        assert await cache.messages(DID, SPACE) == await _stored(store)  # found long
        assert await cache.messages(DID, SPACE) == await _stored(store)  # read whole, kept
        assert sorted(store.asked) == sorted(keys) and cache.chars > 0
        store.asked.clear()
        got = await cache.messages(DID, SPACE)
        assert got == await _stored(store) and store.asked == []  # nothing new: nothing read
        assert list(got) == sorted(got)  # in key order, as a listing
        new = await _add(store, "new")
        changed = keys[3]
        value = message()
        value["content"]["parts"][0]["text"] = "changed"
        await store.put_record(DID, SPACE, MESSAGE, changed, value)
        await store.delete_record(DID, SPACE, MESSAGE, keys[5])
        got = await cache.messages(DID, SPACE)
        assert got == await _stored(store)
        assert sorted(store.asked) == sorted([new, changed, keys[5]])  # written since
        assert _text(got[changed]) == "changed" and keys[5] not in got
        store.asked.clear()
        assert await cache.messages(DID, SPACE) == got and store.asked == []  # up to date


async def test_writes_elsewhere_read_nothing_and_a_long_gap_reads_the_keys_and_cids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with CountingStore.open(tmp_path) as store:
        store.asked = []
        cache = MessageCache(store, cached_from=5)
        keys = [await _add(store, f"m{i}") for i in range(6)]
        await cache.messages(DID, SPACE)
        await cache.messages(DID, SPACE)
        store.asked.clear()
        other_space = new_tid()
        for _ in range(3):
            await store.create_record(DID, other_space, MESSAGE, new_tid(), message())
        assert await cache.messages(DID, SPACE) == await _stored(store)
        assert store.asked == []  # three ops read, none of this conversation's
        # More ops since than a read brings up to date: the keys and CIDs are listed, and
        # only the record that changed is read.
        monkeypatch.setattr(message_cache, "CHANGES_READ", 2)
        for _ in range(3):
            await store.create_record(DID, other_space, MESSAGE, new_tid(), message())
        value = message()
        value["content"]["parts"][0]["text"] = "changed"
        await store.put_record(DID, SPACE, MESSAGE, keys[1], value)
        got = await cache.messages(DID, SPACE)
        assert got == await _stored(store) and store.asked == [keys[1]]
        # A key older than the rest (a client's clock behind) still comes in key order.
        older = "2222222222222"
        await store.create_record(DID, SPACE, MESSAGE, older, message())
        got = await cache.messages(DID, SPACE)
        assert got == await _stored(store) and list(got) == sorted(got) and list(got)[0] == older


async def test_what_another_writer_changed_is_read_again(tmp_path: Path) -> None:
    # Another instance (another store on the same file) writes between two turns: the
    # CIDs tell, nobody has to tell the cache.
    async with LocalStore.open(tmp_path) as store, LocalStore.open(tmp_path) as other:
        cache = MessageCache(store, cached_from=5)
        keys = [await _add(store, f"m{i}") for i in range(6)]
        await cache.messages(DID, SPACE)
        await cache.messages(DID, SPACE)
        value = message()
        value["content"]["parts"][0]["text"] = "rewritten elsewhere"
        await other.put_record(DID, SPACE, MESSAGE, keys[0], value)
        await _add(other, "added elsewhere")
        got = await cache.messages(DID, SPACE)
        assert got == await _stored(store)
        assert _text(got[keys[0]]) == "rewritten elsewhere"


async def test_what_is_kept_stays_within_its_bounds(tmp_path: Path) -> None:
    async with CountingStore.open(tmp_path) as store:
        for i in range(6):
            await _add(store, f"m{i}")
        one = (await all_records(store, DID, SPACE, MESSAGE))[0]
        size = len(one.value["content"]["parts"][0]["text"])
        assert size
        # Too big for the budget: read whole each time, never kept, and found so once.
        store.asked = []
        small = MessageCache(store, cached_from=5, kept_chars=100)
        for _ in range(4):
            assert await small.messages(DID, SPACE) == await _stored(store)
        assert small.chars == 0 and len(store.asked) == 6
        # Two conversations at most: the least recently read goes first.
        spaces = [new_tid() for _ in range(3)]
        for space in spaces:
            for _ in range(5):
                await store.create_record(DID, space, MESSAGE, new_tid(), message())
        two = MessageCache(store, cached_from=5, kept_conversations=2)
        for space in spaces:
            await two.messages(DID, space)
            await two.messages(DID, space)
        kept = two.chars
        assert kept > 0
        store.asked.clear()
        await two.messages(DID, spaces[2])  # kept: nothing read
        assert store.asked == []
        # The first was dropped for the third; still known long, it is read whole and kept
        # again at once (the second goes), without a listing first.
        assert await two.messages(DID, spaces[0]) == {
            r.key: r.value for r in await all_records(store, DID, spaces[0], MESSAGE)
        }
        assert len(store.asked) == 5 and two.chars == kept
        store.asked.clear()
        await two.messages(DID, spaces[0])
        assert store.asked == []


async def test_random_writes_never_leave_the_cache_apart_from_the_store(tmp_path: Path) -> None:
    rng = random.Random(7)
    async with LocalStore.open(tmp_path) as store:
        cache = MessageCache(store, cached_from=8, kept_chars=20_000)
        keys = [await _add(store, f"m{i}") for i in range(10)]
        for step in range(60):
            action = rng.choice(["add", "change", "delete", "elsewhere", "older", "none"])
            if action == "add" or len(keys) < 3:
                keys.append(await _add(store, f"a{step}"))
            elif action == "elsewhere":
                await store.create_record(DID, new_tid(), MESSAGE, new_tid(), message())
            elif action == "older":
                key = f"2{rng.randrange(10**11, 10**12)}z"
                await store.create_record(DID, SPACE, MESSAGE, key, message())
                keys.append(key)
            elif action == "change":
                value = message()
                value["content"]["parts"][0]["text"] = f"c{step}" * rng.randint(1, 400)
                await store.put_record(DID, SPACE, MESSAGE, rng.choice(keys), value)
            elif action == "delete":
                key = keys.pop(rng.randrange(len(keys)))
                await store.delete_record(DID, SPACE, MESSAGE, key)
            got = await cache.messages(DID, SPACE)
            assert got == await _stored(store), step
            assert list(got) == sorted(got), step


async def test_turns_of_a_long_conversation_read_it_through_the_cache_and_leave_it_intact(
    tmp_path, fake
):
    # A hook that changes the user message it is given (it gets a copy) and the engine's
    # own turns: after each turn, every kept value is still what the store holds.
    def meddle(messages: list[dict[str, Any]], ctx: Any) -> list[dict[str, Any]]:
        ctx.user_message["content"]["parts"].append({"$type": "x", "text": "meddled"})
        ctx.user_message["role"] = "meddled"
        return messages

    plugin = Plugin("meddler")
    plugin.on(BEFORE_MODEL)(meddle)
    fake.push(*[f"answer {i}" for i in range(6)])
    async with turn_kit(tmp_path, fake, plugins=PluginSet([plugin])) as kit:
        skey = await kit.conversation()
        parent = None
        for i in range(35):  # 70 messages: past CACHED_FROM
            user = new_tid()
            await kit.store.create_record(DID, skey, MESSAGE, user, message(f"q{i}", parent=parent))
            reply = message(f"r{i}", parent=user, role="assistant", status="complete")
            await kit.store.create_record(DID, skey, MESSAGE, f"{user}.r0", reply)
            parent = f"{user}.r0"
        for i in range(3):
            posted = await kit.engine.post_message(
                DID, skey, parent=parent, parts=[text_part(f"new {i}")], generation={}
            )
            final = await kit.reply(skey, posted.reply_key)
            assert final["status"] == "complete"
            parent = posted.reply_key
            stored = await kit.messages(skey)
            kept = kit.engine.messages._kept.get((DID, skey))  # noqa: SLF001 - what is kept
            if i > 0:
                assert kept is not None and kept.by_key
            for key, (_, value, _) in (kept.by_key.items() if kept else ()):
                assert value == stored[key], key
        # The model saw the whole branch, the meddling nowhere.
        sent = fake.chat_requests[-1].json["messages"]
        assert [m["content"] for m in sent if m["role"] == "user"][:2] == ["q0", "q1"]
        assert sent[-1] == {"role": "user", "content": "new 2"}
        assert "meddled" not in str(sent)


async def test_the_local_stores_keys_and_cids_come_in_pages_and_arguments_are_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_listing, "_CIDS_PAGE", 3)
    monkeypatch.setattr(local_listing, "_KEYS_A_READ", 2)
    async with LocalStore.open(tmp_path) as store:
        keys = sorted([await _add(store, f"m{i}") for i in range(7)])
        stored = await all_records(store, DID, SPACE, MESSAGE)
        assert await store.space_cids(DID, SPACE, MESSAGE) == [(r.key, r.cid) for r in stored]
        got = await store.space_records(DID, SPACE, MESSAGE, [*keys[:5], new_tid()])  # one absent
        assert sorted(r.key for r, _ in got) == keys[:5]
        assert all(chars > len(_text(r.value)) for r, chars in got)
        with pytest.raises(InvalidKey):
            await store.space_records(DID, SPACE, MESSAGE, ["../x"])
        with pytest.raises(InvalidKey):
            await store.space_cids(DID, "not a space", MESSAGE)
