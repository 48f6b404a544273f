"""The Redis pieces of [cluster] (SPEC §18) against a real redis-server, in one process.

Two or three :class:`turns.cluster.Cluster` objects with different instance ids
stand for instances; the end-to-end tests with three ``turnd serve`` processes
are in ``test_cluster.py``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from testbed.redis_server import RedisServer
from turns.cluster import Cluster
from turns.cluster.streams import MirroredBuffer
from turns.streams import StreamEvent

pytestmark = pytest.mark.anyio

ADDR = ("did:plc:alice", "3kconv", "3kmsg.r0")


@asynccontextmanager
async def clusters(url: str, n: int) -> AsyncIterator[list[Cluster]]:
    async with AsyncExitStack() as stack:
        out = [await stack.enter_async_context(Cluster(url, f"inst{i}")) for i in range(n)]
        for c in out:
            assert c.up
        yield out


async def _until(check: Any, seconds: float = 10.0) -> None:
    with anyio.fail_after(seconds):
        while not check():  # noqa: ASYNC110 - polling state another task changes
            await anyio.sleep(0.02)


async def _read(stream: Any, after: int = 0, stop_at: int | None = None) -> list[StreamEvent]:
    got: list[StreamEvent] = []
    async for batch in stream.batches(after, idle=5):
        got.extend(batch)
        if stop_at is not None and got and got[-1].id >= stop_at:
            break
    return got


async def test_coalesced_deltas_keep_one_numbering_for_every_reader() -> None:
    buffer = MirroredBuffer()
    buffer.publish("part-start", {"index": 0, "type": "text"})
    for word in ("a", "b", "c"):
        buffer.publish_delta(0, word)  # no reader looked in between: one event
    seen: list[StreamEvent] = []

    async def reader() -> None:
        async for event in buffer.events():
            seen.append(event)

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        await _until(lambda: len(seen) == 2)
        buffer.publish_delta(0, "d")
        await _until(lambda: len(seen) == 3)
        buffer.publish("status", {"status": "complete"})
        buffer.close()
    assert [(e.id, e.event) for e in seen] == [(1, "part-start"), (2, "delta"), (3, "delta"), (4, "status")]
    assert json.loads(seen[1].data) == {"index": 0, "text": "abc"}
    assert json.loads(seen[2].data) == {"index": 0, "text": "d"}
    # A late reader replays exactly the same events.
    assert [e async for e in buffer.events()] == seen


async def test_a_stream_is_served_by_another_instance_with_resume(redis_server: RedisServer) -> None:
    async with clusters(redis_server.url, 3) as (a, b, c):
        streams_a = a.streams()
        b.streams()
        c.streams()
        buffer = streams_a.open(*ADDR)
        assert isinstance(buffer, MirroredBuffer)
        streams_a.claimed(*ADDR)
        buffer.publish("part-start", {"index": 0, "type": "text"})

        async def stored(_: Any) -> dict[str, Any]:
            return {"status": "pending"}

        remote = await b.remote_stream(ADDR, stored)
        assert remote is not None, "the runner answers the watch"
        first: list[StreamEvent] = []

        async def read_some() -> None:
            first.extend(await _read(remote, 0, stop_at=4))

        async with anyio.create_task_group() as tg:
            tg.start_soon(read_some)
            for i in range(6):
                buffer.publish_delta(0, f"t{i} ")
                await anyio.sleep(0.01)  # let readers take each token as its own event
        assert [e.id for e in first] == [1, 2, 3, 4]
        buffer.publish("status", {"status": "complete"})
        buffer.close()
        # Resumed on a third instance with Last-Event-ID 4: the rest, once each, in order.
        again = await c.remote_stream(ADDR, stored)
        assert again is not None
        rest = await _read(again, 4)
        local = [e async for e in buffer.events()]
        assert first + rest == local
        assert rest[-1].event == "status"
        key = a.link.key("stream", "inst0", *ADDR)
        ttl = await a.link.redis.ttl(key)
        assert 0 < ttl <= 60, "the key expires a minute after the end"
        # Ids on Redis are the sequence numbers.
        ids = [entry[0] for entry in await a.link.redis.xrange(key)]
        assert ids[: len(local)] == [f"{e.id}-1".encode() for e in local]


async def test_no_runner_no_stream_and_no_mirror_without_a_watch(redis_server: RedisServer) -> None:
    async with clusters(redis_server.url, 2) as (a, b):
        streams_a = a.streams()
        b.streams()
        buffer = streams_a.open(*ADDR)
        key = a.link.key("stream", "inst0", *ADDR)

        async def nothing(_: Any) -> None:
            return None

        # Opened for a claim not made yet (it may be lost): not offered to anyone.
        assert await b.remote_stream(ADDR, nothing) is None
        buffer.publish("queued", {})
        assert await a.link.redis.exists(key) == 0, "nobody subscribed elsewhere: nothing written"

        async def stored(_: Any) -> None:
            return None

        assert await b.remote_stream(("did:plc:alice", "3kconv", "other.r0"), stored) is None
        assert await a.link.redis.exists(key) == 0


async def test_cancel_reaches_the_runner_only(redis_server: RedisServer) -> None:
    cancelled: list[tuple[str, ...]] = []

    async def cancel_here(address: tuple[str, str, str]) -> bool:
        if address == ADDR:
            cancelled.append(address)
            return True
        return False

    async def nothing_here(address: tuple[str, str, str]) -> bool:
        return False

    async with clusters(redis_server.url, 3) as (a, b, c):
        a.serve_cancel(cancel_here)
        b.serve_cancel(nothing_here)
        c.serve_cancel(nothing_here)
        assert await c.cancel(ADDR) is True
        assert cancelled == [ADDR]
        assert await b.cancel(("did:plc:alice", "3kconv", "gone.r0")) is False
        assert cancelled == [ADDR]


async def test_rate_limit_is_counted_across_instances(redis_server: RedisServer) -> None:
    async with clusters(redis_server.url, 3) as instances:
        results: list[bool] = []

        async def start(cluster: Cluster) -> None:
            results.append(await cluster.limiter.admit("did:plc:alice", 3))

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                for cluster in instances:
                    tg.start_soon(start, cluster)
        assert sorted(results) == [False] * 6 + [True] * 3
        # Another account has its own window.
        assert await instances[1].limiter.admit("did:plc:bob", 3) is True
        # One turn started by every instance's change feed takes one place, not three.
        for cluster in instances:
            assert await cluster.limiter.admit("did:plc:carol", 1, "conv/k.r0") is True
        assert await instances[0].limiter.admit("did:plc:carol", 1, "conv/k2.r0") is False


async def test_queue_bound_is_shared_and_a_dead_instance_stops_counting(
    redis_server: RedisServer,
) -> None:
    async with clusters(redis_server.url, 2) as (a, b):
        assert await a.limiter.enter_queue("did:plc:alice", 2, "c/1.r0")
        assert await b.limiter.enter_queue("did:plc:alice", 2, "c/2.r0")
        # The same turn queued by the other instance's change feed holds no second place.
        assert await a.limiter.enter_queue("did:plc:alice", 2, "c/2.r0")
        assert not await a.limiter.enter_queue("did:plc:alice", 2, "c/3.r0")
        assert await a.limiter.enter_queue("did:plc:bob", 2, "c/3.r0")
        await a.limiter.exit_queue("did:plc:alice", "c/1.r0")
        assert await b.limiter.enter_queue("did:plc:alice", 2, "c/3.r0")
        assert not await b.limiter.enter_queue("did:plc:alice", 2, "c/4.r0")
        # Entries nobody refreshed for 30 s (their instance died) stop counting.
        key = a.link.key("queued", "did:plc:alice")
        await a.link.redis.zadd(key, {"c/2.r0": 0, "c/3.r0": 0})
        assert await a.limiter.enter_queue("did:plc:alice", 2, "c/4.r0")
        # A reconnect writes this instance's entries back into an empty Redis.
        await a.link.redis.flushall()
        await a.queue.resync()
        assert set(await a.link.redis.zrange(key, 0, -1)) == {b"c/2.r0", b"c/4.r0"}


class _Rows:
    """One instance's own usage totals (what turns.quota.LocalQuotaCounter reads from its
    state file), set by the test."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[int, float]] = {}

    async def totals(self, did: str, now: datetime) -> tuple[int, float]:
        return self.rows.get(did, (0, 0.0))

    async def add(self, did: str, at: datetime, tokens: int, cost: float) -> None:
        old = self.rows.get(did, (0, 0.0))
        self.rows[did] = (old[0] + tokens, old[1] + cost)


