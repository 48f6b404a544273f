"""The suite's pytest fixtures, loaded from ``tests/conftest.py`` as a plugin: ``fake_model``
(``fake`` for short), ``pds``, ``pds_account``, ``redis_server``, ``serve``."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testbed.fakemodel import FakeModel
from testbed.pds import Account, PdsServer, install
from testbed.redis_server import REDIS_SERVER, RedisServer
from tests.support.cli import TURND, Served


@pytest.fixture
def fake_model() -> Iterator[FakeModel]:
    """A started :class:`FakeModel`, stopped after the test."""
    with FakeModel() as fake:
        yield fake


@pytest.fixture
def fake(fake_model: FakeModel) -> FakeModel:
    """``fake_model`` by the short name the turn and tool tests use."""
    return fake_model


@pytest.fixture(scope="session")
def pds() -> Iterator[PdsServer]:
    """The reference PDS, started once per test session (once per xdist worker).

    Set ``TURND_SKIP_PDS=1`` to skip these tests instead (the only case in which they skip).
    """
    if os.environ.get("TURND_SKIP_PDS") == "1":
        pytest.skip("TURND_SKIP_PDS=1: the reference-PDS tests are switched off")
    server = PdsServer(install())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pds_account(pds: PdsServer) -> Account:
    """A fresh account on the session's PDS."""
    return pds.create_account()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """Debian's ``redis-server`` on a free port, no persistence; killed after the test."""
    if not Path(REDIS_SERVER).exists():
        pytest.fail("redis-server is not installed (apt-get install -y redis-server; .ci/run does)")
    server = RedisServer(tmp_path).start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """``serve(cwd, env, *args)`` starts ``turnd serve *args``; what is still running after
    the test is killed. The URL is ``$TURND_HTTP_LISTEN``'s (the default without it)."""
    started: list[Served] = []

    def start(cwd: Path, env: dict[str, str], *args: str) -> Served:
        n = len(started)
        out, err = tmp_path / f"serve{n}.out", tmp_path / f"serve{n}.err"
        with out.open("wb") as o, err.open("wb") as e:
            proc = subprocess.Popen([TURND, "serve", *args], cwd=cwd, env=env, stdout=o, stderr=e)
        listen = env.get("TURND_HTTP_LISTEN", "127.0.0.1:8787")
        served = Served(proc, out, err, f"http://{listen}")
        started.append(served)
        return served

    yield start
    for served in started:  # only the processes this test started, by their handle
        if served.proc.poll() is None:
            served.proc.kill()
            served.proc.wait(10)
