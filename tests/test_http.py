"""The /api routes, attachments, health, metrics, CORS: the real daemon on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from testbed.fakemodel import FakeModel, Reply
from tests.support.accounts import ALICE, BOB_TOKEN
from tests.support.daemon import running_daemon
from tests.support.records import MESSAGE, text_part
from tests.support.sse import read_events

pytestmark = pytest.mark.anyio

DEFS = "network.sharedcomputer.chat.defs"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)


async def test_conversation_lifecycle(tmp_path: Path, fake_model: FakeModel) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        first = await dm.conversation(title="first", systemPrompt="be brief")
        second = await dm.conversation()

        # Without a generation request: only the user message, no turn.
        quiet = await dm.post(first, "just a note")
        assert quiet["replyKey"] is None and quiet["turn"] is None
        # With one: claimed, and the reply lands at <key>.r0.
        asked = await dm.post(first, "hello", parent=quiet["userKey"], generation={})
        assert asked["turn"] == "claimed"
        assert asked["replyKey"] == f"{asked['userKey']}.r0"
        reply = await dm.final(first, asked["replyKey"])
        assert reply["status"] == "complete" and reply["parent"] == asked["userKey"]

        # Regenerating raises the attempt and keeps the earlier reply.
        r = await dm.http.post(
            f"/api/conversations/{first}/messages/{asked['userKey']}/regenerate",
            json={"effort": "low"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["replyKey"] == f"{asked['userKey']}.r1"
        await dm.final(first, r.json()["replyKey"])

        r = await dm.http.get(f"/api/conversations/{first}")
        assert r.status_code == 200
        body = r.json()
        assert body["info"]["title"] == "first" and body["info"]["systemPrompt"] == "be brief"
        assert [m["key"] for m in body["messages"]] == [
            quiet["userKey"],
            asked["userKey"],
            f"{asked['userKey']}.r0",
            f"{asked['userKey']}.r1",
        ]
        assert all(m["cid"].startswith("bafy") for m in body["messages"])
        assert not (await dm.record(first, f"{quiet['userKey']}.r0"))

        # Newest first: the first conversation was written to last.
        r = await dm.http.get("/api/conversations")
        listed = r.json()["conversations"]
        assert [c["skey"] for c in listed] == [first, second]
        assert listed[0]["title"] == "first" and listed[1]["title"] is None
        assert all(c["updatedAt"] for c in listed)

        # Bob sees none of it.
        async with dm.client(BOB_TOKEN) as bob:
            assert (await bob.get("/api/conversations")).json() == {"conversations": [], "cursor": None}


async def test_cancel(tmp_path: Path, fake_model: FakeModel) -> None:
    fake_model.default = Reply.text(["partial ", "answer"]).stall(after=2)
    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation()
        posted = await dm.post(skey, "hi", generation={})
        url = f"/api/conversations/{skey}/messages/{posted['replyKey']}/cancel"
        stream = f"/api/conversations/{skey}/messages/{posted['replyKey']}/stream"
        with anyio.fail_after(5):
            async with dm.http.stream("GET", stream) as r:
                head = await read_events(r, limit=3)  # step, part-start, then the first delta
        assert head[-1]["event"] == "delta"
        r = await dm.http.post(url)
        assert r.status_code == 200 and r.json() == {"cancelled": True}
        final = await dm.final(skey, posted["replyKey"])
        assert final["status"] == "cancelled"
        assert final["content"]["parts"][0]["text"] == "partial "
        assert (await dm.http.post(url)).json() == {"cancelled": False}


async def test_auth_and_ownership_write_nothing(tmp_path: Path, fake_model: FakeModel) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation(title="mine")
        posted = await dm.post(skey, "hi", generation={})
        await dm.final(skey, posted["replyKey"])
        before = await dm.store_keys()
        message = {"parts": [text_part("x")], "generation": {}}
        routes = [
            ("GET", "/api/conversations", None),
            ("POST", "/api/conversations", {"title": "t"}),
            ("GET", f"/api/conversations/{skey}", None),
            ("POST", f"/api/conversations/{skey}/messages", message),
            ("POST", f"/api/conversations/{skey}/messages/{posted['userKey']}/regenerate", {}),
            ("POST", f"/api/conversations/{skey}/messages/{posted['replyKey']}/cancel", None),
            ("GET", f"/api/conversations/{skey}/messages/{posted['replyKey']}/stream", None),
        ]
        for token in (None, "wrong-token"):
            async with dm.client(token) as anon:
                for method, url, body in routes:
                    r = await anon.request(method, url, json=body)
                    assert r.status_code == 401, (method, url)
                    assert r.json()["error"] == "AuthRequired"
                    assert r.headers["www-authenticate"] == "Bearer"
                r = await anon.post("/api/attachments", content=PNG)
                assert r.status_code == 401
        # Another account's conversation is a missing one.
        async with dm.client(BOB_TOKEN) as bob:
            for method, url, body in routes[2:]:
                r = await bob.request(method, url, json=body)
                assert r.status_code == 404, (method, url, r.text)
                assert r.json()["error"] == "NotFound"
        assert await dm.store_keys() == before


async def test_bad_input_is_a_4xx_naming_it(tmp_path: Path, fake_model: FakeModel) -> None:
    async with running_daemon(tmp_path, fake_model, http={"max_body_bytes": 4096}) as dm:
        skey = await dm.conversation()
        before = await dm.store_keys()
        messages = f"/api/conversations/{skey}/messages"

        async def error(method: str, url: str, **kwargs: object) -> tuple[int, str, str]:
            r = await dm.http.request(method, url, **kwargs)  # type: ignore[arg-type]
            body = r.json()
            assert set(body) == {"error", "message"}, body
            return r.status_code, body["error"], body["message"]

        status, name, msg = await error("POST", messages, json={"parts": [], "colour": "red"})
        assert (status, name) == (422, "InvalidRequest") and "colour" in msg
        status, name, msg = await error("POST", messages, json={})
        assert status == 422 and "parts" in msg
        bad_effort = {"parts": [text_part("x")], "generation": {"effort": "extreme"}}
        status, _, msg = await error("POST", messages, json=bad_effort)
        assert status == 422 and "effort" in msg
        status, _, msg = await error("POST", messages, content=b"{not json", headers=_json())
        assert status == 422
        status, _, msg = await error("POST", "/api/conversations", json={"title": 5})
        assert status == 422 and "title" in msg
        # The record validator's verdict: a text part without its text.
        no_text = {"parts": [{"$type": f"{DEFS}#textPart"}], "generation": {}}
        status, name, msg = await error("POST", messages, json=no_text)
        assert (status, name) == (400, "InvalidRecord") and "text" in msg
        status, name, _ = await error("GET", "/api/conversations/bad:key")
        assert (status, name) == (400, "InvalidKey")
        status, name, _ = await error("POST", messages, json={"parts": [], "parent": "nope"})
        assert status == 404
        status, name, _ = await error("GET", "/api/conversations/3zzzzzzzzzzzz")
        assert (status, name) == (404, "NotFound")
        # Too large, declared and chunked (no Content-Length: counted while read).
        big = {"parts": [text_part("y" * 5000)]}
        status, name, _ = await error("POST", messages, json=big)
        assert (status, name) == (413, "PayloadTooLarge")

        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"parts": [{"$type": "' + DEFS.encode() + b'#textPart", "text": "'
            for _ in range(10):
                yield b"z" * 1000
            yield b'"}]}'

        status, name, _ = await error("POST", messages, content=chunks(), headers=_json())
        assert (status, name) == (413, "PayloadTooLarge")
        status, name, _ = await error("POST", "/api/attachments", content=b"q" * 5000)
        assert (status, name) == (413, "PayloadTooLarge")
        status, name, _ = await error("GET", "/api/nowhere")
        assert (status, name) == (404, "NotFound")
        assert await dm.store_keys() == before


def _json() -> dict[str, str]:
    return {"Content-Type": "application/json"}


async def test_attachments(tmp_path: Path, fake_model: FakeModel) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        r = await dm.http.post(
            "/api/attachments", content=PNG, headers={"Content-Type": "image/png"}
        )
        assert r.status_code == 200, r.text
        image = r.json()["part"]
        assert image["$type"] == f"{DEFS}#imagePart"
        assert image["image"]["mimeType"] == "image/png" and image["image"]["size"] == len(PNG)

        r = await dm.http.post(
            "/api/attachments",
            content=b"col1,col2\n1,2\n",
            headers={"Content-Type": "text/csv", "X-Filename": "d%C3%A9j%C3%A0%20vu.csv"},
        )
        file = r.json()["part"]
        assert file["$type"] == f"{DEFS}#filePart" and file["name"] == "déjà vu.csv"
        assert file["file"]["mimeType"] == "text/csv"

        r = await dm.http.post("/api/attachments", content=b"")
        assert (r.status_code, r.json()["error"]) == (400, "InvalidRequest")

        # The parts go into a message as they are.
        skey = await dm.conversation()
        posted = await dm.post(skey, "look", generation={})
        r = await dm.http.post(
            f"/api/conversations/{skey}/messages",
            json={"parent": posted["userKey"], "parts": [image, file, text_part("these")]},
        )
        assert r.status_code == 201, r.text
        stored = await dm.record(skey, r.json()["userKey"])
        assert stored and stored["content"]["parts"][:2] == [image, file]
        blob = await dm.service.store.get_blob(ALICE, image["image"]["ref"]["$link"])
        assert blob == PNG


async def test_ops_routes_and_cors(tmp_path: Path, fake_model: FakeModel) -> None:
    origin = "http://ui.example"
    async with running_daemon(tmp_path, fake_model, http={"cors_origins": [origin]}) as dm:
        r = await dm.http.get("/healthz")
        assert r.status_code == 200 and r.json()["status"] == "ok"
        skey = await dm.conversation()
        await dm.final(skey, (await dm.post(skey, "hi", generation={}))["replyKey"])
        r = await dm.http.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        for name in (
            'turnd_turns_total{status="complete"} 1.0',
            "turnd_queue_length",
            "turnd_time_to_first_token_seconds_bucket",
            "turnd_stream_subscribers",
        ):
            assert name in r.text
        paths = (await dm.http.get("/openapi.json")).json()["paths"]
        for path in (
            "/api/conversations",
            "/api/conversations/{skey}",
            "/api/conversations/{skey}/messages",
            "/api/conversations/{skey}/messages/{key}/regenerate",
            "/api/conversations/{skey}/messages/{replyKey}/cancel",
            "/api/conversations/{skey}/messages/{replyKey}/stream",
            "/api/attachments",
            "/healthz",
            "/metrics",
        ):
            assert path in paths
        r = await dm.http.options(
            "/api/conversations",
            headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
        )
        assert r.headers["access-control-allow-origin"] == origin
        r = await dm.http.get("/api/conversations", headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in r.headers

        dm.service.feed_up = False  # as while the change feed reconnects
        r = await dm.http.get("/healthz")
        assert r.status_code == 503 and r.json()["error"] == "Unavailable"


async def test_cors_off_by_default(tmp_path: Path, fake_model: FakeModel) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        r = await dm.http.get("/api/conversations", headers={"Origin": "http://ui.example"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


async def test_store_records_match_the_api(tmp_path: Path, fake_model: FakeModel) -> None:
    # The API's message list is the store's content, key for key and CID for CID.
    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation()
        await dm.final(skey, (await dm.post(skey, "hi", generation={}))["replyKey"])
        body = (await dm.http.get(f"/api/conversations/{skey}")).json()
        records, _ = await dm.service.store.list_records(ALICE, skey, MESSAGE)
        assert {(m["key"], m["cid"]) for m in body["messages"]} == {(r.key, r.cid) for r in records}
