"""The reply record's writes after its claim, each swapping on the CID of the one before.

While a tool call waits for approval the placeholder is rewritten once with the
parts so far; the final record then swaps on that CID. Large tool outputs go to
blobs (:func:`turns.fit.fit_record`); a final record the lexicon refuses is
stored as an error reply instead. A reply somebody else changed is not
overwritten.
"""

from __future__ import annotations

import logging
from typing import Any

from recordstore import MESSAGE, InvalidRecord, InvalidSwap, RecordStore
from turns import records
from turns.address import TurnAddress
from turns.approval import pending_reply
from turns.fit import fit_record

log = logging.getLogger("turnd.turns")

__all__ = ["ReplyWrites", "read_status", "status_of", "stored_status"]


class ReplyWrites:
    """The claimed reply at ``address``; ``cid`` is its placeholder's, then each rewrite's."""

    def __init__(self, store: RecordStore, address: TurnAddress, cid: str) -> None:
        self._store = store
        self._address = address
        self.cid = cid

    async def rewrite_pending(self, placeholder: dict[str, Any], parts: list[dict[str, Any]]) -> None:
        """A call waits for approval: the placeholder, rewritten with the parts so far."""
        a, store = self._address, self._store
        value = await fit_record(store, a.did, pending_reply(placeholder, parts))
        written = await store.put_record(a.did, a.skey, MESSAGE, a.reply, value, swap_cid=self.cid)
        self.cid = written.cid

    async def final(self, record: dict[str, Any]) -> dict[str, Any]:
        """Put the final record; large tool outputs go to blobs; what cannot be stored is an error.

        StoreError (the store refused or could not be reached) goes to the caller.
        """
        a, store = self._address, self._store
        record = await fit_record(store, a.did, record)
        try:
            await store.put_record(a.did, a.skey, MESSAGE, a.reply, record, swap_cid=self.cid)
            return record
        except InvalidSwap:
            log.warning("reply %s/%s was changed by someone else; not overwritten", a.skey, a.reply)
            return record
        except InvalidRecord as exc:
            fallback = records.unstorable(record, exc)
            await store.put_record(a.did, a.skey, MESSAGE, a.reply, fallback, swap_cid=self.cid)
            return fallback


async def stored_status(store: RecordStore, address: TurnAddress) -> str:
    """The status of the reply as stored (another runner answered it), ``pending`` if none."""
    a = address
    record = await store.get_record(a.did, a.skey, MESSAGE, a.reply)
    return record.value.get("status", "pending") if record else "pending"


def status_of(value: dict[str, Any]) -> dict[str, Any]:
    """A stored reply's ``status`` event, as its stream ended with it."""
    out: dict[str, Any] = {"status": value.get("status", "complete")}
    for name in ("error", "usage", "model"):
        if name in value:
            out[name] = value[name]
    return out


async def read_status(
    store: RecordStore, address: tuple[str, str, str], *, reply_only: bool = False
) -> dict[str, Any] | None:
    """The ``status`` event of the stored message at ``(did, skey, reply key)``, or None
    when there is none (``reply_only``: or it is no assistant reply)."""
    did, skey, reply = address
    record = await store.get_record(did, skey, MESSAGE, reply)
    if record is None or (reply_only and record.value.get("role") != "assistant"):
        return None
    return status_of(record.value)
