"""The change feed of the pds store: ``com.atproto.sync.subscribeRepos`` plus a sweep.

One firehose per PDS (the accounts a :class:`~recordstore.pds.PdsStore` serves may live on
several), through the SDK's ``AsyncFirehoseSubscribeReposClient``. Commits of the served
DIDs touching ``network.sharedcomputer.chat.*`` become :class:`~recordstore.Change` ops,
their records decoded from the commit's CAR blocks (:mod:`recordstore.firehose_reader`).
The sweeps are :mod:`recordstore.repo_sweep`; what the two share per PDS,
:mod:`recordstore.feed_state`; this module runs them and hands their changes over.

Cursors. The feed's cursor is a JSON object ``{"<pds url>": <seq>, ...}``: per PDS, the
sequence number of the last commit whose ops were all *handed to the consumer*. Because it
is built when a change is yielded, it is never ahead of what the consumer handled; within a
commit of several ops, all but the last carry the previous position, so a consumer that
stops half-way through a commit sees its remaining ops again. The SDK client reconnects
with the cursor it was given unless moved on, so it is moved (``update_params``) after each
handled commit.

Gaps. A cursor older than what the PDS keeps (``OutdatedCursor``) or ahead of it
(``FutureCursor``, e.g. a reset PDS) means ops were lost; so does anything else going
wrong between the PDS and us. Each ``sweep_interval`` the feed compares every served
repo's current revision (``getLatestCommit``) with the last one the firehose delivered;
a repo still behind at the next check, or known to have lost ops, is swept: its chat
records are listed and whatever differs from what the feed last reported is emitted
(``live=False``). The firehose and the sweep share one record of "last reported state"
per key, so neither repeats what the other already said.

``live`` is False for ops the PDS sequenced before this feed started (a catch-up from a
stored cursor) and for everything a sweep finds; True for the rest.

One PDS being unreachable only stalls its own firehose (reconnected with backoff); the
others go on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from recordstore import Change, StoreError
from recordstore.feed_state import (
    NOTHING,
    Endpoint,
    FeedAccount,
    FeedSource,
    Item,
    backoff,
)
from recordstore.firehose_reader import FirehoseReader
from recordstore.repo_sweep import RepoSweeper

__all__ = ["FeedAccount", "FeedSource", "PdsFeed", "decode_cursor", "encode_cursor"]

log = logging.getLogger(__name__)


def encode_cursor(positions: dict[str, int]) -> str:
    return json.dumps(dict(sorted(positions.items())), separators=(",", ":"))


def decode_cursor(cursor: str | None) -> dict[str, int]:
    if cursor is None:
        return {}
    try:
        positions = json.loads(cursor)
    except ValueError:
        positions = None
    if not isinstance(positions, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in positions.items()
    ):
        raise StoreError(f'invalid change-feed cursor {cursor!r} (expected {{"<pds>": seq}})')
    return positions


class PdsFeed:
    """The change feed of a :class:`~recordstore.pds.PdsStore` (see the module doc)."""

    def __init__(self, store: FeedSource, *, sweep_interval: float = 60.0) -> None:
        self.store = store
        self.sweep_interval = sweep_interval
        self.started = datetime.now(UTC)
        self.complete: set[str] = set()  # DIDs swept in full: `known` is their whole state

    @asynccontextmanager
    async def changes(self, cursor: str | None = None) -> AsyncIterator[AsyncIterator[Change]]:
        """The feed from just after ``cursor``, running while the ``async with`` lasts."""
        positions = decode_cursor(cursor)
        handled = dict(positions)
        self.started = datetime.now(UTC)
        send, receive = anyio.create_memory_object_stream[Item](0)
        failure: Exception | None = None
        with send, receive:
            async with anyio.create_task_group() as tg:
                await self._start_endpoints(tg, positions, send, from_start=cursor is None)
                try:
                    async with aclosing(self._deliver(receive, handled)) as feed:
                        yield feed
                except Exception as exc:
                    # The consumer's own error: raised as it is once the feed has stopped,
                    # not wrapped in the task group's exception group.
                    failure = exc
                finally:
                    tg.cancel_scope.cancel()
        if failure is not None:
            raise failure

    @staticmethod
    async def _deliver(
        receive: MemoryObjectReceiveStream[Item], handled: dict[str, int]
    ) -> AsyncIterator[Change]:
        async for item in receive:
            if item.seq is not None and item.completes:
                handled[item.endpoint] = item.seq
            if item.change is not NOTHING:
                yield replace(item.change, cursor=encode_cursor(handled))

    async def _start_endpoints(
        self,
        tg: TaskGroup,
        positions: dict[str, int],
        send: MemoryObjectSendStream[Item],
        *,
        from_start: bool,
    ) -> None:
        by_endpoint: dict[str, set[str]] = {}
        for account in self.store.feed_accounts():
            if not account.logged_in:
                tg.start_soon(self._start_late, tg, account, positions, send, from_start)
                continue
            assert account.did is not None
            by_endpoint.setdefault(account.endpoint, set()).add(account.did)
        for endpoint, dids in by_endpoint.items():
            self._start_endpoint(tg, endpoint, dids, positions, send, from_start)

    def _start_endpoint(
        self,
        tg: TaskGroup,
        endpoint: str,
        dids: set[str],
        positions: dict[str, int],
        send: MemoryObjectSendStream[Item],
        from_start: bool,
    ) -> None:
        ep = Endpoint(
            self.store,
            endpoint,
            dids,
            positions.get(endpoint),
            send,
            started=self.started,
            complete=self.complete,
        )
        if from_start or endpoint not in positions:
            ep.from_start()
        tg.start_soon(FirehoseReader(ep).run)
        tg.start_soon(RepoSweeper(ep, self.sweep_interval).run)

    async def _start_late(
        self,
        tg: TaskGroup,
        account: FeedAccount,
        positions: dict[str, int],
        send: MemoryObjectSendStream[Item],
        from_start: bool,
    ) -> None:
        """An account whose PDS was down at open: keep logging in, then feed it."""
        failures = 0
        while not account.logged_in:
            try:
                await self.store.log_in(account)
            except Exception as e:  # noqa: BLE001 - unreachable or refused: try again later
                failures += 1
                log.warning("%s: login failed, retrying: %s", account.identifier, e)
                await anyio.sleep(backoff(failures))
        assert account.did is not None
        self._start_endpoint(tg, account.endpoint, {account.did}, positions, send, from_start)
