"""One PDS as the pds change feed follows it: what the feed needs of the store, and what was
last reported for each key, which the firehose (:mod:`recordstore.firehose_reader`) and
the sweep (:mod:`recordstore.repo_sweep`) share so that neither repeats the other.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from recordstore import Change, InvalidRecord, Op, Record
from recordstore.lexicon import validate_record

__all__ = [
    "NOTHING",
    "Endpoint",
    "FeedAccount",
    "FeedSource",
    "Item",
    "Known",
    "backoff",
    "make_change",
]

_BACKOFF_MAX = 30.0


class FeedAccount(Protocol):
    """One account the feed follows."""

    @property
    def did(self) -> str | None: ...
    @property
    def identifier(self) -> str: ...
    @property
    def logged_in(self) -> bool: ...
    @property
    def endpoint(self) -> str:
        """The PDS its repo is on (known once logged in)."""
        ...


class FeedSource(Protocol):
    """What the feed needs of the store it follows (:class:`~recordstore.pds.PdsStore`)."""

    def feed_accounts(self) -> Sequence[FeedAccount]: ...
    async def log_in(self, account: FeedAccount) -> None: ...
    async def get_record(
        self, did: str, space: str, collection: str, key: str
    ) -> Record | None: ...
    def iter_repo(
        self, did: str, collection: str
    ) -> AsyncIterator[tuple[str, str, dict[str, Any]]]: ...
    async def latest_rev(self, did: str) -> str: ...


@dataclass(slots=True)
class Item:
    """A change on its way to the consumer, with the firehose position it completes."""

    endpoint: str
    seq: int | None  # None: a sweep's change, which moves no cursor
    completes: bool  # the last op of its commit: handling it handles the commit
    change: Change


@dataclass(slots=True)
class Known:
    cid: str
    rev: str  # the repo revision at which this state was seen


# Stands for a commit of served chat ops that all turned out to need no report; it moves
# the cursor and is never yielded.
NOTHING = Change("", "", "", "", "create", None, None, None, "", False)


class Endpoint:
    """One PDS: the DIDs followed on it, and what was last reported for each key."""

    def __init__(
        self,
        store: FeedSource,
        endpoint: str,
        dids: set[str],
        cursor: int | None,
        send: MemoryObjectSendStream[Item],
        *,
        started: datetime,
        complete: set[str],
    ) -> None:
        self.store = store
        self.endpoint = endpoint
        self.dids = dids
        self.cursor = cursor  # the last seq read from the firehose (sent on reconnect)
        self.send = send
        self.started = started  # commits before this are a catch-up (not live)
        self.complete = complete  # DIDs swept in full (of every endpoint of the feed)
        self.known: dict[tuple[str, str, str], Known] = {}  # (did, collection, rkey)
        self.fh_rev: dict[str, str] = {}  # did -> last revision the firehose delivered
        self.lag: dict[str, str] = {}  # did -> a revision the firehose had not reached
        self.needs_sweep: set[str] = set()  # dids known to have lost ops
        self.sweep_now = anyio.Event()
        self.waiting_on_consumer = False  # the firehose is blocked handing over a commit

    async def hand_over(self, item: Item) -> None:
        try:
            await self.send.send(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            # The consumer closed the feed; its cancellation of this task is on the way.
            await anyio.sleep_forever()

    def from_start(self) -> None:
        """No usable position on this PDS: replay all the firehose still holds (from seq 0,
        so nothing falls between a sweep and the connection) and sweep every repo for what
        it no longer holds. ``known`` keeps the two from reporting a state twice."""
        self.cursor = 0
        self.lost_everything()

    def lost_everything(self) -> None:
        self.needs_sweep |= self.dids
        self.sweep_now.set()


def make_change(
    did: str,
    space: str,
    collection: str,
    key: str,
    op: Op,
    cid: str | None,
    value: dict[str, Any] | None,
    live: bool,
) -> Change:
    """A change of the feed, its record validated (a failure is its ``error``)."""
    error = None
    if value is not None:
        try:
            validate_record(collection, value)
        except InvalidRecord as e:
            error = str(e)
    return Change(did, space, collection, key, op, cid, value, error, "", live)


def backoff(failures: int) -> float:
    """How long to wait after ``failures`` failures in a row (jittered, capped)."""
    if failures <= 0:
        return 0.0
    return min(_BACKOFF_MAX, 0.25 * 2 ** (failures - 1)) * random.uniform(0.8, 1.2)
