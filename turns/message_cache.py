"""The messages of long conversations, kept parsed between their turns.

Every turn reads its whole conversation (SPEC §5's load): listing and parsing every
message cost ~0.7 ms at 200 messages and ~1.9 ms at 500 here, more than all the rest of a
short turn, and a turn's CPU grew with its conversation. For a conversation of
:data:`CACHED_FROM` messages or more, this process keeps the messages it parsed, with the
change feed's cursor they are true as of (:class:`~recordstore.abilities.SpaceCids`).
The next turn asks the store which of the conversation's keys were written since that
cursor, by anyone (another instance, a direct XRPC write: every write is in the change
feed), and reads only those again: the cost follows what changed, not the
conversation's length. When more than :data:`CHANGES_READ` changes of the whole store
came since, the conversation's keys and CIDs are listed instead and only the records
whose CID changed are read (a CID names one content).

Below :data:`CACHED_FROM` a conversation is read whole, as before (~0.2 ms at 64
messages), and nothing of it is kept. What is kept is bounded by :data:`KEPT_CHARS`
characters of stored JSON and :data:`KEPT_CONVERSATIONS` conversations, the least
recently read going first; a conversation larger than the whole budget is read whole.

The values are shared between the turns that read them and must not be changed in
place: a turn builds its prompt and records from new objects, and gives plugins a copy
of the user message (turns.turn).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from recordstore import MESSAGE, Record, RecordStore
from recordstore.abilities import SpaceCids

__all__ = ["CACHED_FROM", "KEPT_CHARS", "KEPT_CONVERSATIONS", "MessageCache", "all_records"]

CACHED_FROM = 64  # messages
CHANGES_READ = 2000  # ops of the whole store read to bring one conversation up to date
KEPT_CHARS = 2_000_000  # stored JSON, every kept conversation together (~3x that in RSS)
KEPT_CONVERSATIONS = 64
_TOO_BIG_REMEMBERED = 1024


@dataclass(slots=True)
class _Kept:
    cursor: str  # the change feed's cursor this is true as of, at least
    by_key: dict[str, tuple[str, dict[str, Any], int]] = field(default_factory=dict)
    chars: int = 0


async def all_records(store: RecordStore, did: str, space: str, collection: str) -> list[Record]:
    """Every record of ``collection`` in ``space``, a page of 100 at a time."""
    out: list[Record] = []
    cursor: str | None = None
    while True:
        page, cursor = await store.list_records(did, space, collection, cursor=cursor, limit=100)
        out.extend(page)
        if cursor is None or not page:
            return out


class MessageCache:
    """The parsed messages of this process's long conversations (see the module)."""

    def __init__(
        self,
        store: RecordStore,
        *,
        cached_from: int = CACHED_FROM,
        kept_chars: int = KEPT_CHARS,
        kept_conversations: int = KEPT_CONVERSATIONS,
    ) -> None:
        self._store = store
        # Checked once: a Protocol's isinstance looks up each of its methods.
        self._cids = store if isinstance(store, SpaceCids) else None
        self._cached_from = cached_from
        self._kept_chars = kept_chars
        self._kept_conversations = kept_conversations
        self._kept: OrderedDict[tuple[str, str], _Kept] = OrderedDict()
        self._chars = 0
        # Conversations found larger than the whole budget: read whole each time, without
        # a second read every other turn to find that again.
        self._too_big: OrderedDict[tuple[str, str], None] = OrderedDict()

    @property
    def chars(self) -> int:
        """Characters of stored JSON kept now."""
        return self._chars

    async def messages(self, did: str, skey: str) -> dict[str, dict[str, Any]]:
        """Every message of conversation ``skey``, by key, in key order."""
        store = self._cids
        if store is None:
            return {r.key: r.value for r in await all_records(self._store, did, skey, MESSAGE)}
        kept = self._take(did, skey)
        if kept is not None and kept.cursor:
            changed = await store.keys_changed(did, skey, MESSAGE, kept.cursor, CHANGES_READ)
            if changed is not None:
                keys, kept.cursor = changed
                if keys:
                    await self._reread(store, did, skey, kept, keys)
                self._keep(did, skey, kept)
                return {key: value for key, (_, value, _) in kept.by_key.items()}
        if kept is None:
            records = await all_records(self._store, did, skey, MESSAGE)
            if len(records) >= self._cached_from and (did, skey) not in self._too_big:
                # Known to be long now: the next read keeps what it parses (with the
                # sizes this listing does not give).
                self._keep(did, skey, _Kept(cursor=""))
            return {r.key: r.value for r in records}
        # Long, and nothing kept of it that can be brought up to date: read it whole, as
        # keys and CIDs first (what is kept under the same CID is not read again).
        cursor = await store.change_cursor()  # before the listing: true as of it, at least
        listed = await store.space_cids(did, skey, MESSAGE)
        fresh = _Kept(cursor=cursor)
        missing: list[str] = []
        for key, cid in listed:
            known = kept.by_key.get(key)
            if known is not None and known[0] == cid:
                fresh.by_key[key] = known
                fresh.chars += known[2]
            else:
                missing.append(key)
        if missing:
            await self._reread(store, did, skey, fresh, missing)
        self._keep(did, skey, fresh)
        return {key: value for key, (_, value, _) in fresh.by_key.items()}

    async def _reread(
        self, store: SpaceCids, did: str, skey: str, kept: _Kept, keys: Collection[str]
    ) -> None:
        """Read ``keys`` again into ``kept``: a key no longer there is dropped."""
        read = await store.space_records(did, skey, MESSAGE, sorted(keys))
        by_key = kept.by_key
        for key in keys:
            old = by_key.pop(key, None)
            if old is not None:
                kept.chars -= old[2]
        last = next(reversed(by_key), None)  # the greatest key left: by_key is in key order
        for record, chars in read:  # in key order: appended, they keep it...
            by_key[record.key] = (record.cid, record.value, chars)
            kept.chars += chars
        if read and last is not None and read[0][0].key < last:
            kept.by_key = dict(sorted(by_key.items()))  # ...unless one goes before the rest

    def _take(self, did: str, skey: str) -> _Kept | None:
        kept = self._kept.pop((did, skey), None)
        if kept is not None:
            self._chars -= kept.chars
        return kept

    def _keep(self, did: str, skey: str, kept: _Kept) -> None:
        self._take(did, skey)  # a turn of the same conversation may have kept one meanwhile
        if kept.chars > self._kept_chars:
            self._too_big[(did, skey)] = None
            if len(self._too_big) > _TOO_BIG_REMEMBERED:
                self._too_big.popitem(last=False)
            return
        self._kept[(did, skey)] = kept
        self._chars += kept.chars
        while self._chars > self._kept_chars or len(self._kept) > self._kept_conversations:
            _, dropped = self._kept.popitem(last=False)
            self._chars -= dropped.chars