async def test_quota_usage_is_summed_and_refilled_after_a_restart(
    redis_server: RedisServer,
) -> None:
    # Today, not a fixed date: the Redis keys expire a day after their period by the real
    # clock, so a key for a day long past is gone the moment it is written.
    now = datetime.now(UTC)
    tomorrow = now + timedelta(days=1)
    # Cost is per month: tomorrow in the next month holds only a's own 0.75.
    cost_tomorrow = 1.0 if tomorrow.month == now.month else 0.75
    async with clusters(redis_server.url, 2) as (a, b):
        rows_a, rows_b = _Rows(), _Rows()
        counter_a, counter_b = a.quota_counter(rows_a), b.quota_counter(rows_b)
        await counter_a.add("did:plc:alice", now, 100, 0.5)
        await counter_b.add("did:plc:alice", now, 250, 0.25)
        await counter_a.add("did:plc:alice", now, 50, 0.25)
        assert await counter_b.totals("did:plc:alice", now) == (400, 1.0)
        assert await counter_b.totals("did:plc:bob", now) == (0, 0.0)
        # Tokens are per UTC day, cost per month: tomorrow only a has written its day yet.
        assert await counter_a.totals("did:plc:alice", tomorrow) == (150, cost_tomorrow)
        redis_server.kill()
        await _until(lambda: not a.up and not b.up)
        # Unreachable: each instance counts its own.
        assert await counter_a.totals("did:plc:alice", now) == (150, 0.75)
        redis_server.start()
        await _until(lambda: a.up and b.up)
        # Redis restarted empty: b's check writes b's totals back, a's first call writes a's.
        assert await counter_b.totals("did:plc:alice", now) == (250, 0.25)
        assert await counter_a.totals("did:plc:alice", now) == (400, 1.0)


