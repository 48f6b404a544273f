"""The messages of long conversations, kept parsed between their turns.

Every turn reads its whole conversation (SPEC §5's load): listing and parsing every
message cost ~0.7 ms at 200 messages and ~1.9 ms at 500 here, more than all the rest of a
short turn, and a turn's CPU grew with its conversation. Once a conversation has been
seen with :data:`CACHED_FROM` messages or more, its next read keeps the parsed messages
with the change feed's cursor they are true as of (:class:`~recordstore.abilities.SpaceChanges`;
the first read does not, as a listing does not give the sizes the budget counts). Each
later turn asks the store which of the conversation's keys were written since that cursor,
by anyone (another instance, a direct XRPC write: the local store's triggers log every
insert, update and delete, and the same CID is the same content), and reads only those
again: the cost follows what was written since, not the conversation's length. When more
than :data:`CHANGES_READ` writes to the whole store came since, the conversation's keys
and CIDs are listed instead and only the records whose CID changed are read.

Below :data:`CACHED_FROM` a conversation is read whole, as before (~0.2 ms at 64
messages), and nothing of it is kept. What is kept is bounded by :data:`KEPT_CHARS`
characters of stored JSON (4-5.5 times that in memory: 8-11 MB at most) and
:data:`KEPT_CONVERSATIONS` conversations, the least recently read going first (and read
whole, and kept, at their next turn); a conversation larger than the whole budget is read
whole every turn.

The values are shared between the turns that read them and must not be changed in
place: a turn builds its prompt and records from new objects, and gives plugins (when
any are loaded) a copy of the user message (turns.turn).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from recordstore import MESSAGE, Record, RecordStore
from recordstore.abilities import SpaceChanges

__all__ = [
    "CACHED_FROM",
    "KEPT_CHARS",
    "KEPT_CONVERSATIONS",
    "MessageCache",
    "all_records",
    "read_messages",
]

CACHED_FROM = 64  # messages
CHANGES_READ = 256  # writes to the whole store read through to bring one up to date
KEPT_CHARS = 2_000_000  # stored JSON, every kept conversation together (4-5.5x in memory)
KEPT_CONVERSATIONS = 64
_SEEN_REMEMBERED = 1024  # conversations seen long with nothing kept


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


async def read_messages(store: RecordStore, did: str, skey: str) -> dict[str, dict[str, Any]]:
    """Every message of conversation ``skey``, by key, read whole (nothing kept)."""
    return {r.key: r.value for r in await all_records(store, did, skey, MESSAGE)}


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
        self._changes = store if isinstance(store, SpaceChanges) else None
        self._cached_from = cached_from
        self._kept_chars = kept_chars
        self._kept_conversations = kept_conversations
        self._kept: OrderedDict[tuple[str, str], _Kept] = OrderedDict()
        self._chars = 0
        # Conversations seen long with nothing kept: True, read whole and kept next time
        # (a listing does not give the sizes the budget counts); False, larger than the
        # whole budget, read whole each time.
        self._seen: OrderedDict[tuple[str, str], bool] = OrderedDict()

    @property
    def chars(self) -> int:
        """Characters of stored JSON kept now."""
        return self._chars

    async def messages(self, did: str, skey: str) -> dict[str, dict[str, Any]]:
        """Every message of conversation ``skey``, by key, in key order."""
        store = self._changes
        if store is None:
            return await read_messages(self._store, did, skey)
        at = (did, skey)
        kept = self._take(at)
        if kept is not None:
            changed = await store.keys_changed(did, skey, MESSAGE, kept.cursor, CHANGES_READ)
            if changed is not None:
                keys, kept.cursor = changed
                if keys:
                    await self._reread(store, did, skey, kept, keys)
                self._keep(at, kept)
                return {key: value for key, (_, value, _) in kept.by_key.items()}
            # Too much written since to go through: the listing below, what is kept reused.
        elif self._seen.get(at) is not True:
            records = await all_records(self._store, did, skey, MESSAGE)
            if len(records) >= self._cached_from and at not in self._seen:
                self._remember(at, True)
            return {r.key: r.value for r in records}
        # Read it whole, as keys and CIDs first: what is kept under the same CID (a CID
        # names one content) is not read again.
        cursor = await store.change_cursor()  # before the listing: true as of it, at least
        listed = await store.space_cids(did, skey, MESSAGE)
        fresh = _Kept(cursor=cursor)
        missing: list[str] = []
        known_by_key = kept.by_key if kept is not None else {}
        for key, cid in listed:
            known = known_by_key.get(key)
            if known is not None and known[0] == cid:
                fresh.by_key[key] = known
                fresh.chars += known[2]
            else:
                missing.append(key)
        if missing:
            await self._reread(store, did, skey, fresh, missing)
        self._keep(at, fresh)
        return {key: value for key, (_, value, _) in fresh.by_key.items()}

    async def _reread(
        self, store: SpaceChanges, did: str, skey: str, kept: _Kept, keys: Collection[str]
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

    def _take(self, at: tuple[str, str]) -> _Kept | None:
        kept = self._kept.pop(at, None)
        if kept is not None:
            self._chars -= kept.chars
        return kept

    def _keep(self, at: tuple[str, str], kept: _Kept) -> None:
        self._take(at)  # a turn of the same conversation may have kept one meanwhile
        if kept.chars > self._kept_chars:
            self._remember(at, False)
            return
        self._seen.pop(at, None)
        self._kept[at] = kept
        self._chars += kept.chars
        while self._chars > self._kept_chars or len(self._kept) > self._kept_conversations:
            dropped_at, dropped = self._kept.popitem(last=False)
            self._chars -= dropped.chars
            self._remember(dropped_at, True)  # long still: read whole and kept next time

    def _remember(self, at: tuple[str, str], long: bool) -> None:
        self._seen[at] = long
        self._seen.move_to_end(at)
        if len(self._seen) > _SEEN_REMEMBERED:
            self._seen.popitem(last=False)
