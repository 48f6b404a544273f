"""What this process wrote to the local store lately, so its change feed need not
validate those records again.

The feed validates every op-log row it reads, because a row may have been written by
another version of turnd or straight into the file. A record this process wrote was
validated by :func:`~recordstore.write.prepare_write` on its way in; the feed knows it by
its address, CID and the hash of its stored text, and only parses it.
"""

from __future__ import annotations

from collections import deque

__all__ = ["Written"]

_KEEP = 4096  # a few seconds of writes; a row found here no longer is only validated again


class Written:
    def __init__(self, keep: int = _KEEP) -> None:
        # One int per row, the hash of its address, CID and text: ~0.3 MB when full (a set
        # slot and an int each, the deque sharing the ints; tracemalloc, 0.29 MB at 3962
        # rows), where an OrderedDict of address hash -> text hash took 0.57 MB at ~3600
        # and tuples of the strings ~1.2 MB (SPEC §10's RSS growth). A rewrite of a row
        # adds a second fingerprint; the first ages out.
        self._rows: set[int] = set()
        self._order: deque[int] = deque()
        self._keep = keep

    def add(self, did: str, space: str, collection: str, key: str, cid: str, text: str) -> None:
        row = _fingerprint(did, space, collection, key, cid, text)
        if row in self._rows:
            return
        self._rows.add(row)
        self._order.append(row)
        if len(self._order) > self._keep:
            self._rows.discard(self._order.popleft())

    def validated(
        self, did: str, space: str, collection: str, key: str, cid: str | None, text: object
    ) -> bool:
        """Whether this exact row (same address, CID and text) was written and validated here."""
        if cid is None or not isinstance(text, str):
            return False
        return _fingerprint(did, space, collection, key, cid, text) in self._rows


def _fingerprint(did: str, space: str, collection: str, key: str, cid: str, text: str) -> int:
    return hash((did, space, collection, key, cid, text))
