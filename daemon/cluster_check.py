"""``turnd check``'s line for ``[cluster]``: Redis answers, and runs the scripts turnd needs."""

from __future__ import annotations

from urllib.parse import urlsplit

import anyio

from daemon.config import Config


async def check_cluster(config: Config) -> tuple[bool, str, str] | None:
    """None without [cluster]; else (ok, "cluster", detail). The URL's password is never shown."""
    if not config.redis_url:
        return None
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError

    parts = urlsplit(config.redis_url)
    where = f"{parts.hostname or parts.path}:{parts.port or 6379} (from {config.redis_url_env})"
    client = aioredis.Redis.from_url(config.redis_url, socket_connect_timeout=3, socket_timeout=3)
    try:
        with anyio.fail_after(5):
            await client.ping()
            info = await client.info("server")
            # The shared limits are Lua scripts: a server without scripting cannot share them.
            await client.eval("return redis.call('TIME')[1]", 0)
        server = info.get("valkey_version") and "valkey" or "redis"
        version = info.get("valkey_version") or info.get("redis_version", "?")
        return True, "cluster", f"{server} {version} at {where}"
    except (RedisError, OSError, TimeoutError) as err:
        message = str(err).replace(parts.password or "\0", "***")
        return False, "cluster", f"Redis at {where}: {type(err).__name__}: {message}"[:300]
    finally:
        with anyio.CancelScope(shield=True):
            await client.aclose()
