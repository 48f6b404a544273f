"""turns.ratelimit: a sliding minute per user, and a first-come queue that claims nothing."""

from __future__ import annotations

import anyio
import pytest

from turns.ratelimit import RateLimiter

pytestmark = pytest.mark.anyio


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_per_minute_starts_then_refused_until_the_oldest_is_a_minute_old() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    assert [limiter.try_acquire("alice", 2) for _ in range(3)] == [True, True, False]
    clock.now += 30
    assert not limiter.try_acquire("alice", 2)
    assert limiter.try_acquire("bob", 2)  # per user
    clock.now += 30  # the first two starts are now a minute old
    assert limiter.try_acquire("alice", 2) and limiter.try_acquire("alice", 2)
    assert not limiter.try_acquire("alice", 2)


def test_a_raised_limit_applies_at_once() -> None:
    limiter = RateLimiter(Clock())
    assert limiter.try_acquire("alice", 1) and not limiter.try_acquire("alice", 1)
    assert limiter.try_acquire("alice", 2)


async def test_waiters_start_in_order_once_the_minute_allows() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    assert limiter.try_acquire("alice", 1)
    started: list[str] = []
    first_started = anyio.Event()

    async def wait(name: str) -> None:
        await limiter.acquire("alice", 1)
        started.append(name)
        first_started.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, "first")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(wait, "second")
            await anyio.wait_all_tasks_blocked()
            assert limiter.waiting == 2 and started == []
            # While one waits, a newcomer does not jump the queue.
            assert not limiter.try_acquire("alice", 1)
            clock.now += 60
            await first_started.wait()  # the waiter re-reads the clock at least every second
            assert started == ["first"]
            clock.now += 60
    assert started == ["first", "second"] and limiter.waiting == 0
