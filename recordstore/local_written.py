"""What this process wrote to the local store lately, so its change feed need not
validate those records again.

The feed validates every op-log row it reads, because a row may have been written by
another version of turnd or straight into the file. A record this process wrote was
validated by :func:`~recordstore.write.prepare_write` on its way in; the feed knows it by
its address, CID and the hash of its stored text, and only parses it.

An op-log row is read once by the process's feed, so a row is forgotten once the feed
has asked for it: what is kept is the writes the feed has not reached yet (a few,
unless it lags), not the last 4096 (0.3 MB, most of it rows read long before; SPEC
§10's RSS growth). A second feed on the same store validates what the first took.
"""

from __future__ import annotations

__all__ = ["Written"]

_KEEP = 4096  # rows the feed has not read yet; past that, the oldest are validated again


class Written:
    def __init__(self, keep: int = _KEEP) -> None:
        # One int per row, the hash of its address, CID and text, in insertion order
        # (a dict used as an ordered set: the oldest goes first when it is full).
        self._rows: dict[int, None] = {}
        self._keep = keep

    def add(self, did: str, space: str, collection: str, key: str, cid: str, text: str) -> None:
        self._rows[_fingerprint(did, space, collection, key, cid, text)] = None
        if len(self._rows) > self._keep:
            del self._rows[next(iter(self._rows))]

    def take(
        self, did: str, space: str, collection: str, key: str, cid: str | None, text: object
    ) -> bool:
        """Whether this exact row (same address, CID and text) was written and validated
        here; it is forgotten either way."""
        if cid is None or not isinstance(text, str):
            return False
        fingerprint = _fingerprint(did, space, collection, key, cid, text)
        if fingerprint not in self._rows:
            return False
        del self._rows[fingerprint]
        return True


def _fingerprint(did: str, space: str, collection: str, key: str, cid: str, text: str) -> int:
    return hash((did, space, collection, key, cid, text))
