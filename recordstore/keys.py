"""Record keys: TIDs, reply keys, key validation and the classic-repo mapping.

The classic-repo mapping (:func:`repo_rkey`, :func:`split_repo_rkey`) is the one
place where a space key and a key within the space are joined; everything else
in turnd handles the two separately.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import threading
import time
from datetime import UTC, datetime

from atproto_core.exceptions import InvalidNsidError
from atproto_core.nsid import validate_nsid

from recordstore.errors import InvalidKey

__all__ = [
    "MAX_ATTEMPT",
    "MAX_KEY_LENGTH",
    "TID_ALPHABET",
    "is_tid",
    "message_sort_key",
    "new_tid",
    "parse_reply_key",
    "parse_tid",
    "reply_key",
    "repo_rkey",
    "split_repo_rkey",
    "tid_datetime",
    "tid_from_parts",
    "validate_address",
    "validate_collection",
    "validate_did",
    "validate_key",
    "validate_limit",
    "validate_space_key",
]

TID_ALPHABET = "234567abcdefghijklmnopqrstuvwxyz"
MAX_KEY_LENGTH = 512
MAX_ATTEMPT = 1000  # the lexicon's generationRequest.attempt maximum

_TID_LENGTH = 13
_CLOCK_BITS = 10
_MAX_MICROS = (1 << 53) - 1
# 13 chars x 5 bits = 65 bits; the top bit must be 0, so the first char carries 4.
_TID_RE = re.compile(r"^[234567abcdefghij][234567abcdefghijklmnopqrstuvwxyz]{12}$")
_KEY_RE = re.compile(r"^[A-Za-z0-9._:~-]+$")
_DID_RE = re.compile(r"^did:[a-z]+:[a-zA-Z0-9._:%-]*[a-zA-Z0-9._-]$")
_REPLY_RE = re.compile(r"^(?P<user>.+)\.r(?P<attempt>0|[1-9][0-9]{0,3})$")
_DIGIT = {c: i for i, c in enumerate(TID_ALPHABET)}


# --- TIDs -------------------------------------------------------------------


class _TidClock:
    """Hands out strictly increasing TIDs, across threads, within a process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_micros = 0
        self._clock_id = secrets.randbelow(1 << _CLOCK_BITS)

    def reseed(self) -> None:
        # A forked child shares the parent's clock id and last value; a fresh
        # clock id keeps two processes from minting the same TID in the same µs.
        self._lock = threading.Lock()
        self._clock_id = secrets.randbelow(1 << _CLOCK_BITS)

    def next(self) -> str:
        with self._lock:
            micros = max(time.time_ns() // 1000, self._last_micros + 1)
            self._last_micros = micros
            return tid_from_parts(micros, self._clock_id)


_clock = _TidClock()
os.register_at_fork(after_in_child=_clock.reseed)


def new_tid() -> str:
    """A fresh TID, greater than every TID this process made before."""
    return _clock.next()


def tid_from_parts(micros: int, clock_id: int) -> str:
    """The TID for ``micros`` since the Unix epoch and a 10-bit ``clock_id``."""
    if not 0 <= micros <= _MAX_MICROS:
        raise ValueError(f"TID timestamp out of range: {micros}")
    if not 0 <= clock_id < (1 << _CLOCK_BITS):
        raise ValueError(f"TID clock id out of range: {clock_id}")
    n = (micros << _CLOCK_BITS) | clock_id
    chars = []
    for _ in range(_TID_LENGTH):
        chars.append(TID_ALPHABET[n & 31])
        n >>= 5
    return "".join(reversed(chars))


def is_tid(value: str) -> bool:
    """Whether ``value`` is syntactically a TID."""
    return isinstance(value, str) and _TID_RE.match(value) is not None


def parse_tid(tid: str) -> tuple[int, int]:
    """``(microseconds since the epoch, clock id)`` of a TID; InvalidKey if not one."""
    if not is_tid(tid):
        raise InvalidKey(f"not a TID: {tid!r} (13 chars of {TID_ALPHABET}, first in 2-j)")
    n = 0
    for c in tid:
        n = (n << 5) | _DIGIT[c]
    return n >> _CLOCK_BITS, n & ((1 << _CLOCK_BITS) - 1)


def tid_datetime(tid: str) -> datetime:
    """When a TID was minted (UTC)."""
    micros, _ = parse_tid(tid)
    return datetime.fromtimestamp(micros / 1_000_000, UTC)


# --- validation -------------------------------------------------------------


def validate_key(key: str, what: str = "record key") -> str:
    """Return ``key`` if it is a valid atproto record key, else raise InvalidKey."""
    if not isinstance(key, str):
        raise InvalidKey(f"invalid {what}: expected a string, got {type(key).__name__}")
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise InvalidKey(f"invalid {what}: length {len(key)} is not within 1-{MAX_KEY_LENGTH}")
    if key in (".", ".."):
        raise InvalidKey(f"invalid {what}: {key!r} is reserved")
    if _KEY_RE.match(key) is None:
        raise InvalidKey(f"invalid {what} {_clip(key)}: only A-Z a-z 0-9 and . _ : ~ - are allowed")
    return key


def validate_space_key(skey: str) -> str:
    """A space key is a record key without ``:``, which the classic-repo layout uses."""
    validate_key(skey, "space key")
    if ":" in skey:
        raise InvalidKey(f"invalid space key {_clip(skey)}: ':' is not allowed")
    return skey


def validate_did(did: str) -> str:
    """Return ``did`` if it has the atproto DID syntax, else raise InvalidKey."""
    if not isinstance(did, str) or len(did) > 2048 or _DID_RE.match(did) is None:
        raise InvalidKey(f"invalid DID {_clip(str(did))}: expected did:<method>:<id>")
    return did


def validate_collection(collection: str) -> str:
    """Return ``collection`` if it is a valid NSID, else raise InvalidKey."""
    if not isinstance(collection, str):
        raise InvalidKey(f"invalid collection {_clip(str(collection))}: not a string")
    return _valid_collection(collection)


@functools.lru_cache(maxsize=512)
def _valid_collection(collection: str) -> str:
    # A turn checks the same few collections ~15 times; the SDK's NSID check is ~10 µs.
    # Only valid names are kept (a raise is not cached), at most 512 of them.
    try:
        validate_nsid(collection)
    except (InvalidNsidError, TypeError, AttributeError) as e:
        raise InvalidKey(f"invalid collection {_clip(str(collection))}: {e}") from None
    return collection


def validate_address(did: str, space: str, collection: str, key: str) -> None:
    """Check a record's address ``(did, space, collection, key)``; raise InvalidKey."""
    validate_did(did)
    validate_space_key(space)
    validate_collection(collection)
    validate_key(key)


def validate_limit(limit: int) -> int:
    """Return ``limit`` if it is a page size (at least 1), else raise ValueError."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return limit


def _clip(value: str, limit: int = 80) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "…")


# --- reply keys -------------------------------------------------------------


def reply_key(user_key: str, attempt: int) -> str:
    """The key of the reply to ``user_key`` for generation ``attempt``."""
    if isinstance(attempt, bool) or not isinstance(attempt, int):
        raise InvalidKey(f"reply attempt must be an integer, got {attempt!r}")
    if not 0 <= attempt <= MAX_ATTEMPT:
        raise InvalidKey(f"reply attempt {attempt} is not within 0-{MAX_ATTEMPT}")
    return validate_key(f"{validate_key(user_key, 'user message key')}.r{attempt}", "reply key")


def parse_reply_key(key: str) -> tuple[str, int] | None:
    """``(user_key, attempt)`` when ``key`` is a reply key, else None."""
    m = _REPLY_RE.match(key)
    if m is None:
        return None
    attempt = int(m["attempt"])
    if attempt > MAX_ATTEMPT:
        return None
    return m["user"], attempt


def message_sort_key(key: str) -> tuple[str, int]:
    """Orders a user message before its replies, and replies by attempt number.

    As text ``.r10`` sorts before ``.r2``; this key puts it after.
    """
    parsed = parse_reply_key(key)
    return parsed if parsed is not None else (key, -1)


# --- classic-repo layout ------------------------------------------------------


def repo_rkey(space: str, key: str) -> str:
    """The record key in a classic repo for ``key`` within space ``space``."""
    validate_space_key(space)
    validate_key(key)
    return validate_key(f"{space}:{key}", "classic-repo record key")


def split_repo_rkey(rkey: str) -> tuple[str, str]:
    """``(space, key)`` of a classic-repo record key; InvalidKey if it has no space."""
    validate_key(rkey, "classic-repo record key")
    space, sep, key = rkey.partition(":")
    if not sep or not space or not key:
        raise InvalidKey(f"classic-repo record key {_clip(rkey)} is not '<space>:<key>'")
    return space, key
