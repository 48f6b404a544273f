"""A record's JSON text: written compactly, read back into a value.

A turn reads its whole conversation back (SPEC §5's load), so parsing stored records
was ~9 % of turnd's CPU on short turns. ``jiter`` (already here as the ``openai``
client's parser) reads a record in ~2 µs where ``json.loads`` takes ~7.5, and gives
the same values for everything the store writes (the AT Protocol data model has no
floats; integers of any size, escapes and non-ASCII text all round-trip). What it
refuses and ``json`` reads, a lone surrogate escape (``"\\ud800"``), goes to ``json``.

Only keys are cached: jiter's default (``cache_mode="all"``) also keeps values in a
process-wide cache of 16,384 strings, ~1.5 MB of texts and CIDs that would stay alive
(SPEC §10's RSS growth).
"""

from __future__ import annotations

import json
from typing import Any

import jiter

__all__ = ["compact", "parse", "record_text"]

# ``json.dumps`` with any option builds a JSONEncoder on every call: for a small dict
# 3.1 µs against 2.3 with one built once, for a token's text 0.77 µs against 0.10
# (``encode`` takes a string straight to the C escaper). These are built once.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_RECORD = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def compact(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``."""
    return _COMPACT.encode(value)


def record_text(value: Any) -> str:
    """:func:`compact` for a record: NaN and infinities are refused (ValueError), as
    the AT Protocol data model has no floats."""
    return _RECORD.encode(value)


def parse(text: str) -> Any:
    """The value of a stored record's JSON text, as ``json.loads`` would give it."""
    try:
        return jiter.from_json(text.encode(), cache_mode="keys")
    except (ValueError, UnicodeEncodeError):
        return json.loads(text)
