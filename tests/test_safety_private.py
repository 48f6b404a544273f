"""SPEC §12 "The local store is private": the Host check, private XRPC reads, file modes.

Probe 3 of issue 12: a page on attacker.example rebinds its name to 127.0.0.1 and
reads ``listRecords`` of a predictable handle. Here the same request is sent with
the attacker's Host, then with ours and no login.
"""

from __future__ import annotations

import stat
from pathlib import Path

import anyio
import httpx
import pytest

from daemon.hosts import OwnNames
from testbed.fakemodel import FakeModel
from tests.support.accounts import ALICE, ALICE_TOKEN, BOB_TOKEN
from tests.support.daemon import running_daemon
from tests.support.records import MESSAGE
from turns.tls import tls_context

pytestmark = pytest.mark.anyio

LIST = f"/xrpc/com.atproto.repo.listRecords?repo=alice.test&collection={MESSAGE}&reverse=true"


async def _raw(port: int, request: bytes) -> bytes:
    """One request over a plain socket (httpx always sends a Host header)."""
    async with await anyio.connect_tcp("127.0.0.1", port) as sock:
        await sock.send(request)
        out = b""
        with anyio.fail_after(10):
            try:
                while True:
                    out += await sock.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
        return out


async def test_dns_rebinding_is_refused_and_reads_need_a_login(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation(title="secret")
        await dm.post(skey, "my secret words")
        port = dm.service.port
        cursor = f"&cursor={skey}:"
        async with httpx.AsyncClient(base_url=dm.base_url, timeout=10, verify=tls_context()) as anon:
            # The probe: the attacker's name, as the rebinding browser sends it.
            r = await anon.get(LIST + cursor, headers={"Host": f"attacker.example:{port}"})
            assert r.status_code == 400
            assert r.json()["error"] == "InvalidHost"
            assert "secret" not in r.text
            # Our own name at another port is not ours either.
            r = await anon.get("/healthz", headers={"Host": f"localhost:{port + 1}"})
            assert r.status_code == 400 and r.json()["error"] == "InvalidHost"
            for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
                r = await anon.get("/healthz", headers={"Host": host})
                assert r.status_code == 200, (host, r.text)

            # Our name but no login: the store is private.
            r = await anon.get(LIST + cursor)
            assert r.status_code == 401, r.text
            assert "secret" not in r.text
            for path in (
                f"/xrpc/com.atproto.repo.getRecord?repo={ALICE}&collection={MESSAGE}"
                f"&rkey={skey}:x",
                f"/xrpc/com.atproto.repo.describeRepo?repo={ALICE}",
                f"/xrpc/com.atproto.sync.getBlob?did={ALICE}&cid=bafkreiabc",
            ):
                r = await anon.get(path)
                assert r.status_code == 401, (path, r.text)
            # Bob's /api token does not read Alice's repo; hers does.
            r = await anon.get(LIST + cursor, headers={"Authorization": f"Bearer {BOB_TOKEN}"})
            assert r.status_code == 401
            r = await anon.get(LIST + cursor, headers={"Authorization": f"Bearer {ALICE_TOKEN}"})
            assert r.status_code == 200 and "my secret words" in r.text

        # A POST with a foreign Host is refused before its body is read: the request
        # head promises a body that never comes, and the answer arrives anyway.
        head = (
            b"POST /api/conversations HTTP/1.1\r\nHost: attacker.example\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{"
        )
        answer = await _raw(port, head)
        assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
        assert b"InvalidHost" in answer
        # No Host header at all (HTTP/1.0 allows leaving it out): refused alike.
        for version in (b"1.0", b"1.1"):
            answer = await _raw(port, b"GET /healthz HTTP/" + version + b"\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
            assert b'"error":"InvalidHost"' in answer.replace(b" ", b""), answer


async def test_public_reads_and_allowed_hosts(tmp_path: Path, fake_model: FakeModel) -> None:
    tables = {
        "xrpc": {"public_reads": True},
        "http": {"allowed_hosts": ["chat.example", "other.example:9000"]},
    }
    async with running_daemon(tmp_path, fake_model, **tables) as dm:
        skey = await dm.conversation()
        await dm.post(skey, "open words")
        async with httpx.AsyncClient(base_url=dm.base_url, timeout=10, verify=tls_context()) as anon:
            r = await anon.get(LIST + f"&cursor={skey}:", headers={"Host": "chat.example:1234"})
            assert r.status_code == 200 and "open words" in r.text
            r = await anon.get("/healthz", headers={"Host": "other.example:9000"})
            assert r.status_code == 200
            r = await anon.get("/healthz", headers={"Host": "other.example:9001"})
            assert r.status_code == 400 and r.json()["error"] == "InvalidHost"


def test_wildcard_listen_accepts_ip_literals_only() -> None:
    names = OwnNames("0.0.0.0", lambda: 8787, [])
    assert names.accepts("192.168.1.20:8787")
    assert names.accepts("[fe80::1]:8787")
    assert names.accepts("localhost:8787")
    assert not names.accepts("myhost.lan:8787")
    assert not names.accepts("evil.example")
    named = OwnNames("::", lambda: 8787, ["myhost.lan"])
    assert named.accepts("myhost.lan:8787") and named.accepts("myhost.lan")
    assert not OwnNames("127.0.0.1", lambda: 8787, []).accepts("10.0.0.1:8787")


async def test_data_dir_and_files_are_private(tmp_path: Path, fake_model: FakeModel) -> None:
    async with running_daemon(tmp_path, fake_model) as dm:
        skey = await dm.conversation()
        await dm.post(skey, "x")
        data = dm.service.config.store_path
        login = await dm.http.post(
            "/xrpc/com.atproto.server.createSession",
            json={"identifier": "alice.test", "password": "alice-password-xyz"},
        )
        assert login.status_code == 200
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        files = [p for p in data.rglob("*") if p.is_file()]
        assert any(p.name.startswith("store.sqlite3") for p in files)
        assert any(p.name.startswith("state.sqlite3") for p in files)
        for path in files:
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
