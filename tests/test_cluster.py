"""[cluster] end to end (SPEC §18): three ``turnd serve`` processes on one local store and
one real ``redis-server``, the fake model server in its own process.

A turn posted on one instance is streamed from a second and resumed on the third with
``Last-Event-ID``; a cancel sent to an instance that does not run the turn reaches its
runner; the rate limit is counted across all three; Redis killed mid-stream and
restarted leaves one generation, a finished reply and subscribers that get its status.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from httpx_sse import aconnect_sse

from testbed.redis_server import RedisServer
from tests.support.records import TEXT, reply_text
from tests.support.reliability import FakeProc, Turnd, clean_env, wait_until
from tests.support.sse import event
from turns.tls import tls_context

pytestmark = [pytest.mark.reliability, pytest.mark.anyio]

CLUSTER = '\n[cluster]\nredis_url_env = "T_REDIS_URL"\n'
TURND = str(Path(sys.executable).parent / "turnd")


@contextmanager
def instances(
    tmp_path: Path, redis: RedisServer, fake: FakeProc, n: int = 3, **turns: Any
) -> Iterator[list[Turnd]]:
    data = tmp_path / "data"
    daemons = [
        Turnd(
            tmp_path, f"c{i}", data, fake.base_url, turns=dict(turns), extra=CLUSTER,
            env={"T_REDIS_URL": redis.url},
        )
        for i in range(n)
    ]
    try:
        for d in daemons:
            d.start()
        yield daemons
    finally:
        for d in daemons:
            d.stop()
        fake.stop()


def _conversation(d: Turnd) -> str:
    r = d.client().post("/api/conversations", json={})
    assert r.status_code == 201, r.text
    return r.json()["skey"]


def _post(d: Turnd, skey: str, text: str) -> dict[str, Any]:
    r = d.client().post(
        f"/api/conversations/{skey}/messages",
        json={"parts": [{"$type": TEXT, "text": text}], "generation": {}},
    )
    assert r.status_code == 201, r.text
    return r.json()


async def _events(
    d: Turnd,
    skey: str,
    reply: str,
    *,
    after: int | None = None,
    stop_after: int | None = None,
    out: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The reply's SSE events from ``d`` (after ``Last-Event-ID``), all or the first few,
    appended to ``out`` as they arrive."""
    headers = {"Last-Event-ID": str(after)} if after is not None else {}
    out = [] if out is None else out
    async with d.aclient(timeout=60) as http:
        url = f"/api/conversations/{skey}/messages/{reply}/stream"
        async with aconnect_sse(http, "GET", url, headers=headers) as source:
            assert source.response.status_code == 200
            async for e in source.aiter_sse():
                out.append(event(e))
                if stop_after is not None and len(out) >= stop_after:
                    break
    return out


def _stored(d: Turnd, skey: str, reply: str) -> dict[str, Any] | None:
    messages = d.client().get(f"/api/conversations/{skey}").json()["messages"]
    return next((m["value"] for m in messages if m["key"] == reply), None)


def _final(d: Turnd, skey: str, reply: str, timeout: float = 60) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        value = _stored(d, skey, reply)
        return value if value and value.get("status") != "pending" else None

    return wait_until(done, timeout, f"reply {reply} final")


def _health(d: Turnd) -> tuple[int, dict[str, Any]]:
    r = httpx.get(f"{d.url}/healthz", timeout=5, verify=tls_context())
    return r.status_code, r.json()


def _generations(fake: FakeProc, texts: list[str]) -> dict[str, int]:
    """Model calls for the replies to these messages (title generation calls left out)."""
    return {t: n for t, n in fake.prompts().items() if t in texts}


def _cluster_flag(d: Turnd) -> tuple[int, bool | None]:
    status, body = _health(d)
    return status, body.get("cluster")


