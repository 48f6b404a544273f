"""Crashes: ``kill -9`` of a ``turnd serve`` mid-turn, and of a process in the middle
of store writes, many times.

- A daemon killed while the model stalls mid-reply leaves its claim ``pending``; the
  restarted daemon writes it ``error: interrupted``. Requests that waited for the rate
  limit (queued, unclaimed) run after the restart when younger than
  ``backfillMinutes``, and are dropped when older.
- A writer subprocess hammering ``create_record``/``put_record``/``delete_record`` is
  killed at random moments; after each kill the store opens, is consistent (every op of
  the op log matches the record it left, every CID recomputes, SQLite's integrity check
  passes), and a change feed resumed from a stored cursor, like a feed that kept
  running through all the kills, sees every op exactly once, in order.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from httpx_sse import connect_sse

from recordstore.cid import record_cid
from recordstore.keys import new_tid
from recordstore.local import DB_NAME, LocalStore
from testbed.fakemodel import FakeModel, Reply
from tests.support.accounts import ALICE
from tests.support.records import MESSAGE, TEXT, reply_text
from tests.support.reliability import ROOT, Turnd, wait_until

pytestmark = pytest.mark.reliability

WRITER_KILLS = 25


def _stored(data: Path, skey: str, key: str) -> dict[str, Any] | None:
    with sqlite3.connect(data / DB_NAME) as db:
        row = db.execute(
            "SELECT value FROM records WHERE did=? AND space=? AND collection=? AND key=?",
            (ALICE, skey, MESSAGE, key),
        ).fetchone()
    return json.loads(row[0]) if row else None


def _post(api: httpx.Client, skey: str, text: str) -> dict[str, Any]:
    r = api.post(
        f"/api/conversations/{skey}/messages",
        json={"parts": [{"$type": TEXT, "text": text}], "generation": {}},
    )
    assert r.status_code == 201, r.text
    return r.json()


def test_kill_mid_turn_then_restart(tmp_path: Path) -> None:
    def respond(request: dict[str, Any]) -> Reply:
        prompt = request["messages"][-1]["content"]
        prompt = prompt if isinstance(prompt, str) else prompt[0]["text"]
        if prompt.startswith("stall"):
            return Reply.text(["Hel", "lo ", "never"]).stall(3)  # until the client goes
        return Reply.text(["fine ", "answer"])

    with FakeModel(responder=respond) as fake:
        data = tmp_path / "data"
        d = Turnd(tmp_path, "d", data, fake.base_url, turns={"ratePerMinute": 1})
        d.start()
        try:
            api = d.client()
            skey = api.post("/api/conversations", json={}).json()["skey"]
            running = _post(api, skey, "stall 1")
            assert running["turn"] == "claimed"
            young = _post(api, skey, "young queued")
            old = _post(api, skey, "old queued")
            assert young["turn"] == old["turn"] == "queued"
            fake.wait_for_requests(1, timeout=10)
            # the stream is live and has the partial text
            wait_until(lambda: "Hello" in _partial(d, skey, running["replyKey"]), 10, "deltas")
            time.sleep(2.0)  # the feed's cursor is flushed every second
            d.kill()

            assert _stored(data, skey, running["replyKey"])["status"] == "pending"  # type: ignore[index]
            assert _stored(data, skey, young["replyKey"]) is None
            # The old request waited past the backfill window (60 min) before the crash.
            with sqlite3.connect(d.state) as db:
                changed = db.execute(
                    "UPDATE turn_request SET requested_at = requested_at - 7200 WHERE user_key=?",
                    (old["userKey"],),
                ).rowcount
                assert changed == 1
                assert db.execute("SELECT count(*) FROM turn_claim").fetchone()[0] == 1

            d.turns = {"ratePerMinute": 100}
            d.write_config()
            d.start()
            interrupted = wait_until(
                lambda: _final(data, skey, running["replyKey"]), 20, "the interrupted reply"
            )
            assert interrupted["status"] == "error" and interrupted["error"] == "interrupted"
            answered = wait_until(lambda: _final(data, skey, young["replyKey"]), 20, "young")
            assert answered["status"] == "complete" and reply_text(answered) == "fine answer"
            time.sleep(3)
            assert _stored(data, skey, old["replyKey"]) is None, "an old request was run"
            # Its stream says so, with the stored status.
            events = _stream(d, skey, running["replyKey"])
            assert [e["event"] for e in events] == ["status"]
            assert events[0]["data"] == {"status": "error", "error": "interrupted", "model": {
                "provider": "fake", "id": "fake-model"}}
            with sqlite3.connect(d.state) as db:
                assert db.execute("SELECT count(*) FROM turn_claim").fetchone()[0] == 0
                assert db.execute("SELECT count(*) FROM turn_request").fetchone()[0] == 0

            # A second crash, of the restarted daemon, mid-turn again.
            again = _post(api, skey, "stall 2")
            assert again["turn"] == "claimed"
            wait_until(lambda: "Hello" in _partial(d, skey, again["replyKey"]), 10, "deltas")
            d.kill()
            d.start()
            second = wait_until(lambda: _final(data, skey, again["replyKey"]), 20, "reply")
            assert second["status"] == "error" and second["error"] == "interrupted"
            pending = _all_pending(data)
            assert not pending, pending
            assert d.stop() == 0
            print("\ncrashes: 2 kill -9 mid-turn survived; 1 young queued request ran, "
                  "1 old one dropped; 0 replies left pending")
        finally:
            d.kill()


def _final(data: Path, skey: str, key: str) -> dict[str, Any] | None:
    value = _stored(data, skey, key)
    return value if value and value.get("status") not in (None, "pending") else None


def _all_pending(data: Path) -> list[str]:
    with sqlite3.connect(data / DB_NAME) as db:
        rows = db.execute("SELECT key, value FROM records WHERE collection=?", (MESSAGE,)).fetchall()
    return [k for k, v in rows if json.loads(v).get("status") == "pending"]


def _stream(d: Turnd, skey: str, reply: str) -> list[dict[str, Any]]:
    url = f"/api/conversations/{skey}/messages/{reply}/stream"
    with d.client() as api, connect_sse(api, "GET", url) as source:
        assert source.response.status_code == 200
        return [{"event": e.event, "data": json.loads(e.data)} for e in source.iter_sse()]


def _partial(d: Turnd, skey: str, reply: str) -> str:
    """The text deltas a subscriber has got so far (reads until 1 s of silence)."""
    text = ""
    try:
        with d.client(timeout=1) as api, api.stream(
            "GET", f"/api/conversations/{skey}/messages/{reply}/stream"
        ) as r:
            event = ""
            for line in r.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "delta":
                    text += json.loads(line[5:])["text"]
                if "Hello" in text:
                    break
    except httpx.ReadTimeout:
        pass
    return text


# -- kill -9 in the middle of store writes ------------------------------------------------------


def _check_consistent(db_path: Path, since: int = 0) -> int:
    """The store's invariants, read straight from the file; the number of ops.

    CIDs are recomputed for the ops after ``since`` and the records they wrote (the
    earlier ones were checked after the previous kill)."""
    with sqlite3.connect(db_path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        records = {
            (did, space, coll, key): (cid, value)
            for did, space, coll, key, cid, value in db.execute(
                "SELECT did, space, collection, key, cid, value FROM records"
            )
        }
        last_op: dict[tuple[str, str, str, str], tuple[str, str | None]] = {}
        ids = []
        touched = set()
        for op_id, did, space, coll, key, op, cid, value in db.execute(
            "SELECT id, did, space, collection, key, op, cid, value FROM ops ORDER BY id"
        ):
            ids.append(op_id)
            if op != "delete" and op_id > since:
                assert record_cid(json.loads(value)) == cid, f"op {op_id}: CID does not recompute"
            last_op[(did, space, coll, key)] = (op, cid)
            if op_id > since:
                touched.add((did, space, coll, key))
        assert ids == list(range(1, len(ids) + 1)), "op ids are not contiguous"
        seq = db.execute("SELECT seq FROM sqlite_sequence WHERE name='ops'").fetchone()
        assert (seq[0] if seq else 0) == len(ids)
    for address, (cid, value) in records.items():
        if address in touched:
            assert record_cid(json.loads(value)) == cid, f"{address}: CID does not recompute"
        assert address in last_op, f"{address}: a record without an op"
        assert last_op[address][0] != "delete" and last_op[address][1] == cid, address
    for address, (op, _cid) in last_op.items():
        assert (op == "delete") == (address not in records), address
    return len(ids)


@pytest.mark.anyio
async def test_kill_writer_mid_write_many_times(tmp_path: Path) -> None:
    data = tmp_path / "data"
    skey = new_tid()
    rng = random.Random(3)
    live_seen: list[int] = []
    resumed_seen: list[int] = []
    stored_cursor: str | None = None
    head = 0

    async with LocalStore.open(data, poll_interval=0.05) as watcher:

        async def follow() -> None:
            async with watcher.changes(None) as feed:
                async for change in feed:
                    live_seen.append(int(change.cursor))

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            zygote = subprocess.Popen(  # noqa: ASYNC220 - its pipes are read in threads
                [sys.executable, "-m", "tests.support.reliability", "writer", "--data", str(data),
                 "--space", skey],
                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True,
            )
            assert zygote.stdin is not None and zygote.stdout is not None
            readline = partial(anyio.to_thread.run_sync, zygote.stdout.readline)
            assert (await readline()).strip() == "loaded"
            for i in range(WRITER_KILLS):
                zygote.stdin.write(f"go {i}\n")
                zygote.stdin.flush()
                ready = (await readline()).split()
                assert ready[0] == "ready", ready
                # The kill must fall among writes: wait until the watcher has seen this
                # writer's first op (a loaded machine can take longer than the random
                # delay just to start writing), then let it write on for a while.
                with anyio.fail_after(60):
                    while True:
                        if live_seen and live_seen[-1] > head:
                            break
                        await anyio.sleep(0.01)
                await anyio.sleep(rng.uniform(0.01, 0.3))
                os.kill(int(ready[1]), signal.SIGKILL)  # mid-write most of the time
                assert (await readline()).split() == ["exit", ready[1], str(int(signal.SIGKILL))]

                # A restarted reader: the store opens, is consistent, and a feed resumed
                # from the stored cursor sees what came after it, once each.
                n_ops = await anyio.to_thread.run_sync(_check_consistent, data / DB_NAME, head)
                assert n_ops > head, "the writer wrote nothing"
                async with LocalStore.open(data) as store:
                    async with store.changes(stored_cursor) as feed:
                        async for change in feed:
                            resumed_seen.append(int(change.cursor))
                            stored_cursor = change.cursor
                            if int(change.cursor) == n_ops:
                                break
                head = n_ops
            zygote.stdin.close()
            await anyio.to_thread.run_sync(zygote.wait)
            assert zygote.stderr is not None
            err = zygote.stderr.read()
            assert "Traceback" not in err, err  # the writers died of the kills only
            zygote.stderr.close()
            zygote.stdout.close()
            with anyio.fail_after(10):
                while len(live_seen) < head:  # noqa: ASYNC110 - polling a list
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    assert resumed_seen == list(range(1, head + 1))
    assert live_seen == list(range(1, head + 1))
    print(f"\nstore crashes: {WRITER_KILLS} kill -9 of a writer survived; {head} ops, each seen "
          "exactly once by a resumed feed and by a live feed; store consistent after each")
