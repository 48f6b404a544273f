"""SPEC §12 "Sessions are hardened" (probe 8 of issue 12, scaled down).

The probe: 2,000 wrong passwords in 2.8 s with no limit; refresh tokens never rotated
or revoked; no ``deleteSession``; changing a password ended no session.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemon.sessions import LOGIN_WINDOW, LoginLimiter
from testbed.fakemodel import FakeModel
from tests.support.accounts import ALICE_PASSWORD, BOB_PASSWORD
from tests.support.daemon import Daemon, running_daemon
from turns.tls import tls_context

pytestmark = pytest.mark.anyio

SERVER = "/xrpc/com.atproto.server"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _login(http: httpx.AsyncClient, who: str, password: str, **kw: Any) -> httpx.Response:
    return await http.post(
        f"{SERVER}.createSession", json={"identifier": who, "password": password}, **kw
    )


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_wrong_passwords_lock_the_handle_and_the_address(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    clock = Clock()
    async with running_daemon(tmp_path, fake_model) as dm:
        dm.service.login_limiter = LoginLimiter(clock)  # type: ignore[attr-defined]
        async with httpx.AsyncClient(base_url=dm.base_url, timeout=10, verify=tls_context()) as anon:
            for _ in range(5):
                r = await _login(anon, "alice.test", "wrong")
                assert r.status_code == 401
            # The sixth attempt, right password included: 429 until the window passes.
            for password in ("wrong", ALICE_PASSWORD):
                r = await _login(anon, "alice.test", password)
                assert r.status_code == 429, r.text
                assert r.json()["error"] == "RateLimitExceeded"
                assert 0 < int(r.headers["Retry-After"]) <= LOGIN_WINDOW
            # By DID it is the same account, the same counter.
            r = await _login(anon, dm.service.accounts[0].did, ALICE_PASSWORD)
            assert r.status_code == 429
            # The address is locked as well: bob's right password from here waits too.
            r = await _login(anon, "bob.test", BOB_PASSWORD)
            assert r.status_code == 429
            clock.now += LOGIN_WINDOW + 1
            r = await _login(anon, "alice.test", ALICE_PASSWORD)
            assert r.status_code == 200, r.text
            r = await _login(anon, "bob.test", BOB_PASSWORD)
            assert r.status_code == 200, r.text


def test_the_limiter_counts_handle_and_address_apart() -> None:
    clock = Clock()
    limiter = LoginLimiter(clock)
    for i in range(5):
        # Five handles from one address: the address is locked, no handle is.
        limiter.failed(f"handle:h{i}", "addr:1.2.3.4")
    assert limiter.retry_after("handle:h9", "addr:1.2.3.4") is not None
    assert limiter.retry_after("handle:h0", "addr:5.6.7.8") is None
    for i in range(5):
        # One handle from five addresses: the handle is locked everywhere.
        limiter.failed("handle:target", f"addr:10.0.0.{i}")
    assert limiter.retry_after("handle:target", "addr:9.9.9.9") is not None
    clock.now += LOGIN_WINDOW
    assert limiter.retry_after("handle:target", "addr:1.2.3.4") is None


Anonymous = tuple[Daemon, httpx.AsyncClient]


@pytest.fixture
async def anonymous(tmp_path: Path, fake_model: FakeModel) -> AsyncIterator[Anonymous]:
    """The daemon, and a client of it that sends no credentials of its own."""
    async with running_daemon(tmp_path, fake_model) as dm, dm.client(token=None) as c:
        yield dm, c


async def _session(dm: Daemon) -> dict[str, Any]:
    r = await _login(dm.http, "alice.test", ALICE_PASSWORD)
    assert r.status_code == 200, r.text
    return r.json()


async def test_refresh_tokens_rotate_and_reuse_revokes(anonymous: Anonymous) -> None:
    dm, c = anonymous
    first = await _session(dm)
    r = await c.post(f"{SERVER}.refreshSession", headers=_bearer(first["refreshJwt"]))
    assert r.status_code == 200, r.text
    second = r.json()
    assert second["refreshJwt"] != first["refreshJwt"]
    r = await c.get(f"{SERVER}.getSession", headers=_bearer(second["accessJwt"]))
    assert r.status_code == 200
    # The first refresh token again: a copy is in use. The whole session ends.
    r = await c.post(f"{SERVER}.refreshSession", headers=_bearer(first["refreshJwt"]))
    assert r.status_code == 400 and r.json()["error"] == "ExpiredToken"
    r = await c.post(f"{SERVER}.refreshSession", headers=_bearer(second["refreshJwt"]))
    assert r.status_code == 400 and r.json()["error"] == "ExpiredToken"
    r = await c.get(f"{SERVER}.getSession", headers=_bearer(second["accessJwt"]))
    assert r.status_code == 400 and r.json()["error"] == "ExpiredToken"
    # Another login is a session of its own, untouched.
    other = await _session(dm)
    r = await c.get(f"{SERVER}.getSession", headers=_bearer(other["accessJwt"]))
    assert r.status_code == 200


async def test_delete_session_and_password_change_end_sessions(anonymous: Anonymous) -> None:
    dm, c = anonymous
    s = await _session(dm)
    r = await c.post(f"{SERVER}.deleteSession", headers=_bearer(s["refreshJwt"]))
    assert r.status_code == 200, r.text
    for method, name, token in (
        ("POST", "refreshSession", s["refreshJwt"]),
        ("GET", "getSession", s["accessJwt"]),
    ):
        r = await c.request(method, f"{SERVER}.{name}", headers=_bearer(token))
        assert r.status_code == 400 and r.json()["error"] == "ExpiredToken", r.text

    # A new password (the next start's environment): every older session ends.
    kept = await _session(dm)
    dm.service.accounts = [
        replace(a, password="a-new-password-123") if a.handle == "alice.test" else a
        for a in dm.service.accounts
    ]
    r = await c.get(f"{SERVER}.getSession", headers=_bearer(kept["accessJwt"]))
    assert r.status_code == 400 and r.json()["error"] == "ExpiredToken"
    r = await c.post(f"{SERVER}.refreshSession", headers=_bearer(kept["refreshJwt"]))
    assert r.status_code == 400 and r.json()["error"] == "ExpiredToken"
    r = await _login(c, "alice.test", "a-new-password-123")
    assert r.status_code == 200
    r = await c.get(f"{SERVER}.getSession", headers=_bearer(r.json()["accessJwt"]))
    assert r.status_code == 200