async def test_posted_on_one_streamed_on_another_resumed_on_a_third(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    fake = FakeProc(tmp_path, tokens=60, chunk_delay_ms=25)
    with instances(tmp_path, redis_server, fake) as (d0, d1, d2):
        assert _cluster_flag(d1) == (200, True)
        skey = _conversation(d0)
        reply = _post(d0, skey, "across instances")["replyKey"]
        # Three events (step, part-start, a delta) always leave the rest to resume:
        # the runner merges deltas between its mirror's reads, so under load a
        # reply can have as few as four events in all.
        first = await _events(d1, skey, reply, stop_after=3)
        rest = await _events(d2, skey, reply, after=first[-1]["id"])
        events = first + rest
        assert [e["id"] for e in events] == list(range(1, len(events) + 1)), "once each, in order"
        assert events[-1]["event"] == "status" and events[-1]["data"]["status"] == "complete"
        stored = _final(d0, skey, reply)
        text = "".join(e["data"]["text"] for e in events if e["event"] == "delta")
        assert text == reply_text(stored) and text
        # The runner's own replay has the same events with the same ids.
        local = await _events(d0, skey, reply)
        assert local == events
        # And a fourth look, from the second instance again, after the end: a replay.
        assert await _events(d1, skey, reply) == events
        # Last-Event-ID at the end, elsewhere: the stored status (SPEC §12), not silence.
        past = await _events(d2, skey, reply, after=events[-1]["id"])
        assert [(e["id"], e["event"], e["data"]["status"]) for e in past] == [
            (events[-1]["id"] + 1, "status", "complete")
        ]
        assert _generations(fake, ["across instances"]) == {"across instances": 1}


async def test_cancel_sent_to_another_instance_reaches_the_runner(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    fake = FakeProc(tmp_path, tokens=400, chunk_delay_ms=50)  # 20 s unless cancelled
    with instances(tmp_path, redis_server, fake) as (d0, d1, d2):
        skey = _conversation(d0)
        reply = _post(d0, skey, "cancel me from elsewhere")["replyKey"]
        seen: list[dict[str, Any]] = []

        async def follow() -> None:
            await _events(d1, skey, reply, out=seen)

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: any(e["event"] == "delta" for e in seen), 30, "a delta")
            )
            url = f"/api/conversations/{skey}/messages/{reply}/cancel"
            r = await anyio.to_thread.run_sync(d2.client().post, url)
            assert r.status_code == 200 and r.json() == {"cancelled": True}
        assert seen[-1]["event"] == "status" and seen[-1]["data"]["status"] == "cancelled"
        stored = _final(d0, skey, reply)
        assert stored["status"] == "cancelled"
        assert reply_text(stored), "the partial text is kept"
        # Nobody runs it now: every instance answers false.
        for d in (d0, d1, d2):
            assert d.client().post(url).json() == {"cancelled": False}
        unknown = f"/api/conversations/{skey}/messages/3kzzzzzzzzzzz.r0/cancel"
        assert d1.client().post(unknown).json() == {"cancelled": False}


async def test_rate_limit_and_queue_bound_are_counted_across_three_instances(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    fake = FakeProc(tmp_path, tokens=3)
    with instances(tmp_path, redis_server, fake, ratePerMinute=3, maxQueued=2) as daemons:
        skey = _conversation(daemons[0])
        posted = [_post(d, skey, f"limited {i}-{j}") for i, d in enumerate(daemons) for j in range(2)]
        # A POST may lose its claim to another instance's change feed ("answered"): the
        # message still took one of the three places.
        turns = [p["turn"] for p in posted]
        assert "queued" not in turns[:3] and turns[3:5] == ["queued"] * 2, turns
        replies = [p["replyKey"] for p in posted]
        for reply in replies[:3]:
            assert _final(daemons[0], skey, reply)["status"] == "complete"
        # Two wait for the minute to pass (nothing claimed, nothing generated); the sixth
        # found two waiting across the instances: an error reply, never a model call.
        assert [_stored(daemons[0], skey, r) for r in replies[3:5]] == [None] * 2
        refused = _final(daemons[2], skey, replies[5])
        assert refused["status"] == "error"
        assert refused["error"] == "too many turns waiting for the rate limit"
        texts = [f"limited {i}-{j}" for i in range(3) for j in range(2)]
        assert _generations(fake, texts) == {"limited 0-0": 1, "limited 0-1": 1, "limited 1-0": 1}


async def test_redis_killed_mid_stream_and_restarted(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    fake = FakeProc(tmp_path, tokens=120, chunk_delay_ms=25)  # ~3 s
    with instances(tmp_path, redis_server, fake) as (d0, d1, d2):
        skey = _conversation(d0)
        reply = _post(d0, skey, "through a Redis outage")["replyKey"]
        remote: list[dict[str, Any]] = []
        local: list[dict[str, Any]] = []

        async def follow(d: Turnd, out: list[dict[str, Any]]) -> None:
            await _events(d, skey, reply, out=out)

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow, d1, remote)
            tg.start_soon(follow, d0, local)
            await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: len(remote) >= 3, 30, "three events on the remote")
            )
            redis_server.kill()
            await anyio.to_thread.run_sync(
                lambda: wait_until(
                    lambda: all(_cluster_flag(d) == (200, False) for d in (d0, d1, d2)),
                    10, "cluster false on every instance",
                )
            )
        stored = _final(d0, skey, reply)
        assert stored["status"] == "complete"
        for events in (remote, local):
            assert events[-1]["event"] == "status"
            assert events[-1]["data"]["status"] == "complete"
            assert [e["id"] for e in events] == list(range(1, len(events) + 1))
        assert "".join(e["data"]["text"] for e in local if e["event"] == "delta") == reply_text(stored)
        # A turn started while Redis is down runs on in-process streams.
        # Which instance claims a posted message is a race (the others' change feeds
        # read the shared store every 0.2 s), so post until this one claims one.
        posted_down = []
        for attempt in range(5):
            posted_down.append(f"while Redis is down ({attempt})")
            during = _post(d1, skey, posted_down[-1])
            assert during["turn"] in ("claimed", "answered"), during
            assert _final(d1, skey, during["replyKey"])["status"] == "complete"
            if during["turn"] == "claimed":
                break
        assert during["turn"] == "claimed"

        redis_server.start()
        wait_until(
            lambda: all(_cluster_flag(d) == (200, True) for d in (d0, d1, d2)),
            10, "cluster back in /healthz within 10 s",
        )
        # Streams cross instances again.
        again = _post(d2, skey, "after the restart")["replyKey"]
        events = await _events(d0, skey, again)
        assert events[-1]["data"]["status"] == "complete"
        assert "".join(e["data"]["text"] for e in events if e["event"] == "delta") == reply_text(
            _final(d2, skey, again)
        )
        # One generation per reply, whatever Redis did.
        texts = ["through a Redis outage", *posted_down, "after the restart"]
        assert _generations(fake, texts) == dict.fromkeys(texts, 1)


