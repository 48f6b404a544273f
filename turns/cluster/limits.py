"""Limits shared by every instance: the rate limit, the queue bound, quota usage.

Each is a Lua script (or one command), so a check and its update are one atomic
step on Redis: three instances admitting turns at once still admit exactly the
limit. Times come from Redis's own clock (``TIME``), not from the instances'.
Targets are a single Redis or Valkey node (the scripts touch keys they compute,
which Redis Cluster would refuse).

While Redis is unreachable each falls back to the instance's own count, so turns
keep starting; the limits are then per instance until Redis is back (README).
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections import Counter
from datetime import datetime, timedelta

import anyio

from turns.cluster.link import RedisLink
from turns.quota import QuotaCounter, day_window, month_window
from turns.ratelimit import RateLimiter, WaitLine

log = logging.getLogger("turnd.cluster")

WINDOW_MS = 60_000
ALIVE_SECONDS = 30  # an instance's queue count stops counting this long after it died

# KEYS[1]: the account's window (sorted set of start times, ms). ARGV: limit, window, member
# (the turn: several instances' change feeds may start one message; it counts once).
# Returns 0 when admitted, else the milliseconds until the oldest start leaves the window.
_RATE = """
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], window)
  return 0
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return math.max(1, tonumber(oldest[2]) + window - now)
"""

# KEYS[1]: the account's queued turns (sorted set: turn -> last seen, ms). ARGV: limit, turn,
# the age past which an entry no instance refreshed is dropped (its instance died).
# A turn queued by several instances' change feeds holds one place.
_ENTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]))
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"""

# KEYS[1]: as above. ARGV: the age limit, then the turns this instance still has queued.
_TOUCH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], now, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return 1
"""


def _errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisError

    return (RedisError, OSError, TimeoutError)


class SharedRateLimiter:
    """turns.ratelimit.RateLimiter's interface, counted on Redis across instances."""

    def __init__(
        self, link: RedisLink, queue: SharedQueue, local: RateLimiter | None = None
    ) -> None:
        self._link = link
        self._queue = queue
        self._local = local or RateLimiter()
        self._script = link.redis.register_script(_RATE)
        self._line = WaitLine()
        self._members = itertools.count()

    @property
    def waiting(self) -> int:
        return self._line.waiting

    async def _try(self, user: str, per_minute: int, turn: str) -> int | None:
        """0: admitted; > 0: ms to wait; None: Redis failed (use the local count)."""
        if not self._link.up:
            return None
        member = turn or f"{self._link.instance}:{next(self._members)}"
        try:
            wait = await self._script(
                keys=[self._link.key("rate", user)], args=[per_minute, WINDOW_MS, member]
            )
        except _errors() as err:
            self._link.mark_down(err)
            return None
        return int(wait)

    async def admit(self, user: str, per_minute: int, turn: str = "") -> bool:
        if self._line.held(user):
            return False  # first come, first served: someone here waits already
        wait = await self._try(user, per_minute, turn)
        if wait is None:
            return self._local.try_acquire(user, per_minute)
        return wait == 0

    async def acquire(self, user: str, per_minute: int, turn: str = "") -> None:
        """Wait (first come, first served per user on this instance) until a turn may start."""
        async with self._line.first_in_line(user):
            while True:
                wait = await self._try(user, per_minute, turn)
                if wait == 0:
                    return
                if wait is None:
                    if self._local.try_acquire(user, per_minute):
                        return
                    wait = 1000
                # At most a second: the window may be changed by a config reload,
                # and Redis may come back.
                await anyio.sleep(min(wait / 1000 + 0.005, 1.0))


    async def enter_queue(self, user: str, max_queued: int, turn: str = "") -> bool:
        return await self._queue.enter(user, max_queued, turn)

    async def exit_queue(self, user: str, turn: str = "") -> None:
        await self._queue.leave(user, turn)


