"""The connection to Redis: two clients, a health probe, and reconnection.

redis-py's asyncio client reconnects by itself on the next command; what it does
not do is tell anyone that Redis went away. The probe does: ``up`` is what
``/healthz`` reports as ``cluster``, and the parts that fall back to in-process
state while Redis is unreachable (limits, streams) read it so that a dead Redis
costs a turn nothing, not a connect timeout per call. When the probe sees Redis
again it runs the ``on_reconnect`` callbacks (shared counters are re-published).

The URL may carry a password, so it is never logged.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger("turnd.cluster")

PROBE_SECONDS = 0.5  # how often Redis is pinged: `cluster` in /healthz follows within this
COMMAND_TIMEOUT = 2.0  # a command that takes longer means Redis is not usable right now
PREFIX = "turnd:"
# Connections of the command client. redis-py's pool refuses a command at once past its
# size (100 by default, `MaxConnectionsError`), which read as Redis being gone: with 200
# replies mirrored at once, some mirrors stopped and their readers elsewhere waited out
# an XREAD block (15 s) before asking again (docs/performance-history.md). This
# pool makes a command wait for a free connection instead, within COMMAND_TIMEOUT.
COMMAND_CONNECTIONS = 100
# Connections of the blocking client: each remote subscriber holds one for its XREAD
# BLOCK, so it has room for as many as the HTTP server lets in (at most 1000 by
# default) and the control channel's subscription; Redis's own default is 10000 clients.
READER_CONNECTIONS = 10_000


class RedisLink:
    """One instance's connection to the cluster's Redis."""

    def __init__(self, url: str, *, instance: str | None = None, prefix: str = PREFIX) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # No hidden retries: callers fall back to in-process state at once, and the
        # probe finds Redis again.
        common = dict(
            # Generous: on a loaded machine a connect can take a while; a refused one
            # (Redis down) fails at once anyway.
            socket_connect_timeout=5.0,
            socket_keepalive=True,
            retry=Retry(NoBackoff(), 0),
        )
        commands = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=COMMAND_CONNECTIONS, timeout=COMMAND_TIMEOUT,
            socket_timeout=COMMAND_TIMEOUT, **common,
        )
        self.redis: aioredis.Redis = aioredis.Redis.from_pool(commands)
        # XREAD BLOCK waits longer than any command timeout: its own client and pool.
        self.blocking: aioredis.Redis = aioredis.Redis.from_url(
            url, max_connections=READER_CONNECTIONS, socket_timeout=None, **common
        )
        self.instance = instance or secrets.token_hex(8)
        self.prefix = prefix
        self.up = False
        self.connected = anyio.Event()  # set on the first successful probe
        self._on_reconnect: list[Callable[[], Awaitable[None]]] = []

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def on_reconnect(self, callback: Callable[[], Awaitable[None]]) -> None:
        self._on_reconnect.append(callback)

    def mark_down(self, err: BaseException) -> None:
        """A command failed for a connection reason: treat Redis as gone until the probe."""
        if self.up:
            log.warning("Redis unreachable (%s); running on in-process state", type(err).__name__)
        self.up = False

    async def probe(self) -> None:
        """Ping forever; flip ``up`` and run the reconnect callbacks on the way back."""
        from redis.exceptions import RedisError

        while True:
            try:
                with anyio.fail_after(COMMAND_TIMEOUT):
                    await self.redis.ping()
                ok = True
            except (RedisError, OSError, TimeoutError) as err:
                ok = False
                self.mark_down(err)
            if ok and not self.up:
                for callback in self._on_reconnect:
                    try:
                        await callback()
                    except (RedisError, OSError, TimeoutError) as err:
                        log.warning("cluster: resync after reconnect failed: %s", err)
                        ok = False
                        break
                if ok:
                    if self.connected.is_set():
                        log.info("Redis reachable again")
                    self.up = True
                    self.connected.set()
            await anyio.sleep(PROBE_SECONDS)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            await self.redis.aclose()
            await self.blocking.aclose()
