"""The whole daemon on loopback, for the HTTP, SSE and XRPC tests.

``running_daemon`` starts the real :class:`daemon.service.Service` (local store
in a tmp dir, state file, engine, change feed, uvicorn) on a free port, with the
fake model server as its only provider, and hands back an httpx client pointed
at it. Two accounts: alice and bob, each with a password and an /api token.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx

from daemon.config import build_config
from daemon.service import Service
from testbed.fakemodel import FakeModel
from tests.support.accounts import ACCOUNT_ENV, ALICE, ALICE_TOKEN, BOB
from tests.support.records import MESSAGE, text_part
from turns.tls import tls_context

_ENV = {**ACCOUNT_ENV, "T_FAKE_KEY": "sk-test-fake"}


@dataclass
class Daemon:
    service: Service
    http: httpx.AsyncClient  # authenticated as alice
    base_url: str
    fake: FakeModel
    # Set by a test that leaves turns waiting (e.g. queued past the rate limit): the
    # daemon is then stopped at once, as by a second SIGTERM, not drained.
    kill_on_exit: bool = False

    def client(self, token: str | None = ALICE_TOKEN) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=10, verify=tls_context())

    async def conversation(self, **body: Any) -> str:
        r = await self.http.post("/api/conversations", json=body)
        assert r.status_code == 201, r.text
        return r.json()["skey"]

    async def post(self, skey: str, text: str, **body: Any) -> dict[str, Any]:
        r = await self.http.post(
            f"/api/conversations/{skey}/messages", json={"parts": [text_part(text)], **body}
        )
        assert r.status_code == 201, r.text
        return r.json()

    async def record(self, skey: str, key: str, did: str = ALICE) -> dict[str, Any] | None:
        rec = await self.service.store.get_record(did, skey, MESSAGE, key)
        return rec.value if rec else None

    async def final(self, skey: str, key: str, wait: float = 10) -> dict[str, Any]:
        """The reply record once its status is no longer pending."""
        with anyio.fail_after(wait):
            while True:
                value = await self.record(skey, key)
                if value is not None and value.get("status") not in (None, "pending"):
                    return value
                await anyio.sleep(0.02)

    async def store_keys(self, did: str = ALICE) -> set[tuple[str, str, str]]:
        """Every (space, collection, key) of ``did``, read straight from the store's file."""
        path = self.service.config.store_path / "store.sqlite3"

        def read() -> set[tuple[str, str, str]]:
            import sqlite3

            with sqlite3.connect(path) as db:
                rows = db.execute(
                    "SELECT space, collection, key FROM records WHERE did = ?", (did,)
                ).fetchall()
            return {tuple(r) for r in rows}  # type: ignore[misc]

        return await anyio.to_thread.run_sync(read)


def daemon_config(tmp: Path, fake: FakeModel, **tables: dict[str, Any]) -> Any:
    data: dict[str, Any] = {
        "store": {"kind": "local", "path": str(tmp / "data")},
        "http": {"listen": "127.0.0.1:8787", **tables.pop("http", {})},
        "models": {"default": "fake:fake-model"},
        # Titles off unless a test turns them on: they would take the fake's queued replies.
        "turns": {"retries": 0, "titleModel": "", **tables.pop("turns", {})},
        "providers": {"fake": {"base_url": fake.base_url, "api_key_env": "T_FAKE_KEY"}},
        "accounts": {
            "alice": {
                "handle": "alice.test",
                "did": ALICE,  # pinned: a local account's DID is otherwise random
                "password_env": "T_ALICE_PASSWORD",
                "token_env": "T_ALICE_TOKEN",
            },
            "bob": {
                "handle": "bob.test",
                "did": BOB,
                "password_env": "T_BOB_PASSWORD",
                "token_env": "T_BOB_TOKEN",
            },
        },
        **tables,
    }
    config = build_config(data, env=_ENV, path=None, base_dir=tmp)
    return replace(config, port=0)  # the service binds a free port and reports it as service.port


@asynccontextmanager
async def running_daemon(
    tmp: Path, fake: FakeModel, **tables: dict[str, Any]
) -> AsyncIterator[Daemon]:
    service = Service(daemon_config(tmp, fake, **tables))
    ready = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(service.run, on_ready=lambda _: ready.set()))
        with anyio.fail_after(60):  # a deadline, not a timing claim: loaded CI machines are slow
            await ready.wait()
        base_url = f"http://127.0.0.1:{service.port}"
        headers = {"Authorization": f"Bearer {ALICE_TOKEN}"}
        daemon: Daemon | None = None
        try:
            async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=10, verify=tls_context()) as http:
                daemon = Daemon(service, http, base_url, fake)
                yield daemon
        finally:
            if daemon is not None and daemon.kill_on_exit:
                tg.cancel_scope.cancel()
            else:
                service.request_stop()