class SharedQueue:
    """The per-account bound on turns waiting for the rate limit, across instances.

    Each queued turn is one member of the account's sorted set, refreshed by the
    instance holding it every ``ALIVE_SECONDS / 3``; an instance that dies stops
    counting once its entries are ``ALIVE_SECONDS`` old, and one that reconnects
    writes its entries back (Redis may have restarted empty).
    """

    def __init__(self, link: RedisLink) -> None:
        self._link = link
        self._enter = link.redis.register_script(_ENTER)
        self._touch = link.redis.register_script(_TOUCH)
        self._here: dict[str, Counter[str]] = {}  # did -> turn -> places held here
        link.on_reconnect(self.resync)

    def _key(self, did: str) -> str:
        return self._link.key("queued", did)

    def waiting(self, did: str) -> int:
        return sum(self._here.get(did, {}).values())

    async def enter(self, did: str, limit: int, turn: str = "") -> bool:
        """Count ``turn`` of ``did`` as waiting, unless ``limit`` turns wait already."""
        turn = turn or f"{self._link.instance}:{secrets.token_hex(6)}"
        ok: bool | None = None
        if self._link.up:
            try:
                ok = bool(await self._enter(
                    keys=[self._key(did)], args=[limit, turn, ALIVE_SECONDS * 1000]
                ))
            except _errors() as err:
                self._link.mark_down(err)
        if ok is None:
            ok = self.waiting(did) < limit
        if ok:
            self._here.setdefault(did, Counter())[turn] += 1
        return ok

    async def leave(self, did: str, turn: str = "") -> None:
        held = self._here.get(did)
        if held is None:
            return
        if not turn:
            turn = next(iter(held))
        held[turn] -= 1
        if held[turn] > 0:
            return
        del held[turn]
        if not held:
            del self._here[did]
        if self._link.up:
            # Shielded: a turn leaving the queue because it was cancelled still gives its
            # place back (a failure is mended by the entry's age).
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    await self._link.redis.zrem(self._key(did), turn)
                except _errors() as err:
                    self._link.mark_down(err)

    async def resync(self) -> None:
        for did, held in self._here.items():
            await self._touch(keys=[self._key(did)], args=[ALIVE_SECONDS * 1000, *held])

    async def heartbeat(self) -> None:
        """Keep this instance's queued turns counted."""
        while True:
            await anyio.sleep(ALIVE_SECONDS / 3)
            if self._link.up and self._here:
                try:
                    await self.resync()
                except _errors() as err:
                    self._link.mark_down(err)


# KEYS[1]: the account's day (hash: instance -> tokens), KEYS[2]: its month (instance -> USD).
# ARGV: instance, this instance's tokens today, its USD this month, the keys' expiry times.
# Writes this instance's own totals and answers everyone's sums, in one step.
_USAGE = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('EXPIREAT', KEYS[1], ARGV[4])
redis.call('EXPIREAT', KEYS[2], ARGV[5])
local tokens, cost = 0, 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do tokens = tokens + tonumber(v) end
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do cost = cost + tonumber(v) end
return {tostring(tokens), tostring(cost)}
"""


class SharedQuotaCounter:
    """turns.quota.QuotaCounter summed over instances: quotas shared through Redis.

    Each instance knows its own usage exactly (its state file's rows, through the
    local counter). On every model call it records and on every quota check it
    writes its own totals for the day and the month into one hash field each and
    reads the sum of all instances' fields — one script, one round trip. Writing
    totals, not increments, makes it idempotent: a Redis that restarted empty is
    whole again as soon as each instance has checked or recorded once. Fields are
    keyed by the state file's instance id, stable across restarts. While Redis is
    unreachable a quota counts this instance's usage only.
    """

    def __init__(self, link: RedisLink, local: QuotaCounter) -> None:
        self._link = link
        self._local = local
        self._script = link.redis.register_script(_USAGE)

    async def totals(self, did: str, now: datetime) -> tuple[int, float]:
        mine = await self._local.totals(did, now)
        shared = await self._share(did, now, mine)
        return shared if shared is not None else mine

    async def add(self, did: str, at: datetime, tokens: int, cost: float) -> None:
        await self._local.add(did, at, tokens, cost)
        try:
            mine = await self._local.totals(did, at)
        except Exception as exc:  # noqa: BLE001 - accounting must never fail a turn
            log.warning("cluster: could not read this instance's usage: %s", exc)
            return
        await self._share(did, at, mine)

    async def _share(
        self, did: str, now: datetime, mine: tuple[int, float]
    ) -> tuple[int, float] | None:
        if not self._link.up:
            return None
        day, day_end = day_window(now)
        month, month_end = month_window(now)
        keys = [
            self._link.key("usage", did, day.strftime("%Y-%m-%d")),
            self._link.key("usage", did, month.strftime("%Y-%m")),
        ]
        # Kept a day past their period, for a check at the boundary by a skewed clock.
        expiry = [int((day_end + timedelta(days=1)).timestamp()),
                  int((month_end + timedelta(days=1)).timestamp())]
        try:
            tokens, cost = await self._script(
                keys=keys, args=[self._link.instance, mine[0], repr(float(mine[1])), *expiry]
            )
        except _errors() as err:
            self._link.mark_down(err)
            return None
        return int(float(tokens)), float(cost)
