"""SPEC §12 uploads: 507 on a full disk, clean file names, two at once, a storage cap.

The probe (issue 12, item 6 and 11): an upload on a full disk answered 500;
``X-Filename`` kept control characters and ``../``; uploads had no per-account
concurrency or storage limit.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import anyio
import pytest

from daemon.uploads import clean_filename
from testbed.fakemodel import FakeModel
from tests.support.accounts import ALICE_PASSWORD, BOB_TOKEN
from tests.support.daemon import running_daemon
from tests.support.disk import small_disk

pytestmark = pytest.mark.anyio

ATTACH = "/api/attachments"
OCTET = {"Content-Type": "application/octet-stream"}


async def test_a_full_disk_is_507_never_500(tmp_path: Path, fake_model: FakeModel) -> None:
    with small_disk(tmp_path / "data"):
        async with running_daemon(tmp_path, fake_model) as dm:
            big = os.urandom(7 * 1024 * 1024)  # more than the disk holds
            r = await dm.http.post(ATTACH, content=big, headers=OCTET)
            assert r.status_code == 507, r.text
            assert r.json()["error"] == "InsufficientStorage"
            # The same through XRPC uploadBlob, as a stock client uploads.
            login = await dm.http.post(
                "/xrpc/com.atproto.server.createSession",
                json={"identifier": "alice.test", "password": ALICE_PASSWORD},
            )
            jwt = login.json()["accessJwt"]
            r = await dm.http.post(
                "/xrpc/com.atproto.repo.uploadBlob",
                content=big,
                headers={**OCTET, "Authorization": f"Bearer {jwt}"},
            )
            assert r.status_code == 507, r.text
            assert r.json()["error"] == "InsufficientStorage"
            # Nothing half-written is left taking the space: a small file still fits.
            r = await dm.http.post(ATTACH, content=b"small", headers=OCTET)
            assert r.status_code == 200, r.text
            assert (await dm.http.get("/healthz")).status_code == 200


async def test_x_filename_is_a_clean_base_name(tmp_path: Path, fake_model: FakeModel) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        for raw, want in (
            (quote("../../etc/pa\x01ss\x7fwd"), "passwd"),
            (quote("C:\\Users\\me\\report\u202e.txt"), "report.txt"),
            (quote("line\r\nbreak.txt"), "linebreak.txt"),
            (quote(".."), None),
        ):
            r = await dm.http.post(ATTACH, content=b"x", headers={**OCTET, "X-Filename": raw})
            assert r.status_code == 200, r.text
            assert r.json()["part"].get("name") == want, raw
        long = quote("é" * 300 + ".txt")
        r = await dm.http.post(ATTACH, content=b"x", headers={**OCTET, "X-Filename": long})
        name = r.json()["part"]["name"]
        assert len(name.encode()) <= 255 and name.startswith("é")
    assert clean_filename("a/b/ok.txt") == "ok.txt"


async def test_two_uploads_per_account_at_once(tmp_path: Path, fake_model: FakeModel) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        release = anyio.Event()
        started = [anyio.Event(), anyio.Event()]

        def body(i: int) -> AsyncIterator[bytes]:
            async def gen() -> AsyncIterator[bytes]:
                yield b"first half "
                started[i].set()
                await release.wait()
                yield b"second half"

            return gen()

        results: list[int] = []

        async def slow(i: int) -> None:
            async with dm.client() as c:
                r = await c.post(ATTACH, content=body(i), headers=OCTET)
                results.append(r.status_code)

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow, 0)
            tg.start_soon(slow, 1)
            with anyio.fail_after(60):  # deadlines for a loaded machine, not timings
                for event in started:
                    await event.wait()
            # Both slots are taken while the two bodies trickle in: the third waits no
            # turn, it is refused before its body is read.
            with anyio.fail_after(60):
                while True:
                    r = await dm.http.post(ATTACH, content=b"third", headers=OCTET)
                    if r.status_code == 429:
                        break
                    await anyio.sleep(0.05)  # a slot not yet taken by the server
            assert r.json()["error"] == "RateLimitExceeded"
            # Another account has its own slots.
            async with dm.client(BOB_TOKEN) as bob:
                assert (await bob.post(ATTACH, content=b"bob", headers=OCTET)).status_code == 200
            release.set()
        assert results == [200, 200]
        assert (await dm.http.post(ATTACH, content=b"again", headers=OCTET)).status_code == 200


async def test_max_storage_bytes_caps_an_account(tmp_path: Path, fake_model: FakeModel) -> None:
    accounts = {
        "alice": {
            "handle": "alice.test",
            "password_env": "T_ALICE_PASSWORD",
            "token_env": "T_ALICE_TOKEN",
            "maxStorageBytes": 1000,
        },
        "bob": {"handle": "bob.test", "password_env": "T_BOB_PASSWORD", "token_env": "T_BOB_TOKEN"},
    }
    async with running_daemon(tmp_path, fake_model, accounts=accounts) as dm:
        r = await dm.http.post(ATTACH, content=os.urandom(600), headers=OCTET)
        assert r.status_code == 200, r.text
        r = await dm.http.post(ATTACH, content=os.urandom(600), headers=OCTET)
        assert r.status_code == 413, r.text
        assert r.json()["error"] == "PayloadTooLarge"
        async with dm.client(BOB_TOKEN) as bob:  # no cap for bob
            r = await bob.post(ATTACH, content=os.urandom(600), headers=OCTET)
            assert r.status_code == 200
            r = await bob.post(ATTACH, content=os.urandom(600), headers=OCTET)
            assert r.status_code == 200
