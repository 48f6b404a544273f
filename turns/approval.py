"""Tool calls that wait for the user's yes (SPEC §14).

A turn whose model calls a tool that needs approval pauses that call: the stream gets an
``approval`` event, the reply record is rewritten once (with a swap on the placeholder)
with the parts so far and ``approval: "pending"`` on the call, and the call waits for a
decision — the HTTP route, or an ``approval`` record written by the conversation's owner
at ``<replyKey>.a<index>``. No decision within ``approvalTimeoutSeconds`` is an error
result, as is a denial. The wait does not count against the turn's ``timeoutSeconds``.

:class:`Approvals` is the daemon-wide table of waiting calls; :class:`ApprovalGate` is one
turn's side of it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from recordstore import Change
from recordstore.keys import parse_reply_key
from recordstore.vocabulary import APPROVAL
from turns.prompt import PLAIN
from turns.records import UNDECIDED
from turns.streams import StreamBuffer

log = logging.getLogger("turnd.turns")

DENIED = "not approved by the user"
TIMED_OUT = "approval timed out"

Address = tuple[str, str, str, str]  # did, conversation, reply key, call id


@dataclass
class _Wait:
    index: int  # the toolCall part's index in the reply
    decided: anyio.Event = field(default_factory=anyio.Event)
    approve: bool | None = None


class Approvals:
    """The calls waiting for a decision, by (did, conversation, reply, callId)."""

    def __init__(self) -> None:
        self._waits: dict[Address, _Wait] = {}
        self._closed = False

    def close(self) -> None:
        """Shutting down: every wait, now and later, ends with no decision (``timedout``).

        A person may not be there to answer, and a turn waiting for one would hold the
        shutdown for its whole grace; ended, the turn finishes within it like any other."""
        self._closed = True
        for wait in self._waits.values():
            wait.decided.set()

    def waiting(self, did: str, skey: str, reply: str) -> list[str]:
        return [a[3] for a in self._waits if a[:3] == (did, skey, reply)]

    def decide(self, did: str, skey: str, reply: str, call_id: str, approve: bool) -> bool:
        """Decide a waiting call; False when it is not waiting or already decided."""
        wait = self._waits.get((did, skey, reply, call_id))
        if wait is None or wait.decided.is_set():
            return False
        wait.approve = approve
        wait.decided.set()
        return True

    def on_change(self, change: Change, owners: Mapping[str, Any]) -> bool:
        """An ``approval`` record from the change feed; True when it decided a call.

        Only a record in the conversation owner's own repo counts (a DID this daemon
        serves, the same DID as the turn's); its key must be ``<reply>.a<index>`` for the
        waiting call's index and its fields must name that reply and call.
        """
        if change.collection != APPROVAL or change.op == "delete" or change.did not in owners:
            return False
        value = change.record
        if change.error is not None or not isinstance(value, Mapping):
            return False
        reply, call_id, approve = value.get("reply"), value.get("callId"), value.get("approve")
        if not isinstance(reply, str) or not isinstance(call_id, str) or not isinstance(approve, bool):
            return False
        if parse_reply_key(reply) is None or not change.key.startswith(f"{reply}.a"):
            return False
        index = change.key[len(reply) + 2 :]
        wait = self._waits.get((change.did, change.space, reply, call_id))
        if wait is None or not index.isdigit() or int(index) != wait.index:
            return False
        return self.decide(change.did, change.space, reply, call_id, approve)

    def _add(self, address: Address, index: int) -> _Wait:
        wait = self._waits[address] = _Wait(index)
        if self._closed:
            wait.decided.set()
        return wait

    def _remove(self, address: Address, wait: _Wait) -> None:
        if self._waits.get(address) is wait:
            del self._waits[address]


Rewrite = Callable[[list[dict[str, Any]]], Awaitable[None]]


def pending_reply(placeholder: Mapping[str, Any], parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The placeholder with the parts so far: still ``pending``, still this runner's claim
    (so a restart during the wait marks it interrupted like any other)."""
    return {**placeholder, "content": {"$type": PLAIN, "parts": parts}}


class ApprovalGate:
    """One turn's approvals: publishes, rewrites the record, waits, marks the parts."""

    def __init__(
        self,
        approvals: Approvals,
        did: str,
        skey: str,
        reply: str,
        *,
        parts: list[dict[str, Any]],
        buffer: StreamBuffer | None,
        rewrite: Rewrite,
        timeout_seconds: float,
        scope: anyio.CancelScope,
    ) -> None:
        self._approvals = approvals
        self._where = (did, skey, reply)
        self._parts = parts  # the turn's parts list (PartsBuilder.parts), marked in place
        self._buffer = buffer
        self._rewrite = rewrite
        self._timeout = timeout_seconds
        self._scope = scope  # the turn's: its deadline stops while a call waits
        self._paused = 0
        self._remaining = 0.0
        # call position -> (part index, address, wait): registered before anyone can see them
        self._pending: dict[int, tuple[int, Address, _Wait]] = {}

    async def request(self, calls: Sequence[tuple[int, int, dict[str, Any]]]) -> None:
        """Announce the calls of a step that need approval: ``(position, part index, part)``.

        Each gets its ``approval`` event; then the record is rewritten once for all of them.
        """
        if not calls:
            return
        for position, index, part in calls:
            part["approval"] = "pending"
            address = (*self._where, part["callId"])
            self._pending[position] = (index, address, self._approvals._add(address, index))
            if self._buffer is not None:
                self._buffer.publish(
                    "approval",
                    {"index": index, "callId": part["callId"], "tool": part["tool"], "input": part["input"]},
                )
        try:
            await self._rewrite([dict(p) for p in self._parts])
        except Exception as exc:  # noqa: BLE001 - the stream's clients can still decide
            log.warning("could not write the pending approval of %s/%s: %s", *self._where[1:], exc)

    def needs(self, position: int) -> bool:
        return position in self._pending

    async def wait(self, position: int) -> str | None:
        """Wait for the decision on a requested call: None to run it, else the error result."""
        index, address, wait = self._pending.pop(position)
        part = self._parts[index]
        try:
            with self._pause(), anyio.move_on_after(self._timeout):
                await wait.decided.wait()
        finally:
            self._approvals._remove(address, wait)
        if wait.approve is None:
            part["approval"] = UNDECIDED
            return TIMED_OUT
        part["approval"] = "approved" if wait.approve else "denied"
        return None if wait.approve else DENIED

    def settle(self) -> None:
        """The turn ended (cancelled, shut down) with calls still waiting: no decision can
        reach them now, so they end ``timedout``, as after a restart (records.interrupted)."""
        for _index, address, wait in self._pending.values():
            self._approvals._remove(address, wait)
        self._pending.clear()
        for part in self._parts:
            if part.get("approval") == "pending":
                part["approval"] = UNDECIDED

    @contextmanager
    def _pause(self) -> Iterator[None]:
        """Stop the turn's deadline while any call waits; resume it with what was left."""
        scope = self._scope
        if self._paused == 0:
            self._remaining = scope.deadline - anyio.current_time()
            scope.deadline = math.inf
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
            if self._paused == 0 and not scope.cancel_called:
                scope.deadline = anyio.current_time() + self._remaining
