"""Final records the store refused (a full disk, a store that is down), written later.

SPEC §12: when the final write of a reply fails, the stream still ends with its
``status`` and closes; the write is retried in the background with backoff for
up to ten minutes, and the claim is kept until it succeeds, so that no other
runner (and no restart) mistakes the reply for an abandoned one meanwhile.
While any final write is waiting, the store counts as down for ``/healthz``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from recordstore import StoreError

log = logging.getLogger("turnd.turns")

Write = Callable[[], Awaitable[None]]


class FinalWrites:
    def __init__(
        self, *, first_wait: float = 1.0, max_wait: float = 60.0, give_up_after: float = 600.0
    ) -> None:
        self._first_wait = first_wait
        self._max_wait = max_wait
        self._give_up_after = give_up_after
        self._waiting = 0
        self._last_failed = False  # the newest final write failed
        self._tg: anyio.abc.TaskGroup | None = None

    def attach(self, tg: anyio.abc.TaskGroup) -> None:
        self._tg = tg

    @property
    def failing(self) -> bool:
        """True while a refused final record waits for its retry, or the last write failed."""
        return self._waiting > 0 or self._last_failed

    def succeeded(self) -> None:
        self._last_failed = False

    def retry(self, name: str, write: Write, then: Write) -> None:
        """Run ``write`` again with backoff until it succeeds (then ``then``) or time is up."""
        assert self._tg is not None, "attach() the engine's task group first"
        self._last_failed = True
        self._waiting += 1
        self._tg.start_soon(self._retry, name, write, then)

    async def _retry(self, name: str, write: Write, then: Write) -> None:
        wait = self._first_wait
        try:
            with anyio.move_on_after(self._give_up_after):
                while True:
                    await anyio.sleep(wait)
                    try:
                        await write()
                    except StoreError as exc:
                        log.warning("final record %s still not stored: %s", name, exc)
                        wait = min(wait * 2, self._max_wait)
                        continue
                    self._last_failed = False
                    log.info("final record %s stored after a retry", name)
                    await then()
                    return
            log.error(
                "gave up storing the final record %s after %g s; its claim stays, and the "
                "next start marks it interrupted", name, self._give_up_after,
            )
        finally:
            self._waiting -= 1
