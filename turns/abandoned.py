"""Pending replies no live turn can own any more (SPEC §12's abandoned claims).

A runner that dies with its state file (a lost disk, a deleted data directory)
leaves its placeholders ``pending`` for ever: the seed's rule says others'
pending replies are never touched. A placeholder older than the longest a live
turn can take cannot belong to a live turn, though, so every runner serving the
account rewrites it as ``error: "abandoned"``, with a swap on its CID so that
exactly one of them wins.

The replies to check are the pending ones seen in the change feed (and, once at
start-up, in a scan of the account's conversations): a few references each,
no content.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from recordstore import MESSAGE, Change
from recordstore.keys import parse_reply_key


@dataclass(frozen=True, slots=True)
class PendingReply:
    did: str
    skey: str
    key: str
    created_at: datetime


class PendingReplies:
    def __init__(self) -> None:
        self._pending: dict[tuple[str, str, str], PendingReply] = {}

    def observe(self, change: Change) -> None:
        """Note a reply that is pending after this change, forget one that is not."""
        if change.collection != MESSAGE or parse_reply_key(change.key) is None:
            return
        self.note(change.did, change.space, change.key, change.record)

    def note(self, did: str, skey: str, key: str, value: object) -> None:
        address = (did, skey, key)
        created = pending_since(value)
        if created is None:
            self._pending.pop(address, None)
        else:
            self._pending[address] = PendingReply(did, skey, key, created)

    def forget(self, reply: PendingReply) -> None:
        self._pending.pop((reply.did, reply.skey, reply.key), None)

    def older_than(self, cutoff: datetime) -> Iterator[PendingReply]:
        for reply in list(self._pending.values()):
            if reply.created_at < cutoff:
                yield reply

    def __len__(self) -> int:
        return len(self._pending)


def pending_since(value: object) -> datetime | None:
    """When a reply record became pending (its createdAt), or None if it is not pending."""
    if not isinstance(value, dict) or value.get("status") != "pending":
        return None
    created = value.get("createdAt")
    if not isinstance(created, str):
        return None
    try:
        when = datetime.fromisoformat(created)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
