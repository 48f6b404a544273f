"""Local DIDs (SPEC §13): random per data directory, kept, and old data dirs keep theirs."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from daemon.config import build_config
from daemon.dids import DIDS_FILE, account_did, legacy_did
from recordstore import CONVERSATION, INFO
from recordstore.keys import new_tid, validate_did
from recordstore.local import LocalStore


def _config_did(data: Path) -> str:
    config = build_config(
        {"store": {"kind": "local", "path": str(data)}, "accounts": {"me": {"handle": "me.test"}}},
        env={},
        path=None,
        base_dir=data.parent,
    )
    did = config.accounts[0].did
    assert did is not None
    return did


def test_two_installs_get_different_dids_and_each_keeps_its_own(tmp_path: Path) -> None:
    one, two = _config_did(tmp_path / "one"), _config_did(tmp_path / "two")
    assert one != two
    assert validate_did(one) and one.startswith("did:plc:") and len(one) == len("did:plc:") + 24
    assert legacy_did("me.test") not in (one, two)
    assert _config_did(tmp_path / "one") == one  # the next start reads it back
    assert account_did(tmp_path / "one", "ME.test") == one  # handles are case-insensitive
    assert (tmp_path / "one" / DIDS_FILE).stat().st_mode & 0o777 == 0o600


@pytest.mark.anyio
async def test_a_data_dir_of_an_older_turnd_keeps_the_derived_did(tmp_path: Path) -> None:
    data = tmp_path / "data"
    old = legacy_did("me.test")
    async with LocalStore.open(data) as store:  # what the older turnd wrote
        skey = new_tid()
        await store.create_space(old, CONVERSATION, skey)
        await store.create_record(old, skey, INFO, "self", {"createdAt": "2026-01-01T00:00:00Z"})
    assert _config_did(data) == old
    # A handle that owns nothing there yet is new: random.
    assert account_did(data, "other.test") != legacy_did("other.test")


def _draw(data: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    out.put(account_did(Path(data), "me.test"))


def test_processes_starting_at_once_agree_on_the_did(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_draw, args=(str(tmp_path / "d"), out)) for _ in range(4)]
    for p in procs:
        p.start()
    dids = {out.get(timeout=60) for _ in procs}
    for p in procs:
        p.join(30)
    assert len(dids) == 1