async def test_remote_reader_gets_the_stored_status_through_an_outage(
    redis_server: RedisServer,
) -> None:
    async with clusters(redis_server.url, 2) as (a, b):
        streams_a = a.streams()
        b.streams()
        buffer = streams_a.open(*ADDR)
        streams_a.claimed(*ADDR)
        buffer.publish("part-start", {"index": 0, "type": "text"})
        final: dict[str, Any] = {"status": "pending"}

        async def stored(_: Any) -> dict[str, Any]:
            return final

        remote = await b.remote_stream(ADDR, stored)
        assert remote is not None
        got: list[StreamEvent] = []

        async def read() -> None:
            async for batch in remote.batches(0, idle=5):
                got.extend(batch)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await _until(lambda: len(got) == 1)
            redis_server.kill()
            await _until(lambda: not b.up)
            buffer.publish_delta(0, "while Redis is down")
            buffer.publish("status", {"status": "complete"})
            buffer.close()
            final = {"status": "complete", "model": {"provider": "fake", "id": "m"}}
        assert [e.event for e in got] == ["part-start", "status"]
        assert got[-1].id == 2 and json.loads(got[-1].data)["status"] == "complete"


async def test_health_follows_redis(redis_server: RedisServer) -> None:
    async with clusters(redis_server.url, 1) as (a,):
        redis_server.kill()
        await _until(lambda: not a.up)
        redis_server.start()
        await _until(lambda: a.up)


async def test_a_buffer_for_a_claim_lost_is_not_served_here(redis_server: RedisServer) -> None:
    async with clusters(redis_server.url, 1) as (a,):
        streams = a.streams()
        won = streams.open("did:plc:alice", "c", "won.r0")
        lost = streams.open("did:plc:alice", "c", "lost.r0")
        results: dict[str, Any] = {}

        async def look(name: str, buffer: Any) -> None:
            results[name] = await a.local_stream(buffer)

        async with anyio.create_task_group() as tg:
            tg.start_soon(look, "won", won)
            tg.start_soon(look, "lost", lost)
            await anyio.lowlevel.checkpoint()  # both wait for the claim's outcome
            assert results == {}
            streams.claimed("did:plc:alice", "c", "won.r0")
            streams.lost("did:plc:alice", "c", "lost.r0")
            lost.publish("status", {"status": "pending"})  # what a loser tells its readers
        assert results["won"] is won
        assert results["lost"] is None, "another instance runs it: ask the cluster"
        assert await a.local_stream(lost) is None
        fresh = streams.open("did:plc:alice", "c", "lost2.r0")
        async with anyio.create_task_group() as tg:
            tg.start_soon(look, "lost2", fresh)
            await anyio.lowlevel.checkpoint()
            streams.lost("did:plc:alice", "c", "lost2.r0")
        assert results["lost2"] is None


async def test_more_commands_and_readers_at_once_than_redis_pys_default_pool(
    redis_server: RedisServer,
) -> None:
    # redis-py refuses a command past its pool's 100 connections (MaxConnectionsError),
    # which stopped mirrors when 200 replies were mirrored at once, and marked Redis as
    # gone. Here 150 commands and 150 XREAD BLOCKs that each hold a connection for a
    # while all succeed, and Redis stays up.
    async with clusters(redis_server.url, 1) as (a,):
        link = a.link
        failures: list[BaseException] = []

        async def command(i: int) -> None:
            try:  # BLPOP holds its connection until its timeout, as a slow command would
                await link.redis.blpop([f"turnd:test:none:{i}"], timeout=0.3)
            except Exception as exc:  # noqa: BLE001 - collected, asserted below
                failures.append(exc)

        async def reader(i: int) -> None:
            try:
                await link.blocking.xread({f"turnd:test:stream:{i}": "0-1"}, block=300)
            except Exception as exc:  # noqa: BLE001 - collected, asserted below
                failures.append(exc)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for i in range(150):
                    tg.start_soon(command, i)
                    tg.start_soon(reader, i)
        assert failures == []
        assert link.up
