"""The suite's pytest fixtures, loaded from ``tests/conftest.py`` as a plugin."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.fakemodel import FakeModel
from testbed.pds import Account, PdsServer, install
from testbed.redis_server import REDIS_SERVER, RedisServer


@pytest.fixture
def fake_model() -> Iterator[FakeModel]:
    """A started :class:`FakeModel`, stopped after the test."""
    with FakeModel() as fake:
        yield fake


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
