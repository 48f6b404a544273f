"""The change feed: ``store.changes`` -> the page's events and ``engine.on_change``.

It resumes from the last handled cursor, kept in the state file. The cursor is
never moved past a change that was not handled: a change that fails is tried
:data:`CHANGE_RETRIES` times, then logged and skipped; a feed that fails or ends
is reconnected with a growing back-off. The saved cursor is flushed every
second, and every :data:`CURSOR_FLUSH_EVERY` changes on a busy feed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus

from daemon.events import EventHub
from recordstore import Change, RecordStore
from turns.engine import TurnEngine
from turns.state import StateDB

log = logging.getLogger("turnd.service")

__all__ = ["FeedFollower"]

FEED_CURSOR = "changes"  # the state file's name for the change feed cursor
CURSOR_FLUSH_SECONDS = 1.0
CURSOR_FLUSH_EVERY = 500  # changes: a busy feed still saves its place between flushes
CHANGE_RETRIES = 3  # attempts at one change before it is logged and skipped
FEED_BACKOFF_MAX = 30.0


@dataclass(eq=False)
class FeedFollower:
    """Follows the store's change feed for the engine until ``stop`` is set."""

    store: RecordStore
    state: StateDB
    engine: TurnEngine
    events: EventHub  # the page's live record events see each change first
    owners: Callable[[], dict[str, str]]  # DID -> account name, read per change
    stop: anyio.Event
    up: bool = False  # /healthz's changeFeed
    _handled_cursor: str | None = field(default=None, init=False)
    _saved_cursor: str | None = field(default=None, init=False)
    _since_save: int = field(default=0, init=False)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """store.changes -> engine.on_change, resuming from the last handled cursor."""
        self._handled_cursor = self._saved_cursor = await self.state.get_cursor(FEED_CURSOR)
        self.up = True
        task_status.started()  # HTTP starts after this: /healthz is never 503 at start-up
        delay = 0.5
        while not self.stop.is_set():
            try:
                self.up = True
                async with self.store.changes(self._handled_cursor) as feed:
                    async for change in feed:
                        if self.stop.is_set():
                            break  # not handled, so the cursor stays before it
                        await self._handle(change)
                        delay = 0.5
                        self._handled_cursor = change.cursor
                        self._since_save += 1
                        if self._since_save >= CURSOR_FLUSH_EVERY:
                            await self.flush()
                    else:
                        # A feed that ends by itself is a backend fault: reconnect.
                        log.warning("the change feed ended; reconnecting")
            except Exception as err:  # noqa: BLE001 - any feed failure: log, back off, resume
                self.up = False
                log.error("change feed failed (retrying in %.1fs): %s", delay, err)
            if self.stop.is_set():
                break
            self.up = False
            await anyio.sleep(delay)
            delay = min(delay * 2, FEED_BACKOFF_MAX)
        await anyio.sleep_forever()  # the drain cancels us

    async def _handle(self, change: Change) -> None:
        owners = self.owners()
        self.events.publish(change, owners)
        for attempt in range(1, CHANGE_RETRIES + 1):
            try:
                await self.engine.on_change(change, owners)
                return
            except Exception as err:  # noqa: BLE001 - one bad change must not stop the feed
                if attempt == CHANGE_RETRIES:
                    log.error(
                        "skipping change %s/%s/%s after %d attempts: %s",
                        change.space,
                        change.collection,
                        change.key,
                        attempt,
                        err,
                    )
                    return
                await anyio.sleep(0.2 * attempt)

    async def flush_loop(self) -> None:
        while True:
            await anyio.sleep(CURSOR_FLUSH_SECONDS)
            try:
                await self.flush()
            except Exception as err:  # noqa: BLE001 - the next flush tries again
                log.warning("cannot save the feed cursor: %s", err)

    async def flush(self) -> None:
        cursor = self._handled_cursor
        if cursor is None or cursor == self._saved_cursor:
            return
        await self.state.set_cursor(FEED_CURSOR, cursor)
        self._saved_cursor = cursor
        self._since_save = 0
