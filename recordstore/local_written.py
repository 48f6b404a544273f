"""What this process wrote to the local store lately, so its change feed need not
validate those records again.

The feed validates every op-log row it reads, because a row may have been written by
another version of turnd or straight into the file. A record this process wrote was
validated by :func:`~recordstore.write.prepare_write` on its way in; the feed knows it by
its address, CID and the hash of its stored text, and only parses it.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["Written"]

_KEEP = 4096  # a few seconds of writes; a row found here no longer is only validated again


class Written:
    def __init__(self, keep: int = _KEEP) -> None:
        self._keep = keep
        self._rows: OrderedDict[tuple[str, str, str, str, str], int] = OrderedDict()

    def add(self, did: str, space: str, collection: str, key: str, cid: str, text: str) -> None:
        address = (did, space, collection, key, cid)
        self._rows[address] = hash(text)
        self._rows.move_to_end(address)
        if len(self._rows) > self._keep:
            self._rows.popitem(last=False)

    def validated(
        self, did: str, space: str, collection: str, key: str, cid: str | None, text: object
    ) -> bool:
        """Whether this exact row (same address, CID and text) was written and validated here."""
        if cid is None or not isinstance(text, str):
            return False
        return self._rows.get((did, space, collection, key, cid)) == hash(text)
