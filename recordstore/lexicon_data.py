"""The atproto data model's rules, as checks that raise :class:`Fail` on the first bad value.

A check returns nothing on success; containers add their key to the failure's path while
it unwinds, so the happy path never builds a path string. These are the rules for any
value (unknown fields, open unions, the data-model-only :func:`~recordstore.lexicon.validate_data`);
the checks compiled from lexicon defs (:mod:`recordstore.lexicon_checks`) build on them.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import libipld

__all__ = [
    "Check",
    "Fail",
    "check_blob",
    "check_cid",
    "check_data",
    "check_int",
    "check_link",
    "check_str",
    "decode_bytes",
    "expect",
    "format_path",
]

Check = Callable[[Any], None]

# JS clients (and the reference PDS) read numbers as doubles: integers past 2^53
# would silently change, and with them the record's CID.
_MAX_SAFE_INT = 2**53 - 1
# Deep nesting is never legitimate in a chat record, and bounding it keeps the
# recursive walk (and the DAG-CBOR encoder after us) far from Python's stack limit.
_MAX_DEPTH = 64
# Keys longer than this are cut short in a failure's path (the message has a bound).
_MAX_KEY_IN_PATH = 64


class Fail(Exception):
    """A validation failure; ``path`` is filled innermost-first while unwinding.

    ``at`` starts the path: the key (or index) of the value that failed, when the check
    that found it is the container's.
    """

    def __init__(self, message: str, at: str | int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[str | int] = [] if at is None else [at]


def format_path(path: list[str | int]) -> str:
    out = []
    for seg in reversed(path):
        if isinstance(seg, int):
            out.append(f"[{seg}]")
        else:
            name = str(seg)
            if len(name) > _MAX_KEY_IN_PATH:
                name = name[:_MAX_KEY_IN_PATH] + "…"
            out.append(f".{name}" if out else name)
    return "".join(out)


def check_int(v: int) -> None:
    if not -_MAX_SAFE_INT <= v <= _MAX_SAFE_INT:
        raise Fail("must be an integer between -(2^53-1) and 2^53-1")


def check_str(v: str) -> None:
    # A lone surrogate (e.g. from JSON "\ud800") is not UTF-8 and cannot be encoded.
    if not v.isascii():
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise Fail("must be valid UTF-8 (it contains a lone surrogate)") from None


def check_cid(v: Any) -> None:
    if not isinstance(v, str):
        raise Fail("must be a CID string")
    try:
        libipld.decode_cid(v)
    except Exception:  # libipld raises ValueError or its own errors for junk
        raise Fail("must be a valid CID") from None


def check_link(v: Any) -> None:
    if not isinstance(v, dict) or len(v) != 1 or "$link" not in v:
        raise Fail('must be a CID link {"$link": cid}')
    try:
        check_cid(v["$link"])
    except Fail as e:
        e.path.append("$link")
        raise


def decode_bytes(v: Any) -> bytes:
    if isinstance(v, bytes):
        return v
    if not isinstance(v, dict) or len(v) != 1 or not isinstance(v.get("$bytes"), str):
        raise Fail('must be bytes {"$bytes": base64}')
    s = v["$bytes"]
    try:
        # atproto writes base64 without padding; accept it either way.
        return base64.b64decode(s + "=" * (-len(s) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise Fail("must be valid base64 in $bytes") from None


def check_blob(v: Any) -> None:
    if not isinstance(v, dict) or v.get("$type") != "blob":
        raise Fail('must be a blob {"$type": "blob", "ref", "mimeType", "size"}')
    for key in ("ref", "mimeType", "size"):
        if key not in v:
            raise Fail("is required", at=key)
    try:
        check_link(v["ref"])
    except Fail as e:
        e.path.append("ref")
        raise
    mime, size = v["mimeType"], v["size"]
    if not isinstance(mime, str) or "/" not in mime:
        raise Fail("must be a MIME type", at="mimeType")
    if type(size) is not int or size < 0:
        raise Fail("must be a non-negative integer", at="size")
    for key, item in v.items():
        if key not in ("$type", "ref", "mimeType", "size"):
            _check_data_at(item, key, 1)


def _check_data_at(v: Any, key: str | int, depth: int) -> None:
    try:
        check_data(v, depth)
    except Fail as e:
        e.path.append(key)
        raise


def check_data(v: Any, depth: int = 0) -> None:
    """Any atproto data-model value: what unknown fields and open unions may hold."""
    t = type(v)
    if t is str:
        check_str(v)
    elif t is int:
        check_int(v)
    elif t is bool or v is None or t is bytes:
        pass
    elif t is float:
        raise Fail("must not be a float (the atproto data model has no floats)")
    elif t is dict:
        if depth >= _MAX_DEPTH:
            raise Fail(f"is nested more than {_MAX_DEPTH} levels deep")
        for k in v:
            if not isinstance(k, str):
                raise Fail("must have only string keys")
        if "$type" in v:
            typ = v["$type"]
            if not isinstance(typ, str) or not typ:
                raise Fail("must be a non-empty string", at="$type")
            if typ == "blob":
                check_blob(v)
                return
        # A "$link" or "$bytes" key makes the object a link or bytes: nothing else may
        # stand beside it (the interop suite's data-model rules).
        if "$link" in v:
            check_link(v)
            return
        if "$bytes" in v:
            decode_bytes(v)
            return
        for k, item in v.items():
            _check_data_at(item, k, depth + 1)
    elif t is list:
        if depth >= _MAX_DEPTH:
            raise Fail(f"is nested more than {_MAX_DEPTH} levels deep")
        for i, item in enumerate(v):
            _check_data_at(item, i, depth + 1)
    else:
        raise Fail(f"must be a JSON value, not {t.__name__}")


# In this order: a bool is an int too.
_TYPE_NAMES = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "float"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def _type_name(v: Any) -> str:
    for t, name in _TYPE_NAMES:
        if isinstance(v, t):
            return name
    return "null" if v is None else type(v).__name__


def expect(v: Any, what: str) -> Fail:
    if isinstance(v, float):
        return Fail(f"must be {what} (the atproto data model has no floats)")
    return Fail(f"must be {what}, not {_type_name(v)}")

