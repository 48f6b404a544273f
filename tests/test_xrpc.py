"""XRPC for the local store, driven with the stock atproto SDK as against a PDS."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from atproto import AsyncClient, Client
from atproto_client.exceptions import BadRequestError, UnauthorizedError

from daemon import xrpc
from daemon.auth import ACCESS_SCOPE, REFRESH_SCOPE, SessionTokens, TokenError, load_secret
from daemon.feed import FeedFollower
from recordstore.keys import new_tid
from testbed.fakemodel import FakeModel
from tests.support.accounts import ALICE, ALICE_PASSWORD, BOB
from tests.support.daemon import Daemon, running_daemon
from tests.support.records import INFO, MESSAGE, text_part
from turns.titles import asked_title
from turns.tls import tls_context

pytestmark = pytest.mark.anyio

PLAIN = "network.sharedcomputer.chat.defs#plainContent"
NOW = "2026-01-01T00:00:00.000Z"


def user_message(text: str, **fields: Any) -> dict[str, Any]:
    return {
        "$type": MESSAGE,
        "role": "user",
        "content": {"$type": PLAIN, "parts": [text_part(text)]},
        "createdAt": NOW,
        **fields,
    }


async def login(dm: Daemon) -> AsyncClient:
    client = AsyncClient(dm.base_url)
    await client.login("alice.test", ALICE_PASSWORD, fetch_bsky_profile=False)
    return client


async def wait_reply(client: AsyncClient, rkey: str, wait: float = 10) -> Any:
    """Poll getRecord as a direct client does, until the reply is no longer pending."""
    with anyio.fail_after(wait):
        while True:
            try:
                got = await client.com.atproto.repo.get_record(
                    {"repo": "alice.test", "collection": MESSAGE, "rkey": rkey}
                )
                if got.value["status"] != "pending":
                    return got
            except BadRequestError as err:
                assert err.response.content.error == "RecordNotFound"
            await anyio.sleep(0.05)


async def test_sdk_direct_write_gets_a_reply(tmp_path: Path, fake_model: FakeModel) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        client = await login(dm)
        did = client._session.did
        assert did == ALICE
        skey, key = new_tid(), new_tid()
        info = await client.com.atproto.repo.create_record(
            {"repo": did, "collection": INFO, "rkey": f"{skey}:self", "record": {"createdAt": NOW}}
        )
        assert info.uri == f"at://{did}/{INFO}/{skey}:self"
        assert info.validation_status == "valid"
        msg = await client.com.atproto.repo.create_record(
            {
                "repo": "alice.test",
                "collection": MESSAGE,
                "rkey": f"{skey}:{key}",
                "record": user_message("hello", generation={}),
            }
        )
        reply = await wait_reply(client, f"{skey}:{key}.r0")
        assert reply.value["status"] == "complete"
        assert reply.value["parent"] == key  # keys inside records have no space prefix
        assert reply.value["content"]["parts"][0]["text"] == "Hello!"

        # One conversation's records in key order (SPEC §4: reverse + "<skey>:").
        listed = await client.com.atproto.repo.list_records(
            {"repo": did, "collection": MESSAGE, "cursor": f"{skey}:", "reverse": True}
        )
        assert [r.uri.rsplit("/", 1)[1] for r in listed.records] == [
            f"{skey}:{key}",
            f"{skey}:{key}.r0",
        ]
        assert listed.records[0].cid == msg.cid

        # The session refreshes as against a PDS: a new pair of tokens that work.
        old = client._session.refresh_jwt
        refreshed = await client.com.atproto.server.refresh_session(
            headers={"Authorization": f"Bearer {old}"}
        )
        assert refreshed.did == did and refreshed.refresh_jwt != old
        me = await client.com.atproto.server.get_session(
            headers={"Authorization": f"Bearer {refreshed.access_jwt}"}
        )
        assert me.handle == "alice.test" and me.did == did


async def test_a_direct_message_is_answered_after_its_claim(
    tmp_path: Path, fake_model: FakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """createRecord, putRecord and applyWrites of a message asking for a reply answer once
    its turn is claimed, as a POST does: the reply is there when the write returns, with
    the change feed held back meanwhile. Let go, the feed sees the same writes and starts
    no second generation."""
    held = anyio.Event()
    handle = FeedFollower._handle

    async def held_back(self: FeedFollower, change: Any) -> None:
        await held.wait()
        await handle(self, change)

    monkeypatch.setattr(FeedFollower, "_handle", held_back)
    async with running_daemon(tmp_path, fake_model) as dm:
        client = await login(dm)
        skey = new_tid()
        repo = client.com.atproto.repo
        await repo.create_record(
            {"repo": ALICE, "collection": INFO, "rkey": f"{skey}:self", "record": {"createdAt": NOW}}
        )
        keys = [new_tid() for _ in range(3)]

        async def reply(key: str) -> Any:
            rkey = f"{skey}:{key}.r0"
            return await repo.get_record({"repo": ALICE, "collection": MESSAGE, "rkey": rkey})

        await repo.create_record({"repo": ALICE, "collection": MESSAGE, "rkey": f"{skey}:{keys[0]}",
                                  "record": user_message("by create", generation={})})
        found = [await reply(keys[0])]
        await repo.put_record({"repo": ALICE, "collection": MESSAGE, "rkey": f"{skey}:{keys[1]}",
                               "record": user_message("by put", parent=keys[0], generation={})})
        found.append(await reply(keys[1]))
        await repo.apply_writes({"repo": ALICE, "writes": [{
            "$type": "com.atproto.repo.applyWrites#create", "collection": MESSAGE,
            "rkey": f"{skey}:{keys[2]}",
            "value": user_message("by applyWrites", parent=keys[1], generation={}),
        }]})
        found.append(await reply(keys[2]))
        assert [f.value["role"] for f in found] == ["assistant"] * 3
        for key in keys:
            done = await wait_reply(client, f"{skey}:{key}.r0")
            assert done.value["status"] == "complete"
        held.set()
        await anyio.sleep(0.5)  # time for the feed to start a second generation, were there one
        chats = [r.json["messages"] for r in fake_model.requests
                 if r.path.endswith("/chat/completions") and asked_title(r.json["messages"]) is None]
        assert [m[-1]["content"] for m in chats] == ["by create", "by put", "by applyWrites"]


async def test_sync_client_script_with_automatic_refresh(
    tmp_path: Path, fake_model: FakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Access tokens that expire within the SDK's 15-minute margin: the stock sync
    # Client refreshes (refreshSession with the refresh JWT) before every call.
    refreshes: list[str] = []

    def short_lived(state_path: Path | None, audience: str) -> SessionTokens:
        return _Counting(load_secret(None), audience, access_ttl=60, seen=refreshes)

    monkeypatch.setattr(xrpc, "session_tokens", short_lived)
    async with running_daemon(tmp_path, fake_model) as dm:
        skey, key = new_tid(), new_tid()

        def script() -> str:
            client = Client(dm.base_url)
            client.login("alice.test", ALICE_PASSWORD, fetch_bsky_profile=False)
            client.com.atproto.repo.put_record(
                {
                    "repo": "alice.test",
                    "collection": INFO,
                    "rkey": f"{skey}:self",
                    "record": {"createdAt": NOW, "title": "from a script"},
                }
            )
            client.com.atproto.repo.create_record(
                {
                    "repo": "alice.test",
                    "collection": MESSAGE,
                    "rkey": f"{skey}:{key}",
                    "record": user_message("hi", generation={}),
                }
            )
            got = client.com.atproto.repo.get_record(
                {"repo": "alice.test", "collection": INFO, "rkey": f"{skey}:self"}
            )
            return got.value["title"]

        assert await anyio.to_thread.run_sync(script) == "from a script"
        assert (await dm.final(skey, f"{key}.r0"))["status"] == "complete"
        assert len(refreshes) >= 3  # one before each call after the login


def test_an_access_token_verified_once_is_remembered_until_it_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # daemon.auth: a client sends one access token with every call; once verified, the same
    # string is not parsed and signed again, and it still expires when its exp says.
    tokens = SessionTokens(b"s" * 32, "did:web:localhost", access_ttl=60)
    token = tokens.issue(ALICE, ACCESS_SCOPE, sid="one")
    first = tokens.verify(token, ACCESS_SCOPE)
    assert first.did == ALICE and first.sid == "one"
    parsed: list[str] = []
    verify = tokens._verify
    monkeypatch.setattr(tokens, "_verify", lambda t, s: parsed.append(t) or verify(t, s))
    assert tokens.verify(token, ACCESS_SCOPE) is first and parsed == []
    # Another string (one character changed) is verified, and refused.
    tampered = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    with pytest.raises(TokenError, match="could not be verified"):
        tokens.verify(tampered, ACCESS_SCOPE)
    assert parsed == [tampered]
    # As a refresh token it is checked in full (and refused: wrong type).
    with pytest.raises(TokenError, match="Invalid token type"):
        tokens.verify(token, REFRESH_SCOPE)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 61)
    with pytest.raises(TokenError, match="expired"):
        tokens.verify(token, ACCESS_SCOPE)


class _Counting(SessionTokens):
    def __init__(self, *args: Any, seen: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._seen = seen

    def verify(self, token: str, scope: Any) -> Any:
        claims = super().verify(token, scope)
        if scope == REFRESH_SCOPE:
            self._seen.append(claims.did)
        return claims


async def test_listing_pages_in_pds_order(tmp_path: Path, fake_model: FakeModel) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        client = await login(dm)
        skey = new_tid()
        keys = [new_tid() for _ in range(5)]
        for k in keys:
            await client.com.atproto.repo.create_record(
                {
                    "repo": ALICE,
                    "collection": MESSAGE,
                    "rkey": f"{skey}:{k}",
                    "record": user_message(k),
                }
            )
        seen, cursor = [], f"{skey}:"
        while cursor:
            page = await client.com.atproto.repo.list_records(
                {
                    "repo": ALICE,
                    "collection": MESSAGE,
                    "limit": 2,
                    "cursor": cursor,
                    "reverse": True,
                }
            )
            assert len(page.records) <= 2
            seen += [r.uri.rsplit(":", 1)[1] for r in page.records]
            cursor = page.cursor
        assert seen == keys
        # Without reverse a PDS lists descending; "~" sorts after every key character.
        page = await client.com.atproto.repo.list_records(
            {"repo": ALICE, "collection": MESSAGE, "cursor": f"{skey}:~"}
        )
        assert [r.uri.rsplit(":", 1)[1] for r in page.records] == keys[::-1]
        # Without a cursor, as a stock script would, the whole repo's collection, newest first.
        page = await client.com.atproto.repo.list_records({"repo": ALICE, "collection": MESSAGE})
        assert [r.uri.rsplit("/", 1)[1] for r in page.records][:5] == [f"{skey}:{k}" for k in keys[::-1]]


async def test_put_swap_delete_and_blobs(tmp_path: Path, fake_model: FakeModel) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        client = await login(dm)
        repo = client.com.atproto.repo
        skey = new_tid()
        rkey = f"{skey}:self"
        first = await repo.put_record(
            {"repo": ALICE, "collection": INFO, "rkey": rkey, "record": {"createdAt": NOW}}
        )
        second = await repo.put_record(
            {
                "repo": ALICE,
                "collection": INFO,
                "rkey": rkey,
                "record": {"createdAt": NOW, "title": "t"},
                "swapRecord": first.cid,
            }
        )
        with pytest.raises(BadRequestError) as stale:
            await repo.put_record(
                {
                    "repo": ALICE,
                    "collection": INFO,
                    "rkey": rkey,
                    "record": {"createdAt": NOW, "title": "lost"},
                    "swapRecord": first.cid,
                }
            )
        assert stale.value.response.content.error == "InvalidSwap"
        got = await repo.get_record({"repo": ALICE, "collection": INFO, "rkey": rkey})
        assert got.cid == second.cid and got.value["title"] == "t"

        await repo.delete_record({"repo": ALICE, "collection": INFO, "rkey": rkey})
        with pytest.raises(BadRequestError) as gone:
            await repo.get_record({"repo": ALICE, "collection": INFO, "rkey": rkey})
        assert gone.value.response.content.error == "RecordNotFound"

        png = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
        uploaded = await client.upload_blob(png)  # the SDK sends Content-Type */*
        assert uploaded.blob.mime_type == "image/png" and uploaded.blob.size == len(png)
        back = await client.com.atproto.sync.get_blob({"did": ALICE, "cid": uploaded.blob.ref.link})
        assert back == png
        # A Content-Type that is no media type is not trusted (and is no 500).
        async with httpx.AsyncClient(base_url=dm.base_url, verify=tls_context()) as raw:
            r = await raw.post(
                "/xrpc/com.atproto.repo.uploadBlob",
                content=b"plain bytes",
                headers={
                    "Authorization": f"Bearer {client._session.access_jwt}",
                    "Content-Type": "not a type",
                },
            )
        assert r.status_code == 200 and r.json()["blob"]["mimeType"] == "application/octet-stream"

        described = await repo.describe_repo({"repo": "alice.test"})
        assert described.did == ALICE and described.handle_is_correct
        server = await client.com.atproto.server.describe_server()
        assert server.did.startswith("did:web:")


async def test_errors_have_pds_names_and_write_nothing(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    async with running_daemon(tmp_path, fake_model, http={"max_body_bytes": 4096}) as dm:
        client = await login(dm)
        repo = client.com.atproto.repo
        skey = new_tid()
        before = await dm.store_keys(ALICE)

        async def error_of(call: Any, exc: type[Exception] = BadRequestError) -> tuple[int, str]:
            with pytest.raises(exc) as err:
                await call
            return err.value.response.status_code, err.value.response.content.error

        # A record that breaks its lexicon; a wrong $type; a key outside the layout.
        bad = user_message("x")
        del bad["content"]
        rec = {"repo": ALICE, "collection": MESSAGE, "rkey": f"{skey}:{new_tid()}", "record": bad}
        assert await error_of(repo.create_record(rec)) == (400, "InvalidRecord")
        wrong = {**rec, "record": {**user_message("x"), "$type": INFO}}
        assert await error_of(repo.create_record(wrong)) == (400, "InvalidRecord")
        flat = {**rec, "rkey": new_tid(), "record": user_message("x")}
        assert await error_of(repo.create_record(flat)) == (400, "InvalidRequest")
        # Writing to somebody else's repo.
        theirs = {**rec, "repo": BOB, "record": user_message("x")}
        assert await error_of(repo.create_record(theirs), UnauthorizedError) == (
            401,
            "AuthenticationRequired",
        )

        # A taken key: 400 InvalidRequest (the reference PDS answers a bare 500).
        ok = {**rec, "record": user_message("x")}
        await repo.create_record(ok)
        before_dup = await dm.store_keys(ALICE)
        assert await error_of(repo.create_record(ok)) == (400, "InvalidRequest")
        assert await dm.store_keys(ALICE) == before_dup
        assert len(before_dup - before) == 1

        raw = httpx.AsyncClient(base_url=dm.base_url + "/xrpc", verify=tls_context())
        async with raw:
            create = "/com.atproto.repo.createRecord"
            r = await raw.post(create, json=ok)
            assert (r.status_code, r.json()["error"]) == (401, "AuthMissing")
            r = await raw.post(create, json=ok, headers={"Authorization": "Basic eDp5"})
            assert (r.status_code, r.json()["error"]) == (400, "InvalidToken")
            r = await raw.post(create, json=ok, headers={"Authorization": "Bearer not.a.jwt"})
            assert (r.status_code, r.json()["error"]) == (400, "InvalidToken")
            refresh = {"Authorization": f"Bearer {client._session.refresh_jwt}"}
            r = await raw.post(create, json=ok, headers=refresh)
            assert r.json() == {"error": "InvalidToken", "message": "Invalid token type"}
            secret = (dm.service.config.state_path.parent / xrpc.SECRET_FILE).read_bytes()
            expired = SessionTokens(secret, "did:web:localhost", access_ttl=-60)
            stale = {"Authorization": f"Bearer {expired.issue(ALICE, ACCESS_SCOPE)}"}
            r = await raw.post(create, json=ok, headers=stale)
            assert r.json() == {"error": "ExpiredToken", "message": "Token has expired"}
            forged = SessionTokens(b"k" * 32, "did:web:localhost")
            r = await raw.post(
                create,
                json=ok,
                headers={"Authorization": f"Bearer {forged.issue(ALICE, ACCESS_SCOPE)}"},
            )
            assert (r.status_code, r.json()["error"]) == (400, "InvalidToken")
            r = await raw.post(
                "/com.atproto.server.createSession",
                json={"identifier": "alice.test", "password": "wrong"},
            )
            assert (r.status_code, r.json()["error"]) == (401, "AuthenticationRequired")
            # Params the lexicon refuses (the SDK checks this one itself, curl does not).
            r = await raw.get(
                "/com.atproto.repo.listRecords",
                params={"repo": ALICE, "collection": MESSAGE, "limit": 0},
            )
            assert (r.status_code, r.json()["error"]) == (400, "InvalidRequest")
            assert "limit" in r.json()["message"]
            r = await raw.get("/app.bsky.actor.getProfile", params={"actor": "alice.test"})
            assert (r.status_code, r.json()["error"]) == (501, "MethodNotImplemented")
            access = {"Authorization": f"Bearer {client._session.access_jwt}"}
            big = {**ok, "rkey": f"{skey}:{new_tid()}", "record": user_message("y" * 5000)}
            r = await raw.post(create, json=big, headers=access)
            assert (r.status_code, r.json()["error"]) == (413, "PayloadTooLarge")
            r = await raw.post("/com.atproto.repo.uploadBlob", content=b"z" * 5000, headers=access)
            assert (r.status_code, r.json()["error"]) == (413, "PayloadTooLarge")
        assert await dm.store_keys(ALICE) == before_dup
