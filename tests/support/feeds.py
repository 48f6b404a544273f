"""Reading a store's change feed in tests: the next ``n`` changes, within a deadline."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio

from recordstore import Change

__all__ = ["take"]


async def take(feed: AsyncIterator[Change], n: int, within: float = 20.0) -> list[Change]:
    """The next ``n`` changes of ``feed``; fails when they take longer than ``within`` s."""
    out: list[Change] = []
    with anyio.fail_after(within):
        async for change in feed:
            out.append(change)
            if len(out) == n:
                break
    return out
