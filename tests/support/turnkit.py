"""A turn engine on a real local store and the fake model server, for the turn tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio

from plugins import PluginSet
from recordstore import CONVERSATION, MESSAGE, Change, RecordStore
from recordstore.keys import new_tid
from recordstore.local import LocalStore
from testbed.fakemodel import FakeModel
from tests.support import records
from turns.engine import TurnEngine
from turns.settings import Provider, TurnSettings
from turns.state import StateDB

API_KEY = "sk-test-SECRET-0123456789abcdef"
DID = "did:plc:aliceaaaaaaaaaaaaaaaaaaa"
OTHER_DID = "did:plc:bobbbbbbbbbbbbbbbbbbbbbb"


@dataclass
class Kit:
    store: RecordStore
    state: StateDB
    engine: TurnEngine
    fake: FakeModel
    settings: TurnSettings
    owners: dict[str, str] = field(default_factory=lambda: {DID: "alice"})
    # Every change the feed delivered, in order, after the engine's rules ran on it: a
    # negative test asserts its change arrived, so an empty feed cannot pass it.
    seen: list[Change] = field(default_factory=list)
    _delivered: anyio.Event = field(default_factory=anyio.Event)

    def set(self, **changes: Any) -> None:
        """Change the turn settings; the next turn reads them."""
        self.settings = replace(self.settings, **changes)

    async def conversation(self, **info: Any) -> str:
        return await self.engine.create_conversation(DID, **info)

    async def post(self, skey: str, text: str, *, parent: str | None = None, **generation: Any) -> Any:
        """A user message posted through the engine, as the web UI posts one."""
        return await self.engine.post_message(
            DID, skey, parent=parent, parts=[records.text_part(text)], generation=generation
        )

    async def reply(self, skey: str, reply_key: str, wait: float = 10) -> dict[str, Any]:
        """The reply record once it is final."""
        with anyio.fail_after(wait):
            while True:
                record = await self.store.get_record(DID, skey, MESSAGE, reply_key)
                if record is not None and record.value.get("status") != "pending":
                    return record.value
                await anyio.sleep(0.01)

    async def messages(self, skey: str) -> dict[str, dict[str, Any]]:
        records, _ = await self.store.list_records(DID, skey, MESSAGE, limit=100)
        return {r.key: r.value for r in records}

    async def events(self, skey: str, reply_key: str, after: int = 0) -> list[tuple[int, str, Any]]:
        buffer = self.engine.stream(DID, skey, reply_key)
        assert buffer is not None, "this process is not running that reply"
        out = []
        with anyio.fail_after(10):
            async for event in buffer.events(after):
                out.append((event.id, event.event, json.loads(event.data)))
        return out

    async def feed(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """The change feed into the trigger rules, as the daemon wires it."""
        task_status.started()
        async with self.store.changes(None) as feed:
            async for change in feed:
                await self.engine.on_change(change, self.owners)
                self.seen.append(change)
                self._delivered.set()
                self._delivered = anyio.Event()

    async def delivered(self, key: str, wait: float = 10) -> Change:
        """The change of record ``key`` once the feed has delivered it and the rules ran."""
        with anyio.fail_after(wait):
            while True:
                for change in self.seen:
                    if change.key == key:
                        return change
                await self._delivered.wait()

    async def until_live(self, wait: float = 10) -> None:
        """Return once the feed is past its backfill: the next write is seen live.

        Writes marker records (no ``generation``: they start nothing) until one comes
        back with ``live`` set.
        """
        skey = new_tid()
        await self.store.create_space(DID, CONVERSATION, skey)
        with anyio.fail_after(wait):
            while True:
                key = new_tid()
                await self.store.create_record(DID, skey, MESSAGE, key, records.user_message("marker", attempt=None))
                if (await self.delivered(key)).live:
                    return


@asynccontextmanager
async def turn_kit(
    tmp: Path,
    fake: FakeModel,
    *,
    plugins: PluginSet | None = None,
    settings: TurnSettings | None = None,
    state_path: Path | None = None,
    user_tools: dict[str, list[str]] | None = None,
    titles: bool = False,
    cache_dir: Path | None = None,
    context: int | None = None,
    model_context: dict[str, int] | None = None,
    accounting: Any = None,
    data_dir: Path | None = None,
    **engine_options: Any,
) -> AsyncIterator[Kit]:
    providers = {
        "fake": Provider(
            "fake", fake.base_url, API_KEY, (), context=context, model_context=model_context or {}
        ),
        "other": Provider("other", fake.base_url, API_KEY, ()),
    }
    async with LocalStore.open(data_dir or tmp / "data") as store:
        state = await StateDB.open(state_path or tmp / "state.sqlite3")
        kit: Kit
        engine = TurnEngine(
            store,
            state,
            lambda: kit.settings,
            providers,
            "fake:fake-model",
            plugins,
            user_tools=user_tools,
            cache_dir=cache_dir,
            accounting=accounting,
            **engine_options,
        )
        kit = Kit(store, state, engine, fake, settings or TurnSettings(retries=0))
        if not titles:
            # Off unless a test asks: a title request would take the fake's queued replies.
            kit.settings = replace(kit.settings, title_model="")
        try:
            async with engine:
                yield kit
                await engine.shutdown(1)
        finally:
            await state.aclose()


async def user_message(
    store: RecordStore, skey: str, key: str, text: str, *, did: str = DID, **fields: Any
) -> None:
    """A direct write of a user message, as a stock atproto client would make it."""
    value = records.user_message(
        text, attempt=None, created_at=fields.pop("createdAt", None), **fields
    )
    await store.create_space(did, CONVERSATION, skey)
    await store.create_record(did, skey, MESSAGE, key, value)


async def long_conversation(kit: Any, pairs: int, size: int = 160) -> tuple[str, str]:
    """A conversation of ``pairs`` user/assistant exchanges written straight into the
    store; returns (skey, key of the last reply)."""
    skey = await kit.conversation(title="long")
    parent = None
    for i in range(pairs):
        user = new_tid()
        value: dict[str, Any] = {
            "$type": MESSAGE,
            "role": "user",
            "content": {
                "$type": "network.sharedcomputer.chat.defs#plainContent",
                "parts": [records.text_part(f"question {i}: " + "q" * size)],
            },
            "createdAt": "2026-12-01T00:00:00.000Z",
        }
        if parent:
            value["parent"] = parent
        await kit.store.create_record(DID, skey, MESSAGE, user, value)
        reply = {
            "$type": MESSAGE,
            "role": "assistant",
            "parent": user,
            "status": "complete",
            "model": {"provider": "fake", "id": "fake-model"},
            "content": {
                "$type": "network.sharedcomputer.chat.defs#plainContent",
                "parts": [records.text_part(f"answer {i}: " + "a" * size)],
            },
            "createdAt": "2026-12-01T00:00:00.000Z",
        }
        await kit.store.create_record(DID, skey, MESSAGE, f"{user}.r0", reply)
        parent = f"{user}.r0"
    assert parent is not None
    return skey, parent
