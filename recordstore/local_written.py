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
        # Keyed by the hash of the address and CID, not the strings: 4096 rows kept as
        # ints are ~0.3 MB, as tuples of strings ~1.2 MB (SPEC §10's RSS growth).
        self._rows: OrderedDict[int, int] = OrderedDict()

    def add(self, did: str, space: str, collection: str, key: str, cid: str, text: str) -> None:
        address = hash((did, space, collection, key, cid))
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
        return self._rows.get(hash((did, space, collection, key, cid))) == hash(text)
