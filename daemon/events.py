"""Live record events for the page (SPEC §15, §17), fed by the change feed.

Every change the daemon's feed handles becomes, for its conversation,
``record {action, collection, key, cid}`` (and ``title {title, titleSource}`` when
the info's title changes; ``title-failed {reason}`` when a generated title will not
come, which is no record and so only this daemon's), and for the account ``conversation {action, skey,
title}``. Whoever wrote the record — this daemon, another one, a stock atproto
client — the page hears of it, without polling.

Each log keeps its last 1000 events, so ``Last-Event-ID`` resumes within them.
Event ids grow across the whole process and start from the clock, so an id from
before a restart is still older than every new one. Logs of conversations nobody
follows are dropped least-recently-used first (at most ``MAX_CONVERSATIONS``).
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Collection

import anyio

from recordstore import CONVERSATION_REF, INFO, SETTINGS_SPACE, Change
from recordstore.stored_json import compact
from turns.streams import frame, frame_id

KEEP = 1000  # events per log
MAX_CONVERSATIONS = 128  # conversation logs kept for resuming


class EventLog:
    """A conversation's (or an account's) last ``KEEP`` events, each kept as the SSE
    frame its subscribers are sent.

    A frame is one object where an event with its id and JSON text were three: this is
    what the page's logs cost while they fill (SPEC §10's RSS growth), ~85 bytes an event
    less, and a batch goes out as one join with no framing per subscriber.
    """

    def __init__(self) -> None:
        self._frames: deque[bytes] = deque(maxlen=KEEP)
        self._last_id = 0
        self._changed: anyio.Event | None = None  # made when someone waits
        self.followers = 0
        self.title: tuple[str | None, str | None] | None = None  # the last title event

    @property
    def last_id(self) -> int:
        """The newest event's id; 0 before the first."""
        return self._last_id

    def append(self, id: int, event: str, data: str) -> None:
        self._frames.append(frame(event, data, id))
        self._last_id = id
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def framed_after(self, after: int) -> bytes:
        """The frames of the kept events whose id is greater than ``after``."""
        if after >= self._last_id:
            return b""
        # Ids only grow, and a follower asks for what is new: walk back from the end.
        start = len(self._frames)
        while start and frame_id(self._frames[start - 1]) > after:
            start -= 1
        return b"".join(itertools.islice(self._frames, start, None))

    async def follow(self, after: int, *, idle: float) -> AsyncIterator[bytes]:
        """The frames after ``after``, then live ones as they come; ``b""`` after ``idle``
        seconds without one."""
        self.followers += 1
        try:
            while True:
                if self._changed is None:
                    self._changed = anyio.Event()
                waiter = self._changed
                framed = self.framed_after(after)
                if framed:
                    after = self._last_id
                    yield framed
                    continue
                with anyio.move_on_after(idle) as scope:
                    await waiter.wait()
                if scope.cancelled_caught:
                    yield b""
        finally:
            self.followers -= 1


class EventHub:
    def __init__(self) -> None:
        self._ids = time.time_ns() // 1000  # ids keep growing across a restart
        self._conversations: OrderedDict[tuple[str, str], EventLog] = OrderedDict()
        self._accounts: dict[str, EventLog] = {}

    def conversation(self, did: str, skey: str) -> EventLog:
        log = self._conversations.get((did, skey))
        if log is None:
            log = self._conversations[(did, skey)] = EventLog()
            self._trim()
        else:
            self._conversations.move_to_end((did, skey))
        return log

    def account(self, did: str) -> EventLog:
        log = self._accounts.get(did)
        if log is None:
            log = self._accounts[did] = EventLog()
        return log

    def _trim(self) -> None:
        while len(self._conversations) > MAX_CONVERSATIONS:
            for address, log in self._conversations.items():
                if not log.followers:
                    del self._conversations[address]
                    break
            else:
                return  # all followed: keep them

    def _event(self, log: EventLog, name: str, data: dict[str, object]) -> None:
        self._ids += 1
        log.append(self._ids, name, compact(data))

    def publish(self, change: Change, accounts: Collection[str]) -> None:
        """One change of the store, for the accounts this daemon serves."""
        if change.did not in accounts:
            return
        if change.space == SETTINGS_SPACE:
            if change.collection == CONVERSATION_REF and change.op != "delete":
                self._conversation_event(change, "update", change.key)
            return
        log = self.conversation(change.did, change.space)
        self._event(
            log,
            "record",
            {
                "action": change.op,
                "collection": change.collection,
                "key": change.key,
                "cid": change.cid,
            },
        )
        if change.collection != INFO:
            return
        record = change.record if change.op != "delete" else None
        title = record.get("title") if record else None
        source = record.get("titleSource") if record else None
        state = (
            title if isinstance(title, str) else None,
            source if isinstance(source, str) else None,
        )
        if state != log.title and (log.title is not None or state[0] is not None):
            self._event(log, "title", {"title": state[0], "titleSource": state[1]})
        log.title = state
        self._conversation_event(change, change.op, change.space)

    def no_title(self, did: str, skey: str, reason: str) -> None:
        """``title-failed {reason}``: the title generated after a first reply will not come
        (its model failed or answered none), so a client waiting for it stops waiting."""
        self._event(self.conversation(did, skey), "title-failed", {"reason": reason})

    def _conversation_event(self, change: Change, action: str, skey: str) -> None:
        record = change.record or {}
        title = record.get("title") if action != "delete" else None
        self._event(
            self.account(change.did),
            "conversation",
            {"action": action, "skey": skey, "title": title if isinstance(title, str) else None},
        )