async def test_a_quota_is_shared_by_the_instances(tmp_path: Path, redis_server: RedisServer) -> None:
    fake = FakeProc(tmp_path, tokens=3)
    extra = CLUSTER + "\n[accounts.alice.quota]\ntokensPerDay = 1\n"
    daemons = [
        Turnd(tmp_path, f"q{i}", tmp_path / "data", fake.base_url, extra=extra,
              env={"T_REDIS_URL": redis_server.url})
        for i in range(3)
    ]
    q0, q1, q2 = daemons
    try:
        # The first turn runs on q0 alone and uses the day's tokens.
        q0.start()
        skey = _conversation(q0)
        first = _post(q0, skey, "spend the quota")["replyKey"]
        assert _final(q0, skey, first)["status"] == "complete"
        q0.stop()
        # q1 and q2 have used nothing themselves: only the shared count can refuse.
        q1.start()
        q2.start()
        for d in (q1, q2):
            usage = d.client().get("/api/usage").json()
            assert usage["rows"] == [], "no usage of its own"
            assert usage["quota"]["tokensPerDay"]["used"] >= 1, usage
        second = _post(q1, skey, "over the quota")["replyKey"]
        refused = _final(q1, skey, second)
        assert refused["status"] == "error"
        assert refused["error"].startswith("quota exceeded:") and "tokensPerDay" in refused["error"]
        assert _generations(fake, ["spend the quota", "over the quota"]) == {"spend the quota": 1}
    finally:
        for d in daemons:
            d.stop()
        fake.stop()


async def test_without_cluster_nothing_changes_and_check_reports_it(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    fake = FakeProc(tmp_path, tokens=3)
    plain = Turnd(tmp_path, "plain", tmp_path / "plain-data", fake.base_url)
    try:
        plain.start()
        status, body = _health(plain)
        assert status == 200 and "cluster" not in body
    finally:
        plain.stop()
        fake.stop()
    clustered = Turnd(
        tmp_path, "chk", tmp_path / "data", fake.base_url, extra=CLUSTER,
        env={"T_REDIS_URL": redis_server.url},
    )

    def check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [TURND, "check", "--config", str(clustered.config)],
            env=clean_env(**env), capture_output=True, text=True, timeout=60,
        )

    ok = check({"T_REDIS_URL": redis_server.url})
    line = next(ln for ln in ok.stdout.splitlines() if " cluster " in ln)
    assert line.startswith("ok") and "redis" in line and "T_REDIS_URL" in line, ok.stdout
    missing = check({})
    assert missing.returncode == 2 and "cluster.redis_url_env" in missing.stderr
    redis_server.kill()
    down = check({"T_REDIS_URL": f"redis://:hunter2secret@127.0.0.1:{redis_server.port}/0"})
    assert down.returncode != 0
    line = next(ln for ln in down.stdout.splitlines() if " cluster " in ln)
    assert line.startswith("FAIL") and "hunter2secret" not in down.stdout + down.stderr
