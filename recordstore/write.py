"""Preparing a record write, once for every backend: what a PDS does before it commits.

:func:`prepare_write` fills in ``$type``, reads integral numbers as integers, validates
the record against its lexicon, checks the blobs it references, bounds its size and
computes its CID. The local store and the PDS store both write what it returns, so
the same record gets the same answer (and the same CID) in either.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from recordstore import InvalidRecord
from recordstore.cid import record_cid
from recordstore.keys import validate_collection
from recordstore.lexicon import validate_record
from recordstore.stored_json import record_text

__all__ = [
    "MAX_BLOB_BYTES",
    "MAX_RECORD_BYTES",
    "BlobLookup",
    "BlobRef",
    "BlobRefError",
    "PreparedWrite",
    "blob_refs",
    "integral_numbers",
    "prepare_write",
]

MAX_RECORD_BYTES = 1_000_000  # what the reference PDS accepts as a record write body
MAX_BLOB_BYTES = 50_000_000  # the largest blob the chat lexicons allow (filePart.file)

# cid -> (mime type, size) of a stored blob of the writing account, or None.
BlobLookup = Callable[[str], Awaitable[tuple[str, int] | None]]


class BlobRefError(InvalidRecord):
    """A blob reference that does not match the account's blobs.

    ``error`` is the reference PDS's name for it: ``BlobNotFound``, ``InvalidMimeType``
    or ``InvalidSize``.
    """

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error


@dataclass(frozen=True, slots=True)
class BlobRef:
    cid: str
    mime_type: str
    size: int


@dataclass(frozen=True, slots=True)
class PreparedWrite:
    """A record ready to store: its value (with ``$type``), CID and JSON body."""

    collection: str
    value: dict[str, Any]
    cid: str
    body: bytes
    blobs: tuple[BlobRef, ...]

    @property
    def text(self) -> str:
        return self.body.decode()


async def prepare_write(
    collection: str, value: dict[str, Any], *, blobs: BlobLookup | None = None
) -> PreparedWrite:
    """Check ``value`` for a write into ``collection``; raise InvalidRecord (or BlobRefError).

    ``blobs`` looks up the writing account's blobs; without it (a backend whose server
    checks blob references itself, as a PDS does) they are not looked up.
    """
    validate_collection(collection)
    if not isinstance(value, dict):
        raise InvalidRecord(f"a record must be a JSON object, got {type(value).__name__}")
    record_type = value.get("$type")
    if record_type is None:
        value = {"$type": collection, **value}  # as a PDS does, before the CID
    elif record_type != collection:
        raise InvalidRecord(f"Invalid $type: expected {collection}, got {record_type}")
    value = integral_numbers(value)
    validate_record(collection, value)
    try:
        cid = record_cid(value)
        body = record_text(value).encode()
    except (ValueError, TypeError) as e:
        raise InvalidRecord(f"not atproto data: {e}") from None
    # Every blob reference, current or legacy, has a "mimeType" key: a record whose JSON
    # has none is not walked for them (most of a turn's records; ~3 µs each).
    refs = blob_refs(value) if b'"mimeType"' in body else ()
    if len(body) > MAX_RECORD_BYTES:
        raise InvalidRecord(f"record is larger than {MAX_RECORD_BYTES} bytes")
    if blobs is not None:
        for ref in refs:
            await _check_blob(ref, blobs)
    return PreparedWrite(collection, value, cid, body, refs)


async def _check_blob(ref: BlobRef, blobs: BlobLookup) -> None:
    found = await blobs(ref.cid)
    # The reference PDS's names and messages (actor-store/blob/transactor).
    if found is None:
        raise BlobRefError("BlobNotFound", f"Could not find blob: {ref.cid}")
    mime_type, size = found
    if ref.mime_type != mime_type:
        raise BlobRefError(
            "InvalidMimeType",
            "Referenced Mimetype does not match stored blob. "
            f"Expected: {mime_type}, Got: {ref.mime_type}",
        )
    if ref.size != size:
        raise BlobRefError(
            "InvalidSize",
            f"Referenced Size does not match stored blob. Expected: {size}, Got: {ref.size}",
        )


def integral_numbers(value: Any) -> Any:
    """``value`` with every integral float (``1.0``) as the integer it is.

    JSON has one number type; the reference PDS reads ``123.0`` as the integer 123, so
    turnd does too. Other floats stay floats (the validator refuses them). Containers
    are copied only where something changed.
    """
    try:
        return _integral(value)
    except RecursionError:
        raise InvalidRecord("record is nested too deeply") from None


def _integral(v: Any) -> Any:
    t = type(v)
    if t is float:
        return int(v) if v.is_integer() else v
    if t is dict:
        return _integral_items(v, v.items())
    if t is list:
        return _integral_items(v, enumerate(v))
    return v


def _integral_items(container: Any, items: Iterable[tuple[Any, Any]]) -> Any:
    """``container`` (a dict or list) with its items made integral, copied on first change."""
    out: Any = None
    for k, item in items:
        new = _integral(item)
        if new is not item:
            if out is None:
                out = type(container)(container)
            out[k] = new
    return container if out is None else out


def blob_refs(value: Any) -> tuple[BlobRef, ...]:
    """Every blob a (validated) record references; a legacy ``{cid, mimeType}`` is refused.

    Legacy blob references are read (the validator accepts them) but never written,
    as on the reference PDS ("Legacy blobs are not allowed").
    """
    found: list[BlobRef] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if v.get("$type") == "blob":
                found.append(BlobRef(v["ref"]["$link"], v["mimeType"], v["size"]))
                continue
            if _is_legacy_blob(v):
                raise InvalidRecord(f"Legacy blobs are not allowed ({v['cid']})")
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return tuple(found)


def _is_legacy_blob(v: dict[str, Any]) -> bool:
    return len(v) == 2 and isinstance(v.get("cid"), str) and isinstance(v.get("mimeType"), str)
