"""One XRPC contract, run against turnd's local XRPC and the reference PDS (SPEC §13).

Every case sends the same requests to both servers and asserts the same answer, except
where SPEC §13 fixes a difference; those cases assert each server's own answer, so the
difference stays documented (and noticed if either side changes). The reference PDS
does not know the chat lexicons, so it answers ``validationStatus: "unknown"`` where
turnd (which validates them) answers ``"valid"``.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from recordstore.cid import record_cid
from recordstore.vocabulary import FILE_PART, IMAGE_PART, MESSAGE, PLAIN_CONTENT, TEXT_PART
from testbed.fakemodel import FakeModel
from tests.support.accounts import ALICE_PASSWORD
from tests.support.daemon import running_daemon
from turns.tls import tls_context

pytestmark = pytest.mark.anyio

MISSING_CID = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
SKEY = "3kaaaaaaaaaa2"  # a TID: the conversation the records are written in


@dataclass
class Target:
    kind: str  # "local" or "pds"
    http: httpx.AsyncClient  # base URL .../xrpc, logged in
    did: str
    handle: str

    @property
    def local(self) -> bool:
        return self.kind == "local"

    async def call(self, nsid: str, body: Any = None, **params: Any) -> httpx.Response:
        if body is None:
            return await self.http.get(nsid, params=params)
        return await self.http.post(nsid, json=body)

    async def create(self, key: str, record: dict[str, Any], **extra: Any) -> httpx.Response:
        body = {"repo": self.did, "collection": MESSAGE, "rkey": f"{SKEY}:{key}"}
        return await self.call("com.atproto.repo.createRecord", {**body, "record": record, **extra})

    async def put(self, key: str, record: dict[str, Any], **extra: Any) -> httpx.Response:
        body = {"repo": self.did, "collection": MESSAGE, "rkey": f"{SKEY}:{key}"}
        return await self.call("com.atproto.repo.putRecord", {**body, "record": record, **extra})

    async def get(self, key: str) -> httpx.Response:
        return await self.call(
            "com.atproto.repo.getRecord", repo=self.did, collection=MESSAGE, rkey=f"{SKEY}:{key}"
        )

    async def upload(self, data: bytes, content_type: str) -> dict[str, Any]:
        r = await self.http.post(
            "com.atproto.repo.uploadBlob", content=data, headers={"Content-Type": content_type}
        )
        assert r.status_code == 200, r.text
        return r.json()["blob"]


@asynccontextmanager
async def _local(tmp_path: Path) -> AsyncIterator[Target]:
    with FakeModel() as fake:
        async with running_daemon(tmp_path, fake) as daemon:
            async with httpx.AsyncClient(base_url=f"{daemon.base_url}/xrpc", timeout=20, verify=tls_context()) as http:
                yield await _login(http, "local", "alice.test", ALICE_PASSWORD)


@asynccontextmanager
async def _pds(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    server = request.getfixturevalue("pds")
    account = server.create_account()
    async with httpx.AsyncClient(base_url=f"{server.url}/xrpc", timeout=20, verify=tls_context()) as http:
        yield await _login(http, "pds", account.handle, account.password)


async def _login(http: httpx.AsyncClient, kind: str, handle: str, password: str) -> Target:
    r = await http.post(
        "com.atproto.server.createSession", json={"identifier": handle, "password": password}
    )
    assert r.status_code == 200, r.text
    session = r.json()
    http.headers["Authorization"] = f"Bearer {session['accessJwt']}"
    return Target(kind, http, session["did"], session["handle"])


@pytest.fixture(params=["local", pytest.param("pds", marks=pytest.mark.pds)])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def target(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Target]:
    ctx = _local(tmp_path) if kind == "local" else _pds(request)
    async with ctx as t:
        yield t


def message(*parts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "$type": MESSAGE,
        "role": "user",
        "content": {"$type": PLAIN_CONTENT, "parts": list(parts) or [text("hi")]},
        "createdAt": "2026-01-01T00:00:00.000Z",
        **extra,
    }


def text(t: str) -> dict[str, Any]:
    return {"$type": TEXT_PART, "text": t}


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (3, 2), "red").save(buf, "PNG")
    return buf.getvalue()


def error(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json().get("error", "")


def status_of(t: Target) -> str:
    # SPEC §13: turnd knows its lexicons; the reference PDS does not.
    return "valid" if t.local else "unknown"


# ------------------------------------------------------------------------------ records


async def test_a_record_gets_the_same_cid_and_uri_from_both(kind, request, tmp_path) -> None:
    async with target(kind, request, tmp_path) as t:
        value = message(text("same bytes, same CID"))
        r = await t.create("3kaaaaaaaaab2", value)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["cid"] == record_cid(value)
        assert out["uri"] == f"at://{t.did}/{MESSAGE}/{SKEY}:3kaaaaaaaaab2"
        assert out["validationStatus"] == status_of(t)
        got = (await t.get("3kaaaaaaaaab2")).json()
        assert (got["cid"], got["value"]) == (out["cid"], value)
        assert error(await t.get("3kaaaaaaaaac2")) == (400, "RecordNotFound")


async def test_an_integral_number_is_the_integer(kind, request, tmp_path) -> None:
    async with target(kind, request, tmp_path) as t:
        r = await t.create("3kaaaaaaaaab2", message(extra={"n": 123.0, "m": [1.0]}))
        assert r.status_code == 200, r.text
        assert r.json()["cid"] == record_cid(message(extra={"n": 123, "m": [1]}))
        got = (await t.get("3kaaaaaaaaab2")).json()["value"]
        assert got["extra"] == {"n": 123, "m": [1]} and type(got["extra"]["n"]) is int
        # A float that is not integral is refused by both (the PDS names it InvalidRequest).
        r = await t.create("3kaaaaaaaaac2", message(extra={"n": 1.5}))
        assert error(r) == (400, "InvalidRecord" if t.local else "InvalidRequest")


async def test_validate(kind, request, tmp_path) -> None:
    async with target(kind, request, tmp_path) as t:
        r = await t.create("3kaaaaaaaaab2", message(), validate=True)
        if t.local:  # SPEC §13: turnd validates against its lexicons and says so
            assert r.status_code == 200 and r.json()["validationStatus"] == "valid", r.text
        else:  # the PDS refuses validate: true for a lexicon it does not know
            assert error(r) == (400, "InvalidRequest")
            assert "Unknown lexicon type" in r.json()["message"]
        r = await t.create("3kaaaaaaaaac2", message())  # validate unset
        assert r.json()["validationStatus"] == status_of(t)
        r = await t.create("3kaaaaaaaaad2", message(), validate=False)
        assert r.status_code == 200 and "validationStatus" not in r.json() or t.local
        # turnd validates even then: an invalid record is refused whatever validate says.
        r = await t.create("3kaaaaaaaaae2", {"$type": MESSAGE, "role": 3}, validate=False)
        if t.local:
            assert error(r) == (400, "InvalidRecord")
        else:
            assert r.status_code == 200


async def test_swap_commit(kind, request, tmp_path) -> None:
    async with target(kind, request, tmp_path) as t:
        stale = record_cid({"stale": "commit"})
        r = await t.create("3kaaaaaaaaab2", message(), swapCommit=stale)
        if t.local:  # SPEC §13: the local store has no commits; never silently ignored
            assert error(r) == (400, "InvalidRequest")
            assert r.json()["message"] == "swapCommit is not supported by this store"
        else:
            assert error(r) == (400, "InvalidSwap")
        assert error(await t.get("3kaaaaaaaaab2")) == (400, "RecordNotFound")


async def test_put_with_a_null_swap_is_create_if_absent(kind, request, tmp_path) -> None:
    async with target(kind, request, tmp_path) as t:
        first = message(text("first"))
        r = await t.put("3kaaaaaaaaab2", first, swapRecord=None)
        assert r.status_code == 200, r.text
        assert r.json()["cid"] == record_cid(first)
        r = await t.put("3kaaaaaaaaab2", message(text("second")), swapRecord=None)
        assert error(r) == (400, "InvalidSwap")
        assert r.json()["message"] == f"Record was at {record_cid(first)}"
        assert (await t.get("3kaaaaaaaaab2")).json()["value"] == first
        # A missing swapRecord is an unconditional put.
        r = await t.put("3kaaaaaaaaab2", message(text("third")))
        assert r.status_code == 200 and r.json()["cid"] == record_cid(message(text("third")))


# ------------------------------------------------------------------------------ blobs


async def test_blob_references_are_checked(kind, request, tmp_path) -> None:
    async with target(kind, request, tmp_path) as t:
        missing = {"$type": "blob", "ref": {"$link": MISSING_CID}, "mimeType": "image/png", "size": 3}
        r = await t.create("3kaaaaaaaaab2", message({"$type": IMAGE_PART, "image": missing}))
        assert error(r) == (400, "BlobNotFound")
        assert r.json()["message"] == f"Could not find blob: {MISSING_CID}"

        blob = await t.upload(b"a text file, no signature", "text/plain")
        r = await t.create(
            "3kaaaaaaaaac2", message({"$type": FILE_PART, "file": {**blob, "mimeType": "text/csv"}})
        )
        assert error(r) == (400, "InvalidMimeType")
        assert r.json()["message"] == (
            "Referenced Mimetype does not match stored blob. Expected: text/plain, Got: text/csv"
        )
        r = await t.create(
            "3kaaaaaaaaad2", message({"$type": FILE_PART, "file": {**blob, "size": blob["size"] + 1}})
        )
        assert error(r) == (400, "InvalidSize")
        for key in ("3kaaaaaaaaab2", "3kaaaaaaaaac2", "3kaaaaaaaaad2"):
            assert error(await t.get(key)) == (400, "RecordNotFound")
        r = await t.create("3kaaaaaaaaae2", message({"$type": FILE_PART, "file": blob}))
        assert r.status_code == 200, r.text


async def test_upload_types_the_blob_from_its_bytes(kind, request, tmp_path) -> None:
    async with target(kind, request, tmp_path) as t:
        data = png()
        image = await t.upload(data, "text/plain")  # declared wrong: the bytes win
        assert image["mimeType"] == "image/png" and image["size"] == len(data)
        note = await t.upload(b"plain words", "text/plain")  # no signature: declared kept
        assert note["mimeType"] == "text/plain"
        r = await t.create(
            "3kaaaaaaaaab2",
            message({"$type": IMAGE_PART, "image": image}, {"$type": FILE_PART, "file": note}),
        )
        assert r.status_code == 200, r.text
        for blob, body, content_type in [
            (image, data, "image/png"),
            (note, b"plain words", "text/plain; charset=utf-8"),
        ]:
            cid = blob["ref"]["$link"]
            r = await t.http.get("com.atproto.sync.getBlob", params={"did": t.did, "cid": cid})
            assert r.status_code == 200 and r.content == body
            assert r.headers["content-type"] == content_type
            assert r.headers["content-disposition"] == f'attachment; filename="{cid}"'
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["content-security-policy"] == "default-src 'none'; sandbox"


# ------------------------------------------------------------------------------ repo


async def test_describe_repo_lists_the_collections_present(kind, request, tmp_path) -> None:
    async with target(kind, request, tmp_path) as t:
        r = await t.call("com.atproto.repo.describeRepo", repo=t.did)
        assert r.status_code == 200 and r.json()["collections"] == []
        assert (await t.create("3kaaaaaaaaab2", message())).status_code == 200
        r = await t.call("com.atproto.repo.describeRepo", repo=t.did)
        assert r.json()["collections"] == [MESSAGE]
        assert (r.json()["did"], r.json()["handle"]) == (t.did, t.handle)


async def test_apply_writes(kind, request, tmp_path) -> None:
    async with target(kind, request, tmp_path) as t:
        assert (await t.create("3kaaaaaaaaab2", message(text("b")))).status_code == 200
        assert (await t.create("3kaaaaaaaaac2", message(text("c")))).status_code == 200
        a, b2 = message(text("a")), message(text("b2"))
        ops = [
            {"$type": "com.atproto.repo.applyWrites#create", "collection": MESSAGE,
             "rkey": f"{SKEY}:3kaaaaaaaaaa2", "value": a},
            {"$type": "com.atproto.repo.applyWrites#update", "collection": MESSAGE,
             "rkey": f"{SKEY}:3kaaaaaaaaab2", "value": b2},
            {"$type": "com.atproto.repo.applyWrites#delete", "collection": MESSAGE,
             "rkey": f"{SKEY}:3kaaaaaaaaac2"},
        ]
        r = await t.call("com.atproto.repo.applyWrites", {"repo": t.did, "writes": ops})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["$type"] for x in results] == [
            "com.atproto.repo.applyWrites#createResult",
            "com.atproto.repo.applyWrites#updateResult",
            "com.atproto.repo.applyWrites#deleteResult",
        ]
        assert [x.get("cid") for x in results] == [record_cid(a), record_cid(b2), None]
        assert results[0]["uri"] == f"at://{t.did}/{MESSAGE}/{SKEY}:3kaaaaaaaaaa2"
        assert results[0]["validationStatus"] == status_of(t)
        assert (await t.get("3kaaaaaaaaab2")).json()["value"] == b2
        assert error(await t.get("3kaaaaaaaaac2")) == (400, "RecordNotFound")

        # All or nothing: a create at a taken key fails the batch, and its first write
        # is not kept. (The PDS answers a bare 500; turnd names the conflict.)
        ops = [
            {"$type": "com.atproto.repo.applyWrites#create", "collection": MESSAGE,
             "rkey": f"{SKEY}:3kaaaaaaaaad2", "value": message()},
            {"$type": "com.atproto.repo.applyWrites#create", "collection": MESSAGE,
             "rkey": f"{SKEY}:3kaaaaaaaaaa2", "value": message()},
        ]
        r = await t.call("com.atproto.repo.applyWrites", {"repo": t.did, "writes": ops})
        assert error(r) == ((400, "InvalidRequest") if t.local else (500, "InternalServerError"))
        assert error(await t.get("3kaaaaaaaaad2")) == (400, "RecordNotFound")
        assert (await t.get("3kaaaaaaaaaa2")).json()["value"] == a
        # An update of a record that is not there fails the batch too.
        ops = [{"$type": "com.atproto.repo.applyWrites#update", "collection": MESSAGE,
                "rkey": f"{SKEY}:3kaaaaaaaaaz2", "value": message()}]
        r = await t.call("com.atproto.repo.applyWrites", {"repo": t.did, "writes": ops})
        assert error(r) == ((400, "RecordNotFound") if t.local else (500, "InternalServerError"))
        assert error(await t.get("3kaaaaaaaaaz2")) == (400, "RecordNotFound")


# ------------------------------------------------------------------------------ identity


async def test_resolve_handle(kind, request, tmp_path) -> None:
    async with target(kind, request, tmp_path) as t:
        r = await t.call("com.atproto.identity.resolveHandle", handle=t.handle)
        assert r.status_code == 200 and r.json() == {"did": t.did}
        r = await t.call("com.atproto.identity.resolveHandle", handle="nobody.test")
        assert error(r) == (400, "HandleNotFound")
        assert r.json()["message"] == "Unable to resolve handle"


async def test_a_method_not_served(kind, request, tmp_path) -> None:
    async with target(kind, request, tmp_path) as t:
        r = await t.call("com.example.nothing")
        if t.local:  # SPEC §13: not served -> 501
            assert error(r) == (501, "MethodNotImplemented")
        else:  # the PDS would proxy it to an app view; this one has none configured
            assert error(r) == (400, "InvalidRequest")


# ------------------------------------------------------------------------------ data model


async def test_data_model_rules_the_pds_does_not_check(kind, request, tmp_path) -> None:
    """SPEC §13 follows the interop suite where the PDS (not knowing the chat lexicons)
    stores anything that encodes: link/bytes objects with other keys, bad union types."""
    async with target(kind, request, tmp_path) as t:
        bad = [
            message(extra={"$link": MISSING_CID, "other": 1}),
            message(extra={"$bytes": "AAAA", "x": 1}),
            message({"$type": "a.b.c#d#e", "x": 1}),
            message({"$type": "#textPart", "text": "x"}),
        ]
        for i, value in enumerate(bad):
            r = await t.create(f"3kaaaaaaaab{i}2", value)
            if t.local:
                assert error(r) == (400, "InvalidRecord"), value
            else:
                assert r.status_code == 200, r.text
        # Both accept a datetime of year 0000, and both refuse a legacy blob on write.
        r = await t.create("3kaaaaaaaaab2", {**message(), "createdAt": "0000-01-01T00:00:00.000Z"})
        assert r.status_code == 200, r.text
        note = await t.upload(b"legacy", "text/plain")
        legacy = {"cid": note["ref"]["$link"], "mimeType": "text/plain"}
        r = await t.create("3kaaaaaaaaac2", message({"$type": FILE_PART, "file": legacy}))
        assert error(r) == (400, "InvalidRecord" if t.local else "InvalidRequest")
        assert r.json()["message"].endswith(f"Legacy blobs are not allowed ({legacy['cid']})")
