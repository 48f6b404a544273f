"""SPEC §15 titles: generated after the first complete reply, never over a user title,
off by preference, and a failing title model leaves nothing behind. The whole daemon on
loopback, the real local store, the fake model (title requests are its non-streamed ones)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from recordstore import CONVERSATION_REF, SETTINGS_SPACE
from testbed.fakemodel import FakeModel, Reply
from tests.support.accounts import ALICE
from tests.support.daemon import Daemon, running_daemon
from tests.support.records import INFO
from turns.titles import clean

pytestmark = pytest.mark.anyio

TITLES = {"turns": {"titleModel": "fake:titler"}}


class TitleModel:
    """Answers the non-streamed requests (titles) — after ``gate`` opens, when one is set."""

    def __init__(self, answer: Reply | str = "Planning a trip to Lyon", gate: bool = False) -> None:
        self.answer = answer
        self.requests: list[Any] = []
        self.gate = threading.Event()
        if not gate:
            self.gate.set()

    async def __call__(self, body: Any) -> Reply | str | None:
        if not isinstance(body, dict) or body.get("stream"):
            return None
        self.requests.append(body)
        while not self.gate.is_set():  # noqa: ASYNC110 - a threading.Event, set by the test
            await asyncio.sleep(0.01)
        return self.answer


async def info(dm: Daemon, skey: str) -> dict[str, Any]:
    rec = await dm.service.store.get_record(ALICE, skey, INFO, "self")
    assert rec is not None
    return rec.value


async def eventually_titled(dm: Daemon, skey: str) -> dict[str, Any]:
    with anyio.fail_after(10):
        while "title" not in (value := await info(dm, skey)):  # noqa: ASYNC110 - a store poll
            await anyio.sleep(0.02)
    return value


async def stream_status(dm: Daemon, skey: str, reply: str) -> dict[str, Any]:
    from httpx_sse import aconnect_sse

    url = f"/api/conversations/{skey}/messages/{reply}/stream"
    async with aconnect_sse(dm.http, "GET", url) as source:
        async for sse in source.aiter_sse():
            if sse.event == "status":
                import json

                return json.loads(sse.data)
    raise AssertionError("no status")


async def test_a_title_is_generated_after_the_first_reply_without_delaying_its_status(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    titler = fake_model.responder = TitleModel(gate=True)
    async with running_daemon(tmp_path, fake_model, **TITLES) as dm:
        skey = await dm.conversation()
        posted = await dm.post(skey, "I want to spend a weekend in Lyon", generation={})
        status = await stream_status(dm, skey, posted["replyKey"])
        # The reply is complete while the title model still holds its answer.
        assert status["status"] == "complete"
        assert "title" not in await info(dm, skey)
        titler.gate.set()
        value = await eventually_titled(dm, skey)
        assert value["title"] == "Planning a trip to Lyon" and value["titleSource"] == "generated"
        with anyio.fail_after(10):  # the conversationRef is written right after the info
            while True:
                ref = await dm.service.store.get_record(ALICE, SETTINGS_SPACE, CONVERSATION_REF, skey)
                if ref is not None and "title" in ref.value:
                    break
                await anyio.sleep(0.02)
        assert ref.value["title"] == "Planning a trip to Lyon"
        asked = titler.requests[0]
        assert asked["model"] == "titler"
        assert "weekend in Lyon" in asked["messages"][-1]["content"]

        # Later replies ask for no title: the conversation has one.
        second = await dm.post(skey, "and the food?", generation={}, parent=posted["replyKey"])
        await dm.final(skey, second["replyKey"])
        await anyio.sleep(0.2)
        assert len(titler.requests) == 1


async def test_a_user_title_written_meanwhile_wins(tmp_path: Path, fake_model: FakeModel) -> None:
    titler = fake_model.responder = TitleModel(gate=True)
    async with running_daemon(tmp_path, fake_model, **TITLES) as dm:
        skey = await dm.conversation()
        posted = await dm.post(skey, "hello", generation={})
        await dm.final(skey, posted["replyKey"])
        with anyio.fail_after(10):
            while not titler.requests:  # noqa: ASYNC110 - the fake records in its thread
                await anyio.sleep(0.02)
        r = await dm.http.patch(f"/api/conversations/{skey}", json={"title": "Mine"})
        assert r.status_code == 200
        titler.gate.set()
        await anyio.sleep(0.5)  # the title task has its answer and decides
        value = await info(dm, skey)
        assert value["title"] == "Mine" and value["titleSource"] == "user"
        ref = await dm.service.store.get_record(ALICE, SETTINGS_SPACE, CONVERSATION_REF, skey)
        assert ref is not None and ref.value["title"] == "Mine"


async def test_no_title_when_the_preference_says_so_or_the_conversation_has_one(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    titler = fake_model.responder = TitleModel()
    async with running_daemon(tmp_path, fake_model, **TITLES) as dm:
        titled = await dm.conversation(title="Given")
        posted = await dm.post(titled, "hi", generation={})
        await dm.final(titled, posted["replyKey"])
        r = await dm.http.put("/api/preferences", json={"preferences": {"generateTitles": False}})
        assert r.status_code == 200
        untitled = await dm.conversation()
        posted = await dm.post(untitled, "hi", generation={})
        await dm.final(untitled, posted["replyKey"])
        await anyio.sleep(0.3)
        assert titler.requests == []
        assert "title" not in await info(dm, untitled)
        assert (await info(dm, titled))["title"] == "Given"


async def test_a_failing_title_model_leaves_no_title_and_no_error_reply(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    titler = fake_model.responder = TitleModel(answer=Reply.error(500))
    async with running_daemon(tmp_path, fake_model, **TITLES) as dm:
        skey = await dm.conversation()
        posted = await dm.post(skey, "hi", generation={})
        final = await dm.final(skey, posted["replyKey"])
        assert final["status"] == "complete"
        with anyio.fail_after(10):
            while not titler.requests:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        await anyio.sleep(0.3)
        assert "title" not in await info(dm, skey)
        keys = {k for s, _, k in await dm.store_keys() if s == skey}
        assert keys == {"self", posted["userKey"], posted["replyKey"]}  # no error reply


async def test_the_default_title_model_is_the_turns_own(tmp_path: Path, fake_model: FakeModel) -> None:
    from tests.support.records import text_part
    from tests.support.turnkit import DID, turn_kit
    from turns.settings import TurnSettings

    titler = fake_model.responder = TitleModel(answer="Weekend plans")
    # TurnSettings() leaves titleModel unset: the spec's default, the turn's model.
    async with turn_kit(tmp_path, fake_model, settings=TurnSettings(retries=0), titles=True) as kit:
        skey = await kit.conversation()
        posted = await kit.engine.post_message(
            DID, skey, parent=None, parts=[text_part("hi")], generation={}
        )
        await kit.reply(skey, posted.reply_key)
        with anyio.fail_after(10):
            while True:
                rec = await kit.store.get_record(DID, skey, INFO, "self")
                if rec is not None and "title" in rec.value:
                    break
                await anyio.sleep(0.02)
        assert rec.value["title"] == "Weekend plans"
        assert titler.requests[0]["model"] == "fake-model"


async def test_the_echo_provider_titles_by_the_users_first_words(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    """The embedded defaults' provider: its title is what the user said, not the title
    request echoed back ("Echo: User: ..."); its turns still echo."""
    async with running_daemon(tmp_path, fake_model, turns={"titleModel": "echo:echo"}) as dm:
        skey = await dm.conversation()
        text = "what should I pack for a long weekend in Lyon in May, and which trains go there?\nAnd shoes?"
        posted = await dm.post(skey, text, generation={"model": {"provider": "echo", "id": "echo"}})
        final = await dm.final(skey, posted["replyKey"])
        assert final["content"]["parts"][0]["text"] == f"Echo: {text}"
        value = await eventually_titled(dm, skey)
        assert (value["title"], value["titleSource"]) == ("What should I pack for a long weekend in Lyon in May, and", "generated")
        listed = (await dm.http.get("/api/conversations")).json()["conversations"]
        assert [c["title"] for c in listed if c["skey"] == skey] == ["What should I pack for a long weekend in Lyon in May, and"]


def test_a_models_answer_becomes_a_clean_title():
    assert clean('"Trip to Lyon."') == "Trip to Lyon"
    assert clean("Title: **Budget review**\n\nMore text") == "Budget review"
    long = clean("word " * 40)
    assert len(long) <= 60 and not long.endswith(" ")
