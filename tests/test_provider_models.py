"""A provider without a ``models`` list whose ``GET /models`` never answers (SPEC §17: "cached,
with a short timeout"): the page's ``GET /api/models`` still answers — the other providers'
models and the default — once the listing's timeout is out, and the failure is kept, so
the next requests do not ask that provider again. A real ``turnd serve`` and a real TCP
listener on loopback that accepts connections and never says a word.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.ports import free_port
from tests.support.cli import ME_PASSWORD, ME_TOKEN, clean_env, me_config, wait_healthy
from turns.tls import tls_context


class Silent:
    """Accepts connections and reads, never answers; counts what it accepted."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self._held.append(conn)  # kept open, unanswered

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for conn in self._held:
            conn.close()
        self.sock.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    server = Silent()
    try:
        yield server
    finally:
        server.close()


def test_a_provider_whose_models_never_answer_does_not_hold_the_picker(
    tmp_path: Path, serve: Any, silent: Silent
) -> None:
    port = free_port()
    conf = me_config(
        tmp_path, port, default="mute:big-model",
        providers=f'[providers.mute]\nbase_url = "http://127.0.0.1:{silent.port}/v1"\n',
        turns="[turns]\ntitleModel = \"\"\n",
    )
    env = clean_env(ME_PASSWORD=ME_PASSWORD, ME_TOKEN=ME_TOKEN, TURND_HTTP_LISTEN=f"127.0.0.1:{port}")
    daemon = serve(tmp_path, env, "--config", str(conf))
    daemon.wait_for(r"turnd: serving", timeout=30)
    wait_healthy(daemon.url, timeout=15)
    # serve's start-up probe of the default provider already connected once
    daemon.wait_for(r"warning: the default model's provider cannot be reached: mute ", 30,
                    stderr=True)
    before = silent.accepted
    api = httpx.Client(
        base_url=daemon.url, headers={"Authorization": f"Bearer {ME_TOKEN}"},
        timeout=30,  # a deadline well past the listing's 3 s, on a loaded machine
        verify=tls_context(),
    )
    for _ in range(3):
        got = api.get("/api/models")
        assert got.status_code == 200, got.text
        offered = [(m["provider"], m["id"]) for m in got.json()["models"]]
        # what it could not list: the default model of that provider, and the echo
        assert offered == [("echo", "echo"), ("mute", "big-model")], offered
    # asked once (timed out), then the failure was kept: no new connection
    assert silent.accepted == before + 1
    assert daemon.stop() == 0
