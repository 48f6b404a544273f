"""Reply streams over SSE: replay, resume, stored status, keepalive, disconnects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import daemon.http
from recordstore import MESSAGE
from testbed.fakemodel import FakeModel, Reply
from tests.support.accounts import ALICE
from tests.support.daemon import Daemon, running_daemon
from tests.support.sse import parse_events, read_events

pytestmark = pytest.mark.anyio

PLAIN = "network.sharedcomputer.chat.defs#plainContent"


def stream_url(skey: str, reply_key: str) -> str:
    return f"/api/conversations/{skey}/messages/{reply_key}/stream"


async def read_stream(
    dm: Daemon, skey: str, reply_key: str, *, limit: int | None = None, **headers: str
) -> list[dict[str, Any]]:
    async with dm.http.stream("GET", stream_url(skey, reply_key), headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return await read_events(r, limit=limit)


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["data"]["text"] for e in events if e["event"] == "delta")


async def test_live_stream_then_replay_to_a_late_subscriber(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    fake_model.default = Reply.tokens(20).delayed(chunk_delay=0.01)
    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation()
        posted = await dm.post(skey, "count", generation={})
        live = await read_stream(dm, skey, posted["replyKey"])
        assert [e["id"] for e in live] == list(range(1, len(live) + 1))
        assert live[0] == {
            "id": 1, "event": "step",
            "data": {"index": 0, "model": {"provider": "fake", "id": "fake-model"}},
        }
        assert live[1] == {"id": 2, "event": "part-start", "data": {"index": 0, "type": "text"}}
        assert live[-1]["event"] == "status" and live[-1]["data"]["status"] == "complete"
        assert live[-1]["data"]["model"] == {"provider": "fake", "id": "fake-model"}
        final = await dm.final(skey, posted["replyKey"])
        assert text_of(live) == final["content"]["parts"][0]["text"]

        # The turn is over; its buffer is kept a minute: a late subscriber gets it all.
        assert await read_stream(dm, skey, posted["replyKey"]) == live


async def test_resume_with_last_event_id(tmp_path: Path, fake_model: FakeModel) -> None:
    fake_model.default = Reply.tokens(30).delayed(chunk_delay=0.02)
    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation()
        posted = await dm.post(skey, "count", generation={})
        reply_key = posted["replyKey"]
        head = await read_stream(dm, skey, reply_key, limit=5)  # then disconnect mid-turn
        assert [e["id"] for e in head] == [1, 2, 3, 4, 5]
        tail = await read_stream(dm, skey, reply_key, **{"Last-Event-ID": "5"})
        ids = [e["id"] for e in head + tail]
        assert ids == list(range(1, len(ids) + 1))  # none twice, none lost
        assert tail[-1]["event"] == "status"
        final = await dm.final(skey, reply_key)
        assert text_of(head + tail) == final["content"]["parts"][0]["text"]
        # The query parameter does the same for readers that cannot set headers.
        async with dm.http.stream("GET", stream_url(skey, reply_key) + "?lastEventId=29") as r:
            after = await read_events(r)
        assert [e["id"] for e in after] == list(range(30, ids[-1] + 1))
        # A bad id is a 422 naming where it came from, not a 500.
        for headers, query, where in (
            ({"Last-Event-ID": "x"}, "", "header.Last-Event-ID: Input should be a valid integer"),
            ({"Last-Event-ID": "-1"}, "", "header.Last-Event-ID: Input should be greater than or equal to 0"),
            ({}, "?lastEventId=-3", "query.lastEventId: Input should be greater than or equal to 0"),
            ({}, "?lastEventId=2.5", "query.lastEventId: Input should be a valid integer"),
        ):
            r = await dm.http.get(stream_url(skey, reply_key) + query, headers=headers)
            assert r.status_code == 422
            assert r.json()["error"] == "InvalidRequest"
            assert r.json()["message"].startswith(where), r.json()
        # The header wins over the query (an EventSource resuming sends the header).
        async with dm.http.stream(
            "GET", stream_url(skey, reply_key) + "?lastEventId=3", headers={"Last-Event-ID": "29"}
        ) as r:
            assert [e["id"] for e in await read_events(r)] == list(range(30, ids[-1] + 1))


async def test_stored_status_when_not_running_here(tmp_path: Path, fake_model: FakeModel) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation()
        posted = await dm.post(skey, "hi")
        # A reply this process never ran (another daemon's, or from before a restart).
        reply_key = f"{posted['userKey']}.r0"
        await dm.service.store.create_record(
            ALICE,
            skey,
            MESSAGE,
            reply_key,
            {
                "$type": MESSAGE,
                "role": "assistant",
                "parent": posted["userKey"],
                "content": {"$type": PLAIN, "parts": []},
                "status": "error",
                "error": "interrupted",
                "createdAt": "2026-01-01T00:00:00.000Z",
            },
        )
        events = await read_stream(dm, skey, reply_key)
        assert events == [
            {"id": 1, "event": "status", "data": {"status": "error", "error": "interrupted"}}
        ]
        events = await read_stream(dm, skey, reply_key, **{"Last-Event-ID": "7"})
        assert [e["id"] for e in events] == [8]
        # No record at that key, or a user message: 404 before any stream starts.
        for key in (f"{posted['userKey']}.r5", posted["userKey"]):
            r = await dm.http.get(stream_url(skey, key))
            assert (r.status_code, r.json()["error"]) == (404, "NotFound")


async def test_disconnect_does_not_cancel_and_slow_readers_do_not_slow(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    word = "word" * 50
    fake_model.default = Reply.tokens(400, word=word).delayed(chunk_delay=0.001)
    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation()
        posted = await dm.post(skey, "long", generation={})
        reply_key = posted["replyKey"]
        # One reader leaves after two events; another never reads past the headers.
        await read_stream(dm, skey, reply_key, limit=2)
        async with dm.client() as slow, slow.stream("GET", stream_url(skey, reply_key)) as r:
            assert r.status_code == 200
            final = await dm.final(skey, reply_key, wait=10)
            assert final["status"] == "complete"
            text = final["content"]["parts"][0]["text"]
            assert text == "".join(f"{word}{i} " for i in range(400))


async def _until_subscribers(dm: Daemon, count: int) -> None:
    """Poll /metrics until ``turnd_stream_subscribers`` reads ``count`` (the caller's timeout)."""
    while True:
        metrics = (await dm.http.get("/metrics")).text
        line = next(x for x in metrics.splitlines() if x.startswith("turnd_stream_subscribers "))
        if float(line.split()[1]) == count:
            return
        await anyio.sleep(0.02)


async def test_a_subscriber_that_goes_away_is_let_go_while_the_turn_runs(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    # A quiet stream (the model takes 5 s to its first token) whose client closes its
    # connection: the response ends at once, not at the next keepalive or the turn's end.
    fake_model.default = Reply.text(["late"]).delayed(ttft=5.0)
    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation()
        posted = await dm.post(skey, "hi", generation={})
        async with dm.client() as gone:
            async with gone.stream("GET", stream_url(skey, posted["replyKey"])) as r:
                assert r.status_code == 200
                with anyio.fail_after(5):
                    await _until_subscribers(dm, 1)
        with anyio.fail_after(2):
            await _until_subscribers(dm, 0)
        stored = await dm.http.get(f"/api/conversations/{skey}")
        reply = next(m for m in stored.json()["messages"] if m["key"] == posted["replyKey"])
        assert reply["value"]["status"] == "pending"  # the turn itself goes on
        final = await dm.final(skey, posted["replyKey"], wait=10)
        assert final["status"] == "complete"


async def test_keepalive_and_queued(
    tmp_path: Path, fake_model: FakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stream pings every 15 s when idle; shortened here to see one.
    monkeypatch.setattr(daemon.http, "KEEPALIVE_SECONDS", 0.2)
    fake_model.default = Reply.text(["slow"]).delayed(ttft=1.0)
    async with running_daemon(tmp_path, fake_model, turns={"ratePerMinute": 1}) as dm:
        skey = await dm.conversation()
        first = await dm.post(skey, "one", generation={})
        assert first["turn"] == "claimed"
        async with dm.http.stream("GET", stream_url(skey, first["replyKey"])) as r:
            lines = [line async for line in r.aiter_lines()]
        assert ": ping" in lines  # during the model's 1 s before its first token
        events = parse_events("\n".join(lines) + "\n")
        assert events[-1]["event"] == "status"

        second = await dm.post(skey, "two", generation={})
        assert second["turn"] == "queued"
        dm.kill_on_exit = True  # the queued turn would hold a drain for the rest of the minute
        with anyio.fail_after(5):
            async with dm.http.stream("GET", stream_url(skey, second["replyKey"])) as r:
                events = await read_events(r, limit=1)
        assert events[0] == {"id": 1, "event": "queued", "data": {}}
