"""A blob's type, found as a PDS finds it: from its bytes, the declared type as fallback.

The reference PDS runs every upload through ``file-type`` (magic bytes) and keeps the
declared ``Content-Type`` only when the bytes name no type; ``filetype`` reads the same
signatures. Text has no signature, so a text upload keeps what it was declared.
"""

from __future__ import annotations

import re

import filetype

__all__ = ["OCTET_STREAM", "blob_mime"]

OCTET_STREAM = "application/octet-stream"
_MIME_RE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*")
_HEAD = 8192  # filetype reads no further than this


def blob_mime(data: bytes, declared: str | None) -> str:
    """The type a blob is stored with: the detected one, else the declared, else octet-stream.

    A declared type is reduced to its essence (``text/plain; charset=utf-8`` ->
    ``text/plain``); ``*/*`` or a malformed one says nothing.
    """
    detected = filetype.guess_mime(bytes(data[:_HEAD])) if data else None
    if detected:
        return str(detected)
    essence = (declared or "").split(";")[0].strip().lower()
    if _MIME_RE.fullmatch(essence) and essence != "*/*":
        return essence
    return OCTET_STREAM
