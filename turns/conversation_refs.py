"""The conversationRefs a turn keeps current, without reading back what this process wrote.

Every finished turn moves its conversation's ``updatedAt`` in the settings space (the
listing's order, SPEC §4). That was a read of the ref and a put: two store round trips a
turn. :class:`ConversationRefs` remembers the refs it wrote last (a bounded LRU) with
their CIDs, and the next touch is one put that swaps on that CID. A ref somebody else
changed in between (a rename, another daemon's turn, a direct write) makes the swap fail,
and that touch reads the ref and writes it as before, so the cache is never trusted
past the store's own check.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from recordstore import (
    CONVERSATION_REF,
    SETTINGS_SPACE,
    InvalidSwap,
    Record,
    RecordStore,
    StoreError,
)
from turns import account_space, records

__all__ = ["KEPT", "ConversationRefs"]

log = logging.getLogger("turnd.turns")

KEPT = 1024  # refs remembered; each is a few hundred bytes


class ConversationRefs:
    """Touches of the conversationRefs of one store, remembering the last ones written."""

    def __init__(self, store: RecordStore, kept: int = KEPT) -> None:
        self._store = store
        self._kept = kept
        self._known: OrderedDict[tuple[str, str], Record] = OrderedDict()

    async def touch(self, did: str, skey: str, title: str | None = None) -> None:
        """Keep the conversationRef of ``skey`` current (``title``: with that title)."""
        try:
            known = self._known.pop((did, skey), None)
            if known is not None:
                value = records.conversation_ref(did, skey, known.value, title)
                try:
                    written = await self._store.put_record(
                        did, SETTINGS_SPACE, CONVERSATION_REF, skey, value, swap_cid=known.cid
                    )
                except InvalidSwap:
                    pass  # changed since this process wrote it: read it, as below
                else:
                    self._remember(did, skey, written)
                    return
            existing = await account_space.get_ref(self._store, did, skey)
            value = records.conversation_ref(did, skey, existing.value if existing else None, title)
            written = await account_space.put_ref(self._store, did, skey, value, new=existing is None)
            self._remember(did, skey, written)
        except StoreError as exc:
            log.warning("could not update the conversationRef of %s: %s", skey, exc)

    def _remember(self, did: str, skey: str, record: Record) -> None:
        self._known[(did, skey)] = record
        while len(self._known) > self._kept:
            self._known.popitem(last=False)
