"""The two routes of every turn answered by daemon/turn_routes.py: the same answers as
FastAPI's own handler gives, which still takes every request the fast way does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.fakemodel import FakeModel
from tests.support.daemon import running_daemon
from tests.support.records import text_part
from tests.support.sse import read_events

pytestmark = pytest.mark.anyio

JSON = "application/json"


async def test_a_post_answers_alike_the_fast_way_and_through_fastapi(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation()
        url = f"/api/conversations/{skey}/messages"
        body = json.dumps({"parts": [text_part("héllo")], "generation": {}}).encode()
        answers = []
        # Exactly JSON: the fast way. With a charset: FastAPI's handler.
        for content_type in (JSON, f"{JSON}; charset=utf-8"):
            r = await dm.http.post(url, content=body, headers={"Content-Type": content_type})
            assert r.status_code == 201, r.text
            assert r.headers["content-type"] == JSON
            answers.append(r)
            await dm.final(skey, r.json()["replyKey"])
        fast, general = answers
        assert set(fast.json()) == set(general.json()) == {"userKey", "replyKey", "turn"}
        # Byte for byte the same form: pydantic's compact JSON, as FastAPI writes it.
        assert fast.content == json.dumps(fast.json(), separators=(",", ":")).encode()
        assert general.content == json.dumps(general.json(), separators=(",", ":")).encode()


async def test_a_bad_post_gets_fastapis_errors_in_fastapis_order(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation()
        before = await dm.store_keys()
        url = f"/api/conversations/{skey}/messages"
        good = json.dumps({"parts": [text_part("x")]}).encode()
        cases = [
            # FastAPI reads the body before it asks for the account: malformed is 422 first.
            (None, b"{not json", 422, "InvalidRequest"),
            (None, good, 401, "AuthRequired"),
            ("wrong-token", good, 401, "AuthRequired"),
            (None, b'{"parts": [], "colour": "red"}', 401, "AuthRequired"),
            ("default", b'{"parts": [], "colour": "red"}', 422, "InvalidRequest"),
            ("default", b"[1, 2]", 422, "InvalidRequest"),
            ("default", b"", 422, "InvalidRequest"),
            ("default", b"[" * 100_000, 400, None),  # deeper than the parser goes
        ]
        for token, content, status, name in cases:
            async with dm.client() if token == "default" else dm.client(token) as http:
                r = await http.post(url, content=content, headers={"Content-Type": JSON})
            assert r.status_code == status, (token, content[:20], r.text)
            assert set(r.json()) == {"error", "message"}
            if name is not None:
                assert r.json()["error"] == name
        assert await dm.store_keys() == before


async def test_the_stream_route_reads_its_path_and_resume_point(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation()
        posted = await dm.post(skey, "hi", generation={})
        await dm.final(skey, posted["replyKey"])
        url = f"/api/conversations/{skey}/messages/{posted['replyKey']}/stream"
        async with dm.http.stream("GET", url) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = await read_events(r)
        assert events[-1]["event"] == "status", events
        r = await dm.http.get(url, headers={"Last-Event-ID": "nope"})
        assert r.status_code == 422 and "Last-Event-ID" in r.json()["message"]
        r = await dm.http.get(f"/api/conversations/{skey}/messages/3zzzzzzzzzzzz/stream")
        assert r.status_code == 404 and r.json()["error"] == "NotFound"
